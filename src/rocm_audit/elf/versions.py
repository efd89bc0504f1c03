"""Symbol-version facts of host ELF files: ``.gnu.version_r`` and ``.gnu.version_d``, read directly.

``.gnu.version_r`` says which versions a file needs from each DT_NEEDED library (``GLIBC_2.34``
from ``libc.so.6``); ``.gnu.version_d`` says which versions a library defines. glibc refuses to load
a file whose needed version its provider does not define ("version `GLIBC_2.39' not found").

Read from the section table (elf/sections.py, shared with the other facts of the pass) and the two
sections with their string table, by ``pread``: pyelftools did the same through a file object, but
building an ``ELFFile`` and its section objects cost 15 ms per library (2.5 s of a 12 s ``check``
over 3.4 GB of vendor wheels). pyelftools stays the oracle: tests/test_versions_reader.py compares
both on real libraries.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass

from rocm_audit.errors import FormatError

SHT_GNU_VERDEF = 0x6FFFFFFD
SHT_GNU_VERNEED = 0x6FFFFFFE
MAX_VERSION_BYTES = 16 << 20  # a version section or its string table; real ones are kilobytes
MAX_RECORDS = 1 << 16  # entries walked per section; a chain that loops ends here


@dataclass(frozen=True, slots=True)
class VersionFacts:
    needed: dict[str, frozenset[str]]  # DT_NEEDED file name -> versions required from it
    defined: frozenset[str]  # version nodes this file defines (its own SONAME node included)


def read_versions(path: str, fd: int | None = None) -> VersionFacts:
    """Version needs and definitions of one ELF file (read from fd when given: the caller keeps it
    open and closes it). Raises FormatError or OSError."""
    from rocm_audit.elf.read import parse_header
    from rocm_audit.elf.sections import read_sections

    own = fd is None
    if fd is None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        header = parse_header(os.pread(fd, 64, 0))
        sections = read_sections(fd, header, size)
        needed: dict[str, set[str]] = {}
        defined: set[str] = set()
        for section in sections:
            if section.sh_type not in (SHT_GNU_VERNEED, SHT_GNU_VERDEF) or not section.has_file_bytes:
                continue
            data = _section_bytes(fd, section.offset, section.size, section.index)
            if section.link >= len(sections):
                raise FormatError("ELF", section.offset, f"version section {section.index} links no string table")
            strtab = sections[section.link]
            strings = _section_bytes(fd, strtab.offset, strtab.size, strtab.index) if strtab.has_file_bytes else b""
            if section.sh_type == SHT_GNU_VERNEED:
                for name, versions in _needs(data, strings, header.endian, section.offset):
                    if name:  # a nameless entry names no library to look in
                        needed.setdefault(name, set()).update(versions)
            else:
                defined.update(_definitions(data, strings, header.endian, section.offset))
    finally:
        if own:
            os.close(fd)
    return VersionFacts({k: frozenset(v) for k, v in needed.items()}, frozenset(defined))


def _section_bytes(fd: int, offset: int, size: int, index: int) -> bytes:
    if size > MAX_VERSION_BYTES:
        raise FormatError("ELF", offset, f"section {index} of {size} bytes is no version section or string table")
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise FormatError("ELF", offset, f"section {index} is truncated")
    return data


def _string(strings: bytes, at: int, where: int) -> str:
    end = strings.find(b"\0", at) if at < len(strings) else -1
    if end < 0:
        raise FormatError("ELF", where, f"version name at string offset {at} lies outside the string table")
    return strings[at:end].decode("utf-8", "surrogateescape")


def _needs(data: bytes, strings: bytes, end: str, base: int) -> list[tuple[str, list[str]]]:
    """Elf_Verneed {u16 version, u16 cnt, u32 file, u32 aux, u32 next} -> Elf_Vernaux {u32 hash,
    u16 flags, u16 other, u32 name, u32 next}: offsets relative to the record that holds them."""
    found: list[tuple[str, list[str]]] = []
    at = 0
    for _ in range(MAX_RECORDS):
        if at + 16 > len(data):
            raise FormatError("ELF", base + at, "version need record runs past its section")
        _version, count, file_name, aux, following = struct.unpack_from(end + "HHIII", data, at)
        versions = []
        cursor = at + aux
        for _ in range(min(count, MAX_RECORDS)):
            if cursor + 16 > len(data):
                raise FormatError("ELF", base + cursor, "version need auxiliary runs past its section")
            _hash, _flags, _other, name, step = struct.unpack_from(end + "IHHII", data, cursor)
            versions.append(_string(strings, name, base + cursor))
            if not step:
                break
            cursor += step
        found.append((_string(strings, file_name, base + at), versions))
        if not following:
            return found
        at += following
    raise FormatError("ELF", base, "version need chain does not end")


def _definitions(data: bytes, strings: bytes, end: str, base: int) -> list[str]:
    """Elf_Verdef {u16 version, u16 flags, u16 ndx, u16 cnt, u32 hash, u32 aux, u32 next} ->
    Elf_Verdaux {u32 name, u32 next}."""
    names: list[str] = []
    at = 0
    for _ in range(MAX_RECORDS):
        if at + 20 > len(data):
            raise FormatError("ELF", base + at, "version definition runs past its section")
        _version, _flags, _index, count, _hash, aux, following = struct.unpack_from(end + "HHHHIII", data, at)
        cursor = at + aux
        for _ in range(min(count, MAX_RECORDS)):
            if cursor + 8 > len(data):
                raise FormatError("ELF", base + cursor, "version definition auxiliary runs past its section")
            name, step = struct.unpack_from(end + "II", data, cursor)
            names.append(_string(strings, name, base + cursor))
            if not step:
                break
            cursor += step
        if not following:
            return names
        at += following
    raise FormatError("ELF", base, "version definition chain does not end")


_VERSION = re.compile(r"^([A-Z][A-Z_]*?)_(\d+(?:\.\d+)*)$")


def split_version(name: str) -> tuple[str, tuple[int, ...]] | None:
    """``GLIBC_2.34`` -> ("GLIBC", (2, 34)); None for names without a numeric version."""
    match = _VERSION.match(name)
    if not match:
        return None
    return match.group(1), tuple(int(x) for x in match.group(2).split("."))


def newest(defined: frozenset[str], family: str) -> tuple[int, ...] | None:
    versions = [v for f, v in filter(None, map(split_version, defined)) if f == family]
    return max(versions) if versions else None


def format_version(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))
