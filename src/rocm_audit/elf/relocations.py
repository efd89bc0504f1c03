"""What the dynamic loader writes into given pointer slots of an x86-64 ELF: the value of each slot
after its RELA relocation, read from the section table's ``SHT_RELA`` sections and ``.dynsym``.

The HIP runtime learns where a translation unit's fat binary is from the pointer in its
``.hipFatBinSegment`` wrapper, not from the ``.hip_fatbin`` section: in a shared library that
pointer is 0 in the file and filled at load by an ``R_X86_64_RELATIVE`` relocation (the address
is its addend) or an ``R_X86_64_64`` against a symbol such as ``__hip_fatbin`` (the symbol's value
plus the addend), which hip-clang of ROCm 4.0 used for rccl's bundle in ``.data``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import compress, count

from rocm_audit.elf.read import ElfHeader
from rocm_audit.elf.sections import SHF_ALLOC, Section
from rocm_audit.elf.view import ElfView
from rocm_audit.errors import FormatError

SHT_RELA = 4
SHT_DYNSYM = 11
R_X86_64_64 = 1
R_X86_64_GLOB_DAT = 6
R_X86_64_RELATIVE = 8
RELA_ENTRY = 24
SYM_ENTRY = 24
MAX_RELA_BYTES = 256 << 20  # libLLVM's .rela.dyn is some 12 MB


def loaded_pointers(
    fd: int, header: ElfHeader, sections: Sequence[Section], file_size: int, slots: Iterable[int]
) -> dict[int, int]:
    """Slot address -> the address the loader stores there, for the slots a RELA relocation of a
    known kind fills (a symbol must be defined). Slots without one are not in the result.
    Raises FormatError for a relocation or symbol table outside the file."""
    wanted = set(slots)
    found: dict[int, int] = {}
    if not wanted or not header.is_64 or header.endian != "<":
        return found
    view = ElfView.of_sections(fd, header, tuple(sections), file_size)
    by_index = {section.index: section for section in sections}
    symbol_values: dict[tuple[int, int], int | None] = {}  # (symbol table, symbol index) -> value
    for section in sections:
        if section.sh_type != SHT_RELA or section.size == 0 or section.entsize != RELA_ENTRY:
            continue
        if section.size > MAX_RELA_BYTES:
            raise FormatError("ELF", section.offset, f"{section.name} of {section.size:,} bytes is absurd")
        offsets, infos, addends = view.relocation_columns(section)
        for row in compress(count(), map(wanted.__contains__, offsets)):  # no object per entry
            r_offset, r_info, addend = offsets[row], infos[row], addends[row]
            kind, symbol = r_info & 0xFFFFFFFF, r_info >> 32
            if kind == R_X86_64_RELATIVE:
                found[r_offset] = addend
            elif kind in (R_X86_64_64, R_X86_64_GLOB_DAT) and section.link in by_index:
                table = by_index[section.link]
                if (table.index, symbol) not in symbol_values:
                    symbol_values[table.index, symbol] = _defined_value(view, table, symbol)
                value = symbol_values[table.index, symbol]
                if value is not None:
                    found[r_offset] = value + addend
    return found


def _defined_value(view: ElfView, table: Section, index: int) -> int | None:
    """st_value of symbol ``index`` of ``table`` when it is defined there, else None."""
    if table.sh_type != SHT_DYNSYM or (index + 1) * SYM_ENTRY > table.size:
        return None
    _name, _info, _other, shndx, value = view.symbol_fields(table, index)
    return value if shndx != 0 else None


def file_place(sections: Sequence[Section], address: int) -> tuple[Section, int] | None:
    """The section the loader maps (SHF_ALLOC) with file bytes holding ``address``, and the
    address's file offset."""
    for section in sections:
        if not section.has_file_bytes or not section.flags & SHF_ALLOC or not section.addr:
            continue
        if section.addr <= address < section.addr + section.size:
            return section, section.offset + (address - section.addr)
    return None
