"""Every field of an x86-64 ELF file's header tables, read whole so they can be written back
changed: the ELF header's table fields, program headers with flags/paddr/align, section headers
with alignment. Used by prune --fatbins (prune/fatbins/layout.py) to move file offsets without
moving any virtual address; 64-bit little-endian files only (the caller checks).

Also the places of the values a layout change must move: where each RELA entry's addend and each
symbol's value lie in the file.
"""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Iterator, Mapping, Set
from dataclasses import dataclass, replace
from itertools import compress, count, repeat
from operator import rshift

from rocm_audit.elf.read import ElfHeader
from rocm_audit.elf.sections import Section
from rocm_audit.elf.view import ElfView
from rocm_audit.errors import FormatError

PHDR = struct.Struct("<IIQQQQQQ")
SHDR = struct.Struct("<IIQQQQIIQQ")
PT_LOAD, PT_DYNAMIC, PT_PHDR = 1, 2, 6
SHN_UNDEF, SHN_LORESERVE = 0, 0xFF00
SHT_SYMTAB, SHT_DYNSYM, SHT_RELA = 2, 11, 4
E_PHOFF, E_SHOFF, E_PHNUM = 0x20, 0x28, 0x38
MAX_HEADERS = 1 << 16
NATIVE = "<" if sys.byteorder == "little" else ">"
SYM_SIZE = 24
SYM_SHNDX_VALUE = struct.Struct(NATIVE + "6xHQ")  # st_shndx and st_value of an Elf64_Sym


@dataclass(frozen=True, slots=True)
class Phdr:
    p_type: int
    p_flags: int
    p_offset: int
    p_vaddr: int
    p_paddr: int
    p_filesz: int
    p_memsz: int
    p_align: int

    def pack(self) -> bytes:
        return PHDR.pack(
            self.p_type,
            self.p_flags,
            self.p_offset,
            self.p_vaddr,
            self.p_paddr,
            self.p_filesz,
            self.p_memsz,
            self.p_align,
        )

    def moved(self, **changes: int) -> Phdr:
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class Shdr:
    sh_name: int
    sh_type: int
    sh_flags: int
    sh_addr: int
    sh_offset: int
    sh_size: int
    sh_link: int
    sh_info: int
    sh_addralign: int
    sh_entsize: int

    def pack(self) -> bytes:
        return SHDR.pack(
            self.sh_name,
            self.sh_type,
            self.sh_flags,
            self.sh_addr,
            self.sh_offset,
            self.sh_size,
            self.sh_link,
            self.sh_info,
            self.sh_addralign,
            self.sh_entsize,
        )

    def moved(self, **changes: int) -> Shdr:
        return replace(self, **changes)


def _pread(fd: int, size: int, offset: int, what: str) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise FormatError("ELF", offset, f"{what} runs past the end of the file")
    return data


def read_phdrs(fd: int, header: ElfHeader) -> list[Phdr]:
    """Every program header, every field. Raises FormatError."""
    if header.e_phentsize != PHDR.size or header.e_phnum > MAX_HEADERS:
        raise FormatError("ELF", E_PHOFF, "not a 64-bit program header table")
    table = _pread(fd, header.e_phnum * PHDR.size, header.e_phoff, "the program header table")
    return [Phdr(*fields) for fields in PHDR.iter_unpack(table)]


def read_shdrs(fd: int, header: ElfHeader) -> list[Shdr]:
    """Every section header, every field. Raises FormatError."""
    if header.e_shentsize != SHDR.size or header.e_shnum > MAX_HEADERS:
        raise FormatError("ELF", E_SHOFF, "not a 64-bit section header table")
    table = _pread(fd, header.e_shnum * SHDR.size, header.e_shoff, "the section header table")
    return [Shdr(*fields) for fields in SHDR.iter_unpack(table)]


def header_with(head: bytes, *, e_phoff: int, e_phnum: int, e_shoff: int) -> bytes:
    """The 64-byte ELF header ``head`` with its table fields replaced."""
    data = bytearray(head[:64])
    struct.pack_into("<Q", data, E_PHOFF, e_phoff)
    struct.pack_into("<Q", data, E_SHOFF, e_shoff)
    struct.pack_into("<H", data, E_PHNUM, e_phnum)
    return bytes(data)


@dataclass(frozen=True, slots=True)
class Reloc:
    entry_offset: int  # file offset of the Elf64_Rela
    r_offset: int
    kind: int
    symbol: int
    addend: int
    table: Section  # the relocation section
    symbols: Section | None  # the symbol table it names (sh_link)

    @property
    def addend_offset(self) -> int:
        return self.entry_offset + 16


def relocations_touching(
    view: ElfView, *, addends: range, symbols: Mapping[int, Set[int]], r_offsets: Set[int]
) -> Iterator[Reloc]:
    """The SHT_RELA entries, in file order, that may point into a range or fill a given slot: those
    whose addend lies in ``addends``, whose symbol is one of ``symbols[i]`` (i: the index of the
    symbol table the relocation section names), or whose r_offset is in ``r_offsets``. Every other
    entry is skipped without an object made for it: each column is tested by ``map`` over a
    memoryview of the one buffer read (the jax plugin has 394 000 entries). Raises FormatError."""
    by_index = {section.index: section for section in view.sections}
    for table in view.relocation_sections():
        offsets, infos, addend_column = view.relocation_columns(table)
        table_symbols = by_index.get(table.link)
        rows = set(compress(count(), map(addends.__contains__, addend_column)))
        if r_offsets:
            rows.update(compress(count(), map(r_offsets.__contains__, offsets)))
        wanted = symbols.get(table.link) if table_symbols is not None else None
        if wanted:
            rows.update(compress(count(), map(wanted.__contains__, map(rshift, infos, repeat(32)))))
        for row in sorted(rows):
            r_info = infos[row]
            yield Reloc(
                table.offset + row * 24,
                offsets[row],
                r_info & 0xFFFFFFFF,
                r_info >> 32,
                addend_column[row],
                table,
                table_symbols,
            )


@dataclass(frozen=True, slots=True)
class SymbolRef:
    table: Section
    index: int
    value: int

    @property
    def value_offset(self) -> int:
        """File offset of st_value."""
        return self.table.offset + self.index * 24 + 8


def defined_symbols_in(view: ElfView, low: int, high: int) -> list[SymbolRef]:
    """Symbols of .dynsym and .symtab defined in a section (not undefined, not absolute or common)
    whose value lies in [low, high), in table and index order. Only the symbols whose value is in
    range are decoded (64-bit files: the values are a column of a memoryview). Raises FormatError."""
    found = []
    span = range(low, high)
    for section in view.sections:
        if section.sh_type not in (SHT_SYMTAB, SHT_DYNSYM) or not section.has_file_bytes:
            continue
        if not view.header.is_64 or view.header.endian != NATIVE:
            for base, rows in view.symbol_rows(section):
                for offset, (_name, _info, _other, shndx, value) in enumerate(rows):
                    if low <= value < high and SHN_UNDEF < shndx < SHN_LORESERVE:
                        found.append(SymbolRef(section, base + offset, value))
            continue
        view.check_symbol_entries(section)
        for base, chunk in view.windows(section, align=SYM_SIZE):
            words = memoryview(chunk)[: len(chunk) - len(chunk) % SYM_SIZE].cast("Q")
            for row in compress(count(), map(span.__contains__, words[1::3])):
                shndx, value = SYM_SHNDX_VALUE.unpack_from(chunk, row * SYM_SIZE)
                if SHN_UNDEF < shndx < SHN_LORESERVE:
                    found.append(SymbolRef(section, base // SYM_SIZE + row, value))
    return found
