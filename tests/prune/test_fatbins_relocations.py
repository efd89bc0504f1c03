"""The layout check reads only the relocations and symbols that can point into ``.hip_fatbin``
(elf/tables.py ``relocations_touching``, ``defined_symbols_in``; prune/fatbins/layout.py
``prepare``): each is compared with a plain reference written here, which decodes every entry
with ``struct``, on the real tables of libraries built at test time: a HIP library by clang++-19
and lld (wrappers filled by R_X86_64_RELATIVE, an exported symbol at the first bundle's start
that an R_X86_64_64 and an R_X86_64_GLOB_DAT name) and a C library by gcc and GNU ld (RELATIVE,
R_X86_64_64, GLOB_DAT and JUMP_SLOT entries in .rela.dyn and .rela.plt).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from rocm_audit.elf import read as elfread
from rocm_audit.elf.relocations import R_X86_64_64, R_X86_64_GLOB_DAT, R_X86_64_RELATIVE, loaded_pointers
from rocm_audit.elf.sections import read_sections
from rocm_audit.elf.tables import defined_symbols_in, relocations_touching
from rocm_audit.elf.view import ElfView
from rocm_audit.prune.fatbins import layout
from rocm_audit.prune.fatbins.library import _locate
from support.hip_host import PRELUDE
from support.run import run_checked
from support.tools import require_tool

KERNEL = 'extern "C" __attribute__((global)) void k{i}(float* o) {{ o[{i}] = o[{i} + 1] * {i}.5f; }}\n'
# an exported symbol at the first bundle's start, named by data (R_X86_64_64) and code (GLOB_DAT)
AT_START = "SECTIONS { .hip_fatbin : { fatbin_begin = .; *(.hip_fatbin) } } INSERT AFTER .rodata;\n"
USER = """\
extern const char fatbin_begin[];
const void* fatbin_ref = fatbin_begin;
const void* fatbin_address(void) { return fatbin_begin; }
"""
C_LIBRARY = """\
#include <stdio.h>
#include <stdlib.h>
int counter = 3;
static int local_table[4] = {1, 2, 3, 4};
int* pointers[3] = {&counter, &local_table[1], &local_table[3]};  /* R_X86_64_64, RELATIVE */
static const char* names[] = {"one", "two", "three"};             /* RELATIVE */
void* functions[] = {(void*)puts, (void*)malloc};                  /* R_X86_64_64 on undefined */
const char* name(int i) { printf("%d\\n", counter); return names[i % 3]; }  /* JUMP_SLOT, GLOB_DAT */
"""


@pytest.fixture(scope="module")
def libraries(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("relocations")
    cxx, gcc = require_tool("clang++-19"), require_tool("gcc")
    require_tool("ld.lld-19")
    (out / "k.hip").write_text(PRELUDE + "".join(KERNEL.format(i=i) for i in range(40)))
    (out / "k2.hip").write_text(PRELUDE + KERNEL.format(i=99))
    (out / "user.c").write_text(USER)
    (out / "at_start.ld").write_text(AT_START)
    (out / "lib.c").write_text(C_LIBRARY)
    hip = ["-x", "hip", "-nogpulib", "-nogpuinc", "-fPIC", "-O1", "--offload-arch=gfx942", "--offload-arch=gfx90a"]
    for name in ("k", "k2"):
        run_checked([cxx, *hip, "-c", f"{name}.hip", "-o", f"{name}.o"], out)
    run_checked([require_tool("clang-19"), "-fPIC", "-O1", "-c", "user.c", "-o", "user.o"], out)
    run_checked([cxx, "-shared", "-fuse-ld=lld", "k.o", "k2.o", "user.o", "-Wl,-T,at_start.ld", "-o", "libhip.so"], out)
    run_checked([gcc, "-shared", "-fPIC", "-O1", "lib.c", "-o", "libc_made.so"], out)
    return {"hip": out / "libhip.so", "gcc": out / "libc_made.so"}


def _view(fd: int) -> ElfView:
    size = os.fstat(fd).st_size
    return ElfView(fd, file_size=size, header=elfread.parse_header(os.pread(fd, 64, 0)))


def _every_relocation(view: ElfView) -> list[tuple]:
    """Reference: (entry offset, r_offset, kind, symbol, addend, table index, symbol table index)
    of every SHT_RELA entry, decoded one by one."""
    rows = []
    by_index = {s.index: s for s in view.sections}
    for table in view.sections:
        if table.sh_type != 4 or not table.size:
            continue
        data = os.pread(view.fd, table.size, table.offset)
        symbols = table.link if table.link in by_index else None
        for row, (r_offset, r_info, addend) in enumerate(struct.iter_unpack("<QQq", data)):
            rows.append(
                (table.offset + 24 * row, r_offset, r_info & 0xFFFFFFFF, r_info >> 32, addend, table.index, symbols)
            )
    return rows


def _every_defined_symbol(view: ElfView, low: int, high: int) -> list[tuple]:
    """Reference: (table index, symbol index, value) of defined symbols valued in [low, high)."""
    found = []
    for table in view.sections:
        if table.sh_type not in (2, 11):  # SHT_SYMTAB, SHT_DYNSYM
            continue
        data = os.pread(view.fd, table.size, table.offset)
        for index, (_name, _info, _other, shndx, value, _size) in enumerate(struct.iter_unpack("<IBBHQQ", data)):
            if low <= value < high and 0 < shndx < 0xFF00:
                found.append((table.index, index, value))
    return found


def _touching(view: ElfView, addends: range, symbols: dict[int, set[int]], r_offsets: set[int]) -> list[tuple]:
    return [
        (
            r.entry_offset,
            r.r_offset,
            r.kind,
            r.symbol,
            r.addend,
            r.table.index,
            None if r.symbols is None else r.symbols.index,
        )
        for r in relocations_touching(view, addends=addends, symbols=symbols, r_offsets=r_offsets)
    ]


def _reference_touching(view: ElfView, addends: range, symbols: dict[int, set[int]], r_offsets: set[int]) -> list:
    return [
        row
        for row in _every_relocation(view)
        if row[4] in addends or row[1] in r_offsets or (row[6] is not None and row[3] in symbols.get(row[6], ()))
    ]


def _section(view: ElfView, name: str):
    return next(s for s in view.sections if s.name == name)


@pytest.mark.parametrize("which", ["hip", "gcc"])
def test_only_the_entries_asked_for_are_read_and_exactly_those(libraries, which):
    fd = os.open(libraries[which], os.O_RDONLY)
    try:
        view = _view(fd)
        every = _every_relocation(view)
        kinds = {row[2] for row in every}
        assert {R_X86_64_RELATIVE, R_X86_64_64, R_X86_64_GLOB_DAT} <= kinds  # the fixture has them
        data = _section(view, ".data")
        dynsym = _section(view, ".dynsym")
        named = {row[3] for row in every if row[3]}
        targets = sorted({row[1] for row in every})
        queries = [
            (range(0), {}, set()),  # nothing asked: nothing read
            (range(-(1 << 63), 1 << 63), {}, set()),  # every addend: every entry
            (range(data.addr, data.addr + data.size), {}, set()),
            (range(0), {dynsym.index: named}, set()),  # every symbol named by some entry
            (range(0), {dynsym.index: {max(named)}, 12345: {1}}, set()),
            (range(0), {}, {targets[0], targets[-1], targets[len(targets) // 2], 1, 1 << 40}),
            (range(data.addr, data.addr + 16), {dynsym.index: {min(named)}}, set(targets[::7])),
        ]
        for addends, symbols, r_offsets in queries:
            assert _touching(view, addends, symbols, r_offsets) == _reference_touching(
                view, addends, symbols, r_offsets
            )
        assert len(_touching(view, range(-(1 << 63), 1 << 63), {}, set())) == len(every)
        for section in view.sections:
            if section.flags & 2 and section.size:  # SHF_ALLOC
                low, high = section.addr, section.addr + section.size
                assert [(s.table.index, s.index, s.value) for s in defined_symbols_in(view, low, high)] == (
                    _every_defined_symbol(view, low, high)
                )
        # loaded_pointers: the value the loader stores in each slot some entry fills
        header = elfread.parse_header(os.pread(fd, 64, 0))
        sections = read_sections(fd, header, os.fstat(fd).st_size)
        slots = targets[::3] + [1, 1 << 40]
        expected = {}
        values = {row[1]: row for row in every}
        for slot in slots:
            row = values.get(slot)
            if row is None:
                continue
            if row[2] == R_X86_64_RELATIVE:
                expected[slot] = row[4]
            elif row[2] in (R_X86_64_64, R_X86_64_GLOB_DAT):
                symbol = [s for s in _every_defined_symbol(view, 0, 1 << 64) if s[:2] == (row[6], row[3])]
                if symbol:
                    expected[slot] = symbol[0][2] + row[4]
        assert loaded_pointers(fd, header, sections, os.fstat(fd).st_size, slots) == expected
        assert expected  # some slot is filled
    finally:
        os.close(fd)


def _reference_prepare(view: ElfView, starts: list[int], slots: list[int]) -> tuple[list, str]:
    """The layout check's pointer moves and reason, from every entry decoded one by one."""
    fatbin = _section(view, ".hip_fatbin")
    low, high = fatbin.addr, fatbin.addr + fatbin.size
    starts_v = {fatbin.addr + s - fatbin.offset for s in starts}
    symbols = _every_defined_symbol(view, low, high)
    offsets = {s.index: s.offset for s in view.sections}
    moves = [(offsets[t] + 24 * i + 8, value) for t, i, value in symbols]
    assert all(value in starts_v for _t, _i, value in symbols)
    reason = ""
    in_fatbin = {(t, i) for t, i, _v in symbols}
    for entry, r_offset, kind, symbol, addend, _table, symtab in _every_relocation(view):
        if kind == R_X86_64_RELATIVE and low <= addend < high:
            assert addend in starts_v
            moves.append((entry + 16, addend))
        elif symtab is not None and (symtab, symbol) in in_fatbin:
            assert kind in (R_X86_64_64, R_X86_64_GLOB_DAT) and not addend
        elif r_offset in slots and kind not in (R_X86_64_RELATIVE, R_X86_64_64, R_X86_64_GLOB_DAT):
            reason = f"wrapper slot {r_offset:#x} has relocation type {kind}"
    return moves, reason


def test_the_layout_check_moves_the_same_pointers_as_the_reference(libraries):
    fd = os.open(libraries["hip"], os.O_RDONLY)
    try:
        view = _view(fd)
        _fatbin, places, slots = _locate(fd)
        starts = [place.offset for place in places]
        assert len(starts) == 2
        prepared = layout.prepare(fd, starts, slots)
        moves, reason = _reference_prepare(view, starts, slots)
        assert prepared.reason == reason == ""
        # the slot values some linkers also write are read from the file, not from a relocation
        assert prepared.pointer_moves[: len(moves)] == moves
        kinds = {row[2] for row in _every_relocation(view) if row[1] in set(slots)}
        assert kinds == {R_X86_64_RELATIVE}
        # the exported symbol at the first bundle (in .dynsym and .symtab) moves, and the
        # R_X86_64_64 and GLOB_DAT that name it are accepted
        fatbin = _section(view, ".hip_fatbin")
        assert sum(1 for _o, value in moves if value == fatbin.addr) >= 3
        named = {
            row[2]
            for row in _every_relocation(view)
            if row[3]
            and (row[6], row[3]) in {(t, i) for t, i, _v in _every_defined_symbol(view, fatbin.addr, fatbin.addr + 1)}
        }
        assert {R_X86_64_64, R_X86_64_GLOB_DAT} <= named
    finally:
        os.close(fd)
