"""How one shared library links to LLVM's registries: what it defines, what it binds, what it runs.

formats.md 3 and 6. roles.py says which part a library plays; this module keeps the facts that
decide what really happens when it is loaded next to another LLVM:

- **exports**: every symbol of LLVM's, clang's or MLIR's namespaces that another object can bind to
  (defined, not local, default or protected visibility), with its version node;
- **binds**: every such symbol a dynamic relocation asks the loader for, with the relocation kind
  (GLOB_DAT, JUMP_SLOT, ABS64) and the version the reference requires; a bound symbol the library
  also defines is one it can be made to share with an earlier library (interposition);
- **symbolic**: DT_SYMBOLIC / DF_SYMBOLIC: the library looks itself up first;
- **registers at load**: whether an ``.init_array`` function reaches ``cl::Option::addArgument``
  (directly, through calls into the library's own functions, through its PLT or its GOT). Importing
  addArgument is not enough (formats.md 6: MLIR pass plugins call it only when a pass is built).

The call walk (callwalk.py) is narrow on purpose (x86-64 only, no disassembler dependency): function extents come
from ``.eh_frame_hdr``'s sorted table (every function compiled with unwind tables, the default on
x86-64), and inside a function the only instructions looked at are ``call rel32`` (E8), ``jmp rel32``
(E9), ``call *disp32(%rip)`` (FF 15) and ``jmp *disp32(%rip)`` (FF 25). A byte pattern that is not
really an instruction would have to point exactly at a function start, a PLT stub or the GOT slot
of addArgument to count; the walk is bounded in functions and bytes. Measured: 0.1 to 0.6 s for a
100 MB libLLVM, most of it reading the relocation tables. Other machines: undecided (None).
"""

from __future__ import annotations

import array
import hashlib
import os
import re
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from rocm_audit.elf import read as elfread
from rocm_audit.elf.sections import Section
from rocm_audit.elf.view import VERSYM_HIDDEN, ElfView, open_view, string_at
from rocm_audit.errors import FormatError
from rocm_audit.llvm.callwalk import CodeMap, init_functions, initialised_slots, plt_stubs, reaches

# Entry points of LLVM's registries (formats.md 3.1, 3.4, 6).
ADD_ARGUMENT = "_ZN4llvm2cl6Option11addArgumentEv"  # llvm::cl::Option::addArgument()
TOP_LEVEL_SUBCOMMAND = "_ZN4llvm2cl18TopLevelSubCommandE"  # data, LLVM <= 16
GET_TOP_LEVEL = "_ZN4llvm2cl10SubCommand11getTopLevelEv"  # llvm::cl::SubCommand::getTopLevel(), LLVM >= 16
MACHINE_SCHED_REGISTRY = "_ZN4llvm20MachineSchedRegistry8RegistryE"  # MachinePassRegistry head
REGISTRY_HEAD = re.compile(r"_ZN4llvm8RegistryI.*E4(Head|Tail)E$")  # llvm::Registry<T>::Head / Tail
ENTRY_POINTS = (ADD_ARGUMENT, TOP_LEVEL_SUBCOMMAND, GET_TOP_LEVEL, MACHINE_SCHED_REGISTRY)
# llvm::cl::opt<T, ...>::done() calls addArgument where it is defined: a library that imports the
# done() of an instantiation libLLVM exports registers into libLLVM's registry (roles.py).
OPT_PREFIX, DONE_SUFFIX = "_ZN4llvm2cl3optI", "E4doneEv"


def registers_through(name: str) -> bool:
    return name == ADD_ARGUMENT or (name.startswith(OPT_PREFIX) and name.endswith(DONE_SUFFIX))


def registry_name(name: str) -> bool:
    """An entry point of a registry, or a registry's head: looked up by name whatever its type."""
    return name in ENTRY_POINTS or registers_through(name) or REGISTRY_HEAD.match(name) is not None


# The namespaces whose symbols two LLVMs can share: llvm::, clang::, mlir:: (functions, const
# methods, vtables, data). Type-info objects and names (_ZTI, _ZTS) are left out: sharing them
# across copies is what the C++ ABI intends.
WATCHED_PREFIXES = (
    b"_ZN4llvm",
    b"_ZNK4llvm",
    b"_ZTVN4llvm",
    b"_ZN5clang",
    b"_ZNK5clang",
    b"_ZTVN5clang",
    b"_ZN4mlir",
    b"_ZNK4mlir",
    b"_ZTVN4mlir",
)

SHT_RELA, SHT_INIT_ARRAY = 4, 14
STB_LOCAL, STB_WEAK, STB_GNU_UNIQUE = 0, 2, 10
STT_OBJECT, STT_FUNC, STT_TLS = 1, 2, 6
STV_DEFAULT, STV_PROTECTED = 0, 3
EM_X86_64, EM_AARCH64 = 62, 183

# Relocation kinds that ask the loader to look a symbol up, by machine.
RELOC_KINDS = {
    EM_X86_64: {1: "ABS64", 6: "GLOB_DAT", 7: "JUMP_SLOT"},
    EM_AARCH64: {257: "ABS64", 1025: "GLOB_DAT", 1026: "JUMP_SLOT"},
}
R_X86_64_RELATIVE, R_X86_64_JUMP_SLOT, R_X86_64_GLOB_DAT = 8, 7, 6
KIND_RANK = {"GLOB_DAT": 3, "JUMP_SLOT": 2, "ABS64": 1}  # which kind a symbol is listed under


@dataclass(frozen=True, slots=True)
class Bind:
    """One watched symbol a dynamic relocation looks up."""

    kind: str  # GLOB_DAT, JUMP_SLOT or ABS64 (the strongest when several relocate it)
    version: str | None  # the version the reference requires (None: any)
    defined_here: bool  # the library has its own definition: binding elsewhere shares it


@dataclass(frozen=True, slots=True)
class Linkage:
    """The linkage facts of one library. ``exports`` and ``binds`` hold the watched symbols a
    verdict can ask about by name (verdicts.py): data objects (what two copies can share) and the
    registries' entry points and heads (registry_name), whatever their type. The functions the
    library exports or binds (an MLIR library's 120 000 names, 30 MB of strings) are only counted
    (``export_count``, ``bind_count``), and the whole export table is kept as a digest
    (``exports_digest``) for same_exports: a verdict never looks a function up by name, and a C++
    name of a function never names an object (the mangling encodes the parameter types)."""

    path: str
    machine: int
    symbolic: bool
    exports: Mapping[str, str | None]  # watched data or registry symbol -> version node of its definition
    binds: Mapping[str, Bind]
    has_initialisers: bool
    registers_at_load: bool | None  # None: undecided (not x86-64, or the walk ran out of budget)
    registration_path: str  # how the decision was reached, for the report
    defines_registry: bool = field(default=False)  # defines addArgument: CommandLine.cpp is in it
    # Exported data another copy's relocations can take over harmfully: GLOBAL only. WEAK and
    # STB_GNU_UNIQUE objects are vague linkage (inline variables, template static members, local
    # statics of inline functions, with their guard variables): the loader keeps one per name on
    # purpose (dl-lookup.c's do_lookup_unique) and the guard runs one initialiser.
    strong_data: frozenset[str] = field(default=frozenset())
    registration_imports: tuple[str, ...] = ()  # addArgument, or opt<T>::done() imported: where options go
    own_copies: frozenset[str] = field(default=frozenset())  # bound symbols it also defines
    # Data of its own copies that its .init_array code addresses through the GOT: objects it
    # constructs (and registers a destructor for) when loaded. None: not decided (the walk ran
    # out of budget, or not x86-64): every copy counts.
    initialised_copies: frozenset[str] | None = None
    # Imports glibc's __assert_fail: built with assertions (LLVM_ENABLE_ASSERTIONS; Debian's and
    # the vendors' release LLVMs import none). Such a build's option parsers reject a second literal
    # of one name (a repeated registry entry) with report_fatal_error; release builds skip the check.
    assertions: bool = False
    export_count: int = 0  # every exported watched symbol (distinct names)
    bind_count: int = 0  # .dynsym entries of watched symbols a relocation looks up
    exports_digest: bytes = b""  # of every exported watched symbol and its version, in no order

    @property
    def takes_part(self) -> bool:
        """Exports or binds a watched symbol, or holds the registry: one to judge in pairs."""
        return bool(self.export_count or self.bind_count or self.defines_registry)

    def same_exports(self, other: Linkage) -> bool:
        """Both export the same watched symbols with the same versions (copies of one build)."""
        return self.export_count == other.export_count and self.exports_digest == other.exports_digest

    def entry_points(self) -> dict[str, str]:
        """How each registry entry point is reached: a relocation kind, "defined" or absent."""
        found: dict[str, str] = {}
        for name in self.registry_symbols():
            if name in self.binds:
                found[name] = self.binds[name].kind + (" (own copy)" if self.binds[name].defined_here else "")
            elif name in self.exports:
                found[name] = "defined"
        return found

    def registry_symbols(self) -> list[str]:
        names = [n for n in ENTRY_POINTS if n in self.binds or n in self.exports]
        heads = {n for n in (*self.binds, *self.exports) if REGISTRY_HEAD.match(n)}
        return names + sorted(heads)

    @property
    def shared_copies(self) -> frozenset[str]:
        """Watched symbols it defines and still looks up: what an earlier library can take over."""
        return self.own_copies


EMPTY = Linkage("", 0, False, {}, {}, False, False, "not read")


@dataclass(slots=True)
class _Symbol:
    name: str
    value: int
    defined: bool
    exported: bool
    is_function: bool
    version: str | None
    is_data: bool = False
    vague: bool = False  # WEAK or STB_GNU_UNIQUE: one copy per process is what the compiler meant


def _dynsym(view: ElfView) -> Section | None:
    """The dynamic symbol table (None when empty), checked before anything indexes it."""
    dynsym = view.symbol_table()
    if dynsym is not None and (not view.header.is_64 or dynsym.entsize != 24):
        raise FormatError(
            "ELF", view.section_header_offset(dynsym.index), "only 64-bit .dynsym tables are read for linkage"
        )
    return dynsym


class FunctionStarts:
    """.dynsym index -> address, for the functions a library defines that relocations name: two
    arrays over the table's indices (a dict of libtriton's 45 000 cost 4.5 MB, these 1.2 MB)."""

    __slots__ = ("_defined", "_values")

    def __init__(self, count: int) -> None:
        self._values = array.array("Q", bytes(8 * count))
        self._defined = bytearray(count)

    def __setitem__(self, index: int, value: int) -> None:
        self._values[index] = value
        self._defined[index] = 1

    def __contains__(self, index: object) -> bool:
        return isinstance(index, int) and 0 <= index < len(self._defined) and self._defined[index] == 1

    def __getitem__(self, index: int) -> int:
        if index not in self:
            raise KeyError(index)
        return self._values[index]


@dataclass(slots=True)
class _SymbolFacts:
    """What linkage needs of .dynsym. ``symbols``: the watched symbols a relocation names, and the
    registration entry points (addArgument, ``opt<T>::done``) wherever they are; the other watched
    symbols (most of an exporter's 150 000) only add to ``exports`` and ``strong_data``, so no
    object is made for them. ``function_starts``: the address of each function the library
    defines, for the symbols a relocation names (a PLT call to one of them runs that code);
    ``defined_functions``: every such address, for the walk's "is this a function start"."""

    symbols: dict[int, _Symbol] = field(default_factory=dict)
    exports: dict[str, str | None] = field(default_factory=dict)
    strong_data: set[str] = field(default_factory=set)
    function_starts: FunctionStarts = field(default_factory=lambda: FunctionStarts(0))
    defined_functions: array.array[int] = field(default_factory=lambda: array.array("Q"))
    assertions: bool = False  # __assert_fail is named: see Linkage.assertions
    # Every exported watched symbol, as a hash of its name and one of its name and version, in
    # .dynsym order (for Linkage.export_count and exports_digest).
    export_keys: array.array[int] = field(default_factory=lambda: array.array("Q"))
    export_values: array.array[int] = field(default_factory=lambda: array.array("Q"))
    # 1 at the .dynsym index of each watched symbol a relocation names.
    watched_named: bytearray = field(default_factory=bytearray)

    def export_digest(self) -> tuple[int, bytes]:
        """(distinct names, digest) of the export table as a dict of name -> version would hold
        it: the last entry of one name wins, and the order of the table does not count."""
        keys, values = self.export_keys, self.export_values
        shift = max(1, len(keys).bit_length())
        # One int per entry, its name's hash above its index: sorted, the last of a name comes last.
        order = sorted(key << shift | index for index, key in enumerate(keys))
        mask = (1 << shift) - 1
        digest = hashlib.blake2b(digest_size=16)
        count = 0
        for position, packed in enumerate(order):
            if position + 1 < len(order) and order[position + 1] >> shift == packed >> shift:
                continue
            digest.update(values[packed & mask].to_bytes(8, "little"))
            count += 1
        return count, digest.digest()


def _key(value: object) -> int:
    """A 64-bit hash of a symbol's name (or name and version). Python's own (SipHash): seeded per
    interpreter, and compared only within one run (forked helpers share the seed)."""
    return hash(value) & 0xFFFF_FFFF_FFFF_FFFF


def _watched_symbols(view: ElfView, dynsym: Section | None, named: bytearray) -> _SymbolFacts:
    """The facts of .dynsym that linkage uses; ``named``: 1 at each symbol index a relocation names."""
    facts = _SymbolFacts()
    if dynsym is None:
        return facts
    symbols, exports, strong_data = facts.symbols, facts.exports, facts.strong_data
    export_keys, export_values = facts.export_keys, facts.export_values
    facts.watched_named = watched_named = bytearray(len(named))
    facts.function_starts = function_starts = FunctionStarts(len(named))
    defined_functions = facts.defined_functions
    dynstr = view.read(view.sections[dynsym.link])
    facts.assertions = b"\0__assert_fail\0" in dynstr
    versions = view.symbol_versions()
    version_names = {**view.defined_version_names(), **view.needed_version_names()} if versions else {}
    version_count, unhide = len(versions), ~VERSYM_HIDDEN
    for first, rows in view.symbol_rows(dynsym):
        for index, (st_name, st_info, st_other, st_shndx, st_value) in enumerate(rows, first):
            if index == 0:
                continue
            is_function = st_info & 0xF == STT_FUNC
            if st_name >= len(dynstr):
                raise FormatError("ELF", dynsym.offset + index * 24, "symbol name outside .dynstr")
            if is_function and st_shndx != 0:  # a function start the walk may meet
                defined_functions.append(st_value)
                if index < len(named) and named[index]:
                    function_starts[index] = st_value
            if not dynstr.startswith(WATCHED_PREFIXES, st_name):
                continue
            name = string_at(dynstr, st_name, dynsym.offset, "ascii", "replace")
            defined = st_shndx != 0
            bind, visibility = st_info >> 4, st_other & 3
            exported = defined and bind != STB_LOCAL and visibility in (STV_DEFAULT, STV_PROTECTED)
            version = None
            if index < version_count:
                entry = versions[index] & unhide
                version = version_names.get(entry) if entry > 1 else None
            is_data = st_info & 0xF in (STT_OBJECT, STT_TLS)
            vague = bind in (STB_WEAK, STB_GNU_UNIQUE)
            # Looked up by name (Linkage): objects, and the registries' names whatever their type.
            by_name = not is_function or registry_name(name)
            is_named = index < len(named) and named[index] == 1
            if exported:
                export_keys.append(_key(name))
                export_values.append(_key((name, version)))
                if by_name or name in exports:
                    exports[name] = version  # index order: the last of one name wins
                if is_data and not vague:
                    strong_data.add(name)
            if is_named:
                watched_named[index] = 1
            if (is_named and by_name) or registers_through(name):
                symbols[index] = _Symbol(name, st_value, defined, exported, is_function, version, is_data, vague)
    return facts


@dataclass(slots=True)
class _Named:
    """The dynamic relocations that name a symbol, one column per field (arrays: libtriton's 82 000
    such entries as tuples of ints cost 10 MB, as columns 1.3 MB)."""

    offsets: array.array[int] = field(default_factory=lambda: array.array("Q"))
    types: array.array[int] = field(default_factory=lambda: array.array("I"))
    indices: array.array[int] = field(default_factory=lambda: array.array("I"))

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        return zip(self.offsets, self.types, self.indices, strict=True)

    def flags(self, count: int) -> bytearray:
        """One byte per .dynsym entry of ``count``: 1 where a relocation names that symbol."""
        named = bytearray(count)
        for index in self.indices:
            if index < count:
                named[index] = 1
        return named


def _relocations(
    view: ElfView, dynsym: Section | None, keep_relative: Sequence[tuple[int, int]]
) -> tuple[_Named, dict[int, int]]:
    """The dynamic RELA entries that name a symbol, as (r_offset, type, symbol index), and the
    addends of the R_X86_64_RELATIVE entries whose r_offset lies in one of keep_relative's
    [start, end) ranges (the .init_array slots). libLLVM has 500 000 entries, nearly all
    RELATIVE: the columns are split at C speed and only the rest is looked at one by one."""
    named = _Named()
    relative: dict[int, int] = {}
    if not view.header.is_64:
        return named, relative
    for section in view.sections:
        if section.sh_type != SHT_RELA or section.size == 0:
            continue
        if dynsym is not None and section.link not in (0, dynsym.index):
            continue  # .rela of a static symbol table (an object file's, never a loader's)
        if section.entsize != 24:
            raise FormatError(
                "ELF", view.section_header_offset(section.index), f"{section.name} entry size {section.entsize}"
            )
        offsets, infos, addends = view.relocation_columns(section)
        for index in [i for i, info in enumerate(infos) if info >> 32]:
            info = infos[index]
            named.offsets.append(offsets[index])
            named.types.append(info & 0xFFFFFFFF)
            named.indices.append(info >> 32)
        for start, end in keep_relative:
            for index in [i for i, offset in enumerate(offsets) if start <= offset < end]:
                if infos[index] == R_X86_64_RELATIVE:
                    relative[offsets[index]] = addends[index]
    return named, relative


def read_linkage(path: str, dynamic: elfread.DynamicInfo, view: ElfView | None = None) -> Linkage:
    """The linkage facts of the shared library at path (read through its view when given: the
    caller keeps the file open and closes it). Raises FormatError or OSError."""
    if view is not None:
        return _linkage_checked(path, view, dynamic)
    fd, view = open_view(path)
    try:
        return _linkage_checked(path, view, dynamic)
    finally:
        os.close(fd)


def _linkage_checked(path: str, view: ElfView, dynamic: elfread.DynamicInfo) -> Linkage:
    try:
        return _linkage(path, view, dynamic)
    except (struct.error, ValueError, IndexError, OverflowError) as exc:
        raise FormatError("ELF", 0, f"unreadable linkage data: {exc}") from None


def _linkage(path: str, view: ElfView, dynamic: elfread.DynamicInfo) -> Linkage:
    machine = view.header.e_machine
    dynsym = _dynsym(view)
    init_ranges = [(s.addr, s.addr + s.size) for s in view.sections if s.sh_type == SHT_INIT_ARRAY]
    named, relative = _relocations(view, dynsym, init_ranges if machine == EM_X86_64 else [])
    facts = _watched_symbols(view, dynsym, named.flags(dynsym.size // 24 if dynsym is not None else 0))
    export_count, exports_digest = facts.export_digest()
    facts.export_keys = facts.export_values = array.array("Q")
    symbols = facts.symbols
    code_map = CodeMap(view, facts.function_starts, facts.defined_functions)
    kinds = RELOC_KINDS.get(machine, {})
    binds: dict[str, Bind] = {}
    watched_named = facts.watched_named
    bound = bytearray(len(watched_named))  # 1 at each watched symbol a relocation looks up
    jump_slots: dict[int, int] = {}
    glob_dat_slots: dict[int, int] = {}
    for r_offset, r_type, index in named:
        if machine == EM_X86_64:
            if r_type == R_X86_64_JUMP_SLOT:
                jump_slots[r_offset] = index
            elif r_type == R_X86_64_GLOB_DAT:
                glob_dat_slots[r_offset] = index
        kind = kinds.get(r_type)
        if kind is not None and index < len(watched_named) and watched_named[index]:
            bound[index] = 1
        symbol = symbols.get(index)
        if kind is None or symbol is None or not symbol.name:
            continue
        known = binds.get(symbol.name)
        if known is None or KIND_RANK[kind] > KIND_RANK[known.kind]:
            binds[symbol.name] = Bind(kind, symbol.version, symbol.defined)
    exports = facts.exports
    strong_data = frozenset(facts.strong_data)
    has_initialisers = any(s.sh_type == SHT_INIT_ARRAY and s.size > 0 for s in view.sections)
    add_argument = next((i for i, s in symbols.items() if s.name == ADD_ARGUMENT), None)
    defines_registry = add_argument is not None and symbols[add_argument].defined
    through = {i for i, s in symbols.items() if registers_through(s.name) and (not s.defined or i == add_argument)}
    registration_imports = tuple(
        sorted({symbols[i].name for i in through if symbols[i].name in binds}, key=lambda n: (n != ADD_ARGUMENT, n))
    )
    registers, how = _registers_at_load(
        view, symbols, add_argument, through, relative, jump_slots, glob_dat_slots, has_initialisers, code_map
    )
    own_copies = frozenset(name for name, bind in binds.items() if bind.defined_here)
    initialised = _initialised_copies(view, symbols, own_copies, relative, jump_slots, glob_dat_slots, code_map)
    return Linkage(
        path=path,
        machine=machine,
        symbolic=dynamic.symbolic,
        exports=exports,
        binds=binds,
        has_initialisers=has_initialisers,
        registers_at_load=registers,
        registration_path=how,
        defines_registry=defines_registry,
        strong_data=strong_data,
        registration_imports=registration_imports,
        own_copies=own_copies,
        initialised_copies=initialised,
        assertions=facts.assertions,
        export_count=export_count,
        bind_count=bound.count(1),
        exports_digest=exports_digest,
    )


def _initialised_copies(
    view: ElfView,
    symbols: Mapping[int, _Symbol],
    own_copies: frozenset[str],
    relative: Mapping[int, int],
    jump_slots: Mapping[int, int],
    glob_dat_slots: Mapping[int, int],
    code_map: CodeMap,
) -> frozenset[str] | None:
    """Which of its own data copies a library's static initialisers touch (None: undecided)."""
    if view.header.e_machine != EM_X86_64:
        return None
    data = {i for i, s in symbols.items() if s.name in own_copies and s.is_data}
    slots = {slot: index for slot, index in glob_dat_slots.items() if index in data}
    if not slots:
        return frozenset()
    starts = init_functions(view, relative)
    stubs = plt_stubs(view, jump_slots)
    found = initialised_slots(view, starts, frozenset(slots), code_map, code_map.own_stubs(stubs))
    if found is None:
        return None
    return frozenset(symbols[slots[slot]].name for slot in found)


def _registers_at_load(
    view: ElfView,
    symbols: Mapping[int, _Symbol],
    add_argument: int | None,
    through: set[int],
    relative: Mapping[int, int],
    jump_slots: Mapping[int, int],
    glob_dat_slots: Mapping[int, int],
    has_initialisers: bool,
    code_map: CodeMap,
) -> tuple[bool | None, str]:
    if add_argument is None and not through:
        return False, "does not reference addArgument"
    if not has_initialisers:
        return False, "no .init_array"
    if view.header.e_machine != EM_X86_64:
        return None, "undecided: the call decoder reads x86-64 only"
    targets = set()
    if add_argument is not None and symbols[add_argument].defined:
        targets.add(symbols[add_argument].value)
    entries = through | ({add_argument} if add_argument is not None else set())
    stubs = plt_stubs(view, jump_slots)
    targets |= {stub for stub, index in stubs.items() if index in entries}
    got = frozenset(slot for slot, index in {**jump_slots, **glob_dat_slots}.items() if index in entries)
    starts = init_functions(view, relative)
    if not starts:
        return False, "no .init_array function"
    return reaches(view, starts, frozenset(targets), got, code_map, stubs, code_map.own_stubs(stubs))
