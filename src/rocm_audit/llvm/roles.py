"""Which part a shared library plays in LLVM's ``cl::opt`` registry, from ELF facts alone.

formats.md 3.4. Roles:

- **exporter**: ``.dynsym`` defines a strong, default- or protected-visibility ``llvm::cl``
  symbol (``_ZN4llvm2cl*`` or ``_ZTVN4llvm2cl*``) and does not import ``addArgument``: another
  object can bind to its registry.
- **registrant**: imports ``llvm::cl::Option::addArgument()``, or the ``done()`` of a ``cl::opt``
  instantiation libLLVM exports (``opt<bool>``, ``opt<int>`` ..., whose ``done()`` calls
  ``addArgument`` inside libLLVM: what a small comgr compiled against LLVM 15 imports), and has
  initialisers, so its static ``cl::opt``s register into whichever LLVM it binds to (whatever
  else it defines).
- **private copy**: ``.rodata`` holds CommandLine.cpp's messages, nothing above does: a hidden
  registry.
- **none**: everything else.

elfsections supplies the section table and pyelftools the version sections; the bulk work (``.dynstr``,
``.dynsym``, ``.rela.dyn``, ``.rodata``) is streamed in fixed windows straight from the file, so a
117 MB libLLVM costs a few MB of reads and no allocation depends on a size field of the file.
Iterating libLLVM's 46 000 dynamic symbols through pyelftools takes a second; the windowed scan
below takes 20 ms.
"""

from __future__ import annotations

import enum
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection

from rocm_audit.elf import read as elfread
from rocm_audit.elf.sections import Section, read_sections
from rocm_audit.errors import FormatError

WINDOW_BYTES = 1 << 20

# formats.md 3.4 (2): a *strong* (GLOBAL or UNIQUE) definition of any _ZN4llvm2cl* or
# _ZTVN4llvm2cl* symbol (addArgument, TopLevelSubCommand, SubCommand::getTopLevel, the Option
# vtable ...). WEAK ones do not count: every user of cl::opt<T> with its own T emits vague-linkage
# copies of cl::apply, OptionValue<T> and parser<T> vtables (libclang-cpp-15 exports seven such
# and owns no registry).
ADD_ARGUMENT = "_ZN4llvm2cl6Option11addArgumentEv"  # llvm::cl::Option::addArgument()
# llvm::cl::opt<T, ...>::done(): registers the option (calls addArgument) where it is defined.
OPT_PREFIX, DONE_SUFFIX = "_ZN4llvm2cl3optI", "E4doneEv"


def _is_opt_done(name: str) -> bool:
    return name.startswith(OPT_PREFIX) and name.endswith(DONE_SUFFIX)


TOP_LEVEL_SUBCOMMAND = "_ZN4llvm2cl18TopLevelSubCommandE"  # data, LLVM <= 16
CL_PREFIXES = (b"_ZN4llvm2cl", b"_ZTVN4llvm2cl")
# formats.md 3.1: CommandLine.cpp literals; present only where the registry itself is compiled in.
REGISTRY_STRINGS = (
    b"inconsistency in registered CommandLine options",
    b"CommandLine Error: Option '",
)

SHT_PROGBITS, SHT_RELA, SHT_DYNSYM, SHT_INIT_ARRAY = 1, 4, 11, 14
SHN_UNDEF = 0
STB_GLOBAL, STB_GNU_UNIQUE = 1, 10  # STB_WEAK (2) is left out on purpose: see CL_PREFIXES
STV_DEFAULT, STV_PROTECTED = 0, 3
VERSYM_HIDDEN = 0x8000
# R_<arch>_GLOB_DAT: how a GOT slot is bound to a data symbol (formats.md 3.4 (4)).
GLOB_DAT_BY_MACHINE = {62: 6, 183: 1025, 21: 20}  # x86-64, AArch64, PPC64
MAX_VERSION_ENTRIES = 1 << 16


class Role(str, enum.Enum):
    EXPORTER = "exporter"
    REGISTRANT = "registrant"
    PRIVATE_COPY = "private-copy"
    NONE = "none"
    UNKNOWN = "unknown"  # the file could not be read or parsed (a finding says where)


@dataclass(frozen=True, slots=True)
class ClFacts:
    """The registry-related ELF facts of one shared library (formats.md 3.4)."""

    path: str
    role: Role
    soname: str | None
    # exporter: the node its llvm::cl symbols are defined under (e.g. "LLVM_15");
    # registrant: the node its addArgument import requires; None when unversioned.
    version_node: str | None
    exported_cl_symbols: int
    imports_add_argument: bool
    has_initialisers: bool
    embeds_registry: bool | None  # None: not looked at (the role was decided without it)
    symbolic: bool  # DT_FLAGS DF_SYMBOLIC / DT_SYMBOLIC: every reference binds inside the file
    # A GLOB_DAT slot for TopLevelSubCommand: the registry itself interposes (formats.md 3.2).
    interposable_registry: bool | None
    nodelete: bool

    @property
    def llvm_role(self) -> bool:
        """Exporters and registrants: the roles that clash when duplicated."""
        return self.role in (Role.EXPORTER, Role.REGISTRANT)


# pyelftools reports malformed input through these (its construct errors surface as ELFParseError).
_PARSE_ERRORS = (
    ELFError,
    struct.error,
    ValueError,
    IndexError,
    KeyError,
    UnicodeDecodeError,
    OverflowError,
)


class _ElfView:
    """A bounds-checked view of one open ELF file: sections by name, windowed reads.

    The section table comes from elfsections (two preads); pyelftools is constructed only when a
    version section must be decoded, which only exporters and registrants need."""

    def __init__(self, stream: IO[bytes], file_size: int, header: elfread.ElfHeader) -> None:
        self.stream = stream
        self.file_size = file_size
        self.header = header
        self.sections: tuple[Section, ...] = read_sections(stream.fileno(), header, file_size)
        self._elffile: Any = None

    @property
    def elffile(self) -> Any:
        if self._elffile is None:
            self._elffile = ELFFile(self.stream)
        return self._elffile

    def section_header_offset(self, index: int) -> int:
        return self.header.e_shoff + index * self.header.e_shentsize

    def by_name(self, name: str) -> Section | None:
        return next((s for s in self.sections if s.name == name), None)

    def windows(self, section: Section, overlap: int = 0, align: int = 1) -> Iterator[tuple[int, bytes]]:
        """(offset in section, bytes) windows, window_step(align) apart, overlap bytes longer."""
        step = self.window_step(align)
        position = 0
        while position < section.size:
            length = min(step + overlap, section.size - position)
            self.stream.seek(section.offset + position)
            chunk = self.stream.read(length)
            if len(chunk) != length:
                raise FormatError("ELF", section.offset + position, f"{section.name} is truncated")
            yield position, chunk
            position += step

    @staticmethod
    def window_step(align: int = 1) -> int:
        return max(align, WINDOW_BYTES - WINDOW_BYTES % align)

    def find_all(self, section: Section, needle: bytes) -> Iterator[int]:
        """Every offset (inside the section) where needle starts."""
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

    def read_at(self, offset: int, size: int) -> bytes:
        if offset < 0 or offset + size > self.file_size:
            raise FormatError("ELF", offset, "read past the end of the file")
        self.stream.seek(offset)
        return self.stream.read(size)


@dataclass(frozen=True, slots=True)
class _SymbolHit:
    index: int
    name: str
    defined: bool
    exported: bool  # strong, defined, DEFAULT or PROTECTED: another object can bind to it


def _cl_symbols(view: _ElfView) -> list[_SymbolHit]:
    """The llvm::cl symbols of .dynsym, found through their names in .dynstr."""
    dynsym = next((s for s in view.sections if s.sh_type == SHT_DYNSYM), None)
    if dynsym is None or dynsym.size == 0:
        return []
    if not 0 < dynsym.link < len(view.sections):
        raise FormatError("ELF", view.section_header_offset(dynsym.index), "sh_link of .dynsym is not a section")
    dynstr = view.sections[dynsym.link]
    names: dict[int, bytes] = {}
    for prefix in CL_PREFIXES:
        for offset in view.find_all(dynstr, prefix):
            names[offset] = prefix
    if not names:
        return []
    is_64 = view.header.is_64
    entry_size = 24 if is_64 else 16
    if dynsym.entsize != entry_size:
        raise FormatError(
            "ELF",
            view.section_header_offset(dynsym.index),
            f".dynsym entry size {dynsym.entsize}, expected {entry_size}",
        )
    layout = struct.Struct(view.header.endian + ("IBBHQQ" if is_64 else "IIIBBH"))
    hits: list[_SymbolHit] = []
    for base, chunk in view.windows(dynsym, align=entry_size):
        usable = len(chunk) - len(chunk) % entry_size
        for position, fields in enumerate(layout.iter_unpack(chunk[:usable])):
            if is_64:
                st_name, st_info, st_other, st_shndx = fields[0], fields[1], fields[2], fields[3]
            else:
                st_name, st_info, st_other, st_shndx = fields[0], fields[3], fields[4], fields[5]
            if st_name not in names:
                continue
            name = _string_at(view, dynstr, st_name)
            bind, visibility = st_info >> 4, st_other & 3
            defined = st_shndx != SHN_UNDEF
            strong = bind in (STB_GLOBAL, STB_GNU_UNIQUE)
            exported = defined and strong and visibility in (STV_DEFAULT, STV_PROTECTED)
            hits.append(_SymbolHit(base // entry_size + position, name, defined, exported))
    return hits


def _string_at(view: _ElfView, strtab: Section, offset: int) -> str:
    if not 0 <= offset < strtab.size:
        raise FormatError("ELF", strtab.offset, f"string offset {offset} outside {strtab.name}")
    limit = min(4096, strtab.size - offset)
    raw = view.read_at(strtab.offset + offset, limit)
    end = raw.find(b"\0")
    if end < 0:
        raise FormatError("ELF", strtab.offset + offset, "unterminated symbol name")
    return raw[:end].decode("ascii", "replace")


def _version_name(view: _ElfView, symbol_index: int, defined: bool) -> str | None:
    """The version node of one dynamic symbol, or None when unversioned."""
    versym = view.by_name(".gnu.version")
    if versym is None:
        return None
    if (symbol_index + 1) * 2 > versym.size:
        raise FormatError("ELF", versym.offset, ".gnu.version is shorter than .dynsym")
    (raw,) = struct.unpack(view.header.endian + "H", view.read_at(versym.offset + symbol_index * 2, 2))
    index = raw & ~VERSYM_HIDDEN
    if index <= 1:  # VER_NDX_LOCAL, VER_NDX_GLOBAL
        return None
    section_name = ".gnu.version_d" if defined else ".gnu.version_r"
    table = view.by_name(section_name)
    if table is None:
        return None
    # pyelftools walks sh_info entries; a hostile count would spin, so bound it by the size.
    if table.info > min(MAX_VERSION_ENTRIES, table.size // 16):
        raise FormatError("ELF", view.section_header_offset(table.index), f"{section_name} sh_info is absurd")
    section = view.elffile.get_section(table.index)
    if not isinstance(section, GNUVerDefSection if defined else GNUVerNeedSection):
        raise FormatError("ELF", view.section_header_offset(table.index), f"{section_name} has the wrong type")
    if isinstance(section, GNUVerDefSection):
        definition = section.get_version(index)
        if definition is None:
            return None
        names = [aux.name for aux in definition[1]]
        return str(names[0]) if names else None
    requirement = section.get_version(index)
    return None if requirement is None else str(requirement[1].name)


def _has_initialisers(view: _ElfView) -> bool:
    return any(s.sh_type == SHT_INIT_ARRAY and s.size > 0 for s in view.sections)


def _embeds_registry(view: _ElfView) -> bool:
    rodata = [s for s in view.sections if s.sh_type == SHT_PROGBITS and s.name.startswith((".rodata", ".lrodata"))]
    return all(any(view.contains(s, needle) for s in rodata) for needle in REGISTRY_STRINGS)


def _glob_dat_against(view: _ElfView, symbol_index: int) -> bool | None:
    """True when some RELA section binds a GOT slot to dynamic symbol symbol_index."""
    glob_dat = GLOB_DAT_BY_MACHINE.get(view.header.e_machine)
    if glob_dat is None or not view.header.is_64:
        return None
    wanted = struct.pack(view.header.endian + "Q", (symbol_index << 32) | glob_dat)
    for section in view.sections:
        if section.sh_type != SHT_RELA or section.size == 0:
            continue
        if section.entsize != 24:
            raise FormatError(
                "ELF",
                view.section_header_offset(section.index),
                f"{section.name} entry size {section.entsize}, expected 24",
            )
        for _base, chunk in view.windows(section, align=24):
            start = 0
            while (hit := chunk.find(wanted, start)) >= 0:
                if hit % 24 == 8:  # windows start on entries; r_offset (8 bytes), then r_info
                    return True
                start = hit + 1
    return False


def classify(path: str, dynamic: elfread.DynamicInfo, fd: int | None = None) -> ClFacts:
    """Role and registry facts of the shared library at path (read from fd when given: the caller
    keeps it open and closes it). Raises FormatError or OSError."""
    owned = fd is None
    if fd is None:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb", closefd=owned) as stream:
        stream.seek(0)
        file_size = os.fstat(stream.fileno()).st_size
        header = elfread.parse_header(stream.read(64))
        try:
            view = _ElfView(stream, file_size, header)
            return _classify_view(path, view, dynamic)
        except _PARSE_ERRORS as exc:
            raise FormatError("ELF", stream.tell(), f"unreadable section data: {exc}") from None


def _classify_view(path: str, view: _ElfView, dynamic: elfread.DynamicInfo) -> ClFacts:
    symbols = _cl_symbols(view)
    exported = [s for s in symbols if s.exported]
    add_argument_import = next((s for s in symbols if s.name == ADD_ARGUMENT and not s.defined), None)
    if add_argument_import is None:
        add_argument_import = next((s for s in symbols if not s.defined and _is_opt_done(s.name)), None)
    has_initialisers = _has_initialisers(view)
    version_node: str | None = None
    interposable: bool | None = None
    embeds: bool | None = None
    if exported and add_argument_import is None:
        role = Role.EXPORTER
        anchor = next((s for s in exported if s.name == ADD_ARGUMENT), exported[0])
        version_node = _version_name(view, anchor.index, defined=True)
        top_level = next((s for s in exported if s.name == TOP_LEVEL_SUBCOMMAND), None)
        if dynamic.symbolic:
            interposable = False  # -Bsymbolic binds the GOT slot inside the file
        elif top_level is None:
            interposable = False
        else:
            interposable = _glob_dat_against(view, top_level.index)
    elif add_argument_import is not None and has_initialisers:
        role = Role.REGISTRANT
        version_node = _version_name(view, add_argument_import.index, defined=False)
    else:
        embeds = _embeds_registry(view)
        role = Role.PRIVATE_COPY if embeds else Role.NONE
    return ClFacts(
        path=path,
        role=role,
        soname=dynamic.soname,
        version_node=version_node,
        exported_cl_symbols=len(exported),
        imports_add_argument=add_argument_import is not None,
        has_initialisers=has_initialisers,
        embeds_registry=embeds,
        symbolic=dynamic.symbolic,
        interposable_registry=interposable,
        nodelete=bool(dynamic.flags_1 & elfread.DF_1_NODELETE),
    )
