"""One view of one open ELF file: every structure a check reads, parsed once and kept on the view.

The fact pass (tree/facts.py) opens a file once and hands this view to every reader of that file
(verify-arch, llvm roles and linkage, post-build versions), so the header, program headers, dynamic
section, section table and symbol-version tables are read and parsed once per file, whichever checks
ask. Each is parsed on first use: constructing a view reads nothing, so a file that is not ELF
(Triton's JSON metadata) costs nothing but the descriptor.

What grows with the library is read on demand and never kept: symbol tables, string tables and
relocation tables (libLLVM's ``.dynstr`` is 10 MB, its ``.rela.dyn`` 12 MB). They are read either
whole under a hard limit (``read``) or in fixed windows (``windows``, ``find_all``), so no
allocation depends on a size field of the file beyond those limits. Every bound is checked before
a read; malformed input raises ``FormatError("ELF", offset, reason)``.

pyelftools is not used: it was used for one thing, the version node of one symbol in
llvm/roles.py, and this view answers that from the version tables it parses anyway (measured in
docs/dependencies.md). pyelftools remains the oracle in tests/test_versions_reader.py.
"""

from __future__ import annotations

import array
import itertools
import os
import struct
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from rocm_audit.elf import read as elfread
from rocm_audit.elf.sections import Section, read_sections
from rocm_audit.errors import FormatError

SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_NOTE, SHT_REL, SHT_DYNSYM = 1, 2, 3, 4, 7, 9, 11
SHT_INIT_ARRAY = 14
SHT_GNU_VERDEF, SHT_GNU_VERNEED, SHT_GNU_VERSYM = 0x6FFFFFFD, 0x6FFFFFFE, 0x6FFFFFFF
PT_NOTE = 4
VERSYM_HIDDEN = 0x8000
WINDOW_BYTES = 1 << 20  # windowed scans: a 117 MB libLLVM costs a few MB of reads at a time
MAX_TABLE_BYTES = 256 << 20  # a table read whole (.dynsym, .dynstr, relocations): above any real one
MAX_VERSION_BYTES = 16 << 20  # a version section or its string table; real ones are kilobytes
MAX_RECORDS = 1 << 16  # entries walked per version section; a chain that loops ends here
MAX_NOTE_BYTES = 1 << 20
MAX_NOTES = 4096
MAX_NAME_BYTES = 4096  # one symbol name read through a window
MAX_INIT_ARRAY_BYTES = 16 << 20
MAX_EH_FRAME_HDR_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class VersionDefinition:
    """One Elf_Verdef: its index (what .gnu.version entries name) and its names, own name first."""

    index: int
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class VersionNeed:
    """One Elf_Verneed: the DT_NEEDED file and (vna_other index, version name) of each version."""

    file: str
    versions: tuple[tuple[int, str], ...]


@dataclass(frozen=True, slots=True)
class Note:
    name: str
    n_type: int
    desc: bytes


def string_at(table: bytes, offset: int, where: int, encoding: str = "utf-8", errors: str = "surrogateescape") -> str:
    """The NUL-terminated string at ``offset`` of a string table already read. ``where``: the file
    offset reported when the string lies outside the table. Raises FormatError."""
    end = table.find(b"\0", offset)  # -1 when offset lies past the table
    if end < 0 or offset < 0:
        raise FormatError("ELF", where, f"string at offset {offset} lies outside its string table")
    return table[offset:end].decode(encoding, errors)


_View = TypeVar("_View", bound="ElfView")


class ElfView:
    """The lazily parsed structures of the ELF file open at ``fd`` (see the module docstring).

    The view does not own the descriptor: whoever opened it closes it, after the last use."""

    def __init__(self, fd: int, *, file_size: int | None = None, header: elfread.ElfHeader | None = None) -> None:
        self.fd = fd
        self._file_size = file_size
        self._header = header
        self._program_headers: list[elfread.ProgramHeader] | None = None
        self._dynamic: elfread.DynamicInfo | None = None
        self._sections: tuple[Section, ...] | None = None
        self._definitions: tuple[VersionDefinition, ...] | None = None
        self._needs: tuple[VersionNeed, ...] | None = None
        self._notes: tuple[Note, ...] | None = None

    @classmethod
    def of_sections(
        cls: type[_View], fd: int, header: elfread.ElfHeader, sections: tuple[Section, ...], file_size: int
    ) -> _View:
        """A view whose header and section table the caller already read."""
        view = cls(fd, file_size=file_size, header=header)
        view._sections = sections
        return view

    def pread(self, size: int, offset: int) -> bytes:
        """``os.pread`` of the view's file: every read of a section's bytes comes through here."""
        return os.pread(self.fd, size, offset)

    # -- header, program headers, dynamic section ------------------------------------------------

    @property
    def file_size(self) -> int:
        if self._file_size is None:
            self._file_size = os.fstat(self.fd).st_size
        return self._file_size

    @property
    def header(self) -> elfread.ElfHeader:
        if self._header is None:
            self._header = elfread.parse_header(os.pread(self.fd, 64, 0))
        return self._header

    @property
    def program_headers(self) -> list[elfread.ProgramHeader]:
        if self._program_headers is None:
            self._program_headers = elfread.read_program_headers(self.fd, self.header, b"", self.file_size)
        return self._program_headers

    @property
    def dynamic(self) -> elfread.DynamicInfo:
        """SONAME, DT_NEEDED, run paths and flags (elf/read.py). Raises FormatError."""
        if self._dynamic is None:
            self._dynamic = elfread.read_dynamic(self.fd, self.header, self.program_headers, self.file_size)
        return self._dynamic

    # -- sections ----------------------------------------------------------------------------------

    @property
    def sections(self) -> tuple[Section, ...]:
        """Every section header with its name (elf/sections.py). Raises FormatError."""
        if self._sections is None:
            self._sections = read_sections(self.fd, self.header, self.file_size)
        return self._sections

    def section_header_offset(self, index: int) -> int:
        return self.header.e_shoff + index * self.header.e_shentsize

    def by_name(self, name: str) -> Section | None:
        return next((s for s in self.sections if s.name == name), None)

    def by_type(self, sh_type: int) -> Section | None:
        return next((s for s in self.sections if s.sh_type == sh_type), None)

    def linked(self, section: Section) -> Section:
        """The section named by ``section``'s sh_link. Raises FormatError when there is none."""
        if not 0 < section.link < len(self.sections):
            raise FormatError(
                "ELF", self.section_header_offset(section.index), f"sh_link of {section.name} is not a section"
            )
        return self.sections[section.link]

    def read(self, section: Section, limit: int = MAX_TABLE_BYTES) -> bytes:
        """The whole contents of a section of at most ``limit`` bytes (b"" for SHT_NOBITS).
        Raises FormatError."""
        if not section.has_file_bytes:
            return b""
        if section.size > limit or section.offset + section.size > self.file_size:
            raise FormatError(
                "ELF", self.section_header_offset(section.index), f"{section.name} lies outside the file or is absurd"
            )
        data = self.pread(section.size, section.offset)
        if len(data) != section.size:
            raise FormatError("ELF", section.offset, f"{section.name} is truncated")
        return data

    def read_at(self, offset: int, size: int) -> bytes:
        """size bytes at a file offset, all inside the file. Raises FormatError."""
        if offset < 0 or size < 0 or offset + size > self.file_size:
            raise FormatError("ELF", offset, "read past the end of the file")
        data = self.pread(size, offset)
        if len(data) != size:
            raise FormatError("ELF", offset, "short read")
        return data

    def read_vaddr(self, vaddr: int, size: int) -> bytes:
        """size bytes of an allocated section at vaddr (shorter at the section's end, b"" outside)."""
        for section in self.sections:
            if section.has_file_bytes and section.addr <= vaddr < section.addr + section.size:
                size = min(size, section.addr + section.size - vaddr)
                return self.pread(size, section.offset + vaddr - section.addr)
        return b""

    @staticmethod
    def window_step(align: int = 1) -> int:
        return max(align, WINDOW_BYTES - WINDOW_BYTES % align)

    def windows(self, section: Section, overlap: int = 0, align: int = 1) -> Iterator[tuple[int, bytes]]:
        """(offset in section, bytes) windows, window_step(align) apart, overlap bytes longer."""
        step = self.window_step(align)
        position = 0
        while position < section.size:
            length = min(step + overlap, section.size - position)
            chunk = self.pread(length, section.offset + position)
            if len(chunk) != length:
                raise FormatError("ELF", section.offset + position, f"{section.name} is truncated")
            yield position, chunk
            position += step

    def find_all(self, section: Section, needle: bytes) -> Iterator[int]:
        """Every offset (inside the section) where needle starts, read window by window."""
        step = self.window_step()
        for base, chunk in self.windows(section, overlap=len(needle) - 1):
            start = 0
            # Each window reports the hits that start in its first `step` bytes; a hit starting
            # later lies whole in the next window, which reports it.
            while (hit := chunk.find(needle, start)) >= 0 and hit < step:
                yield base + hit
                start = hit + 1

    def contains(self, section: Section, needle: bytes) -> bool:
        return next(self.find_all(section, needle), None) is not None

    def string_in(self, strtab: Section, offset: int) -> str:
        """One name of a string table section, read alone (at most MAX_NAME_BYTES). Raises FormatError."""
        if not 0 <= offset < strtab.size:
            raise FormatError("ELF", strtab.offset, f"string offset {offset} outside {strtab.name}")
        raw = self.read_at(strtab.offset + offset, min(MAX_NAME_BYTES, strtab.size - offset))
        end = raw.find(b"\0")
        if end < 0:
            raise FormatError("ELF", strtab.offset + offset, "unterminated symbol name")
        return raw[:end].decode("ascii", "replace")

    # -- symbol tables -----------------------------------------------------------------------------

    def symbol_table(self, sh_type: int = SHT_DYNSYM) -> Section | None:
        """.dynsym (or .symtab), None when absent or empty; its sh_link checked."""
        table = self.by_type(sh_type)
        if table is None or table.size == 0:
            return None
        self.linked(table)
        return table

    def check_symbol_entries(self, table: Section) -> None:
        """Raise FormatError unless the table's entries are Elf64_Sym / Elf32_Sym."""
        entry_size = 24 if self.header.is_64 else 16
        if table.entsize != entry_size:
            raise FormatError(
                "ELF",
                self.section_header_offset(table.index),
                f"{table.name} entry size {table.entsize}, expected {entry_size}",
            )

    def _symbol_layout(self) -> struct.Struct:
        if self.header.is_64:
            return struct.Struct(self.header.endian + "IBBHQ8x")  # Elf64_Sym without st_size
        return struct.Struct(self.header.endian + "IIIBBH")  # Elf32_Sym: name, value, size, info, other, shndx

    def symbol_rows(self, table: Section) -> Iterator[tuple[int, Iterator[tuple[int, ...]]]]:
        """The symbols of a table, window by window: (index of the window's first symbol, rows of
        (st_name, st_info, st_other, st_shndx, st_value)). Rows come straight from ``iter_unpack``
        for 64-bit files (libLLVM has 150 000 dynamic symbols: no call per symbol). Raises FormatError."""
        self.check_symbol_entries(table)
        entry_size = table.entsize
        layout = self._symbol_layout()
        for base, chunk in self.windows(table, align=entry_size):
            rows = layout.iter_unpack(chunk[: len(chunk) - len(chunk) % entry_size])
            if not self.header.is_64:
                rows = ((name, info, other, shndx, value) for name, value, _size, info, other, shndx in rows)
            yield base // entry_size, rows

    def symbol_fields(self, table: Section, index: int) -> tuple[int, ...]:
        """(st_name, st_info, st_other, st_shndx, st_value) of one symbol, read alone. Raises FormatError."""
        self.check_symbol_entries(table)
        if (index + 1) * table.entsize > table.size:
            raise FormatError("ELF", table.offset, f"symbol {index} lies past the end of {table.name}")
        fields = self._symbol_layout().unpack(self.read_at(table.offset + index * table.entsize, table.entsize))
        if self.header.is_64:
            return tuple(fields)
        name, value, _size, info, other, shndx = fields
        return name, info, other, shndx, value

    def symbol_versions(self) -> Sequence[int]:
        """The raw .gnu.version entry of every dynamic symbol (empty without one): mask off
        VERSYM_HIDDEN before looking an entry up (done by the user: 150 000 entries in libLLVM)."""
        versym = self.by_type(SHT_GNU_VERSYM)
        if versym is None:
            return ()
        data = self.read(versym)
        entries = array.array("H")
        entries.frombytes(data[: len(data) // 2 * 2])
        if self.header.little_endian != (sys.byteorder == "little"):
            entries.byteswap()
        return entries

    def symbol_version_index(self, symbol_index: int) -> int | None:
        """The .gnu.version entry of one dynamic symbol (hidden bit cleared), None when unversioned."""
        versym = self.by_type(SHT_GNU_VERSYM)
        if versym is None:
            return None
        if (symbol_index + 1) * 2 > versym.size:
            raise FormatError("ELF", versym.offset, f"{versym.name} is shorter than .dynsym")
        raw = int.from_bytes(
            self.read_at(versym.offset + symbol_index * 2, 2), "little" if self.header.little_endian else "big"
        )
        return raw & ~VERSYM_HIDDEN

    # -- symbol versions ---------------------------------------------------------------------------

    @property
    def version_definitions(self) -> tuple[VersionDefinition, ...]:
        """Every Elf_Verdef of .gnu.version_d (parsed once). Raises FormatError."""
        if self._definitions is None:
            self._read_versions()
        assert self._definitions is not None
        return self._definitions

    @property
    def version_needs(self) -> tuple[VersionNeed, ...]:
        """Every Elf_Verneed of .gnu.version_r (parsed once). Raises FormatError."""
        if self._needs is None:
            self._read_versions()
        assert self._needs is not None
        return self._needs

    def defined_version_names(self) -> dict[int, str]:
        """Version index -> the node a definition names first (its own name)."""
        return {d.index: d.names[0] for d in self.version_definitions if d.names}

    def needed_version_names(self) -> dict[int, str]:
        """vna_other index -> the version a reference requires."""
        return {other: name for need in self.version_needs for other, name in need.versions}

    def _read_versions(self) -> None:
        definitions: list[VersionDefinition] = []
        needs: list[VersionNeed] = []
        for section in self.sections:
            if section.sh_type not in (SHT_GNU_VERNEED, SHT_GNU_VERDEF) or not section.has_file_bytes:
                continue
            data = self._version_bytes(section)
            if section.link >= len(self.sections):
                raise FormatError("ELF", section.offset, f"version section {section.index} links no string table")
            strtab = self.sections[section.link]
            strings = self._version_bytes(strtab) if strtab.has_file_bytes else b""
            if section.sh_type == SHT_GNU_VERNEED:
                needs.extend(_needs(data, strings, self.header.endian, section.offset))
            else:
                definitions.extend(_definitions(data, strings, self.header.endian, section.offset))
        self._definitions, self._needs = tuple(definitions), tuple(needs)

    def _version_bytes(self, section: Section) -> bytes:
        if section.size > MAX_VERSION_BYTES:
            raise FormatError(
                "ELF",
                section.offset,
                f"section {section.index} of {section.size} bytes is no version section or string table",
            )
        data = self.pread(section.size, section.offset)
        if len(data) != section.size:
            raise FormatError("ELF", section.offset, f"section {section.index} is truncated")
        return data

    # -- relocations -------------------------------------------------------------------------------

    def relocation_sections(self, *, with_rel: bool = False) -> list[Section]:
        """The non-empty SHT_RELA sections (.rela.dyn, .rela.plt), and SHT_REL ones when asked,
        each with its entry size checked. Raises FormatError."""
        found = []
        for section in self.sections:
            if section.size == 0 or section.sh_type not in ((SHT_RELA, SHT_REL) if with_rel else (SHT_RELA,)):
                continue
            expected = _relocation_entry_size(section.sh_type, self.header.is_64)
            if section.entsize != expected:
                raise FormatError(
                    "ELF",
                    self.section_header_offset(section.index),
                    f"{section.name} entry size {section.entsize}, expected {expected}",
                )
            found.append(section)
        return found

    def relocation_columns(self, section: Section) -> tuple[Sequence[int], Sequence[int], Sequence[int]]:
        """(r_offset, r_info, r_addend) of every entry of a 64-bit relocation section, as columns
        that are views of the one buffer read (libLLVM has 500 000 entries: no object per entry).
        SHT_REL entries have addend 0. 32-bit files: no columns. Raises FormatError."""
        if not self.header.is_64:
            return (), (), ()
        rela = section.sh_type == SHT_RELA
        step = 24 if rela else 16
        data = self.read(section)
        usable = len(data) - len(data) % step
        if self.header.endian == ("<" if sys.byteorder == "little" else ">"):
            words = memoryview(data)[:usable].cast("Q")
        else:
            swapped = array.array("Q")
            swapped.frombytes(data[:usable])
            swapped.byteswap()
            words = memoryview(swapped)
        width = step // 8
        offsets, infos = words[0::width], words[1::width]
        addends: Sequence[int] = words.cast("B").cast("q")[2::3] if rela else [0] * len(offsets)
        return offsets, infos, addends

    def relocates_with_info(self, r_info: int) -> bool | None:
        """Whether some RELA entry carries exactly this r_info (64-bit files; None otherwise):
        searched as bytes, window by window, without decoding the tables."""
        if not self.header.is_64:
            return None
        wanted = struct.pack(self.header.endian + "Q", r_info)
        for section in self.relocation_sections():
            for _base, chunk in self.windows(section, align=24):
                start = 0
                while (hit := chunk.find(wanted, start)) >= 0:
                    if hit % 24 == 8:  # windows start on entries; r_offset (8 bytes), then r_info
                        return True
                    start = hit + 1
        return False

    # -- code layout -------------------------------------------------------------------------------

    def init_array_pointers(self) -> list[tuple[int, int]]:
        """(slot address, pointer as stored in the file) of every .init_array entry of a 64-bit
        file (a shared library's are 0 in the file and filled by RELATIVE relocations)."""
        found: list[tuple[int, int]] = []
        if not self.header.is_64:
            return found
        for section in self.sections:
            if section.sh_type != SHT_INIT_ARRAY or section.size == 0:
                continue
            data = self.read(section, MAX_INIT_ARRAY_BYTES)
            pointers = struct.iter_unpack(self.header.endian + "Q", data[: len(data) // 8 * 8])
            found.extend((section.addr + index * 8, value) for index, (value,) in enumerate(pointers))
        return found

    def eh_frame_function_starts(self) -> array.array[int] | None:
        """Sorted function start addresses from .eh_frame_hdr's binary search table, or None when
        absent or in an encoding other than the one every toolchain emits (an array: a third of a
        list's memory for the 400 000 functions of an MLIR library). Not kept: its user keeps it."""
        section = self.by_name(".eh_frame_hdr")
        if section is None or section.size < 12:
            return None
        data = self.read(section, MAX_EH_FRAME_HDR_BYTES)
        version, frame_enc, count_enc, table_enc = data[0], data[1], data[2], data[3]
        # pcrel|sdata4 pointer, udata4 count, datarel|sdata4 table (LSB: Linux Standard Base, .eh_frame_hdr).
        if version != 1 or count_enc != 0x03 or table_enc != 0x3B or frame_enc not in (0x1B, 0x03, 0x0B):
            return None
        (count,) = struct.unpack_from(self.header.endian + "I", data, 8)
        if 12 + count * 8 > len(data):
            return None
        table = array.array("i", data[12 : 12 + count * 8])
        del data
        if self.header.little_endian != (sys.byteorder == "little"):
            table.byteswap()
        starts = array.array("Q", (section.addr + start for start in table[0::2]))
        # The search table is sorted (binary search is its purpose): sorting a list of 400 000 ints
        # again cost 15 MB. A file whose table is not sorted is sorted here.
        if all(a <= b for a, b in itertools.pairwise(starts)):
            return starts
        return array.array("Q", sorted(starts))

    # -- notes -------------------------------------------------------------------------------------

    @property
    def notes(self) -> tuple[Note, ...]:
        """The notes of every PT_NOTE segment (parsed once). Raises FormatError."""
        if self._notes is None:
            found: list[Note] = []
            for ph in self.program_headers:
                if ph.p_type != PT_NOTE or ph.p_filesz == 0:
                    continue
                if ph.p_filesz > MAX_NOTE_BYTES:
                    raise FormatError("ELF", ph.p_offset, f"PT_NOTE of {ph.p_filesz} bytes is absurd")
                found.extend(_notes(self.read_at(ph.p_offset, ph.p_filesz), self.header.endian, ph.p_offset))
                if len(found) > MAX_NOTES:
                    raise FormatError("ELF", ph.p_offset, "too many notes")
            self._notes = tuple(found)
        return self._notes


def open_view(path: str, *, follow_symlinks: bool = False) -> tuple[int, ElfView]:
    """Open path (through a final symlink only when asked) and a view of it; the caller closes
    the fd. Raises OSError."""
    flags = os.O_RDONLY | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW | os.O_NONBLOCK)
    fd = os.open(path, flags)
    return fd, ElfView(fd)


def _relocation_entry_size(sh_type: int, is_64: bool) -> int:
    if sh_type == SHT_RELA:
        return 24 if is_64 else 12
    return 16 if is_64 else 8


def _needs(data: bytes, strings: bytes, end: str, base: int) -> list[VersionNeed]:
    """Elf_Verneed {u16 version, u16 cnt, u32 file, u32 aux, u32 next} -> Elf_Vernaux {u32 hash,
    u16 flags, u16 other, u32 name, u32 next}: offsets relative to the record that holds them."""
    found: list[VersionNeed] = []
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
            _hash, _flags, other, name, step = struct.unpack_from(end + "IHHII", data, cursor)
            versions.append((other & ~VERSYM_HIDDEN, string_at(strings, name, base + cursor)))
            if not step:
                break
            cursor += step
        found.append(VersionNeed(string_at(strings, file_name, base + at), tuple(versions)))
        if not following:
            return found
        at += following
    raise FormatError("ELF", base, "version need chain does not end")


def _definitions(data: bytes, strings: bytes, end: str, base: int) -> list[VersionDefinition]:
    """Elf_Verdef {u16 version, u16 flags, u16 ndx, u16 cnt, u32 hash, u32 aux, u32 next} ->
    Elf_Verdaux {u32 name, u32 next}."""
    found: list[VersionDefinition] = []
    at = 0
    for _ in range(MAX_RECORDS):
        if at + 20 > len(data):
            raise FormatError("ELF", base + at, "version definition runs past its section")
        _version, _flags, index, count, _hash, aux, following = struct.unpack_from(end + "HHHHIII", data, at)
        names = []
        cursor = at + aux
        for _ in range(min(count, MAX_RECORDS)):
            if cursor + 8 > len(data):
                raise FormatError("ELF", base + cursor, "version definition auxiliary runs past its section")
            name, step = struct.unpack_from(end + "II", data, cursor)
            names.append(string_at(strings, name, base + cursor))
            if not step:
                break
            cursor += step
        found.append(VersionDefinition(index, tuple(names)))
        if not following:
            return found
        at += following
    raise FormatError("ELF", base, "version definition chain does not end")


def _notes(data: bytes, end: str, base: int) -> list[Note]:
    """Elf_Nhdr {u32 namesz, u32 descsz, u32 type}, name and desc each padded to 4 bytes."""
    found: list[Note] = []
    at = 0
    while at + 12 <= len(data):
        namesz, descsz, n_type = struct.unpack_from(end + "III", data, at)
        name_at = at + 12
        desc_at = name_at + (namesz + 3) // 4 * 4
        next_at = desc_at + (descsz + 3) // 4 * 4
        if desc_at + descsz > len(data):
            raise FormatError("ELF", base + at, "note runs past its segment")
        name = data[name_at : name_at + namesz].rstrip(b"\0").decode("utf-8", "surrogateescape")
        found.append(Note(name, n_type, data[desc_at : desc_at + descsz]))
        at = next_at
    return found
