"""Test-side byte writers that follow formats.md byte for byte (bundles, CCOB, kpack, tiny ELFs).

They make what no toolchain makes: truncated and hostile containers, CCOB v1/v3 and zlib payloads,
kpack archives and 1 GB sparse sections. Written from formats.md only, not from rocm_audit's code.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import msgpack
import zstandard

if TYPE_CHECKING:
    from rocm_audit.gpu.codeobjects import FileCodeObjects

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"


def align(value: int, to: int) -> int:
    return (value + to - 1) // to * to


def bundle(entries: list[tuple[str, bytes]], alignment: int = 4096) -> bytes:
    """formats.md 2.2: magic, u64 N, N x (u64 offset, u64 size, u64 id_len, id), objects aligned."""
    table = sum(24 + len(entry_id) for entry_id, _ in entries) + 32
    offsets = []
    pos = table
    for _, data in entries:
        pos = align(pos, alignment) if data else pos
        offsets.append(pos)
        pos += len(data)
    out = bytearray(BUNDLE_MAGIC + struct.pack("<Q", len(entries)))
    for (entry_id, data), offset in zip(entries, offsets, strict=True):
        raw = entry_id.encode()
        out += struct.pack("<QQQ", offset, len(data), len(raw)) + raw
    for (_, data), offset in zip(entries, offsets, strict=True):
        out += b"\0" * (offset - len(out)) + data
    return bytes(out)


def ccob(
    payload: bytes,
    *,
    version: int = 2,
    method: int = 1,
    declared_size: int | None = None,
    total_size: int | None = None,
) -> bytes:
    """formats.md 2.4: CCOB v1 (20-byte header), v2 (24), v3 (32); method 0 zlib, 1 zstd."""
    body = zstandard.ZstdCompressor(level=3).compress(payload) if method == 1 else zlib.compress(payload, 6)
    digest = hashlib.md5(payload).digest()[:8]
    size = len(payload) if declared_size is None else declared_size
    if version == 1:
        header = b"CCOB" + struct.pack("<HHI", 1, method, size) + digest
    elif version == 2:
        total = 24 + len(body) if total_size is None else total_size
        header = b"CCOB" + struct.pack("<HHII", 2, method, total, size) + digest
    else:
        total = 32 + len(body) if total_size is None else total_size
        header = b"CCOB" + struct.pack("<HHQQ", 3, method, total, size) + digest
    return header + body


def kpack_archive(kernels: list[tuple[str, str, bytes]], *, scheme: str = "none", family: str = "test") -> bytes:
    """formats.md 1.7: <4sIQ header, pad to 64, blobs, msgpack TOC to EOF; (key, arch, bytes)."""
    out = bytearray(64)
    toc: dict[str, object] = {
        "format_version": 1,
        "group_name": "t",
        "gfx_arch_family": family,
        "gfx_arches": sorted({arch for _, arch, _ in kernels}),
        "compression_scheme": scheme,
        "toc": {},
    }
    entries: dict[str, dict[str, object]] = {}
    if scheme == "none":
        blobs = []
        for ordinal, (key, arch, data) in enumerate(kernels):
            blobs.append({"offset": len(out), "size": len(data)})
            out += data
            entries.setdefault(key, {})[arch] = {
                "type": "hsaco",
                "ordinal": ordinal,
                "original_size": len(data),
            }
        toc["blobs"] = blobs
    else:
        blob = bytearray(struct.pack("<I", len(kernels)))
        for ordinal, (key, arch, data) in enumerate(kernels):
            frame = zstandard.ZstdCompressor(level=3).compress(data)
            blob += struct.pack("<I", len(frame)) + frame
            entries.setdefault(key, {})[arch] = {
                "type": "hsaco",
                "ordinal": ordinal,
                "original_size": len(data),
            }
        toc["zstd_offset"], toc["zstd_size"] = len(out), len(blob)
        out += blob
    toc["toc"] = entries
    toc_offset = len(out)
    out += msgpack.packb(toc)
    out[:16] = struct.pack("<4sIQ", b"KPAK", 1, toc_offset)
    return bytes(out)


def host_elf(sections: list[tuple[str, int, int, bytes | int]], path: str) -> None:
    """Write a minimal x86-64 ET_DYN ELF; sections are (name, sh_type, sh_flags, data or size).

    A size instead of bytes leaves a hole (sparse file): a 1 GB section costs no disk.
    """
    names = b"\0" + b"".join(name.encode() + b"\0" for name, *_ in sections) + b".shstrtab\0"
    layout = []
    pos = 4096
    for name, sh_type, flags, content in sections:
        size = content if isinstance(content, int) else len(content)
        layout.append((name, sh_type, flags, pos, size, content))
        pos = align(pos + size, 4096)
    strtab_offset = pos
    shoff = align(strtab_offset + len(names), 8)
    count = len(sections) + 2
    header = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    header += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 56, 0, 64, count, count - 1)
    shdrs = bytearray(64)  # SHN_UNDEF
    name_pos = 1
    for name, sh_type, flags, offset, size, _ in layout:
        shdrs += struct.pack("<IIQQQQIIQQ", name_pos, sh_type, flags, offset, offset, size, 0, 0, 4096, 0)
        name_pos += len(name) + 1
    shdrs += struct.pack("<IIQQQQIIQQ", name_pos, 3, 0, 0, strtab_offset, len(names), 0, 0, 1, 0)
    with open(path, "wb") as handle:
        handle.write(header)
        for _, _, _, offset, _size, content in layout:
            if not isinstance(content, int):
                handle.seek(offset)
                handle.write(content)
        handle.seek(strtab_offset)
        handle.write(names)
        handle.seek(shoff)
        handle.write(shdrs)


def amdgpu_header(e_flags: int, *, abi_version: int = 4, e_type: int = 3, osabi: int = 64) -> bytes:
    """A bare 64-byte AMDGPU ELF header (no program or section headers)."""
    ident = b"\x7fELF" + bytes([2, 1, 1, osabi, abi_version]) + bytes(7)
    return ident + struct.pack("<HHIQQQIHHHHHH", e_type, 224, 1, 0, 0, 0, e_flags, 64, 56, 0, 64, 0, 0)


def section_bytes(path: Path, name: str) -> tuple[int, bytes]:
    """(file offset, contents) of one section, via pyelftools (not rocm_audit's reader)."""
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as handle:
        section = ELFFile(handle).get_section_by_name(name)
        assert section is not None, f"{path} has no {name}"
        return section["sh_offset"], section.data()


def scan_path(path: Path) -> FileCodeObjects:
    """rocm_audit's view of one file, through the inventory as the commands see it."""
    from rocm_audit.gpu.codeobjects import scan_file
    from rocm_audit.tree.discovery import resolve_roots
    from rocm_audit.tree.inventory import build_inventory

    roots, _ = resolve_roots([str(path)])
    inventory = build_inventory(roots)
    assert len(inventory.files) == 1
    return scan_file(inventory.files[0])
