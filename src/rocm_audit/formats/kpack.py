"""kpack: ``.kpack`` archives (KPAK + MessagePack TOC), ``.kpm`` manifests, ``.rocm_kpack_ref``.

Layout: formats.md 1.7 [kpack-old: python/rocm_kpack/kpack.py,
runtime/include/rocm_kpack/kpack_types.h;
rocm-systems: shared/kpack/runtime/src/toc_parser.cpp, loader.cpp].
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from rocm_audit.errors import FormatError

KPACK_MAGIC = b"KPAK"
KPACK_HEADER = struct.Struct("<4sIQ")  # magic, u32 version, u64 toc_offset
KPACK_VERSION = 1
MAX_TOC_BYTES = 64 << 20
MAX_REF_BYTES = 64 << 10  # the runtime's metadata parse limit (formats.md 1.7)
SCHEME_NONE, SCHEME_ZSTD = "none", "zstd-per-kernel"


def _unpack(data: bytes, fmt: str, base: int) -> Any:
    import msgpack  # noqa: PLC0415 - heavy module, loaded on first use (style.md 3)

    try:
        # unpackb bounds every length by len(data): a hostile length cannot drive allocation.
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.exceptions.UnpackException) as exc:
        raise FormatError(fmt, base, f"not valid MessagePack: {str(exc) or type(exc).__name__}") from None


@dataclass(frozen=True, slots=True)
class KpackHeader:
    version: int
    toc_offset: int


def parse_kpack_header(buf: bytes | memoryview, file_size: int) -> KpackHeader:
    if len(buf) < KPACK_HEADER.size:
        raise FormatError("kpack", len(buf), "file ends inside the 16-byte KPAK header")
    magic, version, toc_offset = KPACK_HEADER.unpack_from(buf, 0)
    if magic != KPACK_MAGIC:
        raise FormatError("kpack", 0, "no KPAK magic")
    if version != KPACK_VERSION:
        raise FormatError("kpack", 4, f"unknown KPAK version {version}")
    if toc_offset < KPACK_HEADER.size or toc_offset >= file_size:
        raise FormatError("kpack", 8, f"TOC offset {toc_offset} lies outside the file ({file_size} bytes)")
    if file_size - toc_offset > MAX_TOC_BYTES:
        raise FormatError("kpack", 8, f"TOC of {file_size - toc_offset} bytes is larger than 64 MiB")
    return KpackHeader(version, toc_offset)


@dataclass(frozen=True, slots=True)
class KpackKernel:
    key: str  # "<relpath>#<co_index>" (newer) or "<prefix>/<relpath>" (older)
    arch: str
    ordinal: int
    original_size: int
    blob: tuple[int, int] | None  # (offset, size) in the archive for scheme "none"


@dataclass(frozen=True, slots=True)
class KpackToc:
    group_name: str
    arch_family: str
    arches: tuple[str, ...]
    scheme: str
    kernels: tuple[KpackKernel, ...]
    zstd_blob: tuple[int, int] | None


def parse_kpack_toc(data: bytes, base: int, file_size: int) -> KpackToc:
    """Decode the TOC (``data`` = bytes from ``toc_offset`` to EOF). Raises FormatError."""
    toc = _unpack(data, "kpack TOC", base)
    if not isinstance(toc, dict):
        raise FormatError("kpack TOC", base, "TOC is not a map")
    scheme = toc.get("compression_scheme", SCHEME_NONE)
    if scheme not in (SCHEME_NONE, SCHEME_ZSTD):
        raise FormatError("kpack TOC", base, f"unknown compression scheme {scheme!r}")
    arches = toc.get("gfx_arches", [])
    if not isinstance(arches, list) or not all(isinstance(a, str) for a in arches):
        raise FormatError("kpack TOC", base, "gfx_arches is not a list of strings")
    blobs = toc.get("blobs", [])
    if not isinstance(blobs, list):
        raise FormatError("kpack TOC", base, "blobs is not a list")
    entries = toc.get("toc", {})
    if not isinstance(entries, dict):
        raise FormatError("kpack TOC", base, "toc is not a map")
    kernels = []
    for key, per_arch in entries.items():
        if not isinstance(key, str) or not isinstance(per_arch, dict):
            raise FormatError("kpack TOC", base, f"entry {key!r} is not a map of arches")
        for arch, info in per_arch.items():
            if not isinstance(arch, str) or not isinstance(info, dict):
                raise FormatError("kpack TOC", base, f"entry {key!r} has a malformed arch record")
            ordinal = info.get("ordinal")
            original_size = info.get("original_size", 0)
            if not isinstance(ordinal, int) or not isinstance(original_size, int) or ordinal < 0:
                raise FormatError("kpack TOC", base, f"entry {key!r}@{arch} has no valid ordinal")
            blob = None
            if scheme == SCHEME_NONE:
                if ordinal >= len(blobs) or not isinstance(blobs[ordinal], dict):
                    raise FormatError("kpack TOC", base, f"entry {key!r}@{arch} names missing blob {ordinal}")
                offset, size = blobs[ordinal].get("offset"), blobs[ordinal].get("size")
                if (
                    not isinstance(offset, int)
                    or not isinstance(size, int)
                    or offset < 0
                    or size < 0
                    or offset + size > file_size
                ):
                    raise FormatError("kpack TOC", base, f"blob {ordinal} lies outside the archive")
                blob = (offset, size)
            kernels.append(KpackKernel(key, arch, ordinal, original_size, blob))
    zstd_blob = None
    if scheme == SCHEME_ZSTD:
        offset, size = toc.get("zstd_offset"), toc.get("zstd_size")
        if (
            not isinstance(offset, int)
            or not isinstance(size, int)
            or offset < 0
            or size < 0
            or offset + size > file_size
        ):
            raise FormatError("kpack TOC", base, "zstd blob lies outside the archive")
        zstd_blob = (offset, size)
    return KpackToc(
        str(toc.get("group_name", "")),
        str(toc.get("gfx_arch_family", "")),
        tuple(arches),
        scheme,
        tuple(sorted(kernels, key=lambda k: (k.key, k.arch))),
        zstd_blob,
    )


@dataclass(frozen=True, slots=True)
class KpackRef:
    search_paths: tuple[str, ...]
    kernel_name: str


def parse_kpack_ref(data: bytes, base: int) -> KpackRef:
    """Decode ``.rocm_kpack_ref``: ``{"kpack_search_paths": [...], "kernel_name": ...}``, read the way
    the kpack runtime reads it: the first MessagePack object within 64 KiB of the section start
    (bytes after it are ignored), search-path entries that are not strings skipped, at least one
    left [kpack-old and rocm-systems: runtime/src/loader.cpp parse_hipk_metadata]."""
    import msgpack  # noqa: PLC0415 - heavy module, loaded on first use (style.md 3)

    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=MAX_REF_BYTES)
    try:
        unpacker.feed(data[:MAX_REF_BYTES])
        ref = unpacker.unpack()
    except msgpack.OutOfData:
        raise FormatError(
            ".rocm_kpack_ref", base, "MessagePack ends before its first object does (the runtime reads 64 KiB)"
        ) from None
    except (ValueError, TypeError, msgpack.exceptions.UnpackException) as exc:
        raise FormatError(".rocm_kpack_ref", base, f"not valid MessagePack: {str(exc) or type(exc).__name__}") from None
    if not isinstance(ref, dict):
        raise FormatError(".rocm_kpack_ref", base, "not a map")
    paths = ref.get("kpack_search_paths")
    name = ref.get("kernel_name")
    if not isinstance(name, str) or not isinstance(paths, list):
        raise FormatError(".rocm_kpack_ref", base, "kpack_search_paths/kernel_name missing or mistyped")
    strings = tuple(p for p in paths if isinstance(p, str))
    if not strings:
        raise FormatError(".rocm_kpack_ref", base, "kpack_search_paths holds no string")
    return KpackRef(strings, name)


@dataclass(frozen=True, slots=True)
class KpackManifest:
    component_name: str
    files_by_arch: dict[str, str]
    prefix: str = ""  # the build stage prefix the TOC keys start with ("math-libs/BLAS/rocBLAS/stage")


def parse_kpm(data: bytes, base: int) -> KpackManifest:
    """Decode an older-flow ``.kpm``: ``kpack_files: {arch: {file, size, kernel_count}}``."""
    manifest = _unpack(data, "kpm", base)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("kpack_files"), dict):
        raise FormatError("kpm", base, "no kpack_files map")
    files = {}
    for arch, info in manifest["kpack_files"].items():
        if isinstance(arch, str) and isinstance(info, dict) and isinstance(info.get("file"), str):
            files[arch] = info["file"]
    prefix = manifest.get("prefix")
    return KpackManifest(str(manifest.get("component_name", "")), files, prefix if isinstance(prefix, str) else "")


def zstd_frame_offsets(read_at: Any, blob_size: int, base: int, max_kernels: int = 1 << 20) -> list[tuple[int, int]]:
    """(offset, size) of each frame of a zstd-per-kernel blob, walking only the u32 size fields.

    ``read_at(offset, size)`` reads bytes relative to the blob start; one small read per kernel.
    """
    head = read_at(0, 4)
    if len(head) < 4:
        raise FormatError("kpack", base, "zstd blob ends inside its kernel count")
    (count,) = struct.unpack("<I", head)
    if count > max_kernels:
        raise FormatError("kpack", base, f"zstd blob declares {count} kernels")
    frames = []
    pos = 4
    for _ in range(count):
        size_field = read_at(pos, 4)
        if len(size_field) < 4:
            raise FormatError("kpack", base + pos, "zstd blob ends inside a frame size")
        (size,) = struct.unpack("<I", size_field)
        if pos + 4 + size > blob_size:
            raise FormatError("kpack", base + pos, "zstd frame runs past the blob")
        frames.append((pos + 4, size))
        pos += 4 + size
    return frames
