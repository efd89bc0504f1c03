"""Apply a plan: lock the trees, journal, compare each pair (helpers share the reading), link, verify."""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rocm_audit.dedup import tuning
from rocm_audit.dedup.link import (
    DIFFERS,
    PairBefore,
    PairPiece,
    Skip,
    compare_piece,
    look_before,
    remove_leftover,
    replace_with_link,
)
from rocm_audit.dedup.manifest import default_manifest_path, journal_changes, list_in_record
from rocm_audit.dedup.plan import DedupGroup, DedupPlan, PlannedLink, regroup_differing
from rocm_audit.dedup.verify import NeededBefore, needed_before, verify_applied
from rocm_audit.errors import Interrupted
from rocm_audit.findings import Finding, make_finding
from rocm_audit.progress import SILENT, Progress
from rocm_audit.tree.forkmap import fork_imap, worker_count
from rocm_audit.tree.identical import pieces
from rocm_audit.tree.inventory import TEMP_PREFIX, Inventory
from rocm_audit.tree.journal import one_change, tree_locks


class _NoManifest(Exception):
    """The revert manifest could not be written: nothing may change."""


@dataclass(frozen=True, slots=True)
class SnapshotShare:
    """Some of the duplicates whose DT_NEEDED resolution is recorded before the first change."""

    paths: tuple[str, ...]


@dataclass(slots=True)
class BeforeChanges:
    """What an applying run's first round does before its first change: journal the plan (in this
    process, once the comparisons have begun) and record DT_NEEDED resolutions (in any process;
    the resolutions arrive in ``snapshot``)."""

    journal: Callable[[], None]
    snapshot_paths: list[str]
    snapshot: dict[str, NeededBefore] = field(default_factory=dict)


@dataclass(slots=True)
class ApplyResult:
    replaced: int = 0
    skipped: int = 0
    bytes_freed: int = 0
    verified: bool | None = None
    manifest: str | None = None
    planned: int = 0  # changes the plan held when the run began


def apply_plan(
    plan: DedupPlan, manifest_path: str | None, findings: list[Finding], progress: Progress = SILENT
) -> ApplyResult:
    """Carry out the plan; every skip or failure becomes a finding and the run goes on.

    Raises Interrupted on Ctrl-C: each change is made whole or not at all (tree/journal.py
    one_change), and the exception says how many were made."""
    result = ApplyResult()
    if not plan.groups:
        return result
    planned = result.planned = sum(len(g.duplicates) for g in plan.groups)
    try:
        return _apply_locked(plan, manifest_path, findings, progress, result, planned)
    except Interrupted:
        raise
    except KeyboardInterrupt:
        raise Interrupted("dedup", result.replaced, planned, result.manifest if result.replaced else None) from None


def _apply_locked(
    plan: DedupPlan,
    manifest_path: str | None,
    findings: list[Finding],
    progress: Progress,
    result: ApplyResult,
    planned: int,
) -> ApplyResult:
    trees = sorted(
        {r.sdk_tree for g in plan.groups for r in (g.keeper, *(d.record for d in g.duplicates)) if r.sdk_tree}
    )
    with tree_locks(trees) as busy:
        if busy:
            for tree in busy:
                findings.append(make_finding("DUP008", tree, "another rocm-audit run holds this tree; nothing changed"))
            _skip_all(plan.groups, result)
            return result
        result.manifest = manifest = os.path.abspath(manifest_path or default_manifest_path(plan))
        run_id = os.urandom(8).hex()

        def journal() -> None:
            try:
                journal_changes(manifest, plan.groups, run_id, header=True)
            except OSError as exc:
                raise _NoManifest(exc.strerror) from None
            if manifest_path is None:  # the default place: pip uninstall takes it away with the links
                # Best effort: an unwritable RECORD only means the manifest outlives an uninstall.
                with contextlib.suppress(OSError):
                    list_in_record(manifest, plan)
            _remove_leftovers(plan.inventory, findings)

        first = BeforeChanges(journal, [d.record.path for g in plan.groups for d in g.duplicates])
        progress.phase("comparing and linking", planned, "files")
        try:
            pending = _regrouped(
                _apply_groups(plan.groups, plan, result, findings, first, progress), plan, result, findings, run_id
            )
        except _NoManifest as missing:  # no manifest, no way back (a read-only tree fails here too)
            findings.append(
                make_finding("DUP005", manifest, f"cannot write the revert manifest: {missing}; nothing changed")
            )
            _skip_all(plan.groups, result)
            result.manifest = None
            return result
        while pending:
            pending = _regrouped(
                _apply_groups(pending, plan, result, findings, progress=progress), plan, result, findings, run_id
            )
        plan.groups[:] = sorted((g for g in plan.groups if g.duplicates), key=lambda g: g.keeper.path)
        progress.phase("checking what each changed library loads")
        result.verified = verify_applied(plan, first.snapshot, findings)
    return result


def _skip_all(groups: list[DedupGroup], result: ApplyResult) -> None:
    for group in groups:
        for planned in group.duplicates:
            if group.status[planned.record.path] == "planned":
                group.status[planned.record.path] = "skipped"
                result.skipped += 1


def _apply_groups(
    groups: list[DedupGroup],
    plan: DedupPlan,
    result: ApplyResult,
    findings: list[Finding],
    first: BeforeChanges | None = None,
    progress: Progress = SILENT,
) -> list[tuple[DedupGroup, list[PlannedLink]]]:
    """Re-check and byte-compare every planned pair, and replace each duplicate as soon as its
    comparison is in: forked helpers share the reading while this process renames. ``first``
    (the first round) is done before the first change: its snapshot shares go first to whoever is
    free, its journal runs here meanwhile, and pairs compared before both are done wait. Returns
    the members whose bytes differ from their keeper's, by group (only an inexact plan has them:
    they agreed on size, head and tail)."""
    run = _Linking(_pairs_to_link(groups, result, findings), plan, result, findings, progress)
    compared, owners = _pieces_by_pair(run.pairs)
    workers = worker_count(sum(2 * (p.byte_range[1] - p.byte_range[0]) for p in compared), tuning.PARALLEL_MIN_BYTES)
    items: list[PairPiece | SnapshotShare] = list(compared)
    priorities = list(range(len(compared), 0, -1))  # in the order just built
    shares_left = 0
    if first is not None:  # the snapshot shares go before every piece: no link is made without them
        paths = first.snapshot_paths
        for start in range(0, len(paths), tuning.SNAPSHOT_SHARE):
            items.append(SnapshotShare(tuple(paths[start : start + tuning.SNAPSHOT_SHARE])))
            priorities.append(len(compared) + 1)
            shares_left += 1
    outstanding = Counter(owners)
    problems: dict[int, str] = {}
    waiting: list[int] = []  # pairs compared before the snapshot was complete
    stats = plan.stats
    bytes_before = stats.bytes_read

    def work(item: PairPiece | SnapshotShare) -> Any:
        return needed_before(item.paths) if isinstance(item, SnapshotShare) else compare_piece(item, stats)

    for index, answer in fork_imap(work, items, priorities, workers, meanwhile=first.journal if first else None):
        item = items[index]
        if isinstance(item, SnapshotShare):
            assert first is not None  # only the first round has shares
            first.snapshot.update(answer)
            shares_left -= 1
            if not shares_left:
                for number in waiting:
                    run.finish(number, problems.get(number))
            continue
        problem, count = answer
        run.bytes_read += count  # helpers count in their own copy of stats
        progress.update(result.replaced + result.skipped, run.bytes_read)
        number = owners[index]
        if problem is not None:
            problems.setdefault(number, problem)
        outstanding[number] -= 1
        if outstanding[number]:
            continue
        if shares_left:
            waiting.append(number)
        else:
            run.finish(number, problems.get(number))
    stats.bytes_read = bytes_before + run.bytes_read
    for number, (_, planned, _) in enumerate(run.pairs):
        if planned.hardlink:  # one inode: nothing to compare
            run.finish(number, None)
    return list(run.differing.values())


def _pairs_to_link(
    groups: list[DedupGroup], result: ApplyResult, findings: list[Finding]
) -> list[tuple[DedupGroup, PlannedLink, PairBefore]]:
    """Every planned pair with its look before the change; a pair that fails that look is skipped."""
    pairs: list[tuple[DedupGroup, PlannedLink, PairBefore]] = []
    for group in groups:
        for planned in group.duplicates:
            if group.status[planned.record.path] != "planned":
                continue  # skipped when its manifest entries could not be written
            try:
                pairs.append((group, planned, look_before(group, planned)))
            except Skip as skip:
                _record_skip(group, planned, skip, result, findings)
    return pairs


def _pieces_by_pair(pairs: list[tuple[DedupGroup, PlannedLink, PairBefore]]) -> tuple[list[PairPiece], list[int]]:
    """The pieces to compare, and the pair each belongs to.

    Pieces of about tuning.PIECE_BYTES each, so that processes share even one pair of 1 GB
    libraries. Smallest pairs first, each pair's pieces one after another: pairs complete from the
    start, and this process, which alone makes the links, has a steady supply of them while helpers
    read the large pairs (largest first, the first link waited for every 1 GB pair's last piece)."""
    compared: list[PairPiece] = []
    owners: list[int] = []
    for number in sorted(range(len(pairs)), key=lambda n: pairs[n][0].size):
        group, planned, _ = pairs[number]
        if planned.hardlink:
            continue  # one inode: nothing to compare
        for byte_range in pieces(group.keeper.size, tuning.PIECE_BYTES // 2):
            compared.append(PairPiece(group.keeper.path, planned.record.path, group.keeper.size, byte_range))
            owners.append(number)
    return compared, owners


@dataclass(slots=True)
class _Linking:
    """The pairs of one round of :func:`_apply_groups` and what became of them."""

    pairs: list[tuple[DedupGroup, PlannedLink, PairBefore]]
    plan: DedupPlan
    result: ApplyResult
    findings: list[Finding]
    progress: Progress
    differing: dict[int, tuple[DedupGroup, list[PlannedLink]]] = field(default_factory=dict)
    bytes_read: int = 0  # helpers count in their own copy of stats

    def finish(self, number: int, problem: str | None) -> None:
        """Replace pair ``number`` now that its comparison is in (or skip it, with a finding)."""
        group, planned, before = self.pairs[number]
        result = self.result
        if problem == DIFFERS and not self.plan.exact:
            self.differing.setdefault(id(group), (group, []))[1].append(planned)
            return
        with one_change():  # a Ctrl-C waits until the link is in place and counted
            try:
                if problem == DIFFERS:
                    raise Skip("DUP003", "bytes differ from the keeper at apply time")
                if problem is not None:
                    raise Skip("DUP005", problem)
                replace_with_link(group, planned, before)
            except Skip as skip:
                _record_skip(group, planned, skip, result, self.findings)
            else:
                group.status[planned.record.path] = "replaced"
                result.replaced += 1
                if not planned.hardlink:
                    result.bytes_freed += group.size
        self.progress.update(result.replaced + result.skipped, self.bytes_read)


def _regrouped(
    differing: list[tuple[DedupGroup, list[PlannedLink]]],
    plan: DedupPlan,
    result: ApplyResult,
    findings: list[Finding],
    run_id: str,
) -> list[DedupGroup]:
    """New exact groups of the members that differ from their keeper, journalled (one fsync for
    them all) before any change."""
    pending: list[DedupGroup] = []
    for group, different in differing:
        pending.extend(regroup_differing(group, different, plan, findings))
    try:
        journal_changes(result.manifest or "", pending, run_id, header=False)
    except OSError as exc:
        findings.append(
            make_finding("DUP005", result.manifest or "", f"cannot write the revert manifest: {exc.strerror}")
        )
        _skip_all(pending, result)
    return pending


def _record_skip(
    group: DedupGroup, planned: PlannedLink, skip: Skip, result: ApplyResult, findings: list[Finding]
) -> None:
    findings.append(make_finding(skip.rule, planned.record.path, skip.message, related=[group.keeper.path]))
    group.status[planned.record.path] = "skipped" if skip.rule == "DUP003" else "failed"
    result.skipped += 1


def _remove_leftovers(inventory: Inventory, findings: list[Finding]) -> None:
    """Remove temporary links and copies an interrupted run left (fixed prefix, inside SDK trees only)."""
    leftovers = [r.path for r in inventory.files if r.sdk_tree and os.path.basename(r.path).startswith(TEMP_PREFIX)]
    leftovers += [
        link.path for link in inventory.links if link.sdk_tree and os.path.basename(link.path).startswith(TEMP_PREFIX)
    ]
    for path in leftovers:
        remove_leftover(path, findings)
    # The inventory reported them (SCAN004); once removed they are no longer a problem.
    removed = set(leftovers)
    inventory.findings[:] = [
        f for f in inventory.findings if not (f.rule == "SCAN004" and f.path in removed and not os.path.lexists(f.path))
    ]
