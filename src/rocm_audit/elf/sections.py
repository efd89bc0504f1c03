"""Section headers of a host ELF, read lazily with two ``pread`` calls (table + names).

Only the section header table and ``.shstrtab`` are read, never a section's contents, so a library
with a 1 GB ``.hip_fatbin`` costs a few kilobytes here. pyelftools would do the same through a file
object but costs ~1.4 ms per file to construct; elf/view.py keeps the table this returns, so the
checks of one fact pass (verify-arch, llvm, post-build) share it.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from rocm_audit.elf.read import ElfHeader
from rocm_audit.errors import FormatError

SHT_NOBITS = 8
SHF_ALLOC = 0x2
SHF_EXECINSTR = 0x4
MAX_SECTIONS = 1 << 16
MAX_SHSTRTAB_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class Section:
    index: int
    name: str
    sh_type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int

    @property
    def has_file_bytes(self) -> bool:
        return self.sh_type != SHT_NOBITS and self.size > 0


def read_sections(fd: int, header: ElfHeader, file_size: int) -> tuple[Section, ...]:
    """Every section header with its name. Raises FormatError for tables outside the file.

    Read once per file by its view (elf/view.py), which every check of the fact pass shares."""
    if header.e_shnum == 0 or header.e_shoff == 0:
        return ()
    entry = 64 if header.is_64 else 40
    if header.e_shentsize < entry:
        raise FormatError("ELF", 0x3A if header.is_64 else 0x2E, f"e_shentsize {header.e_shentsize} too small")
    if header.e_shnum > MAX_SECTIONS:
        raise FormatError("ELF", 0x3C if header.is_64 else 0x30, f"e_shnum {header.e_shnum} is absurd")
    table_size = header.e_shnum * header.e_shentsize
    if header.e_shoff + table_size > file_size:
        raise FormatError("ELF", header.e_shoff, "section header table runs past the end of the file")
    table = os.pread(fd, table_size, header.e_shoff)
    if len(table) != table_size:
        raise FormatError("ELF", header.e_shoff, "section header table is truncated")
    end = header.endian
    raw = []
    for index in range(header.e_shnum):
        base = index * header.e_shentsize
        # Elf64_Shdr / Elf32_Shdr: name, type, flags, addr, offset, size, link, info, addralign, entsize
        fields = struct.unpack_from(end + ("IIQQQQIIQQ" if header.is_64 else "IIIIIIIIII"), table, base)
        raw.append(fields[:8] + fields[9:])
    names = b""
    if header.e_shstrndx < len(raw):
        str_offset, str_size = raw[header.e_shstrndx][4:6]
        if str_size > MAX_SHSTRTAB_BYTES or str_offset + str_size > file_size:
            raise FormatError(
                "ELF",
                header.e_shoff + header.e_shstrndx * header.e_shentsize,
                "section name table lies outside the file",
            )
        names = os.pread(fd, str_size, str_offset)
    sections = []
    for index, (name, sh_type, flags, addr, offset, size, link, info, entsize) in enumerate(raw):
        end_name = names.find(b"\0", name) if name < len(names) else -1
        text = names[name:end_name].decode("utf-8", "replace") if end_name >= 0 else ""
        if sh_type != SHT_NOBITS and size and offset + size > file_size:
            raise FormatError(
                "ELF",
                header.e_shoff + index * header.e_shentsize,
                f"section {text or index} runs past the end of the file",
            )
        sections.append(Section(index, text, sh_type, flags, addr, offset, size, link, info, entsize))
    return tuple(sections)
