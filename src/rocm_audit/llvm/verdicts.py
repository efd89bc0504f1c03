"""What a sequence of dlopens does to LLVM's registries: abort, crash or clean (formats.md 3, 6).

A pure model over linkage facts (linkage.py) and the objects each dlopen maps (closure.py). It
follows glibc's symbol lookup (elf/dl-lookup.c): an object's references are looked up in the global
scope (the program, then every object loaded RTLD_GLOBAL, in load order) followed by the search
list of the dlopen that mapped it (its closure, breadth first); a DT_SYMBOLIC object looks in itself
first; a reference that requires a version matches a definition of that version or an unversioned
one, an unversioned reference matches any default definition (``check_match``).

Three things go wrong, and the first one that happens decides the verdict:

- **abort**: two registrations of one set of options into one option map. An object whose
  ``.init_array`` reaches ``cl::Option::addArgument`` registers into the map of the addArgument it
  binds to (its own when the call is local, another library's through JUMP_SLOT or GLOB_DAT);
  that addArgument's library files the options under the ``TopLevelSubCommand`` (GLOB_DAT) or
  ``SubCommand::getTopLevel`` (JUMP_SLOT) it bound when it was loaded. Two libraries register the
  same options when they are one library (one SONAME or file name) or both carry LLVM's own
  CommandLine.cpp (every LLVM registers its core options).
- **crash**: a newly mapped object's relocation against shared state it defines itself (LLVM's
  registries ``MachineSchedRegistry`` and ``Registry<T>::Head``, clang's or MLIR's data) binds to
  the GLOBAL definition of a library loaded earlier, outside its own closure: a double free at exit
  or a crash in a static initialiser; or a registry entry point it imports binds to another whole
  LLVM instead of the one its own closure provides. Of clang's and MLIR's data only objects the
  library's own static initialisers touch count (constructed twice into one place, destroyed twice
  at exit); constant-initialised ones (MLIR's TypeIDs) are never written. WEAK and STB_GNU_UNIQUE
  definitions (vague linkage: template data, inline variables, local statics of inline functions,
  each with its guard; vtables) and llvm::'s plain data (pass IDs, flags) are shared harmlessly:
  measured, never a crash (tests/llvm/test_llvm_unique.py).
- **clean**: none of that.

Hangs (an endless loop in an interposed data structure, formats.md 6) are seen only by a probe.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rocm_audit.llvm.linkage import (
    ADD_ARGUMENT,
    GET_TOP_LEVEL,
    MACHINE_SCHED_REGISTRY,
    REGISTRY_HEAD,
    TOP_LEVEL_SUBCOMMAND,
    Linkage,
)
from rocm_audit.report_types import LlvmPrediction
from rocm_audit.units import clip

LLVM_CORE = "llvm-core"  # the option family every copy of CommandLine.cpp's library registers
MAX_NAMED_SYMBOLS = 3


class Verdict(str, enum.Enum):
    ABORT = "abort"
    CRASH = "crash"
    HANG = "hang"  # observed only (probes, real loads)
    CLEAN = "clean"

    @property
    def bad(self) -> bool:
        return self is not Verdict.CLEAN

    @property
    def rank(self) -> int:
        return {Verdict.CLEAN: 0, Verdict.CRASH: 1, Verdict.HANG: 1, Verdict.ABORT: 2}[self]


@dataclass(frozen=True, slots=True)
class Mapped:
    """One object a dlopen maps, as the model needs it."""

    identity: tuple[int, int]
    path: str
    linkage: Linkage
    family: str  # SONAME or file name: what makes two files "one library"
    reused: bool  # already in the process: not relocated or initialised again
    needed_by: str | None = None


@dataclass(frozen=True, slots=True)
class Step:
    objects: tuple[Mapped, ...]  # the dlopen's closure, breadth first, root first
    rtld_global: bool


@dataclass(frozen=True, slots=True)
class Prediction:
    verdict: Verdict
    reason: str
    culprit: str | None = None  # the object whose load goes wrong
    other: str | None = None  # the object it collides with
    step: int | None = None  # index of the step that goes wrong
    symbols: tuple[str, ...] = ()

    @property
    def layout_dependent(self) -> bool:
        """Clean as modelled, but only while two builds' C++ class layouts agree, which no ELF
        fact shows (a clean prediction that names a culprit: _interposition)."""
        return self.verdict is Verdict.CLEAN and self.culprit is not None

    def to_dict(self) -> LlvmPrediction:
        return {
            "verdict": self.verdict.value,
            "reason": self.reason,
            "culprit": self.culprit,
            "other": self.other,
            "step": self.step,
            "symbols": list(self.symbols),
        }


CLEAN = Prediction(Verdict.CLEAN, "no registration or data of one LLVM reaches another's")


def _compatible(reference: str | None, definition: str | None) -> bool:
    return reference is None or definition is None or reference == definition


def _resolve(name: str, version: str | None, scope: Sequence[Mapped]) -> Mapped | None:
    for candidate in scope:
        defined = candidate.linkage.exports
        if name in defined and _compatible(version, defined[name]):
            return candidate
    return None


def _families(one: Mapped) -> frozenset[str]:
    if one.linkage.defines_registry:
        return frozenset((one.family, LLVM_CORE))
    return frozenset((one.family,))


def _shared_state(name: str) -> bool:
    """Data whose sharing between two copies breaks them: LLVM's registries (pass, scheduler,
    GC, plugin lists: one copy's static initialisers insert into the other's, the exit handlers
    of both free the nodes) and clang's global data. Pass and analysis IDs, option flags and
    other plain data of llvm:: are shared harmlessly (measured: never a crash), and
    TopLevelSubCommand is the option map, which _register judges. Of clang's and MLIR's data,
    only what the library's own initialisers construct breaks (_interposition asks
    Linkage.initialised_copies): a cl::opt or a container built twice in one place and destroyed
    twice at exit; constant-initialised objects (MLIR's TypeIDs, pass IDs) are shared harmlessly."""
    if _registry(name):
        return True
    return name.startswith(("_ZN5clang", "_ZN4mlir"))


def _registry(name: str) -> bool:
    return name == MACHINE_SCHED_REGISTRY or bool(REGISTRY_HEAD.match(name))


def _short(name: str) -> str:
    return clip(name, 80)


class _Process:
    def __init__(self) -> None:
        self.global_scope: list[Mapped] = []
        self.loaded: dict[tuple[int, int], Mapped] = {}
        self.option_map: dict[tuple[int, int], tuple[int, int]] = {}  # registry owner -> map owner
        self.registrations: dict[tuple[int, int], list[tuple[frozenset[str], Mapped]]] = {}

    def scope_for(self, one: Mapped, search_list: Sequence[Mapped]) -> list[Mapped]:
        scope = [one] if one.linkage.symbolic else []
        seen = {one.identity} if one.linkage.symbolic else set()
        for candidate in (*self.global_scope, *search_list):
            if candidate.identity not in seen:
                seen.add(candidate.identity)
                scope.append(candidate)
        return scope

    def bound(self, one: Mapped, name: str, scope: Sequence[Mapped]) -> Mapped | None:
        bind = one.linkage.binds.get(name)
        if bind is None:
            return one if name in one.linkage.exports or one.linkage.defines_registry else None
        return _resolve(name, bind.version, scope)


def simulate(steps: Sequence[Step]) -> Prediction:
    """The first thing that goes wrong while the steps load (and at exit), or CLEAN."""
    process = _Process()
    worst = CLEAN
    for index, step in enumerate(steps):
        search_list = [process.loaded.get(o.identity, o) for o in step.objects]
        new = [o for o in search_list if o.identity not in process.loaded and not o.reused]
        for one in new:
            process.loaded[one.identity] = one
        # Relocation first (every new object), then initialisers, dependencies first.
        scopes = {one.identity: process.scope_for(one, search_list) for one in new}
        for one in new:
            found = _interposition(one, scopes[one.identity], search_list, index)
            if found is not None and (found.verdict.rank > worst.verdict.rank or worst is CLEAN):
                worst = found  # the first caveat of a clean load is kept too
            if one.linkage.defines_registry:
                map_owner = _map_owner(process, one, scopes[one.identity])
                process.option_map[one.identity] = map_owner
        for one in reversed(new):
            found = _register(process, one, scopes[one.identity], index)
            if found is not None:
                return found  # an abort ends the process
        if step.rtld_global:
            known = {o.identity for o in process.global_scope}
            process.global_scope.extend(o for o in search_list if o.identity not in known)
    return worst


def _map_owner(process: _Process, one: Mapped, scope: Sequence[Mapped]) -> tuple[int, int]:
    """Whose SubCommand map a registry's addOption files options in (bound at load)."""
    for name in (TOP_LEVEL_SUBCOMMAND, GET_TOP_LEVEL):
        if name in one.linkage.binds:
            owner = _resolve(name, one.linkage.binds[name].version, scope)
            if owner is not None and owner.identity != one.identity:
                return process.option_map.get(owner.identity, owner.identity)
            return one.identity
    return one.identity


def _register(process: _Process, one: Mapped, scope: Sequence[Mapped], index: int) -> Prediction | None:
    if one.linkage.registers_at_load is False:
        return None
    entry = next(iter(one.linkage.registration_imports), ADD_ARGUMENT)
    if entry not in one.linkage.binds and not one.linkage.defines_registry:
        return None
    registry = process.bound(one, entry, scope)
    if registry is None:
        return None
    map_owner = process.option_map.get(registry.identity, registry.identity)
    families = _families(one)
    entries = process.registrations.setdefault(map_owner, [])
    for earlier_families, earlier in entries:
        if earlier_families & families:
            what = "addArgument" if entry == ADD_ARGUMENT else "cl::opt<T>::done()"
            how = f"its own {what}" if registry.identity == one.identity else f"{what} of {registry.path}"
            kind = one.linkage.binds.get(entry)
            through = f" through {kind.kind}" if kind is not None and registry.identity != one.identity else ""
            owner = process.loaded.get(map_owner, registry)
            # Copies: the second registrant is a copy of the first, and the registry it calls files
            # into its own map (two libclang-cpp-15 into one libLLVM-15; two libLLVM-15).
            copies = one.linkage.same_exports(earlier.linkage) and registry.linkage.same_exports(owner.linkage)
            # Measured (differential sweep, 40 libraries): copies always abort (26 of 26); where two
            # builds share one option map (code of one, objects or options of another), a SIGSEGV
            # often comes first (228 of 472 such predicted aborts; 6 hung).
            effect = (
                "LLVM aborts with 'registered more than once'"
                if copies
                else "LLVM aborts with 'registered more than once', or crashes first (two LLVM builds, one option map)"
            )
            return Prediction(
                Verdict.ABORT,
                f"{one.path} registers its options ({how}{through}) into the option map that "
                f"{earlier.path} already filled: {effect}",
                culprit=one.path,
                other=earlier.path,
                step=index,
                symbols=(entry,),
            )
    entries.append((families, one))
    return None


def _interposition(
    one: Mapped, scope: Sequence[Mapped], search_list: Sequence[Mapped], index: int
) -> Prediction | None:
    """A crash: one's own copy of shared state, or one of its imports, taken from another library."""
    taking = _taken_copies(one, scope, {o.identity for o in search_list})
    if taking.taken:
        return _taken_prediction(one, taking.taken, taking.taker, index)
    # Imports its own closure provides, taken from a library loaded earlier (another LLVM).
    local = [o for o in search_list if o.identity != one.identity]
    if not local or len(scope) == len(search_list):
        return None
    foreign: list[str] = []
    foreign_from: Mapped | None = None
    for name in (ADD_ARGUMENT, GET_TOP_LEVEL, TOP_LEVEL_SUBCOMMAND):
        bind = one.linkage.binds.get(name)
        if bind is None or bind.defined_here:
            continue
        expected = _resolve(name, bind.version, local)
        actual = _resolve(name, bind.version, scope)
        # Only a whole other LLVM (one with CodeGen's registries) takes over enough of the
        # library's imports to break its initialisers; a pass plugin's partial LLVM did not.
        whole = actual is not None and MACHINE_SCHED_REGISTRY in actual.linkage.exports
        if expected is not None and actual is not None and whole and actual.identity != expected.identity:
            foreign.append(name)
            foreign_from = foreign_from or actual
    if foreign and foreign_from is not None:
        return Prediction(
            Verdict.CRASH,
            f"{one.path} binds LLVM's registry ({_short(foreign[0])}) to {foreign_from.path} instead of "
            "the LLVM its own dependencies provide",
            culprit=one.path,
            other=foreign_from.path,
            step=index,
            symbols=tuple(foreign),
        )
    if taking.relaid and taking.relaid_on is not None:
        # Measured (differential sweep): the same ~300 cl::opt objects and vtables of a Debian
        # libLLVM 14-19 bound to triton 3.6's pass plugin were clean, to triton 3.8's
        # instrumentation library (a later LLVM) a double free at exit. Clean, with the caveat.
        named = tuple(_short(n) for n in sorted(taking.relaid)[:MAX_NAMED_SYMBOLS])
        return Prediction(
            Verdict.CLEAN,
            f"clean while the two LLVM builds share one class layout: {len(taking.relaid)} of {one.path}'s own "
            f"initialised llvm objects (e.g. {named[0]}) bind to {taking.relaid_on.path}'s copies and are built "
            "again there (another layout: a double free at exit)",
            culprit=one.path,
            other=taking.relaid_on.path,
            step=index,
            symbols=named,
        )
    return None


@dataclass(slots=True)
class _Taking:
    """What of one library's own shared copies a library earlier in its scope stands in for."""

    taken: list[str] = field(default_factory=list)  # shared state bound to ``taker``'s copy
    taker: Mapped | None = None
    relaid: list[str] = field(default_factory=list)  # own initialised objects another whole LLVM's copies stand in for
    relaid_on: Mapped | None = None


def _taken_copies(one: Mapped, scope: Sequence[Mapped], in_closure: set[tuple[int, int]]) -> _Taking:
    """Walk ``scope`` up to ``one``: the first library that takes any of one's own copies of shared
    state, and the whole LLVMs whose initialised copies stand in for one's own."""
    taking = _Taking()
    own = one.linkage.shared_copies
    if not own:
        return taking
    for candidate in scope:
        if candidate.identity == one.identity:
            break  # from here on one's own definitions win
        whole = one.linkage.defines_registry and candidate.linkage.defines_registry
        if candidate.identity in in_closure and not whole:
            continue  # linked together on purpose (vague-linkage copies of one build)
        # Two whole LLVMs (each with CommandLine.cpp) in one closure are no such build: the
        # one later in the search list binds its registries to the earlier one's like any
        # interposition (rocm-bindings-compiler's unversioned libLLVM.so before Debian's
        # libLLVM-15 in one DT_NEEDED list: MachineSchedRegistry shared, a crash at exit).
        common = own & candidate.linkage.strong_data
        initialised = one.linkage.initialised_copies
        # In one closure every object is relocated before any initialiser runs: measured on
        # triton's pass plugin before Debian's libLLVM 19 in one DT_NEEDED list, libLLVM's
        # own cl::opt objects (PrintChanged, ...) bound to the plugin's copies and built by
        # both crash at exit (free(): invalid pointer); dlopened one after the other, the
        # same binding was clean. Data no initialiser touches is shared harmlessly either way.
        together = whole and candidate.identity in in_closure
        for name in common:
            built_here = initialised is None or name in initialised
            binds_there = _compatible(one.linkage.binds[name].version, candidate.linkage.exports.get(name))
            if not _shared_state(name):
                if not (together and built_here):
                    if whole and built_here and binds_there:
                        taking.relaid.append(name)
                        taking.relaid_on = taking.relaid_on or candidate
                    continue
            elif not _registry(name) and not built_here:
                continue  # constant-initialised (an MLIR TypeID): its initialisers never touch it
            if binds_there:
                taking.taken.append(name)
                taking.taker = taking.taker or candidate
        if taking.taken:
            break
    return taking


def _taken_prediction(one: Mapped, taken: list[str], taker: Mapped | None, index: int) -> Prediction:
    """What happens when ``taker`` holds the copies of shared state ``one`` defines itself."""
    heads = sorted(n for n in taken if n == MACHINE_SCHED_REGISTRY or REGISTRY_HEAD.match(n))
    named = tuple(_short(n) for n in (heads or sorted(taken))[:MAX_NAMED_SYMBOLS])
    what = "LLVM's registries" if heads else "data and code"
    assert taker is not None
    if MACHINE_SCHED_REGISTRY in taken and taker.linkage.assertions:
        # Its schedulers ("default", ...) are added to the taker's registry, whose listener (the
        # -misched option's parser, an assertions build's) has them already. Measured: triton
        # 3.8's libtriton loaded GLOBAL, then a Debian libLLVM 14-19 (or a library on one).
        return Prediction(
            Verdict.ABORT,
            f"{one.path} adds its machine schedulers to {taker.path}'s registry (it binds "
            f"{_short(MACHINE_SCHED_REGISTRY)} there), an assertions build whose -misched parser "
            "has those names already: LLVM aborts with \"Option 'default' already exists!\"",
            culprit=one.path,
            other=taker.path,
            step=index,
            symbols=(MACHINE_SCHED_REGISTRY,),
        )
    return Prediction(
        Verdict.CRASH,
        f"{len(taken)} of {one.path}'s own llvm/clang/mlir definitions ({what}, e.g. {named[0]}) bind "
        f"to {taker.path}: two copies share one object (a double free at exit or a crash while loading)",
        culprit=one.path,
        other=taker.path,
        step=index,
        symbols=named,
    )


def worst(predictions: Mapping[str, Prediction]) -> Prediction:
    return max(predictions.values(), key=lambda p: p.verdict.rank, default=CLEAN)
