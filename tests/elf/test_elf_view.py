"""The one ELF view (elf/view.py) against pyelftools on the Debian libraries of this machine:
sections, dynamic symbols, symbol versions, relocations, .init_array, notes; each structure parsed
once per view; malformed tables are FormatErrors."""

from __future__ import annotations

import glob
import os
import shutil
import struct

import pytest

from rocm_audit.elf import view as elfview
from rocm_audit.elf.view import ElfView, open_view
from rocm_audit.errors import FormatError


def _libraries(limit: int) -> list[str]:
    found = []
    for path in sorted(glob.glob("/usr/lib/x86_64-linux-gnu/*.so*")):
        if os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path) < 32 << 20:
            with open(path, "rb") as handle:
                if handle.read(4) == b"\x7fELF":
                    found.append(path)
    step = max(1, len(found) // limit)  # spread over the alphabet: different toolchains and features
    return found[::step][:limit]


def _compare(path: str) -> int:
    """Assert the view and pyelftools agree on one library; return the relocations compared."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection
    from elftools.elf.relocation import RelocationSection

    fd, view = open_view(path)
    compared = 0
    with open(path, "rb") as handle:
        try:
            elf = ELFFile(handle)
            theirs = list(elf.iter_sections())
            for ours, section in zip(view.sections, theirs, strict=True):
                assert (ours.name, ours.offset, ours.size, ours.link) == (
                    section.name,
                    section.header.sh_offset,
                    section.header.sh_size,
                    section.header.sh_link,
                ), path
                if isinstance(section, GNUVerDefSection):
                    expected = {d["vd_ndx"]: next(iter(a)).name for d, a in section.iter_versions()}
                    assert view.defined_version_names() == expected, path
                elif isinstance(section, GNUVerNeedSection):
                    expected = {x["vna_other"] & 0x7FFF: x.name for _n, aux in section.iter_versions() for x in aux}
                    assert view.needed_version_names() == expected, path
                elif isinstance(section, RelocationSection) and section.is_RELA() and section.header.sh_size:
                    offsets, infos, addends = view.relocation_columns(ours)
                    rows = [(r["r_offset"], r["r_info"], r["r_addend"]) for r in section.iter_relocations()]
                    assert list(zip(offsets, infos, addends, strict=True)) == rows, (path, ours.name)
                    compared += len(rows)
            dynsym = elf.get_section_by_name(".dynsym")
            table = view.symbol_table()
            if dynsym is not None and table is not None:
                ours_symbols = [(row[0], row[4]) for _first, rows in view.symbol_rows(table) for row in rows]
                assert view.symbol_fields(table, len(ours_symbols) - 1)[4] == ours_symbols[-1][1]
                assert ours_symbols == [(s["st_name"], s["st_value"]) for s in dynsym.iter_symbols()], path
                versym = elf.get_section_by_name(".gnu.version")
                if versym is not None:
                    expected_versions = [versym.get_symbol(i)["ndx"] for i in range(versym.num_symbols())]
                    ours_versions = [entry & 0x7FFF for entry in view.symbol_versions()]
                    assert ours_versions == [v & 0x7FFF if isinstance(v, int) else _NDX[v] for v in expected_versions]
            notes = [
                (note["n_name"], note["n_type"] if isinstance(note["n_type"], int) else None, note["n_descdata"])
                for segment in elf.iter_segments()
                if segment["p_type"] == "PT_NOTE"
                for note in segment.iter_notes()
            ]
            assert [(n.name, n.desc) for n in view.notes] == [(name, desc) for name, _type, desc in notes], path
        finally:
            os.close(fd)
    return compared


_NDX = {"VER_NDX_LOCAL": 0, "VER_NDX_GLOBAL": 1}


def test_the_view_agrees_with_pyelftools_on_real_libraries():
    libraries = _libraries(24)
    assert len(libraries) >= 20, "too few system libraries to compare"
    relocations = sum(_compare(path) for path in libraries)
    assert relocations > 1000


def test_each_structure_is_parsed_once(monkeypatch):
    path = _libraries(1)[0]
    fd, view = open_view(path)
    try:
        first = (view.sections, view.dynamic, view.version_definitions, view.version_needs, view.notes)
        reads = []
        monkeypatch.setattr(elfview.os, "pread", lambda *args: reads.append(args) or b"")
        again = (view.sections, view.dynamic, view.version_definitions, view.version_needs, view.notes)
        assert all(a is b for a, b in zip(first, again, strict=True)) and reads == []
    finally:
        os.close(fd)


def test_a_view_reads_nothing_until_asked(tmp_path):
    not_elf = tmp_path / "metadata.json"
    not_elf.write_text("{}")
    fd, view = open_view(str(not_elf))
    try:
        with pytest.raises(FormatError, match="no ELF magic"):
            _ = view.sections
    finally:
        os.close(fd)


def _shdr_offset(path: str, name: str) -> int:
    fd, view = open_view(path)
    try:
        section = next(s for s in view.sections if s.name == name)
        return view.section_header_offset(section.index)
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("field_at", "value", "reason"),
    [(0x38, 16, "entry size 16, expected 24"), (0x20, 1 << 40, "runs past the end of the file")],
)
def test_malformed_relocation_tables_are_format_errors(tmp_path, field_at, value, reason):
    source = next(p for p in _libraries(40) if _has(p, ".rela.dyn"))
    broken = tmp_path / "libbroken.so"
    shutil.copyfile(source, broken)
    header_at = _shdr_offset(str(broken), ".rela.dyn")
    data = bytearray(broken.read_bytes())
    struct.pack_into("<Q", data, header_at + field_at, value)  # Elf64_Shdr sh_entsize / sh_size
    broken.write_bytes(bytes(data))
    fd = os.open(broken, os.O_RDONLY)
    try:
        with pytest.raises(FormatError) as raised:
            ElfView(fd).relocation_sections()
        assert raised.value.offset == header_at and reason in raised.value.reason
    finally:
        os.close(fd)


def _has(path: str, name: str) -> bool:
    fd, view = open_view(path)
    try:
        return view.by_name(name) is not None
    except FormatError:
        return False
    finally:
        os.close(fd)
