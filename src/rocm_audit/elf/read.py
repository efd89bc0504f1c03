"""Header-only ELF reader: file header, program headers and the dynamic section.

This is the cheap pass run on every file of a tree. It reads the first block (already read for
classification), then at most a few small ``pread`` calls for PT_DYNAMIC and the strings it names,
so a 2 GB library costs the same as a 20 kB one. The fact pass reads the same structures, and the
deeper ones (sections, symbols, versions, relocations, notes), through one view per file
(elf/view.py), which calls these functions.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from rocm_audit.errors import FormatError
from rocm_audit.formats.elf_header import ELF32_HEADER_SIZE, ELF64_HEADER_SIZE, unpack_header_fields

ELF_MAGIC = b"\x7fELF"
ELFCLASS32, ELFCLASS64 = 1, 2
ELFDATA2LSB, ELFDATA2MSB = 1, 2
ET_REL, ET_EXEC, ET_DYN, ET_CORE = 1, 2, 3, 4
EM_AMDGPU = 224  # formats.md 2.7
PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_SONAME, DT_RPATH = 0, 1, 5, 10, 14, 15
DT_SYMBOLIC, DT_FLAGS, DT_RUNPATH = 16, 30, 29
DT_FLAGS_1 = 0x6FFFFFFB
DF_SYMBOLIC = 0x2
DF_1_NODELETE, DF_1_PIE = 0x8, 0x08000000

# Bounds that keep a hostile header from driving work or memory (DEVELOPERS.md, Standards).
MAX_PHNUM = 4096
MAX_DYNAMIC_BYTES = 1 << 20
MAX_STRING_BYTES = 64 << 10
MAX_NEEDED = 4096


@dataclass(frozen=True, slots=True)
class ElfHeader:
    elf_class: int
    little_endian: bool
    osabi: int
    abiversion: int
    e_type: int
    e_machine: int
    e_flags: int
    e_phoff: int
    e_phentsize: int
    e_phnum: int
    e_shoff: int
    e_shentsize: int
    e_shnum: int
    e_shstrndx: int

    @property
    def is_64(self) -> bool:
        return self.elf_class == ELFCLASS64

    @property
    def endian(self) -> str:
        return "<" if self.little_endian else ">"


@dataclass(frozen=True, slots=True)
class ProgramHeader:
    p_type: int
    p_offset: int
    p_vaddr: int
    p_filesz: int
    p_memsz: int


@dataclass(frozen=True, slots=True)
class DynamicInfo:
    soname: str | None
    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    flags: int
    flags_1: int

    @property
    def symbolic(self) -> bool:
        return bool(self.flags & DF_SYMBOLIC)


EMPTY_DYNAMIC = DynamicInfo(None, (), (), (), 0, 0)


def parse_header(head: bytes) -> ElfHeader:
    """Parse the ELF file header from the first bytes of a file. Raises FormatError."""
    if head[:4] != ELF_MAGIC:
        raise FormatError("ELF", 0, "no ELF magic")
    if len(head) < 20:
        raise FormatError("ELF", len(head), "file ends inside the ELF identification")
    elf_class, data = head[4], head[5]
    if elf_class not in (ELFCLASS32, ELFCLASS64):
        raise FormatError("ELF", 4, f"invalid EI_CLASS {elf_class}")
    if data not in (ELFDATA2LSB, ELFDATA2MSB):
        raise FormatError("ELF", 5, f"invalid EI_DATA {data}")
    need = ELF64_HEADER_SIZE if elf_class == ELFCLASS64 else ELF32_HEADER_SIZE
    if len(head) < need:
        raise FormatError("ELF", len(head), f"file ends inside the {need}-byte ELF header")
    fields = unpack_header_fields(head, is_64=elf_class == ELFCLASS64, little_endian=data == ELFDATA2LSB)
    return ElfHeader(
        elf_class,
        data == ELFDATA2LSB,
        head[7],
        head[8],
        fields.e_type,
        fields.e_machine,
        fields.e_flags,
        fields.e_phoff,
        fields.e_phentsize,
        fields.e_phnum,
        fields.e_shoff,
        fields.e_shentsize,
        fields.e_shnum,
        fields.e_shstrndx,
    )


def _pread_exact(fd: int, size: int, offset: int, what: str) -> bytes:
    chunk = os.pread(fd, size, offset)
    if len(chunk) != size:
        raise FormatError("ELF", offset, f"{what} runs past the end of the file")
    return chunk


def read_program_headers(fd: int, header: ElfHeader, head: bytes, file_size: int) -> list[ProgramHeader]:
    """Program headers, taken from ``head`` when they lie inside it. Raises FormatError."""
    if header.e_phnum == 0:
        return []
    table = _program_header_table(fd, header, head, file_size)
    end = header.endian
    phdrs = []
    for index in range(header.e_phnum):
        base = index * header.e_phentsize
        if header.is_64:
            p_type, _flags, off, vaddr, _paddr, filesz, memsz, _align = struct.unpack_from(
                end + "IIQQQQQQ", table, base
            )
        else:
            p_type, off, vaddr, _paddr, filesz, memsz, _flags, _align = struct.unpack_from(
                end + "IIIIIIII", table, base
            )
        phdrs.append(ProgramHeader(p_type, off, vaddr, filesz, memsz))
    return phdrs


def program_header_types(fd: int, header: ElfHeader, head: bytes, file_size: int) -> list[int]:
    """``p_type`` of every program header: the checks of read_program_headers without building
    objects (the inventory asks only "is there a PT_INTERP?" of every file). Raises FormatError."""
    if header.e_phnum == 0:
        return []
    table = _program_header_table(fd, header, head, file_size)
    step, fmt = header.e_phentsize, header.endian + "I"
    return [struct.unpack_from(fmt, table, index * step)[0] for index in range(header.e_phnum)]


def _program_header_table(fd: int, header: ElfHeader, head: bytes, file_size: int) -> bytes:
    """The raw program header table, bounds-checked. Raises FormatError."""
    entry_size = 56 if header.is_64 else 32
    if header.e_phentsize < entry_size:
        raise FormatError("ELF", 0x36 if header.is_64 else 0x2A, f"e_phentsize {header.e_phentsize} too small")
    if header.e_phnum > MAX_PHNUM:
        raise FormatError("ELF", 0x38 if header.is_64 else 0x2C, f"e_phnum {header.e_phnum} is absurd")
    table_size = header.e_phentsize * header.e_phnum
    if header.e_phoff + table_size > file_size:
        raise FormatError("ELF", header.e_phoff, "program header table runs past the end of the file")
    if header.e_phoff + table_size <= len(head):
        return head[header.e_phoff : header.e_phoff + table_size]
    return _pread_exact(fd, table_size, header.e_phoff, "program header table")


def vaddr_to_offset(phdrs: list[ProgramHeader], vaddr: int) -> int | None:
    """File offset of a virtual address through the PT_LOAD segments, or None."""
    for ph in phdrs:
        if ph.p_type == PT_LOAD and ph.p_vaddr <= vaddr < ph.p_vaddr + ph.p_filesz:
            return ph.p_offset + (vaddr - ph.p_vaddr)
    return None


def _read_string(fd: int, offset: int, file_size: int) -> str:
    if offset >= file_size:
        raise FormatError("ELF", offset, "dynamic string lies past the end of the file")
    chunk = os.pread(fd, min(256, file_size - offset), offset)
    while b"\0" not in chunk:
        if len(chunk) >= MAX_STRING_BYTES or offset + len(chunk) >= file_size:
            raise FormatError("ELF", offset, "unterminated dynamic string")
        more = os.pread(fd, min(4096, file_size - offset - len(chunk)), offset + len(chunk))
        if not more:
            raise FormatError("ELF", offset, "unterminated dynamic string")
        chunk += more
    return chunk[: chunk.index(b"\0")].decode("utf-8", "surrogateescape")


def read_dynamic(fd: int, header: ElfHeader, phdrs: list[ProgramHeader], file_size: int) -> DynamicInfo:
    """SONAME, DT_NEEDED, DT_RPATH/DT_RUNPATH and flags from PT_DYNAMIC. Raises FormatError."""
    dynamic = next((ph for ph in phdrs if ph.p_type == PT_DYNAMIC), None)
    if dynamic is None or dynamic.p_filesz == 0:
        return EMPTY_DYNAMIC
    if dynamic.p_filesz > MAX_DYNAMIC_BYTES:
        raise FormatError("ELF", dynamic.p_offset, f"PT_DYNAMIC of {dynamic.p_filesz} bytes is absurd")
    if dynamic.p_offset + dynamic.p_filesz > file_size:
        raise FormatError("ELF", dynamic.p_offset, "PT_DYNAMIC runs past the end of the file")
    table = _pread_exact(fd, dynamic.p_filesz, dynamic.p_offset, "PT_DYNAMIC")
    layout = header.endian + ("qQ" if header.is_64 else "iI")
    step = struct.calcsize(layout)
    strtab_vaddr = None
    string_tags: list[tuple[int, int]] = []
    flags = flags_1 = 0
    for base in range(0, len(table) - step + 1, step):
        tag, value = struct.unpack_from(layout, table, base)
        if tag == DT_NULL:
            break
        if tag == DT_STRTAB:
            strtab_vaddr = value
        elif tag in (DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH):
            if len(string_tags) >= MAX_NEEDED:
                raise FormatError("ELF", dynamic.p_offset + base, "too many DT_NEEDED entries")
            string_tags.append((tag, value))
        elif tag == DT_FLAGS:
            flags = value
        elif tag == DT_FLAGS_1:
            flags_1 = value
        elif tag == DT_SYMBOLIC:
            flags |= DF_SYMBOLIC
    if not string_tags:
        return DynamicInfo(None, (), (), (), flags, flags_1)
    if strtab_vaddr is None:
        raise FormatError("ELF", dynamic.p_offset, "PT_DYNAMIC names strings but has no DT_STRTAB")
    strtab_offset = vaddr_to_offset(phdrs, strtab_vaddr)
    if strtab_offset is None:
        raise FormatError("ELF", dynamic.p_offset, f"DT_STRTAB {strtab_vaddr:#x} is not in any PT_LOAD")
    soname = None
    needed: list[str] = []
    rpath: list[str] = []
    runpath: list[str] = []
    for tag, value in string_tags:
        text = _read_string(fd, strtab_offset + value, file_size)
        if tag == DT_NEEDED:
            needed.append(text)
        elif tag == DT_SONAME:
            soname = text
        elif tag == DT_RPATH:
            rpath.extend(part for part in text.split(":") if part)
        else:
            runpath.extend(part for part in text.split(":") if part)
    return DynamicInfo(soname, tuple(needed), tuple(rpath), tuple(runpath), flags, flags_1)
