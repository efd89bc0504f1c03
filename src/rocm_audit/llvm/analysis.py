"""The analysis of `rocm-audit llvm` without probes: roles, the three kinds of clash (duplicates,
interposable exporters, closures) and the pairs the glibc-lookup model judges failing."""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from rocm_audit.elf import read as elfread
from rocm_audit.findings import Finding, make_finding
from rocm_audit.llvm import copies, fixes
from rocm_audit.llvm.clash_findings import MAX_VIA_ROOTS, at_path, clash_finding, expect_of, pair_finding
from rocm_audit.llvm.closure import Closure, HostView, ProcessModel
from rocm_audit.llvm.libfacts import LibraryFacts, identities, read_linkages_of
from rocm_audit.llvm.linkage import Linkage
from rocm_audit.llvm.optin import opt_in_libraries, soften_opt_in
from rocm_audit.llvm.pairs import PairJudge, PairVerdicts
from rocm_audit.llvm.prediction import Clash, Expect, Reason, Risk, binds_data, predict_closure, predict_pair
from rocm_audit.llvm.probes import (
    CLOSURE_MODES,
    DEFAULT_TIMEOUT_S,
    ProbeResult,
)
from rocm_audit.llvm.roles import ClFacts, Role
from rocm_audit.llvm.verdicts import Verdict
from rocm_audit.progress import SILENT, Progress
from rocm_audit.tree.discovery import Interpreter, is_tree_of
from rocm_audit.tree.identical import Candidate, CompareStats, ReadFailure, partition_identical
from rocm_audit.tree.inventory import FileKind, FileRecord, Inventory
from rocm_audit.tree.keeper import KeeperRule
from rocm_audit.tree.loader import LoaderModel
from rocm_audit.tree.ownership import Ownership, runtime_twin

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
    # The pairs each pair finding stands for, itself first (llvm/copies.py), and what says which
    # libraries are byte-identical copies of one another.
    pair_members: dict[tuple[str, str], list[PairVerdicts]] = field(default_factory=dict)
    class_of: copies.ClassOf = str
    pair_probes: dict[tuple[str, str], tuple[list[ProbeResult], list[Verdict]]] = field(default_factory=dict)
    facts: LibraryFacts | None = None
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
    facts: LibraryFacts,
    findings: list[Finding],
    preloaded: frozenset[tuple[int, int]] = frozenset(),
) -> tuple[list[Clash], dict[tuple[int, int], int], list[set[str]]]:
    """Clash kind 1, the group number of every exporter/registrant inode, and the classes of
    byte-identical copies among them (one path per inode)."""
    records = {r.path: r for r in inventory.files}
    ownership = Ownership.of_trees(inventory.sdk_trees)  # the keeper dedup keeps: a wheel's own copy first
    paths_by_identity: dict[tuple[int, int], list[str]] = {}
    for record in inventory.by_kind(FileKind.SHARED_LIBRARY):
        if facts.of(record.path, record.identity).llvm_role:
            paths_by_identity.setdefault(record.identity, []).append(record.path)
    _shared_inodes(inventory, paths_by_identity, findings)
    representatives = {identity: sorted(paths)[0] for identity, paths in paths_by_identity.items()}
    identical = _identical_classes(inventory, [records[p] for p in representatives.values()], findings)
    groups = _duplicate_groups(representatives, facts, identical)
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
    return clashes, group_of, identical


def _shared_inodes(
    inventory: Inventory, paths_by_identity: dict[tuple[int, int], list[str]], findings: list[Finding]
) -> None:
    """LLVM010 for every LLVM inode reached through several paths (hardlinks or symlinks)."""
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


def _duplicate_groups(
    representatives: dict[tuple[int, int], str], facts: LibraryFacts, identical: list[set[str]]
) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """The inodes of one library: union-find over "same SONAME" and "same bytes"."""
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
    for cls in identical:
        members = [identity_of_path[p] for p in cls]
        for other in members[1:]:
            union(members[0], other)
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for identity in representatives:
        groups.setdefault(find(identity), []).append(identity)
    return groups


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
    facts: LibraryFacts,
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
    facts = LibraryFacts(inventory, findings)
    host = HostView(options.sysroot, known_elf_keys=inventory.elf_keys(), unextracted=options.unextracted)
    loader = LoaderModel(sysroot=options.sysroot, ld_library_path=options.ld_library_path, host=host)

    def process() -> ProcessModel:
        return ProcessModel(loader, facts.dynamic, host)

    libraries = inventory.by_kind(FileKind.SHARED_LIBRARY)
    progress.phase("LLVM: reading roles", len(libraries), "libraries")
    for done, record in enumerate(libraries, 1):
        facts.of(record.path, record.identity)
        progress.update(done)
    preloaded = identities(options.preload)
    clashes, group_of, identical = _duplicate_clashes(inventory, facts, findings, preloaded)
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

    library_list, in_scan, identity_of = _library_list(inventory, libraries, facts)
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
        clash.finding = clash_finding(clash)
        findings.append(clash.finding)
    covered = {frozenset(c.paths) for c in clashes if c.judged is not None}
    covered |= {frozenset(c.judged.paths) for c in clashes if c.judged is not None}
    uncovered = [p for p in pairs if p.bad and frozenset(p.paths) not in covered]
    analysis = LlvmAnalysis(library_list, in_scan, identity_of, clashes, closures, closure_roles, findings)
    analysis.class_of = copies.class_map(identical)
    analysis.pair_members = copies.fold(uncovered, analysis.class_of, lambda _pair: ())
    for paths, members in analysis.pair_members.items():
        analysis.pair_findings[paths] = copies.with_copies(pair_finding(members[0], judge), members, analysis.class_of)
        findings.append(analysis.pair_findings[paths])
    analysis.pairs = uncovered
    analysis.judged_pairs = judged_count
    analysis.facts = facts
    analysis.judge = judge
    needed_names = {name for root in roots for name in (facts.dynamic(root) or elfread.EMPTY_DYNAMIC).needed}
    analysis.opt_in = opt_in_libraries(
        ((r.path, (facts.dynamic(r.path) or elfread.EMPTY_DYNAMIC).soname) for r in libraries), needed_names
    )
    return analysis


def _library_list(
    inventory: Inventory, libraries: Sequence[FileRecord], facts: LibraryFacts
) -> tuple[list[ClFacts], dict[str, bool], dict[str, tuple[int, int]]]:
    """The libraries listed in the report, whether each was scanned, and each one's inode."""
    # A hardlinked file is classified once and listed under each of its paths.
    library_list = [at_path(facts.by_identity[r.identity], r.path) for r in libraries]
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
    return library_list, in_scan, identity_of


MAX_JUDGED_LIBRARIES = 96  # 4560 pairs; beyond that only exporters and registrants are paired


def _by_soname(libraries: Sequence[FileRecord], facts: LibraryFacts) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    seen: set[tuple[int, int]] = set()
    for record in sorted(libraries, key=lambda r: r.path):
        dynamic = facts.dynamic(record.path)
        if dynamic is not None and dynamic.soname and record.identity not in seen:
            seen.add(record.identity)
            found.setdefault(dynamic.soname, []).append(record.path)
    return found


def _judge_pairs(
    libraries: Sequence[FileRecord],
    facts: LibraryFacts,
    judge: PairJudge,
    clashes: list[Clash],
    progress: Progress = SILENT,
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
        read_linkages_of(facts.inventory, carriers)  # several at a time; the loop finds them read
    for done, record in enumerate(carriers, 1):
        progress.update(done)
        if record.identity in seen:
            continue
        seen.add(record.identity)
        linkage = facts.linkage(record.path, record.identity)
        if linkage.takes_part:
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
            clash.predictions = {mode: expect_of(p.verdict) for mode, p in clash.closure_judged.items()}
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
        clash.predictions = {mode: expect_of(p.verdict) for mode, p in worst_order.modes.items()}
        if clash.reason is Reason.INTERPOSABLE_EXPORTERS:
            clash.paths = (worst_order.first, worst_order.second)
            caution = judge.global_caution(*clash.paths)
            clash.fix = fixes.pair_fix(*clash.paths, caution, clash.judged.arrives_through())
        clash.risk = Risk.HIGH if clash.judged.bad else Risk.LOW
    return list(results.values()), len(results)
