"""LLVM OffloadBinary (magic ``10 FF 10 AD``), as found in ``.llvm.offloading`` sections.

Layout: formats.md 2.6 [LLVM: llvm/include/llvm/Object/OffloadBinary.h,
llvm/lib/Object/OffloadBinary.cpp].
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from rocm_audit.errors import FormatError

FMT = "OffloadBinary"
OFFLOAD_BINARY_MAGIC = b"\x10\xff\x10\xad"
IMAGE_KINDS = {
    0: "none",
    1: "object",
    2: "bitcode",
    3: "cubin",
    4: "fatbinary",
    5: "ptx",
    6: "spirv",
}
OFFLOAD_KINDS = {1: "openmp", 2: "cuda", 4: "hip", 8: "sycl"}  # bitmask, v2+ (formats.md 2.6)
OFFLOAD_KINDS_V1 = {0: "none", 1: "openmp", 2: "cuda", 3: "hip"}
ENTRY_SIZE = 40
MAX_ENTRIES = 4096
MAX_STRINGS = 256


@dataclass(frozen=True, slots=True)
class OffloadImage:
    image_kind: str
    offload_kinds: tuple[str, ...]
    flags: int
    strings: dict[str, str]
    image_offset: int  # from the binary's start
    image_size: int
    compressed: bool

    @property
    def triple(self) -> str | None:
        return self.strings.get("triple")

    @property
    def arch(self) -> str | None:
        return self.strings.get("arch")


@dataclass(frozen=True, slots=True)
class OffloadBinary:
    version: int
    size: int
    images: tuple[OffloadImage, ...]


def _string_at(buf: bytes | memoryview, offset: int, base: int) -> str:
    if offset >= len(buf):
        raise FormatError(FMT, base + offset, "string offset lies outside the binary")
    end = bytes(buf[offset : offset + 4096]).find(b"\0")
    if end < 0:
        raise FormatError(FMT, base + offset, "unterminated string")
    return bytes(buf[offset : offset + end]).decode("utf-8", "replace")


def parse_offload_binary(buf: bytes | memoryview, base: int) -> OffloadBinary:
    """Parse one OffloadBinary at the start of ``buf``. Raises FormatError."""
    if len(buf) < 32:
        raise FormatError(FMT, base + len(buf), "data ends inside the OffloadBinary header")
    if bytes(buf[:4]) != OFFLOAD_BINARY_MAGIC:
        raise FormatError(FMT, base, "no OffloadBinary magic")
    version, size, entries_offset, entries_count = struct.unpack_from("<IQQQ", buf, 4)
    if version < 1 or version > 3:
        raise FormatError(FMT, base + 4, f"unknown OffloadBinary version {version}")
    header_size = 40 if version >= 3 else 32
    if size < header_size or size > len(buf):
        raise FormatError(FMT, base + 8, f"declared size {size} does not fit the {len(buf)} bytes available")
    inflated = struct.unpack_from("<Q", buf, 32)[0] if version >= 3 else 0
    if inflated:
        # v3 compressed body: the entry table is inside the compressed data; list it as one image.
        return OffloadBinary(
            version,
            size,
            (OffloadImage("compressed", (), 0, {}, header_size, size - header_size, True),),
        )
    if version == 1:
        # Observed in clang-19 output: v1 stores the entry *size* (40) at @24 and holds one entry.
        if entries_count < ENTRY_SIZE:
            raise FormatError(FMT, base + 24, f"entry size {entries_count} is smaller than {ENTRY_SIZE}")
        entries_count = 1
    elif entries_count > MAX_ENTRIES:
        raise FormatError(FMT, base + 24, f"entry count {entries_count} is out of range")
    if entries_offset + entries_count * ENTRY_SIZE > size:
        raise FormatError(FMT, base + 16, "entry table runs past the binary")
    string_size = 16 if version == 1 else 24
    images = []
    view = buf[:size]
    for index in range(entries_count):
        at = entries_offset + index * ENTRY_SIZE
        image_kind, offload_kind, flags, string_offset, num_strings, image_offset, image_size = struct.unpack_from(
            "<HHIQQQQ", view, at
        )
        if num_strings > MAX_STRINGS or string_offset + num_strings * string_size > size:
            raise FormatError(FMT, base + at + 8, "string table runs past the binary")
        if image_offset + image_size > size:
            raise FormatError(FMT, base + at + 24, "image runs past the binary")
        strings = {}
        for number in range(num_strings):
            key_off, value_off = struct.unpack_from("<QQ", view, string_offset + number * string_size)
            strings[_string_at(view, key_off, base)] = _string_at(view, value_off, base)
        kinds: tuple[str, ...]
        if version == 1:
            # v1 OffloadKind is an enum (LLVM 19: 1 OpenMP, 2 Cuda, 3 HIP), later a bitmask.
            kinds = (OFFLOAD_KINDS_V1.get(offload_kind, str(offload_kind)),)
        else:
            kinds = tuple(name for bit, name in OFFLOAD_KINDS.items() if offload_kind & bit)
        images.append(
            OffloadImage(
                IMAGE_KINDS.get(image_kind, str(image_kind)),
                kinds,
                flags,
                strings,
                image_offset,
                image_size,
                False,
            )
        )
    return OffloadBinary(version, size, tuple(images))


def parse_section(buf: bytes | memoryview, base: int) -> list[OffloadBinary]:
    """Every OffloadBinary in a ``.llvm.offloading`` section (each 8-byte aligned)."""
    binaries = []
    pos = 0
    while pos + 4 <= len(buf):
        if bytes(buf[pos : pos + 4]) != OFFLOAD_BINARY_MAGIC:
            if any(buf[pos : pos + 8]):
                raise FormatError(FMT, base + pos, "unexpected bytes between OffloadBinaries")
            pos += 8
            continue
        one = parse_offload_binary(buf[pos:], base + pos)
        binaries.append(one)
        pos += (one.size + 7) & ~7
    return binaries
