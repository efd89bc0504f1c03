"""`rocm-audit llvm`: every LLVM command-line option double registration an image can hit.

From ELF facts (``llvm_cl``) and load closures (``closure``), three kinds of clash (formats.md 3.2,
3.4), each with the load modes in which it fires and a fix; ``--probe`` then confirms each one in a
sandboxed child (``probes``) and keeps prediction and outcome side by side.

1. Duplicates: two or more inodes of one exporter or registrant (same SONAME or same bytes): HIGH.
2. Interposable exporters: different exporters whose llvm::cl data bind to each other (unversioned
   or one version node) once the first is in the global scope: MEDIUM.
3. Closures: two LLVM exporters in the load closure of one library or executable: HIGH when they
   bind to each other (they share one lookup scope whatever the RTLD flags), else MEDIUM.
"""

from __future__ import annotations

import dataclasses
import enum
import glob
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rocm_audit.elf import read as elfread
from rocm_audit.errors import FormatError, UsageError
from rocm_audit.findings import Finding, Severity, make_finding
from rocm_audit.llvm import fixes
from rocm_audit.llvm.closure import Closure, HostView, ProcessModel
from rocm_audit.llvm.linkage import EMPTY as EMPTY_LINKAGE
from rocm_audit.llvm.linkage import Linkage, read_linkage
from rocm_audit.llvm.optin import opt_in_libraries, soften_opt_in
from rocm_audit.llvm.pairs import PairJudge, PairVerdicts
from rocm_audit.llvm.probes import (
    CLOSURE_MODES,
    DEFAULT_TIMEOUT_S,
    PAIR_MODES,
    LoadStep,
    ProbeOutcome,
    ProbeResult,
    ProbeVerdict,
    probe_closure,
    probe_pair,
    run_probe,
)
from rocm_audit.llvm.roles import ClFacts, Role, classify
from rocm_audit.llvm.verdicts import Prediction, Verdict
from rocm_audit.outcome import CommandOutcome
from rocm_audit.progress import SILENT, Progress
from rocm_audit.report_types import (
    ClashJudgement,
    LinkageFields,
    LlvmClash,
    LlvmLibrary,
    LlvmPair,
    LoadClosure,
    ProbeInterpreter,
    Sections,
)
from rocm_audit.tree.discovery import Interpreter, interpreter_for, is_tree_of, resolve_roots
from rocm_audit.tree.identical import Candidate, CompareStats, ReadFailure, partition_identical
from rocm_audit.tree.inventory import FileKind, FileRecord, Inventory, build_inventory, read_dynamic_info
from rocm_audit.tree.keeper import KeeperRule
from rocm_audit.tree.loader import LoaderModel
from rocm_audit.tree.ownership import Ownership, runtime_twin

log = logging.getLogger(__name__)

MAX_VIA_ROOTS = 20  # closure roots listed per clash; the count says how many there were


class Expect(str, enum.Enum):
    """What a load in one mode is predicted to do."""

    ABORT = "abort"  # double registration: LLVM prints the message and aborts
    UNSAFE = "unsafe"  # other llvm::cl data interposed, registry not: crash possible (e.g. at exit)
    CLEAN = "clean"


class Risk(str, enum.Enum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


class Reason(str, enum.Enum):
    DUPLICATE_EXPORTER = "duplicate-exporter"
    DUPLICATE_REGISTRANT = "duplicate-registrant"
    INTERPOSABLE_EXPORTERS = "interposable-exporters"
    CLOSURE_INTERPOSITION = "closure-interposition"
    CLOSURE_TWO_LLVMS = "closure-two-llvms"


# Each rule's catalogue severity matches the clash risk (high: error, medium: warning), so a
# rules file can override it like any other rule's.
_RULE_OF_REASON = {
    Reason.DUPLICATE_EXPORTER: "LLVM001",
    Reason.DUPLICATE_REGISTRANT: "LLVM001",
    Reason.INTERPOSABLE_EXPORTERS: "LLVM002",
    Reason.CLOSURE_INTERPOSITION: "LLVM003",
    Reason.CLOSURE_TWO_LLVMS: "LLVM004",
}


@dataclass(slots=True)
class Clash:
    reason: Reason
    risk: Risk
    paths: tuple[str, ...]
    predictions: dict[str, Expect]  # probe mode -> expectation
    fix: str
    soname: str | None = None
    version_node: str | None = None
    identical: bool | None = None  # duplicates: every copy has the same bytes
    via: tuple[str, ...] = ()  # closure clashes: roots whose closure holds the pair
    via_count: int = 0
    probe_root: str | None = None  # closure clashes: the root a probe dlopens (a library if any)
    probes: list[ProbeResult] = field(default_factory=list)
    judged: PairVerdicts | None = None  # both orders, three modes, whole closures (pairs.py)
    probe_expect: list[Verdict] = field(default_factory=list)  # judged: the static verdict of each probe
    closure_judged: dict[str, Prediction] = field(default_factory=dict)  # closure clashes: mode -> model
    finding: Finding | None = None  # the clash's own finding (a probe verdict rewrites it)

    @property
    def mode(self) -> str:
        """When the clash fires: "any", "first-global", "both-global" or "none"."""
        return mode_of(self.predictions)

    @property
    def kind(self) -> str:
        return "closure" if self.reason in (Reason.CLOSURE_INTERPOSITION, Reason.CLOSURE_TWO_LLVMS) else "pair"

    @property
    def confirmed(self) -> bool | None:
        """True: a probe saw the double registration; False: probes ran, none saw it; None."""
        if any(p.outcome is ProbeOutcome.CONFIRMED for p in self.probes):
            return True
        if any(p.outcome in (ProbeOutcome.CLEAN, ProbeOutcome.CRASH_AT_EXIT) for p in self.probes):
            return False
        return None

    @property
    def option(self) -> str | None:
        return next((p.option for p in self.probes if p.option), None)

    def sort_key(self) -> tuple[tuple[str, ...], str]:
        return (self.paths, self.reason.value)


# ---------------------------------------------------------------------------------------------
# Predictions (formats.md 3.2 and 4): pure functions of ClFacts, shared by detection and tests.


def binds_data(consumer: ClFacts, provider: ClFacts) -> bool:
    """Whether consumer's references to llvm::cl data resolve to provider's definitions when
    provider comes first in consumer's lookup scope (glibc ``check_match``: an unversioned side
    matches anything, otherwise the version names must agree)."""
    if consumer.role is not Role.EXPORTER or provider.role is not Role.EXPORTER or consumer.symbolic:
        return False
    return (
        consumer.version_node is None or provider.version_node is None or consumer.version_node == provider.version_node
    )


def _interposed(consumer: ClFacts) -> Expect:
    # TopLevelSubCommand through a GLOB_DAT slot shares the registry itself (abort, observed with
    # LLVM 14-16); without it only other data is shared (LLVM 19 copies: SIGSEGV at exit).
    return Expect.ABORT if consumer.interposable_registry else Expect.UNSAFE


def predict_pair(
    first: ClFacts,
    second: ClFacts,
    *,
    same_file: bool,
    same_library: bool,
    preloaded: tuple[bool, bool] = (False, False),
) -> dict[str, Expect]:
    """Expected outcome of loading first, then second, in each of probes.PAIR_MODES.

    same_file: one (st_dev, st_ino), so glibc maps it once. same_library: one SONAME or the same
    bytes, so two registrants bind to one registry. preloaded: the file (or another path to it)
    is preloaded RTLD_GLOBAL before both, as rocm_sdk.preload_libraries does.
    """
    clean = {mode: Expect.CLEAN for mode in PAIR_MODES}
    if same_file:
        return clean
    if first.role is Role.REGISTRANT and second.role is Role.REGISTRANT and same_library:
        # Both import addArgument from the one libLLVM the process has: any RTLD mode (7818).
        return {mode: Expect.ABORT for mode in PAIR_MODES}
    if preloaded[1] and not preloaded[0]:
        first, second = second, first  # the preloaded one is mapped first, whatever the steps say
    if binds_data(second, first):
        expect = _interposed(second)
        # The second binds to the first only when the first is in the global scope.
        return {
            mode: (expect if first_global or any(preloaded) else Expect.CLEAN)
            for mode, (first_global, _second_global) in PAIR_MODES.items()
        }
    return clean


def predict_closure(earlier: ClFacts, later: ClFacts) -> dict[str, Expect]:
    """Expected outcome of dlopening a root whose closure maps earlier before later (BFS order).

    Objects of one dlopen share its local scope, so later binds to earlier whatever the flags.
    """
    expect = _interposed(later) if binds_data(later, earlier) else Expect.CLEAN
    return {mode: expect for mode in CLOSURE_MODES}


def mode_of(predictions: dict[str, Expect]) -> str:
    firing = {mode for mode, expect in predictions.items() if expect is not Expect.CLEAN}
    if not firing:
        return "none"
    if firing == set(predictions):
        return "any"
    if firing == {"global-global", "global-local"}:
        return "first-global"
    if firing == {"global-global"}:
        return "both-global"
    return ",".join(sorted(firing))


def agrees(expect: Expect, outcome: ProbeOutcome) -> bool | None:
    """Whether a probe outcome matches the prediction; None when the probe says nothing."""
    if outcome in (ProbeOutcome.INCONCLUSIVE, ProbeOutcome.LOAD_ERROR):
        return None
    if expect is Expect.ABORT:
        return outcome is ProbeOutcome.CONFIRMED
    if expect is Expect.UNSAFE:
        return outcome in (ProbeOutcome.CONFIRMED, ProbeOutcome.CRASH_AT_EXIT)
    return outcome is ProbeOutcome.CLEAN


# ---------------------------------------------------------------------------------------------
# Analysis


@dataclass(slots=True)
class LlvmOptions:
    probe: bool = False
    probe_timeout_s: float = DEFAULT_TIMEOUT_S
    preload: tuple[str, ...] = ()  # loaded RTLD_GLOBAL before every probe, and modelled so
    preload_rocm_sdk: bool = False  # add what rocm_sdk.preload_libraries would load
    closure_paths: tuple[str, ...] = ()
    sysroot: str = "/"
    unextracted: frozenset[str] = frozenset()  # as CheckOptions.unextracted
    ld_library_path: tuple[str, ...] = ()
    python: str | None = None  # --python: the interpreter probes run under (else the audited one)


# rocm_sdk.initialize_process preloads these (RTLD_GLOBAL) before anything else; `rocm-sdk test`
# then loads every library (formats.md 1.5; TheRock rocm_sdk/__init__.py).
ROCM_SDK_PRELOADS = ("amd_comgr", "amdhip64", "hiprtc", "rocm_kpack")


def rocm_sdk_preloads(sdk_trees: Iterable[str]) -> list[str]:
    """The file rocm_sdk.find_libraries picks for each preload: the first sorted lib/lib<name>.so*
    match in a _rocm_sdk_core tree."""
    cores = sorted(tree for tree in sdk_trees if is_tree_of(os.path.basename(tree), "core"))
    found = []
    for short in ROCM_SDK_PRELOADS:
        for core in cores:
            matches = sorted(glob.glob(os.path.join(glob.escape(core), "lib", f"lib{short}.so*")))
            if matches:
                found.append(matches[0])
                break
    return found


def _identities(paths: Iterable[str]) -> frozenset[tuple[int, int]]:
    identities = set()
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        identities.add((st.st_dev, st.st_ino))
    return frozenset(identities)


@dataclass(slots=True)
class LlvmAnalysis:
    libraries: list[ClFacts]
    library_in_scan: dict[str, bool]
    library_identity: dict[str, tuple[int, int]]
    clashes: list[Clash]
    closures: list[Closure]
    closure_roles: dict[str, Role]
    findings: list[Finding]
    pairs: list[PairVerdicts] = field(default_factory=list)  # failing pairs no clash names
    judged_pairs: int = 0
    judge: PairJudge | None = None
    pair_findings: dict[tuple[str, str], Finding] = field(default_factory=dict)
    pair_probes: dict[tuple[str, str], tuple[list[ProbeResult], list[Verdict]]] = field(default_factory=dict)
    facts: _Facts | None = None
    probe_interpreter: Interpreter | None = None  # what ran the probes, and why that one
    # Test and instrumentation libraries nothing loads unless asked (llvm/optin.py).
    opt_in: set[str] = field(default_factory=set)

    def reported_findings(self) -> list[Finding]:
        """The findings as reported: a clash confined to a test library is a warning that says so."""
        return soften_opt_in(self.findings, self.opt_in)

    def linkage_of(self, path: str) -> Linkage | None:
        """The linkage facts of a listed exporter, registrant or private copy (None otherwise)."""
        identity = self.library_identity.get(path)
        if self.facts is None or identity is None:
            return None
        one = self.facts.by_identity.get(identity)
        if one is None or one.role in (Role.NONE, Role.UNKNOWN):
            return None
        return self.facts.linkage(path, identity)


class _Facts:
    """ClFacts by file identity: every file is classified once, scanned or reached by a closure."""

    def __init__(self, inventory: Inventory, findings: list[Finding]) -> None:
        self.inventory = inventory
        self.findings = findings
        self.by_identity: dict[tuple[int, int], ClFacts] = {}
        self._dynamic: dict[str, elfread.DynamicInfo | None] = {}
        self._records = {r.path: r for r in inventory.files}
        self._linkage: dict[tuple[int, int], Linkage] = {}

    def linkage(self, path: str, identity: tuple[int, int], real_path: str | None = None) -> Linkage:
        """Linkage facts (linkage.py) of the file at path, read once per inode; an unreadable
        file has none (its LLVM009 finding comes from the role pass)."""
        found = self._linkage.get(identity)
        if found is None:
            real = real_path or path
            record = self._records.get(real)
            if self.of(path, identity, real).role in (Role.NONE, Role.UNKNOWN):
                # No llvm::cl symbol and no registry in it (roles.py): libc, libstdc++, libtriton's
                # hidden LLVM. Measured: none of those took part in a failing load.
                self._linkage[identity] = EMPTY_LINKAGE
                return EMPTY_LINKAGE
            try:
                dynamic = self.dynamic(real) or elfread.EMPTY_DYNAMIC
                if record is not None:
                    found = self.inventory.facts.get(
                        record, "llvm-linkage", lambda view: read_linkage(real, dynamic, view)
                    )
                else:
                    found = read_linkage(real, dynamic)
            except (OSError, FormatError):
                found = EMPTY_LINKAGE
            self._linkage[identity] = found
        return found

    def dynamic(self, path: str) -> elfread.DynamicInfo | None:
        """DT_NEEDED and friends of a regular file (a scanned one from the inventory's cache)."""
        if path not in self._dynamic:
            record = self._records.get(path)
            try:
                self._dynamic[path] = self.inventory.dynamic(record) if record is not None else read_dynamic_info(path)
            except (OSError, FormatError):
                self._dynamic[path] = None
        return self._dynamic[path]

    def of(self, path: str, identity: tuple[int, int], real_path: str | None = None) -> ClFacts:
        """Facts of the file at path; real_path is the regular file to open when path is a link."""
        facts = self.by_identity.get(identity)
        if facts is None:
            facts = self._classify(path, real_path or path)
            self.by_identity[identity] = facts
        return facts

    def _classify(self, path: str, real_path: str) -> ClFacts:
        try:
            record = self._records.get(real_path)
            dynamic = self.inventory.dynamic(record) if record is not None else read_dynamic_info(real_path)
            if record is not None:
                found = role_facts_of(self.inventory, record)
            else:
                found = classify(real_path, dynamic)
            return dataclasses.replace(found, path=path)
        except FormatError as exc:
            self.findings.append(
                make_finding(
                    "LLVM009",
                    path,
                    f"{exc.reason} at offset {exc.offset:#x}",
                    data={"offset": exc.offset},
                )
            )
        except OSError as exc:
            self.findings.append(make_finding("LLVM009", path, f"cannot read: {exc.strerror}"))
        return ClFacts(path, Role.UNKNOWN, None, None, 0, False, False, None, False, None, False)


def role_facts_of(inventory: Inventory, record: FileRecord) -> ClFacts:
    """The LLVM-role fact of one inventory file, read once per run. Raises FormatError or OSError."""
    dynamic = inventory.dynamic(record)
    return inventory.facts.get(record, "llvm-role", lambda view: classify(record.path, dynamic, view))


def linkage_facts_of(inventory: Inventory, record: FileRecord) -> Linkage | None:
    """The linkage fact (linkage.py) of an exporter, registrant or private copy, read in the same
    fact pass as its role (tree/facts.py); None for other libraries."""
    if role_facts_of(inventory, record).role in (Role.NONE, Role.UNKNOWN):
        return None
    dynamic = inventory.dynamic(record)
    return inventory.facts.get(record, "llvm-linkage", lambda view: read_linkage(record.path, dynamic, view))


def _identical_classes(inventory: Inventory, records: Sequence[FileRecord], findings: list[Finding]) -> list[set[str]]:
    """Classes of byte-identical files among records (one path per inode); what this run compared
    already (dedup's plan, in `check`) is not read again."""
    by_size: dict[int, list[FileRecord]] = {}
    for record in records:
        by_size.setdefault(record.size, []).append(record)
    classes: list[set[str]] = []
    failures: list[ReadFailure] = []
    stats = CompareStats()
    for same_size in by_size.values():
        if len(same_size) < 2:
            continue
        known = inventory.identical.classes_among([r.identity for r in same_size])
        if known is not None:
            path_of = {r.identity: r.path for r in same_size}
            classes.extend({path_of[i] for i in members} for members in known)
            continue
        candidates = [Candidate(r.path, r.size, r.head_digest) for r in same_size]
        for cls in partition_identical(candidates, stats, failures):
            classes.append({c.path for c in cls})
    for failure in failures:
        message = f"cannot read for comparison: {failure.error.strerror}"
        findings.append(make_finding("LLVM009", failure.path, message))
    return classes


def _duplicate_clashes(
    inventory: Inventory,
    facts: _Facts,
    findings: list[Finding],
    preloaded: frozenset[tuple[int, int]] = frozenset(),
) -> tuple[list[Clash], dict[tuple[int, int], int]]:
    """Clash kind 1, plus the group number of every exporter/registrant inode."""
    records = {r.path: r for r in inventory.files}
    ownership = Ownership.of_trees(inventory.sdk_trees)  # the keeper dedup keeps: a wheel's own copy first
    paths_by_identity: dict[tuple[int, int], list[str]] = {}
    for record in inventory.by_kind(FileKind.SHARED_LIBRARY):
        if facts.of(record.path, record.identity).llvm_role:
            paths_by_identity.setdefault(record.identity, []).append(record.path)
    for identity, paths in paths_by_identity.items():
        linked = sorted(link.path for link in inventory.links if inventory.resolved(link) in paths)
        if len(paths) + len(linked) > 1:
            findings.append(
                make_finding(
                    "LLVM010",
                    sorted(paths)[0],
                    f"one inode reached through {len(paths) + len(linked)} paths "
                    f"(hardlinks or symlinks): the loader maps it once",
                    related=sorted(paths)[1:] + linked,
                    data={"inode": identity[1]},
                )
            )
    representatives = {identity: sorted(paths)[0] for identity, paths in paths_by_identity.items()}
    # Union-find over "same SONAME" and "same bytes".
    parent = {identity: identity for identity in representatives}

    def find(item: tuple[int, int]) -> tuple[int, int]:
        while parent[item] != item:
            parent[item] = parent[parent[item]]
            item = parent[item]
        return item

    def union(a: tuple[int, int], b: tuple[int, int]) -> None:
        parent[find(a)] = find(b)

    by_soname: dict[str, tuple[int, int]] = {}
    for identity, _path in sorted(representatives.items(), key=lambda item: item[1]):
        soname = facts.by_identity[identity].soname
        if soname:
            if soname in by_soname:
                union(identity, by_soname[soname])
            else:
                by_soname[soname] = identity
    identity_of_path = {path: identity for identity, path in representatives.items()}
    identical = _identical_classes(inventory, [records[p] for p in representatives.values()], findings)
    for cls in identical:
        members = [identity_of_path[p] for p in cls]
        for other in members[1:]:
            union(members[0], other)
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for identity in representatives:
        groups.setdefault(find(identity), []).append(identity)
    group_of = {identity: n for n, members in enumerate(groups.values()) for identity in members}
    keeper_rule = KeeperRule.from_policy()
    clashes = []
    for members in groups.values():
        if len(members) < 2:
            continue
        paths = sorted(representatives[i] for i in members)
        first_facts = facts.by_identity[members[0]]
        same_bytes = any(set(paths) <= cls for cls in identical)
        ordered = sorted(members, key=lambda i: representatives[i])
        a, b = facts.by_identity[ordered[0]], facts.by_identity[ordered[1]]
        predictions = predict_pair(
            a,
            b,
            same_file=False,
            same_library=True,
            preloaded=(ordered[0] in preloaded, ordered[1] in preloaded),
        )
        registrant = first_facts.role is Role.REGISTRANT

        def sdk_tree_of(p: str) -> str | None:
            return records[p].sdk_tree if p in records else None

        keeper = fixes.choose_keeper(paths, sdk_tree_of, first_facts.soname, keeper_rule, ownership.is_owned)
        keeper_tree = sdk_tree_of(keeper)
        if same_bytes and keeper_tree is not None:  # `-p _rocm_sdk_devel`: dedup keeps the runtime copy
            keeper = runtime_twin(keeper, keeper_tree, ownership) or keeper
        fix = fixes.duplicate_fix(
            paths,
            identical=same_bytes,
            keeper=keeper,
            in_sdk_trees=all(sdk_tree_of(p) for p in paths),
            shared="SONAME" if first_facts.soname else "content",
        )
        clashes.append(
            Clash(
                reason=Reason.DUPLICATE_REGISTRANT if registrant else Reason.DUPLICATE_EXPORTER,
                risk=Risk.HIGH,
                paths=tuple(paths),
                predictions=predictions,
                fix=fix,
                soname=first_facts.soname,
                version_node=first_facts.version_node,
                identical=same_bytes,
            )
        )
    return clashes, group_of


def _interposable_clashes(
    exporters: list[tuple[tuple[int, int], str, ClFacts]],
    group_of: dict[tuple[int, int], int],
    preloaded: frozenset[tuple[int, int]] = frozenset(),
) -> list[Clash]:
    """Clash kind 2: different exporters (not copies of one library) that bind each other's data."""
    clashes = []
    for index, (id_a, path_a, a) in enumerate(exporters):
        for id_b, path_b, b in exporters[index + 1 :]:
            if group_of[id_a] == group_of[id_b]:
                continue  # copies of one library: kind 1 already names them
            # Probe (and report) the order in which the second binds to the first.
            if binds_data(b, a):
                first, second = (path_a, a, id_a), (path_b, b, id_b)
            elif binds_data(a, b):
                first, second = (path_b, b, id_b), (path_a, a, id_a)
            else:
                continue
            predictions = predict_pair(
                first[1],
                second[1],
                same_file=False,
                same_library=False,
                preloaded=(first[2] in preloaded, second[2] in preloaded),
            )
            clashes.append(
                Clash(
                    reason=Reason.INTERPOSABLE_EXPORTERS,
                    risk=Risk.MEDIUM,
                    paths=(first[0], second[0]),
                    predictions=predictions,
                    soname=second[1].soname,
                    version_node=second[1].version_node,
                    fix=(
                        "Never load both into one process. If both are needed, rebuild one with "
                        "its own symbol version node (LLVM_VERSION_SUFFIX with "
                        "LLVM_ENABLE_SYMBOL_VERSIONING) or link LLVM into it statically with "
                        f"hidden visibility; meanwhile do not load {first[0]} RTLD_GLOBAL (or "
                        f"preload it): {second[0]} binds to it."
                    ),
                )
            )
    return clashes


def _closure_clashes(
    roots: Iterable[str],
    process_of: Callable[[], ProcessModel],
    host: HostView,
    facts: _Facts,
    executables: frozenset[str] = frozenset(),
) -> list[Clash]:
    """Clash kind 3: two LLVM exporters mapped by one dlopen (or one executable's start-up)."""
    found: dict[tuple[tuple[int, int], tuple[int, int]], tuple[Clash, list[str]]] = {}
    for root in roots:
        closure = process_of().dlopen(root)
        exporters = []
        for loaded in closure.objects:
            one = facts.of(loaded.path, loaded.identity, host.realpath(loaded.path))
            if one.role is Role.EXPORTER:
                exporters.append((loaded, one))
        for index, (earlier, earlier_facts) in enumerate(exporters):
            for later, later_facts in exporters[index + 1 :]:
                key = (earlier.identity, later.identity)
                if key in found:
                    found[key][1].append(root)
                    continue
                predictions = predict_closure(earlier_facts, later_facts)
                binding = any(expect is not Expect.CLEAN for expect in predictions.values())
                if binding:
                    fix = (
                        f"{root} maps both {earlier.path} and {later.path} and the second binds "
                        f"to the first's LLVM state: drop the DT_NEEDED or RUNPATH entry that "
                        f"reaches {later.path}, or hide LLVM in one of them (static link, "
                        "-fvisibility=hidden, version script `local: *;`)."
                    )
                else:
                    fix = (
                        f"{root} maps two LLVMs: versioned symbols keep their registries apart, "
                        "but each keeps its own global state; use one LLVM, or hide LLVM in one "
                        "of them."
                    )
                clash = Clash(
                    reason=Reason.CLOSURE_INTERPOSITION if binding else Reason.CLOSURE_TWO_LLVMS,
                    risk=Risk.HIGH if binding else Risk.MEDIUM,
                    paths=(earlier.path, later.path),
                    predictions=predictions,
                    fix=fix,
                    soname=later_facts.soname,
                    version_node=later_facts.version_node,
                )
                found[key] = (clash, [root])
    clashes = []
    for clash, via in found.values():
        ordered = sorted(set(via))
        clash.via = tuple(ordered[:MAX_VIA_ROOTS])
        clash.via_count = len(ordered)
        # glibc will not dlopen a PIE executable: probe through a library root when there is one.
        clash.probe_root = next((r for r in ordered if r not in executables), ordered[0])
        clashes.append(clash)
    return clashes


def analyse(inventory: Inventory, options: LlvmOptions, progress: Progress = SILENT) -> LlvmAnalysis:
    """Roles, clashes and requested closures for an inventory (probes not run)."""
    findings: list[Finding] = []
    facts = _Facts(inventory, findings)
    host = HostView(options.sysroot, known_elf_keys=inventory.elf_keys(), unextracted=options.unextracted)
    loader = LoaderModel(sysroot=options.sysroot, ld_library_path=options.ld_library_path, host=host)

    def process() -> ProcessModel:
        return ProcessModel(loader, facts.dynamic, host)

    libraries = inventory.by_kind(FileKind.SHARED_LIBRARY)
    progress.phase("LLVM: reading roles", len(libraries), "libraries")
    for done, record in enumerate(libraries, 1):
        facts.of(record.path, record.identity)
        progress.update(done)
    preloaded = _identities(options.preload)
    clashes, group_of = _duplicate_clashes(inventory, facts, findings, preloaded)
    exporters: dict[tuple[int, int], tuple[tuple[int, int], str, ClFacts]] = {}
    for record in sorted(libraries, key=lambda r: r.path):  # one entry per inode, first path
        one = facts.by_identity[record.identity]
        if one.role is Role.EXPORTER and record.identity not in exporters:
            exporters[record.identity] = (record.identity, record.path, one)
    clashes += _interposable_clashes(list(exporters.values()), group_of, preloaded)
    roots = sorted(
        r.path
        for r in inventory.by_kind(FileKind.SHARED_LIBRARY, FileKind.EXECUTABLE)
        if facts.dynamic(r.path) is not None
    )
    executables = frozenset(r.path for r in inventory.by_kind(FileKind.EXECUTABLE))
    progress.phase(f"LLVM: following the load closures of {len(roots)} files")
    clashes += _closure_clashes(roots, process, host, facts, executables)
    clashes.sort(key=Clash.sort_key)
    judge = PairJudge(
        process,
        lambda path, identity: facts.linkage(path, identity, host.realpath(path)),
        _by_soname(libraries, facts),
        preload=options.preload,
    )
    pairs, judged_count = _judge_pairs(libraries, facts, judge, clashes, progress)

    closures = [process().dlopen(path) for path in options.closure_paths]
    closure_roles = {
        o.path: facts.of(o.path, o.identity, host.realpath(o.path)).role for c in closures for o in c.objects
    }

    # A hardlinked file is classified once and listed under each of its paths.
    library_list = [_at_path(facts.by_identity[r.identity], r.path) for r in libraries]
    in_scan = {r.path: True for r in libraries}
    identity_of = {r.path: r.identity for r in libraries}
    # Exporters and registrants that only a closure reached (a system libLLVM) are listed too;
    # scanned executables (closure roots) are not libraries.
    scanned = {r.path for r in inventory.files}
    for identity, one in facts.by_identity.items():
        if one.path not in scanned and one.llvm_role:
            library_list.append(one)
            in_scan[one.path] = False
            identity_of[one.path] = identity
    library_list.sort(key=lambda one: one.path)
    for one in library_list:
        if one.role is Role.PRIVATE_COPY and in_scan.get(one.path):
            findings.append(
                make_finding(
                    "LLVM011",
                    one.path,
                    "links LLVM's command-line registry privately (exports none of it)",
                )
            )
    for clash in clashes:
        clash.finding = _clash_finding(clash)
        findings.append(clash.finding)
    covered = {frozenset(c.paths) for c in clashes if c.judged is not None}
    covered |= {frozenset(c.judged.paths) for c in clashes if c.judged is not None}
    uncovered = [p for p in pairs if p.bad and frozenset(p.paths) not in covered]
    analysis = LlvmAnalysis(library_list, in_scan, identity_of, clashes, closures, closure_roles, findings)
    for pair in uncovered:
        analysis.pair_findings[pair.paths] = _pair_finding(pair, judge)
        findings.append(analysis.pair_findings[pair.paths])
    analysis.pairs = uncovered
    analysis.judged_pairs = judged_count
    analysis.facts = facts
    analysis.judge = judge
    needed_names = {name for root in roots for name in (facts.dynamic(root) or elfread.EMPTY_DYNAMIC).needed}
    analysis.opt_in = opt_in_libraries(
        ((r.path, (facts.dynamic(r.path) or elfread.EMPTY_DYNAMIC).soname) for r in libraries), needed_names
    )
    return analysis


MAX_JUDGED_LIBRARIES = 96  # 4560 pairs; beyond that only exporters and registrants are paired


def _by_soname(libraries: Sequence[FileRecord], facts: _Facts) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    seen: set[tuple[int, int]] = set()
    for record in sorted(libraries, key=lambda r: r.path):
        dynamic = facts.dynamic(record.path)
        if dynamic is not None and dynamic.soname and record.identity not in seen:
            seen.add(record.identity)
            found.setdefault(dynamic.soname, []).append(record.path)
    return found


def _judge_pairs(
    libraries: Sequence[FileRecord], facts: _Facts, judge: PairJudge, clashes: list[Clash], progress: Progress = SILENT
) -> tuple[list[PairVerdicts], int]:
    """Judge every pair of LLVM-carrying libraries (one path per inode) in both orders and three
    modes; attach each clash's worst pair; return the pairs and how many were judged."""
    candidates: list[tuple[str, tuple[int, int]]] = []
    seen: set[tuple[int, int]] = set()
    carriers = [
        r
        for r in sorted(libraries, key=lambda r: r.path)
        # nothing of LLVM's registry in the others (roles.py read their .dynstr and .rodata)
        if facts.by_identity[r.identity].role not in (Role.NONE, Role.UNKNOWN)
    ]
    if carriers:
        progress.phase("LLVM: reading linkage", len(carriers), "libraries")
    for done, record in enumerate(carriers, 1):
        progress.update(done)
        if record.identity in seen:
            continue
        seen.add(record.identity)
        linkage = facts.linkage(record.path, record.identity)
        if linkage.exports or linkage.binds or linkage.defines_registry:
            candidates.append((record.path, record.identity))
    if len(candidates) > MAX_JUDGED_LIBRARIES:
        candidates = [c for c in candidates if facts.by_identity[c[1]].llvm_role][:MAX_JUDGED_LIBRARIES]
    results: dict[frozenset[str], PairVerdicts] = {}
    if len(candidates) > 1:
        progress.phase(
            f"LLVM: judging {len(candidates)} libraries", len(candidates) * (len(candidates) - 1) // 2, "pairs"
        )
    for index, (a, _) in enumerate(candidates):
        for b, _ in candidates[index + 1 :]:
            results[frozenset((a, b))] = judge.judge(a, b)
            progress.update(len(results))
    for clash in clashes:
        if clash.reason is Reason.CLOSURE_INTERPOSITION:
            # The model judges the root's own dlopen too (LLVM004's separate LLVMs stay a warning).
            root = clash.probe_root or clash.via[0]
            clash.closure_judged = {mode: judge.predict([(root, rtld)]) for mode, rtld in CLOSURE_MODES.items()}
            clash.predictions = {mode: _expect_of(p.verdict) for mode, p in clash.closure_judged.items()}
            if not any(p.verdict.bad for p in clash.closure_judged.values()):
                clash.risk = Risk.LOW
        if clash.kind != "pair":
            continue
        group = [results.get(frozenset((x, y))) for i, x in enumerate(clash.paths) for y in clash.paths[i + 1 :]]
        judged = [g for g in group if g is not None]
        if not judged:
            continue
        clash.judged = max(judged, key=lambda p: p.worst.verdict.rank)
        worst_order = max(clash.judged.orders, key=lambda o: o.worst.verdict.rank)
        clash.predictions = {mode: _expect_of(p.verdict) for mode, p in worst_order.modes.items()}
        if clash.reason is Reason.INTERPOSABLE_EXPORTERS:
            clash.paths = (worst_order.first, worst_order.second)
            caution = judge.global_caution(*clash.paths)
            clash.fix = fixes.pair_fix(*clash.paths, caution, clash.judged.arrives_through())
        clash.risk = Risk.HIGH if clash.judged.bad else Risk.LOW
    return list(results.values()), len(results)


# When a clash fires (Clash.mode), in words: the RTLD flags of the two dlopen calls.
_WHEN = {
    "any": "they are loaded together in any way",
    "first-global": "the first one loaded is in the global scope (RTLD_GLOBAL, a preload or a DT_NEEDED "
    "of the executable)",
    "both-global": "both are loaded RTLD_GLOBAL",
    "none": "(in no load mode)",
}

# What a verdict means for a person, in the one-line message of a finding.
_OUTCOME_TEXT = {
    Verdict.ABORT: "aborts ('Option ... registered more than once')",
    Verdict.CRASH: "can crash (two LLVMs share one option registry)",
    Verdict.HANG: "hangs",
    Verdict.CLEAN: "is clean",
}


def _outcome(verdict: Verdict, how: str) -> str:
    """``the process aborts (...) when they are loaded together, as a load probe confirmed``."""
    return f"the process {_OUTCOME_TEXT[verdict]} when they are loaded together{how}"


def _expect_of(verdict: Verdict) -> Expect:
    if verdict is Verdict.ABORT:
        return Expect.ABORT
    return Expect.CLEAN if verdict is Verdict.CLEAN else Expect.UNSAFE


def _pair_finding(pair: PairVerdicts, judge: PairJudge, probes: Sequence[ProbeResult] = ()) -> Finding:
    """LLVM012 (the failure arrives through a dependency or a host) or LLVM013; with conclusive
    probes, their verdict decides (clean: LLVM014)."""
    worst = pair.worst
    decided = probe_decided(probes)
    through = pair.arrives_through()
    hosts = [h for hs in pair.hosts.values() for h in hs]
    failing = ", ".join(f"{o.first} then {o.second}" for o in pair.failing_orders())
    caution = judge.global_caution(*pair.paths)
    fix = fixes.pair_fix(*pair.paths, caution, through)
    rule = "LLVM012" if through or hosts else "LLVM013"
    where = f"; arrives through {', '.join(through)}" if through else ""
    host_text = f"; loaded after its host {', '.join(hosts)}" if hosts else ""
    data = {"verdict": worst.verdict.value, "arrives_through": through, "decided_by": "static"}
    if decided is not None:
        data.update(verdict=decided.value, decided_by="probe")
        if not decided.bad:
            return make_finding(
                "LLVM014",
                pair.paths[0],
                f"loading them together is harmless ({len(probes)} probe loads were clean)",
                detail=f"predicted {worst.verdict.value} ({failing}), but every probe load was clean",
                related=[pair.paths[1], *through],
                data=data,
            )
        return make_finding(
            rule,
            pair.paths[0],
            _outcome(decided, ", as load probes confirmed"),
            detail=f"probe: {decided.value} when loaded together{where}{host_text} (static: {worst.reason}); "
            f"fix: {fix}",
            related=[pair.paths[1], *through],
            data=data,
        )
    return make_finding(
        rule,
        pair.paths[0],
        _outcome(worst.verdict, ""),
        detail=f"{worst.verdict.value} in {failing}{where}{host_text}: {worst.reason}; fix: {fix}",
        related=[pair.paths[1], *through],
        data=data,
    )


def _at_path(facts: ClFacts, path: str) -> ClFacts:
    return facts if facts.path == path else dataclasses.replace(facts, path=path)


def _closure_finding(clash: Clash, what: str, data: dict[str, Any]) -> Finding:
    """A closure clash judged by the model (and perhaps a probe): clean is never an error."""
    static = max((p.verdict for p in clash.closure_judged.values()), key=lambda v: v.rank)
    decided = probe_decided(clash.probes)
    verdict = decided or static
    data.update(verdict=verdict.value, decided_by="probe" if decided is not None else "static")
    if not verdict.bad:
        return make_finding(
            "LLVM014",
            clash.paths[0],
            f"{' '.join(what.split())}, but loading it is harmless (RTLD_GLOBAL or RTLD_LOCAL)"
            + (", as probes confirmed" if decided is not None else ""),
            related=clash.paths[1:],
            data=data,
        )
    reason = next(p.reason for p in clash.closure_judged.values() if p.verdict is static)
    return make_finding(
        _RULE_OF_REASON[clash.reason],
        clash.paths[0],
        f"{' '.join(what.split())}: {_outcome(verdict, '')}",
        detail=f"{verdict.value} when {_WHEN[clash.mode]}; {reason}; fix: {clash.fix}",
        related=clash.paths[1:],
        data=data,
        severity=Severity.ERROR,
    )


def _clash_finding(clash: Clash) -> Finding:
    copies = f"{len(clash.paths)} copies (different files) of {clash.soname or 'one library'}"
    example = f" (e.g. {clash.via[0]})" if clash.via else ""
    what = {
        Reason.DUPLICATE_EXPORTER: f"{copies}, which exports LLVM's option registry",
        Reason.DUPLICATE_REGISTRANT: f"{copies}, which registers LLVM options",
        Reason.INTERPOSABLE_EXPORTERS: "two libraries export LLVM's option registry and bind each other's",
        Reason.CLOSURE_INTERPOSITION: f"one load closure maps two LLVMs that bind each other's state{example}",
        Reason.CLOSURE_TWO_LLVMS: f"one load closure maps two different LLVMs{example}",
    }[clash.reason]
    data: dict[str, Any] = {"reason": clash.reason.value, "mode": clash.mode}
    judged = clash.judged
    if judged is None and clash.closure_judged:
        return _closure_finding(clash, what, data)
    if judged is None:
        return make_finding(
            _RULE_OF_REASON[clash.reason],
            clash.paths[0],
            " ".join(what.split()),
            detail=f"fails when {_WHEN[clash.mode]}; fix: {clash.fix}",
            related=clash.paths[1:],
            data=data,
        )
    data.update(verdict=judged.worst.verdict.value, decided_by="static", arrives_through=judged.arrives_through())
    decided = probe_decided(clash.probes)
    if decided is not None:
        data.update(verdict=decided.value, decided_by="probe")
        loads = sum(1 for p in clash.probes if p.verdict.conclusive)
        if not decided.bad:
            return make_finding(
                "LLVM014",
                clash.paths[0],
                f"{' '.join(what.split())}, but loading them together is harmless ({loads} probe loads were clean)",
                detail=f"static verdict: {judged.worst.verdict.value}; every probe (both orders, every mode) was clean",
                related=clash.paths[1:],
                data=data,
            )
        seen = next(p for p in clash.probes if p.verdict.conclusive and p.verdict is not ProbeVerdict.CLEAN)
        return make_finding(
            _RULE_OF_REASON[clash.reason],
            clash.paths[0],
            f"{' '.join(what.split())}: {_outcome(decided, ', as load probes confirmed')}",
            detail=f"probe: {decided.value} ({seen.mode}: {seen.detail}); fix: {clash.fix}",
            related=clash.paths[1:],
            data=data,
            severity=Severity.ERROR,
        )
    if not judged.bad:
        # Severity follows the truth: clean in every order and mode is never an error.
        return make_finding(
            "LLVM014",
            clash.paths[0],
            f"{' '.join(what.split())}, but loading them together is harmless",
            detail=f"clean in both orders and every RTLD mode: {judged.worst.reason}",
            related=clash.paths[1:],
            data=data,
        )
    failing = ", ".join(f"{o.first} then {o.second}" for o in judged.failing_orders())
    return make_finding(
        _RULE_OF_REASON[clash.reason],
        clash.paths[0],
        f"{' '.join(what.split())}: {_outcome(judged.worst.verdict, '')}",
        detail=f"{judged.worst.verdict.value} in {failing}, when {_WHEN[clash.mode]}; {judged.worst.reason}; "
        f"fix: {clash.fix}",
        related=clash.paths[1:],
        data=data,
        severity=Severity.ERROR,
    )


# ---------------------------------------------------------------------------------------------
# Probing


def probe_clashes(
    clashes: Sequence[Clash],
    options: LlvmOptions,
    judge: PairJudge | None = None,
    python: str | None = None,
    progress: Progress = SILENT,
) -> list[Finding]:
    """Run every clash's probes under ``python`` (None: this interpreter; one child per mode; a
    judged pair in both orders, each library after its hosts); return the findings they lead to."""
    findings: list[Finding] = []
    for done, clash in enumerate(clashes, 1):
        progress.update(done)
        if clash.judged is not None and judge is not None:
            clash.probes, clash.probe_expect = _probe_orders(clash.judged, judge, options, python)
            findings.extend(_judged_probe_findings(clash.paths, clash.probes, clash.probe_expect))
            continue
        for mode in clash.predictions:
            common: dict[str, Any] = {
                "timeout_s": options.probe_timeout_s,
                "preload": options.preload,
                "ld_library_path": options.ld_library_path,
                "python": python,
            }
            if clash.kind == "closure":
                root = clash.probe_root or clash.via[0]
                result = probe_closure(root, mode, watch=clash.paths, **common)
            else:
                result = probe_pair(clash.paths[0], clash.paths[1], mode, **common)
            log.info("probe %s %s: %s", mode, " + ".join(clash.paths), result.outcome.value)
            clash.probes.append(result)
        findings.extend(_probe_findings(clash))
    return findings


def _probe_orders(
    pair: PairVerdicts, judge: PairJudge, options: LlvmOptions, python: str | None = None
) -> tuple[list[ProbeResult], list[Verdict]]:
    """Both orders, three modes: what a real process loads (hosts first), and what was expected."""
    results: list[ProbeResult] = []
    expected: list[Verdict] = []
    for order in pair.orders:
        for mode, prediction in order.modes.items():
            sequence = judge.load_sequence(order.first, order.second, mode)
            result = run_probe(
                mode,
                [LoadStep(path, rtld_global) for path, rtld_global in sequence],
                timeout_s=options.probe_timeout_s,
                preload=options.preload,
                ld_library_path=options.ld_library_path,
                python=python,
            )
            log.info("probe %s %s then %s: %s", mode, order.first, order.second, result.verdict.value)
            results.append(result)
            expected.append(prediction.verdict)
    return results, expected


def _judged_probe_findings(
    paths: Sequence[str], probes: Sequence[ProbeResult], expected: Sequence[Verdict]
) -> list[Finding]:
    findings = []
    subject, related = paths[0], list(paths[1:])

    def where(result: ProbeResult) -> str:
        loads = [step.split(":", 1)[1] for step in result.steps]
        return f"{probe_mode_text(result.mode)} ({' then '.join(loads)})"

    aborted = [p for p in probes if p.verdict is ProbeVerdict.ABORT]
    if aborted:
        option = next((p.option for p in aborted if p.option), None)
        named = f" of option '{option}'" if option else ""
        findings.append(
            make_finding(
                "LLVM005",
                subject,
                f"a load probe confirmed the double registration{named}: the process aborts",
                detail="; ".join(where(p) for p in aborted[:3]),
                related=related,
                data={"option": option, "modes": sorted({p.mode for p in aborted})},
            )
        )
    at_exit = [p for p in probes if p.outcome is ProbeOutcome.CRASH_AT_EXIT]
    if at_exit:
        findings.append(
            make_finding(
                "LLVM006",
                subject,
                f"probe loaded the libraries, then crashed at exit ({'; '.join(where(p) for p in at_exit[:3])})",
                related=related,
                data={"modes": sorted({p.mode for p in at_exit})},
            )
        )
    loading = [
        p for p in probes if p.verdict is ProbeVerdict.HANG or (p.verdict is ProbeVerdict.CRASH and p.step != "exit")
    ]
    for result in loading[:3]:
        what = (
            f"hung while loading {result.step}"
            if result.verdict is ProbeVerdict.HANG
            else (f"killed by {result.signal} while loading {result.step}")
        )
        findings.append(
            make_finding(
                "LLVM015",
                subject,
                f"probe ({probe_mode_text(result.mode)}): {what}",
                related=related,
                data={
                    "mode": result.mode,
                    "verdict": result.verdict.value,
                    "signal": result.signal,
                    "step": result.step,
                },
            )
        )
    for result, expect in zip(probes, expected, strict=True):
        if not result.verdict.conclusive:
            findings.append(
                make_finding(
                    "LLVM008",
                    subject,
                    f"probe {where(result)} inconclusive: {result.detail}",
                    related=related,
                    data={"mode": result.mode},
                )
            )
        elif (result.verdict is not ProbeVerdict.CLEAN) != expect.bad:
            findings.append(
                make_finding(
                    "LLVM007",
                    subject,
                    f"probe {where(result)}: predicted {expect.value}, observed {result.verdict.value}",
                    related=related,
                    data={"mode": result.mode, "predicted": expect.value, "observed": result.verdict.value},
                )
            )
    if any(p.isolation == "host network" for p in probes):
        findings.append(
            make_finding(
                "LLVM016",
                subject,
                "probes ran with the host's network (not root: no network namespace)",
                related=related,
            )
        )
    return findings


def probe_mode_text(mode: str) -> str:
    """``global-local`` as a person reads it: ``loaded RTLD_GLOBAL, then RTLD_LOCAL``."""
    flags = [f"RTLD_{part.upper()}" for part in mode.split("-") if part in ("global", "local")]
    return "loaded " + ", then ".join(flags) if flags else mode


def probe_decided(probes: Sequence[ProbeResult]) -> Verdict | None:
    """The verdict conclusive probes give (the worst seen), None when none was conclusive."""
    conclusive = [p.verdict for p in probes if p.verdict.conclusive]
    if not conclusive:
        return None
    if ProbeVerdict.ABORT in conclusive:
        return Verdict.ABORT
    if ProbeVerdict.CRASH in conclusive:
        return Verdict.CRASH
    if ProbeVerdict.HANG in conclusive:
        return Verdict.HANG
    return Verdict.CLEAN


def probe_analysis(analysis: LlvmAnalysis, options: LlvmOptions, progress: Progress = SILENT) -> None:
    """Probe every clash and every failing pair; the probe verdict overrides the static one (the
    clash's finding is rewritten: a clean probe downgrades it to LLVM014 with the evidence, a bad
    one makes it an error) and the report says which decided.

    The probes run under the audited interpreter (interpreter_for: --python, else the owner of the
    audited directories, else this one), recorded in ``analysis.probe_interpreter``: an extension
    module built for 3.12 does not load into 3.11. Raises UsageError for a --python that does not run."""
    audited = [root.path for root in analysis.facts.inventory.roots] if analysis.facts is not None else []
    interpreter = interpreter_for(options.python, audited)
    analysis.probe_interpreter = interpreter
    python = interpreter.executable
    progress.phase("LLVM: probing clashes in child processes", len(analysis.clashes) + len(analysis.pairs))
    analysis.findings.extend(probe_clashes(analysis.clashes, options, analysis.judge, python, progress))
    judge = analysis.judge
    for done, pair in enumerate(analysis.pairs, len(analysis.clashes) + 1):
        if judge is None:
            break
        progress.update(done)
        probes, expected = _probe_orders(pair, judge, options, python)
        analysis.pair_probes[pair.paths] = (probes, expected)
        analysis.findings.extend(_judged_probe_findings(pair.paths, probes, expected))
    rewritten: dict[int, Finding] = {}
    for clash in analysis.clashes:
        judged = clash.judged is not None or bool(clash.closure_judged)
        if clash.finding is not None and judged and probe_decided(clash.probes) is not None:
            rewritten[id(clash.finding)] = _clash_finding(clash)
            clash.finding = rewritten[id(clash.finding)]
    for pair in analysis.pairs:
        probes = analysis.pair_probes.get(pair.paths, ([], []))[0]
        old = analysis.pair_findings.get(pair.paths)
        if old is not None and judge is not None and probe_decided(probes) is not None:
            rewritten[id(old)] = _pair_finding(pair, judge, probes)
    analysis.findings = [rewritten.get(id(f), f) for f in analysis.findings]


def _probe_findings(clash: Clash) -> list[Finding]:
    findings = []
    subject, related = clash.paths[0], clash.paths[1:]
    confirmed = [p.mode for p in clash.probes if p.outcome is ProbeOutcome.CONFIRMED]
    if confirmed:
        option = f" of option '{clash.option}'" if clash.option else ""
        findings.append(
            make_finding(
                "LLVM005",
                subject,
                f"a load probe confirmed the double registration{option}: the process aborts",
                detail="probes: " + "; ".join(probe_mode_text(m) for m in confirmed),
                related=related,
                data={"option": clash.option, "modes": confirmed},
            )
        )
    crashed = [p.mode for p in clash.probes if p.outcome is ProbeOutcome.CRASH_AT_EXIT]
    if crashed:
        findings.append(
            make_finding(
                "LLVM006",
                subject,
                f"probe loaded the libraries, then crashed at exit (modes: {', '.join(crashed)})",
                related=related,
                data={"modes": crashed},
            )
        )
    for result in clash.probes:
        verdict = agrees(clash.predictions[result.mode], result.outcome)
        if verdict is None and result.verdict in (ProbeVerdict.CRASH, ProbeVerdict.HANG):
            findings.append(
                make_finding(
                    "LLVM015",
                    subject,
                    f"probe ({probe_mode_text(result.mode)}): {result.detail}",
                    related=related,
                    data={"mode": result.mode, "verdict": result.verdict.value, "signal": result.signal},
                )
            )
        elif verdict is None:
            findings.append(
                make_finding(
                    "LLVM008",
                    subject,
                    f"probe ({probe_mode_text(result.mode)}) inconclusive: {result.detail}",
                    related=related,
                    data={"mode": result.mode},
                )
            )
        elif not verdict:
            findings.append(
                make_finding(
                    "LLVM007",
                    subject,
                    f"probe ({probe_mode_text(result.mode)}): predicted {clash.predictions[result.mode].value}, "
                    f"observed {result.outcome.value}",
                    related=related,
                    data={
                        "mode": result.mode,
                        "predicted": clash.predictions[result.mode].value,
                        "observed": result.outcome.value,
                    },
                )
            )
    return findings


# ---------------------------------------------------------------------------------------------
# Report sections and text


def library_to_dict(
    one: ClFacts, in_scan: bool, identity: tuple[int, int] | None, linkage: Linkage | None = None
) -> LlvmLibrary:
    extra: LinkageFields = {}
    if linkage is not None and linkage is not EMPTY_LINKAGE:
        extra = {
            "registers_at_load": linkage.registers_at_load,
            "registration_path": linkage.registration_path,
            "registry_entry_points": linkage.entry_points(),
        }
    return {
        **extra,
        "path": one.path,
        "role": one.role.value,
        "soname": one.soname,
        "version_node": one.version_node,
        "exported_cl_symbols": one.exported_cl_symbols,
        "imports_add_argument": one.imports_add_argument,
        "has_initialisers": one.has_initialisers,
        "embeds_registry": one.embeds_registry,
        "symbolic": one.symbolic,
        "interposable_registry": one.interposable_registry,
        "nodelete": one.nodelete,
        "in_scan": in_scan,
        "device": identity[0] if identity else None,
        "inode": identity[1] if identity else None,
    }


def interpreter_to_dict(interpreter: Interpreter) -> ProbeInterpreter:
    """The report's ``probe_interpreter``: which interpreter ran the probes, and why."""
    return {
        "executable": interpreter.executable,
        "version": interpreter.version,
        "chosen_by": interpreter.chosen_by.value,
        "reason": interpreter.reason,
    }


def clash_to_dict(clash: Clash) -> LlvmClash:
    return {
        "paths": list(clash.paths),
        "reason": clash.reason.value,
        "severity": clash.risk.value,
        "mode": clash.mode,
        "confirmed": clash.confirmed,
        "option": clash.option,
        "fix": clash.fix,
        "soname": clash.soname,
        "version_node": clash.version_node,
        "identical": clash.identical,
        "via": list(clash.via),
        "via_count": clash.via_count,
        "predictions": {mode: expect.value for mode, expect in clash.predictions.items()},
        **_judged_fields(clash),
        "probes": [
            {
                "mode": p.mode,
                "outcome": p.outcome.value,
                "option": p.option,
                "returncode": p.returncode,
                "detail": p.detail,
                "preload": list(p.preload),
                "steps": list(p.steps),
                "stderr_tail": p.stderr_tail,
                "instances": p.instances,
                "agrees": _agreement(clash, index, p),
                "verdict": p.verdict.value,
                "signal": p.signal,
                "step": p.step,
                "isolation": p.isolation,
            }
            for index, p in enumerate(clash.probes)
        ],
    }


def _agreement(clash: Clash, index: int, probe: ProbeResult) -> bool | None:
    if index < len(clash.probe_expect):
        if not probe.verdict.conclusive:
            return None
        return (probe.verdict is not ProbeVerdict.CLEAN) == clash.probe_expect[index].bad
    return agrees(clash.predictions[probe.mode], probe.outcome)


def _judged_fields(clash: Clash) -> ClashJudgement:
    """Fields added to schema v1 by issue 16: the verdict, who decided it, both orders."""
    if clash.judged is None and clash.closure_judged:
        decided = probe_decided(clash.probes)
        static = max((p.verdict for p in clash.closure_judged.values()), key=lambda v: v.rank)
        return {"verdict": (decided or static).value, "decided_by": "probe" if decided is not None else "static"}
    if clash.judged is None:
        return {}
    decided = probe_decided(clash.probes)
    return {
        "verdict": (decided or clash.judged.worst.verdict).value,
        "decided_by": "probe" if decided is not None else "static",
        "arrives_through": clash.judged.arrives_through(),
        "orders": clash.judged.to_dict()["orders"],
    }


def pair_to_dict(pair: PairVerdicts, probes: tuple[list[ProbeResult], list[Verdict]] | None = None) -> LlvmPair:
    found = pair.to_dict()
    results = probes[0] if probes else []
    decided = probe_decided(results)
    return {
        **found,
        "verdict": decided.value if decided is not None else found["verdict"],
        "decided_by": "probe" if decided is not None else "static",
        "probes": [
            {
                "mode": p.mode,
                "steps": list(p.steps),
                "verdict": p.verdict.value,
                "signal": p.signal,
                "step": p.step,
                "detail": p.detail,
                "option": p.option,
            }
            for p in results
        ],
    }


def closure_to_dict(closure: Closure, roles: dict[str, Role]) -> LoadClosure:
    return {
        "root": closure.root,
        "objects": [
            {
                "path": o.path,
                "request": o.request,
                "via": o.via,
                "needed_by": o.needed_by,
                "depth": o.depth,
                "soname": o.soname,
                "device": o.identity[0],
                "inode": o.identity[1],
                "role": roles.get(o.path, Role.NONE).value,
            }
            for o in closure.objects
        ],
        "missing": [{"needed_by": m.needed_by, "name": m.name, "detail": m.detail} for m in closure.missing],
        "truncated": closure.truncated,
    }


def run_llvm(
    paths: list[str] | None,
    options: LlvmOptions,
    progress: Progress = SILENT,
) -> CommandOutcome:
    """Scan, analyse, optionally probe; the outcome the CLI renders. Raises UsageError."""
    options = dataclasses.replace(options)  # filled in below; the caller's stays as it was
    if options.probe and options.sysroot not in ("", "/"):
        raise UsageError("--probe loads libraries with this host's loader; it cannot model --sysroot")
    for option, given in (("--closure", options.closure_paths), ("--preload", options.preload)):
        for path in given:
            if not os.path.isfile(path):
                raise UsageError(f"{option}: not a file: {path}")
    roots, looked = resolve_roots(paths)
    inventory = build_inventory(roots, progress)
    if options.preload_rocm_sdk:
        found = rocm_sdk_preloads(inventory.sdk_trees)
        if not found:
            raise UsageError(
                "--preload-rocm-sdk: no _rocm_sdk_core/lib/lib{"
                + ",".join(ROCM_SDK_PRELOADS)
                + "}.so* in the scanned trees"
            )
        options.preload = (*options.preload, *found)
    options.closure_paths = tuple(os.path.abspath(p) for p in options.closure_paths)
    analysis = analyse(inventory, options, progress)
    if options.probe:
        probe_analysis(analysis, options, progress)
    findings = list(inventory.findings) + analysis.reported_findings()
    sections: Sections = {
        "libraries": [
            library_to_dict(
                one,
                analysis.library_in_scan.get(one.path, True),
                analysis.library_identity.get(one.path),
                analysis.linkage_of(one.path),
            )
            for one in analysis.libraries
        ],
        "clashes": [clash_to_dict(c) for c in analysis.clashes],
        "pairs": [pair_to_dict(p, analysis.pair_probes.get(p.paths)) for p in analysis.pairs],
        "judged_pairs": analysis.judged_pairs,
    }
    if analysis.closures:
        sections["closures"] = [closure_to_dict(c, analysis.closure_roles) for c in analysis.closures]
    if analysis.probe_interpreter is not None:
        sections["probe_interpreter"] = interpreter_to_dict(analysis.probe_interpreter)
    high = sum(1 for c in analysis.clashes if c.risk is Risk.HIGH)
    confirmed = sum(1 for c in analysis.clashes if c.confirmed)
    summary = f"llvm: {len(analysis.libraries)} libraries, {len(analysis.clashes)} clash(es), {high} high" + (
        f", {confirmed} confirmed by probe" if options.probe else ""
    )
    return CommandOutcome(
        command="llvm",
        findings=findings,
        inputs=looked,
        sections=sections,
        summary=summary,
    )
