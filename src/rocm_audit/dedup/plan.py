"""Plan: group byte-identical (and hardlinked) SDK libraries and choose each group's keeper."""

from __future__ import annotations

import functools
import os
import stat
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from rocm_audit.dedup import tuning
from rocm_audit.errors import FormatError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.progress import SILENT, Progress
from rocm_audit.rulebook.policy import policy
from rocm_audit.tree.forkmap import fork_imap, worker_count
from rocm_audit.tree.identical import (
    CHUNK_BYTES,
    HEAD_BYTES,
    MAX_LOCKSTEP_MEMBERS,
    TAIL_BYTES,
    Candidate,
    CompareStats,
    HeadFilter,
    ReadFailure,
    equal_over,
    keeping_open,
    middle_pieces,
    partition_identical,
    refine,
    same_bytes,
)
from rocm_audit.tree.inventory import TEMP_PREFIX, FileKind, FileRecord, Inventory, ListedFile, classify
from rocm_audit.tree.keeper import KeeperRule
from rocm_audit.tree.ownership import Ownership, is_family_distribution, sibling_trees, tree_relpath


@dataclass(frozen=True, slots=True)
class PlannedLink:
    record: FileRecord  # the duplicate as the plan saw it
    link_text: str  # relative symlink text, as `ln -sr` would write it
    hardlink: bool  # shares the keeper's inode
    # What replaces the duplicate: "symlink" (link_text), or "hardlink" of the keeper for what TheRock
    # links itself (its device reconcile re-hardlinks a symlink; mirrored data files and executables,
    # which find their siblings through /proc/self/exe, must stay regular files).
    make: str = "symlink"
    # An expansion already on its owned keeper's inode, as rocm-sdk init made it: one library for the
    # loader now; the symlink is hardening (it survives a per-tree copy), so --check does not fail on it.
    intact: bool = False


@dataclass(slots=True)
class DedupGroup:
    keeper: FileRecord
    duplicates: list[PlannedLink]
    reason: str  # "identical-content", "hardlink", or "mirrored" (a devel file split from its runtime twin)
    status: dict[str, str] = field(default_factory=dict)  # duplicate path -> planned/replaced/...
    # The keeper's st_ctime_ns after this run hardlinked it (a link moves it): the last look expects it.
    keeper_ctime_ns_ours: int | None = None

    @property
    def size(self) -> int:
        return self.keeper.size

    def bytes_freed_if_done(self) -> int:
        # Hardlinks already share blocks: turning them into symlinks frees nothing.
        return sum(self.size for d in self.duplicates if not d.hardlink)


@dataclass(slots=True)
class DedupPlan:
    inventory: Inventory
    groups: list[DedupGroup]
    findings: list[Finding]
    stats: CompareStats
    exact: bool = True  # False: members agree on size, head and tail; apply_plan compares the rest
    ownership: Ownership = field(default_factory=lambda: Ownership({}, {}))
    # Expansions that already share their runtime file's inode, as rocm-sdk made them: (keeper, paths).
    intact: list[tuple[str, list[str]]] = field(default_factory=list)


def relative_link_text(
    keeper_real: str,
    link_path: str,
    realdir: Callable[[str], str] = os.path.realpath,
    reldir: Callable[[str, str], str] = os.path.relpath,
) -> str:
    """The text `ln -sr keeper link` writes: the keeper's real path relative to the link's real
    directory. ``realdir`` and ``reldir`` may be cached: a plan asks about few directories, and
    their real paths and relative paths cost a system call or a string walk per component."""
    keeper_dir, name = os.path.split(keeper_real)
    up = reldir(keeper_dir, realdir(os.path.dirname(link_path)))
    return name if up == "." else f"{up}/{name}"


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def hardlinked(listed: list[ListedFile]) -> set[str]:
    """The files dedup's inventory opens: hardlinked ones, whose kind a plan needs without any
    content comparison. Every other candidate is first opened by the comparison itself, which
    classifies one member per class of identical heads; a file of unique size is never opened."""
    return {entry.path for entry in listed if entry.sdk_tree is not None and entry.stat.st_nlink > 1}


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
        groups += _mirrored_groups(inventory, ownership, classed, stats, findings, intact, exact=exact)
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
                _group_from(records, inventory, run.keeper_rule, findings, ownership, intact, run.realdir, run.reldir)
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
                _group_from(
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


def _group_from(
    records: list[FileRecord],
    inventory: Inventory,
    keeper_rule: KeeperRule,
    findings: list[Finding],
    ownership: Ownership,
    intact: list[tuple[str, list[str]]],
    realdir: Callable[[str], str] = os.path.realpath,
    reldir: Callable[[str, str], str] = os.path.relpath,
) -> list[DedupGroup]:
    """The groups of byte-identical ``records`` (none when nothing may change). Ownership first
    (tree/ownership.py): the keeper is a copy a wheel installed when there is one; a copy another
    distribution installed stays its own (DUP010), and an expansion already on the keeper's inode
    is left as rocm-sdk made it. An expansion whose distribution names the other owner it was
    built against (``Ownership.made_for``) goes with that owner's copy, in a group of its own."""
    owner = {r.path: ownership.owner(r.path) for r in records}
    ordered = _keeper_first(records, owner, inventory, keeper_rule, findings)
    keeper = ordered[0]
    keeper_owner = owner[keeper.path]
    foreign = [r for r in ordered[1:] if owner[r.path] not in (None, keeper_owner)]
    expansions = _Expansions.sort_out(ordered, owner, foreign, ownership)
    for record in expansions.with_other_owner:
        intact.append((expansions.foreign_inodes[record.identity].path, [record.path]))
    for record in expansions.mismatched:
        findings.append(
            make_finding(
                "DUP010",
                record.path,
                f"its distribution was built against {expansions.made_for[record.path]}, which installs no copy "
                f"with these bytes here ({keeper_owner}'s is the same bytes), so it is left as it is",
                related=[keeper.path],
                data={"owner": None, "others": [keeper_owner]},
            )
        )
    groups: list[DedupGroup] = []
    for other in sorted({expansions.made_for[r.path] for r in expansions.elsewhere}, key=str):
        groups += _group_from(
            [r for r in records if owner[r.path] == other]
            + [r for r in expansions.elsewhere if expansions.made_for[r.path] == other],
            inventory,
            keeper_rule,
            findings,
            ownership,
            intact,
            realdir,
            reldir,
        )
    split = [r for r in foreign if r.identity != keeper.identity]
    if split:
        findings.append(
            make_finding(
                "DUP010",
                keeper.path,
                f"{len(split)} copy(ies) of these bytes installed by another distribution "
                f"({', '.join(sorted({owner[r.path] or '' for r in split}))}); each owns its copy, none is linked",
                related=[r.path for r in split],
                data={"owner": keeper_owner, "others": sorted({owner[r.path] or "" for r in split})},
            )
        )
    left_alone = foreign + expansions.left_alone()
    group = _group_of_changeable(
        ordered, left_alone, keeper_owner is not None, findings, ownership, intact, realdir, reldir
    )
    return groups if group is None else [*groups, group]


def _keeper_first(
    records: list[FileRecord],
    owner: dict[str, str | None],
    inventory: Inventory,
    keeper_rule: KeeperRule,
    findings: list[Finding],
) -> list[FileRecord]:
    """``records`` in the keeper rule's order, the keeper first (the SONAME read only when the
    rule needs it to break a tie)."""
    soname = None
    if keeper_rule.needs_soname([r.sdk_tree for r in records], [owner[r.path] is not None for r in records]):
        try:
            soname = inventory.dynamic(records[0]).soname
        except (OSError, FormatError) as exc:  # a malformed dynamic section only loses the SONAME tie-break
            findings.append(make_finding("SCAN002", records[0].path, f"cannot read the dynamic section: {exc}"))
    return sorted(
        records, key=lambda r: keeper_rule.sort_key(r.path, r.sdk_tree, soname, owned=owner[r.path] is not None)
    )


@dataclass(slots=True)
class _Expansions:
    """The expansions among a group's members that are not linked to its keeper, by why.

    An expansion belongs to the runtime copy it was made from. rocm-sdk init hardlinks it to that
    copy, and a legacy per-family devel wheel links into its own family's tree only
    (build_python_packages.py _run_legacy; py_packaging.py _find_populated): one on another
    distribution's copy stays with that copy (``with_other_owner``), and one split from it goes
    back to it when its distribution names that family (``elsewhere``). One built against a
    family whose copy is not among these bytes is never linked to another family's
    (``mismatched``). One on its own inode beside two owners' copies that names none cannot tell
    which it came from (``undecided``; the mirrored pass reports it): linking it to either could
    make the very split it should mend."""

    foreign_inodes: dict[tuple[int, int], FileRecord]
    made_for: dict[str, str | None]
    with_other_owner: list[FileRecord]
    elsewhere: list[FileRecord]
    mismatched: list[FileRecord]
    undecided: list[FileRecord]

    @classmethod
    def sort_out(
        cls,
        ordered: list[FileRecord],
        owner: dict[str, str | None],
        foreign: list[FileRecord],
        ownership: Ownership,
    ) -> _Expansions:
        keeper = ordered[0]
        keeper_owner = owner[keeper.path]
        foreign_inodes = {r.identity: r for r in foreign}
        foreign_owners = {owner[r.path] for r in foreign}
        expansions = [r for r in ordered[1:] if owner[r.path] is None and ownership.is_expansion(r.path)]
        with_other_owner = [r for r in expansions if r.identity != keeper.identity and r.identity in foreign_inodes]
        made_for = {r.path: ownership.made_for(r.path) for r in expansions}
        elsewhere = [
            r
            for r in expansions
            if r.identity != keeper.identity and r not in with_other_owner and made_for[r.path] in foreign_owners
        ]
        mismatched = [
            r
            for r in expansions
            if r.identity != keeper.identity
            and r not in with_other_owner
            and r not in elsewhere
            and made_for[r.path] is not None
            and keeper_owner is not None
            and is_family_distribution(keeper_owner)
            and made_for[r.path] != keeper_owner
        ]
        undecided = [
            r
            for r in expansions
            if foreign
            and r.identity != keeper.identity
            and r not in with_other_owner
            and r not in elsewhere
            and r not in mismatched
            and (keeper_owner is None or made_for[r.path] != keeper_owner)
        ]
        return cls(foreign_inodes, made_for, with_other_owner, elsewhere, mismatched, undecided)

    def left_alone(self) -> list[FileRecord]:
        return self.with_other_owner + self.elsewhere + self.mismatched + self.undecided


def _group_of_changeable(
    ordered: list[FileRecord],
    left_alone: list[FileRecord],
    keeper_owned: bool,
    findings: list[Finding],
    ownership: Ownership,
    intact: list[tuple[str, list[str]]],
    realdir: Callable[[str], str],
    reldir: Callable[[str, str], str],
) -> DedupGroup | None:
    """The group of what may become a link to the keeper ``ordered[0]``: every other member but
    those ``left_alone`` and the device links TheRock keeps on the keeper's inode itself (those go
    to ``intact``). None when nothing may change, or when the keeper resolves outside its root."""
    keeper = ordered[0]
    on_keeper = {
        r.path for r in ordered[1:] if keeper_owned and r.identity == keeper.identity and ownership.is_expansion(r.path)
    }
    # TheRock's device reconcile re-hardlinks these on every init/path/test: left as it made them.
    settled = [r for r in ordered[1:] if r.path in on_keeper and ownership.is_device_link(r.path)]
    if settled:
        intact.append((keeper.path, [r.path for r in settled]))
    changeable = [r for r in ordered[1:] if r not in left_alone and r not in settled]
    if not changeable:
        return None
    # records are regular files (lstat), so realpath(file) == realpath(its directory) + its name
    keeper_real = os.path.join(realdir(os.path.dirname(keeper.path)), os.path.basename(keeper.path))
    if not _inside(keeper_real, keeper.root):
        findings.append(
            make_finding(
                "DUP005",
                keeper.path,
                "keeper resolves outside the audited root; group left alone",
                related=[r.path for r in ordered[1:]],
            )
        )
        return None
    duplicates = []
    for record in changeable:
        link_text = relative_link_text(keeper_real, record.path, realdir, reldir)
        make = "hardlink" if ownership.is_device_link(record.path) else "symlink"
        duplicates.append(
            PlannedLink(
                record,
                link_text,
                hardlink=record.identity == keeper.identity,
                make=make,
                intact=record.path in on_keeper,
            )
        )
        _report_mode_difference(record, keeper, findings)
    reason = "hardlink" if all(d.hardlink for d in duplicates) else "identical-content"
    group = DedupGroup(keeper, duplicates, reason)
    for planned in duplicates:
        group.status[planned.record.path] = "planned"
    return group


def _report_mode_difference(record: FileRecord, keeper: FileRecord, findings: list[Finding]) -> None:
    if stat.S_IMODE(record.mode) != stat.S_IMODE(keeper.mode) or (record.uid, record.gid) != (
        keeper.uid,
        keeper.gid,
    ):
        findings.append(
            make_finding(
                "DUP004",
                record.path,
                f"mode {stat.S_IMODE(record.mode):o} owner {record.uid}:{record.gid} differs from the keeper's "
                f"mode {stat.S_IMODE(keeper.mode):o} owner {keeper.uid}:{keeper.gid}",
                related=[keeper.path],
            )
        )


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
_NOT_MIRRORED = ("__init__.py", ".devel_reconcile.lock")


def _mirrored_groups(
    inventory: Inventory,
    ownership: Ownership,
    classed: set[str],
    stats: CompareStats,
    findings: list[Finding],
    intact: list[tuple[str, list[str]]],
    *,
    exact: bool,
) -> list[DedupGroup]:
    """Files TheRock links from an expansion (devel) to the runtime file of the same path inside a
    sibling tree (kernel DBs, ``.kpack``/``.kpm``, Tensile files, executables, headers): when a copy
    split them and the bytes are still equal, the plan restores TheRock's hardlink. Shared libraries
    that the content groups already judged are left to them. Inexact (an applying run): head and
    tail only, since the apply compares every pair in full before it links."""
    by_path = {r.path: r for r in inventory.files}
    realdir = functools.lru_cache(maxsize=None)(os.path.realpath)
    groups: dict[str, DedupGroup] = {}
    left = {f.path for f in findings if f.rule == "DUP010"}  # the content groups said why already
    for record in inventory.files:
        if record.sdk_tree is None or record.path in classed or not ownership.is_expansion(record.path):
            continue
        if record.path in left:
            continue
        relpath = tree_relpath(record.path, record.sdk_tree)
        if relpath in _NOT_MIRRORED or "__pycache__" in relpath.split(os.sep):
            continue
        twins = []  # the same path in each sibling tree, where a wheel installed it
        for sibling in sibling_trees(record.sdk_tree, inventory.sdk_trees):
            twin = by_path.get(os.path.join(sibling, relpath))
            if twin is not None and ownership.owner(twin.path):
                twins.append(twin)
        on_twin = [twin for twin in twins if twin.identity == record.identity]
        twins, reason = _twins_to_link(record, twins, on_twin, ownership)
        if reason is not None:
            findings.append(
                make_finding(
                    "DUP010",
                    record.path,
                    f"{reason}, so it is left as it is",
                    related=[twin.path for twin in twins],
                    data={"owner": None, "others": sorted({ownership.owner(twin.path) or "" for twin in twins})},
                )
            )
            continue
        _link_to_twin(record, on_twin or twins, stats, findings, intact, groups, realdir, exact=exact)
    return list(groups.values())


def _twins_to_link(
    record: FileRecord, twins: list[FileRecord], on_twin: list[FileRecord], ownership: Ownership
) -> tuple[list[FileRecord], str | None]:
    """The runtime files an expansion may be linked to, or why it is left as it is.

    Legacy per-family wheels: each family's devel links into its own tree, which a copy on its own
    inode still names when its distribution records the family. A copy beside several owners'
    runtime files that names none of them cannot tell which one it mirrors."""
    owners = sorted({ownership.owner(twin.path) or "" for twin in twins})
    made_for = None if on_twin else ownership.made_for(record.path)
    if made_for is not None and any(is_family_distribution(ownership.owner(t.path) or "") for t in twins):
        chosen = [twin for twin in twins if ownership.owner(twin.path) == made_for]
        if chosen:
            return chosen, None
        return twins, (
            f"its distribution was built against {made_for}, which installs no copy here; "
            f"the same path in {', '.join(owners)} is another family's"
        )
    if not on_twin and len(owners) > 1:
        source = (
            f"its distribution was built against {made_for}, which installs no copy here"
            if made_for
            else "which one it was made from is not recorded"
        )
        mirrored = f"the runtime file it mirrors is installed by {len(owners)} distributions"
        return twins, f"{mirrored} ({', '.join(owners)}); {source}"
    return twins, None


def _link_to_twin(
    record: FileRecord,
    twins: list[FileRecord],
    stats: CompareStats,
    findings: list[Finding],
    intact: list[tuple[str, list[str]]],
    groups: dict[str, DedupGroup],
    realdir: Callable[[str], str],
    *,
    exact: bool,
) -> None:
    """Plan a hardlink of ``record`` to the first of ``twins`` (already on its inode: intact; equal
    bytes on one filesystem: a link; on another: DUP012)."""
    for twin in twins:
        if twin.identity == record.identity:
            intact.append((twin.path, [record.path]))
        elif twin.size == record.size and twin.dev == record.dev:
            try:
                equal = all(
                    same_bytes(twin.path, record.path, twin.size, stats, byte_range)
                    for byte_range in _ends(twin.size, exact)
                )
            except ReadFailure as failure:
                findings.append(make_finding("SCAN001", failure.path, f"cannot read: {failure.error.strerror}"))
                break
            if equal:
                keeper_real = os.path.join(realdir(os.path.dirname(twin.path)), os.path.basename(twin.path))
                planned = PlannedLink(
                    record, relative_link_text(keeper_real, record.path, realdir), hardlink=False, make="hardlink"
                )
                group = groups.setdefault(twin.path, DedupGroup(twin, [], "mirrored"))
                group.duplicates.append(planned)
                group.status[record.path] = "planned"
        elif twin.size == record.size:
            findings.append(
                make_finding(
                    "DUP012",
                    record.path,
                    "split from the runtime file TheRock links it to, on another filesystem: cannot be hardlinked",
                    related=[twin.path],
                )
            )
        break


def _ends(size: int, exact: bool) -> list[tuple[int, int]]:
    """What a mirrored pair's plan compares: all of it, or (inexact) head and tail, the last range
    ending at ``size`` so that growth still shows."""
    if exact or size <= HEAD_BYTES + TAIL_BYTES:
        return [(0, size)]
    return [(0, HEAD_BYTES), (size - TAIL_BYTES, size)]
