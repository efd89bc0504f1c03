"""Plan: group byte-identical (and hardlinked) SDK libraries and choose each group's keeper."""

from __future__ import annotations

import functools
import os
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from rocm_audit.dedup import tuning
from rocm_audit.dedup.groups import DedupGroup, DedupPlan, PlannedLink
from rocm_audit.dedup.keeping import group_from
from rocm_audit.dedup.mirrored import mirrored_groups
from rocm_audit.errors import FormatError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.progress import SILENT, Progress
from rocm_audit.rulebook.policy import policy
from rocm_audit.tree.forkmap import fork_imap, worker_count
from rocm_audit.tree.identical import (
    CHUNK_BYTES,
    MAX_LOCKSTEP_MEMBERS,
    Candidate,
    CompareStats,
    HeadFilter,
    ReadFailure,
    equal_over,
    keeping_open,
    middle_pieces,
    partition_identical,
    refine,
)
from rocm_audit.tree.inventory import TEMP_PREFIX, FileKind, FileRecord, Inventory, ListedFile, classify
from rocm_audit.tree.keeper import KeeperRule
from rocm_audit.tree.ownership import Ownership

# The plan's shapes live in dedup/groups.py; importers keep finding them here.
__all__ = [
    "BucketPiece",
    "DedupGroup",
    "DedupPlan",
    "PlannedLink",
    "hardlinked",
    "make_plan",
    "regroup_differing",
]


def hardlinked(listed: list[ListedFile]) -> set[str]:
    """The files dedup's inventory opens: hardlinked ones, whose kind a plan needs without any
    content comparison. Every other candidate is first opened by the comparison itself, which
    classifies one member per class of identical heads; a file of unique size is never opened."""
    return {entry.path for entry in listed if entry.sdk_tree is not None and entry.nlink > 1}


def _kind_filter(kinds: set[FileKind], findings: list[Finding]) -> HeadFilter:
    def wanted(path: str, fd: int, head: memoryview) -> bool:
        try:
            kind, _ = classify(fd, bytes(head), os.fstat(fd).st_size)
        except FormatError as exc:
            findings.append(make_finding("SCAN002", path, exc.reason, data={"offset": exc.offset}))
            return False
        return kind in kinds

    return wanted


def make_plan(inventory: Inventory, *, exact: bool = True, progress: Progress = SILENT) -> DedupPlan:
    """Group byte-identical (and hardlinked) SDK shared libraries and choose each group's keeper.

    ``exact=False`` is for a run that applies the plan at once: the apply step must byte-compare
    every pair just before replacing it anyway, so the plan stops after size, head and tail and
    each file is read in full only once, by that comparison (apply_plan regroups the rare member
    that turns out to differ from its keeper).
    """
    settings = policy("dedup")
    kinds = {FileKind(k) for k in settings.get("kinds", ["shared-library"])}
    findings: list[Finding] = []
    stats = CompareStats()
    # kind None: not opened yet (dedup's own inventory); the comparison classifies those.
    # A leftover temporary name of a killed run (a hardlink of a keeper, say) is removed, never planned.
    candidates = [
        r
        for r in inventory.files
        if r.sdk_tree is not None
        and (r.kind is None or r.kind in kinds)
        and not os.path.basename(r.path).startswith(TEMP_PREFIX)
    ]
    paths_by_inode = _paths_by_inode(candidates)
    ownership = Ownership.of_trees(inventory.sdk_trees)
    intact: list[tuple[str, list[str]]] = []
    with keeping_open():  # a file compared in pieces is opened once, by all processes together
        groups = _groups_among(
            paths_by_inode,
            inventory,
            findings,
            stats,
            exact=exact,
            kinds=kinds,
            ownership=ownership,
            intact=intact,
            progress=progress,
        )
        classed = {p for g in groups for p in (g.keeper.path, *(d.record.path for d in g.duplicates))}
        classed.update(p for _, paths in intact for p in paths)
        groups += mirrored_groups(inventory, ownership, classed, stats, findings, intact, exact=exact)
    for records in paths_by_inode.values():
        if records[0].nlink > len(records):
            findings.append(
                make_finding(
                    "DUP009",
                    records[0].path,
                    f"link count {records[0].nlink} but {len(records)} path(s) under the audited trees",
                    related=[r.path for r in records[1:]],
                )
            )
    groups.sort(key=lambda g: g.keeper.path)
    intact.sort()
    return DedupPlan(inventory, groups, findings, stats, exact, ownership, intact)


@dataclass(slots=True)
class _BucketOutcome:
    """One size bucket, or one piece of one, compared (possibly in a forkmap helper, hence plain
    picklable data)."""

    classes: list[list[str]]  # paths of members equal over what was compared
    failures: list[ReadFailure]
    findings: list[Finding]  # malformed files met while classifying
    bytes_read: int


@dataclass(frozen=True, slots=True)
class BucketPiece:
    """The members of one probable class (equal size, head and tail) over one range of their bytes."""

    probable: int  # which probable class
    members: tuple[Candidate, ...]
    byte_range: tuple[int, int]


def _paths_by_inode(records: list[FileRecord]) -> dict[tuple[str, int, int], list[FileRecord]]:
    paths_by_inode: dict[tuple[str, int, int], list[FileRecord]] = defaultdict(list)
    for record in records:
        paths_by_inode[(record.root, record.dev, record.ino)].append(record)
    return paths_by_inode


def _groups_among(
    paths_by_inode: dict[tuple[str, int, int], list[FileRecord]],
    inventory: Inventory,
    findings: list[Finding],
    stats: CompareStats,
    *,
    exact: bool,
    kinds: set[FileKind] | None,
    ownership: Ownership,
    intact: list[tuple[str, list[str]]],
    progress: Progress = SILENT,
) -> list[DedupGroup]:
    """Groups of identical inodes (and of paths of one inode), each with its keeper chosen.
    ``kinds``: classify the files the inventory did not open, and keep only these kinds.
    Expansions already on their keeper's inode go to ``intact``, not into a group."""
    buckets = _size_buckets(paths_by_inode)
    if buckets:
        progress.phase(f"comparing {len(buckets)} candidate group{'s' if len(buckets) > 1 else ''}", len(buckets))
    # What each bucket will read: everything when exact; else head and tail (a file that fits one
    # chunk is read whole).
    weights = [len(b) * (b[0].size if exact else min(b[0].size, CHUNK_BYTES)) for b in buckets]
    workers = worker_count(sum(weights), tuning.PARALLEL_MIN_BYTES)
    run = _Grouping(
        buckets,
        paths_by_inode,
        inventory,
        stats,
        kinds,
        exact,
        ownership,
        intact,
        KeeperRule.from_policy(),
        functools.lru_cache(maxsize=None)(os.path.realpath),  # one realpath per directory
        functools.lru_cache(maxsize=None)(os.path.relpath),  # one relpath per directory pair
    )
    bytes_before = stats.bytes_read
    work = run.work_items(weights, workers)
    run.compare_all(work, workers, progress)
    stats.bytes_read = bytes_before + run.bytes_read
    for number in sorted(run.found_by_bucket):
        findings.extend(run.found_by_bucket[number])
    # A single inode with several paths in the trees is a hardlink group on its own.
    for key, records in paths_by_inode.items():
        if key not in run.grouped and len(records) > 1:
            run.groups.extend(
                group_from(records, inventory, run.keeper_rule, findings, ownership, intact, run.realdir, run.reldir)
            )
    return run.groups


def _size_buckets(paths_by_inode: dict[tuple[str, int, int], list[FileRecord]]) -> list[list[FileRecord]]:
    """Size buckets of distinct inodes (one record each, by inode number); never read anything for
    a singleton (peers.md 1)."""
    inodes_by_size: dict[tuple[str, int, int], list[FileRecord]] = defaultdict(list)
    for records in paths_by_inode.values():
        first = records[0]
        inodes_by_size[(first.root, first.dev, first.size)].append(first)
    return [sorted(reps, key=lambda r: r.ino) for _, reps in sorted(inodes_by_size.items()) if len(reps) > 1]


@dataclass(slots=True)
class _WorkItems:
    """What the helpers compare: whole buckets, and pieces of the large ones once their heads and
    tails agree, with each item's weight and bucket, and each probable class's members and count
    of pieces."""

    items: list[list[FileRecord] | BucketPiece] = field(default_factory=list)
    weights: list[int] = field(default_factory=list)
    buckets: list[int] = field(default_factory=list)
    probable: list[tuple[int, tuple[Candidate, ...], int]] = field(default_factory=list)

    def add(self, item: list[FileRecord] | BucketPiece, weight: int, bucket_number: int) -> None:
        self.items.append(item)
        self.weights.append(weight)
        self.buckets.append(bucket_number)


@dataclass(slots=True)
class _Grouping:
    """One run of :func:`_groups_among`: the buckets it compares, what the comparisons found (by
    bucket, merged in bucket order so that it is the same each run), and the groups built so far."""

    buckets: list[list[FileRecord]]
    paths_by_inode: dict[tuple[str, int, int], list[FileRecord]]
    inventory: Inventory
    stats: CompareStats
    kinds: set[FileKind] | None
    exact: bool
    ownership: Ownership
    intact: list[tuple[str, list[str]]]
    keeper_rule: KeeperRule
    realdir: Callable[[str], str]
    reldir: Callable[[str, str], str]
    groups: list[DedupGroup] = field(default_factory=list)
    grouped: set[tuple[str, int, int]] = field(default_factory=set)
    found_by_bucket: dict[int, list[Finding]] = field(default_factory=lambda: defaultdict(list))
    bytes_read: int = 0  # helpers count in their own copy of stats

    def compare(self, item: list[FileRecord] | BucketPiece, *, full: bool | None = None) -> _BucketOutcome:
        """Compare one whole bucket (in full, or size, head and tail only) or one piece."""
        failures: list[ReadFailure] = []
        found: list[Finding] = []
        before = self.stats.bytes_read
        if isinstance(item, BucketPiece):
            classes = equal_over(item.members, item.byte_range, self.stats, failures)
        else:
            kinds = self.kinds
            unread = kinds is not None and any(r.kind is None for r in item)
            classes = partition_identical(
                [Candidate(r.path, r.size, r.head_digest) for r in item],
                self.stats,
                failures,
                _kind_filter(kinds, found) if unread and kinds else None,
                full=self.exact if full is None else full,
            )
        return _BucketOutcome(
            [[c.path for c in cls] for cls in classes], failures, found, self.stats.bytes_read - before
        )

    def take(self, bucket_number: int, outcome: _BucketOutcome) -> None:
        """Record what a comparison found; classes that are final become groups at once."""
        self.bytes_read += outcome.bytes_read
        found = self.found_by_bucket[bucket_number]
        found.extend(outcome.findings)
        for failure in outcome.failures:
            found.append(make_finding("SCAN001", failure.path, f"cannot read: {failure.error.strerror}"))

    def group(self, bucket_number: int, classes: list[list[str]]) -> None:
        """Make groups of the final classes of one bucket."""
        by_path = {r.path: r for r in self.buckets[bucket_number]}
        for paths in classes:
            keys = [(r.root, r.dev, r.ino) for r in (by_path[p] for p in paths)]
            self.grouped.update(keys)
            self.groups.extend(
                group_from(
                    [r for key in keys for r in self.paths_by_inode[key]],
                    self.inventory,
                    self.keeper_rule,
                    self.found_by_bucket[bucket_number],
                    self.ownership,
                    self.intact,
                    self.realdir,
                    self.reldir,
                )
            )

    def work_items(self, weights: list[int], workers: int) -> _WorkItems:
        """Whole buckets, and pieces of the large ones: those are compared over head and tail
        here first, and only the members of each probable class are split into pieces."""
        work = _WorkItems()
        for number, bucket in enumerate(self.buckets):
            if (
                workers < 2
                or not self.exact
                or weights[number] <= tuning.PIECE_BYTES
                or len(bucket) > MAX_LOCKSTEP_MEMBERS
            ):
                work.add(bucket, weights[number], number)
                continue
            outcome = self.compare(bucket, full=False)
            self.take(number, outcome)
            by_path = {r.path: r for r in bucket}
            if not outcome.failures:  # members in no probable class differ in head or tail from all others
                in_classes = {p for cls in outcome.classes for p in cls}
                self.inventory.identical.record([r.identity for r in bucket if r.path not in in_classes], [])
            for paths in outcome.classes:
                members = tuple(Candidate(p, by_path[p].size, None) for p in paths)
                ranges = middle_pieces(bucket[0].size, tuning.PIECE_BYTES // len(members))
                work.probable.append((number, members, len(ranges)))
                for byte_range in ranges:
                    work.add(
                        BucketPiece(len(work.probable) - 1, members, byte_range),
                        len(members) * (byte_range[1] - byte_range[0]),
                        number,
                    )
                if not ranges:  # head and tail were all of it
                    self.group(number, [list(paths)])
        return work

    def compare_all(self, work: _WorkItems, workers: int, progress: Progress) -> None:
        """Compare every item; groups are built as answers come in, while helpers still compare
        the rest. Heaviest first keeps the end of the run balanced."""
        pieces_in: dict[int, list[list[list[Candidate]]]] = defaultdict(list)
        items_left = Counter(work.buckets)  # a bucket is compared once its last item is in
        buckets_done = len(self.buckets) - len(items_left)
        progress.update(buckets_done)
        for index, outcome in fork_imap(self.compare, work.items, work.weights, workers):
            item, number = work.items[index], work.buckets[index]
            self.take(number, outcome)
            items_left[number] -= 1
            if not items_left[number]:
                buckets_done += 1
            progress.update(buckets_done, self.bytes_read)  # per piece too: two 1 GiB libraries take seconds
            if not isinstance(item, BucketPiece):
                self.whole_bucket_compared(number, outcome)
                continue
            _, members, expected = work.probable[item.probable]
            member_by_path = {one.path: one for one in members}
            partitions = pieces_in[item.probable]
            partitions.append([[member_by_path[p] for p in cls] for cls in outcome.classes])
            if len(partitions) == expected:
                self.pieces_compared(number, members, partitions)
                del pieces_in[item.probable]

    def whole_bucket_compared(self, number: int, outcome: _BucketOutcome) -> None:
        if self.exact and not outcome.failures:  # compared in full: later checks need not read again
            identity_of = {r.path: r.identity for r in self.buckets[number]}
            self.inventory.identical.record(
                [r.identity for r in self.buckets[number]],
                [[identity_of[p] for p in cls] for cls in outcome.classes],
            )
        self.group(number, outcome.classes)

    def pieces_compared(
        self, number: int, members: tuple[Candidate, ...], partitions: list[list[list[Candidate]]]
    ) -> None:
        refined = refine(members, partitions)
        if not any(f.rule == "SCAN001" for f in self.found_by_bucket[number]):  # no piece failed to read
            identity_of = {r.path: r.identity for r in self.buckets[number]}
            self.inventory.identical.record(
                [identity_of[one.path] for one in members],
                [[identity_of[one.path] for one in cls] for cls in refined],
            )
        self.group(number, [[one.path for one in cls] for cls in refined])


def regroup_differing(
    group: DedupGroup, different: list[PlannedLink], plan: DedupPlan, findings: list[Finding]
) -> list[DedupGroup]:
    """Take members that differ from their keeper out of the group; group them among themselves,
    exactly this time. A member left alone was never a duplicate: it is not reported."""
    group.duplicates = [d for d in group.duplicates if d not in different]
    for planned in different:
        del group.status[planned.record.path]
    paths_by_inode = _paths_by_inode([d.record for d in different])
    # Classified again: equal heads do not make equal dynamic sections (a PIE tells itself apart there).
    kinds = {FileKind(k) for k in policy("dedup").get("kinds", ["shared-library"])}
    regrouped = _groups_among(
        paths_by_inode,
        plan.inventory,
        findings,
        plan.stats,
        exact=True,
        kinds=kinds,
        ownership=plan.ownership,
        intact=plan.intact,
    )
    plan.groups.extend(regrouped)
    return regrouped


# What TheRock never mirrors into devel (rocm_sdk/tests/devel_test.py skips them too).
