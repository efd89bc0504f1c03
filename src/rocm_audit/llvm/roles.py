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

The file's view (elf/view.py) supplies the section table and the version tables; the bulk work
(``.dynstr``, ``.dynsym``, ``.rela.dyn``, ``.rodata``) is streamed in fixed windows by it, so a
117 MB libLLVM costs a few MB of reads and no allocation depends on a size field of the file.
Iterating libLLVM's 46 000 dynamic symbols through pyelftools takes a second; the windowed scan
below takes 20 ms.
"""

from __future__ import annotations

import enum
import os
import struct
from dataclasses import dataclass

from rocm_audit.elf import read as elfread
from rocm_audit.elf.view import ElfView, open_view
from rocm_audit.errors import FormatError

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

SHT_PROGBITS, SHT_INIT_ARRAY = 1, 14
SHN_UNDEF = 0
STB_GLOBAL, STB_GNU_UNIQUE = 1, 10  # STB_WEAK (2) is left out on purpose: see CL_PREFIXES
STV_DEFAULT, STV_PROTECTED = 0, 3
# R_<arch>_GLOB_DAT: how a GOT slot is bound to a data symbol (formats.md 3.4 (4)).
GLOB_DAT_BY_MACHINE = {62: 6, 183: 1025, 21: 20}  # x86-64, AArch64, PPC64


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


# What a malformed table can raise inside the readers below besides FormatError.
_PARSE_ERRORS = (struct.error, ValueError, IndexError, UnicodeDecodeError, OverflowError)


@dataclass(frozen=True, slots=True)
class _SymbolHit:
    index: int
    name: str
    defined: bool
    exported: bool  # strong, defined, DEFAULT or PROTECTED: another object can bind to it


def _cl_symbols(view: ElfView) -> list[_SymbolHit]:
    """The llvm::cl symbols of .dynsym, found through their names in .dynstr."""
    dynsym = view.symbol_table()
    if dynsym is None:
        return []
    dynstr = view.linked(dynsym)
    names: dict[int, bytes] = {}
    for prefix in CL_PREFIXES:
        for offset in view.find_all(dynstr, prefix):
            names[offset] = prefix
    if not names:
        return []
    hits: list[_SymbolHit] = []
    for first, rows in view.symbol_rows(dynsym):
        for index, (st_name, st_info, st_other, st_shndx, _value) in enumerate(rows, first):
            if st_name not in names:
                continue
            name = view.string_in(dynstr, st_name)
            bind, visibility = st_info >> 4, st_other & 3
            defined = st_shndx != SHN_UNDEF
            strong = bind in (STB_GLOBAL, STB_GNU_UNIQUE)
            exported = defined and strong and visibility in (STV_DEFAULT, STV_PROTECTED)
            hits.append(_SymbolHit(index, name, defined, exported))
    return hits


def _version_name(view: ElfView, symbol_index: int, defined: bool) -> str | None:
    """The version node of one dynamic symbol, or None when unversioned."""
    index = view.symbol_version_index(symbol_index)
    if index is None or index <= 1:  # VER_NDX_LOCAL, VER_NDX_GLOBAL
        return None
    names = view.defined_version_names() if defined else view.needed_version_names()
    return names.get(index)


def _has_initialisers(view: ElfView) -> bool:
    return any(s.sh_type == SHT_INIT_ARRAY and s.size > 0 for s in view.sections)


def _embeds_registry(view: ElfView) -> bool:
    rodata = [s for s in view.sections if s.sh_type == SHT_PROGBITS and s.name.startswith((".rodata", ".lrodata"))]
    return all(any(view.contains(s, needle) for s in rodata) for needle in REGISTRY_STRINGS)


def _glob_dat_against(view: ElfView, symbol_index: int) -> bool | None:
    """True when some RELA section binds a GOT slot to dynamic symbol symbol_index."""
    glob_dat = GLOB_DAT_BY_MACHINE.get(view.header.e_machine)
    if glob_dat is None:
        return None
    return view.relocates_with_info((symbol_index << 32) | glob_dat)


def classify(path: str, dynamic: elfread.DynamicInfo, view: ElfView | None = None) -> ClFacts:
    """Role and registry facts of the shared library at path (read through its view when given:
    the caller keeps the file open and closes it). Raises FormatError or OSError."""
    if view is not None:
        return _classify_checked(path, view, dynamic)
    fd, view = open_view(path)
    try:
        return _classify_checked(path, view, dynamic)
    finally:
        os.close(fd)


def _classify_checked(path: str, view: ElfView, dynamic: elfread.DynamicInfo) -> ClFacts:
    try:
        return _classify_view(path, view, dynamic)
    except _PARSE_ERRORS as exc:
        raise FormatError("ELF", 0, f"unreadable section data: {exc}") from None


def _classify_view(path: str, view: ElfView, dynamic: elfread.DynamicInfo) -> ClFacts:
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
