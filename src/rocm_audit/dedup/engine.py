"""`rocm-audit dedup`: replace byte-identical SDK shared libraries by relative symlinks.

Why: glibc treats two paths as one library only when (st_dev, st_ino) match (formats.md 4), so
byte-identical copies of an LLVM registrant are loaded twice and abort with ``Option ... registered
more than once!`` (TheRock issue 7818, formats.md 1.5). A relative symlink to the runtime copy is
one inode for the loader, survives every image-layer copy, and leaves ``$ORIGIN`` unchanged.

Safety (peers.md 2): the plan records each file's stat; just before each replacement both files are
re-stat'ed and byte-compared; the link is made under a temporary name in the same directory and
renamed over the target, so the path never stops existing; links never cross filesystems or leave
the audited root; every planned change is journalled (fsync'ed) in a manifest before the first
change, so ``--revert`` works from any interrupted state.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import re
import stat
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from rocm_audit import __version__
from rocm_audit.elf import read as elfread
from rocm_audit.errors import FormatError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.outcome import CommandOutcome
from rocm_audit.rulebook.policy import policy
from rocm_audit.tree.discovery import resolve_roots
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
    pieces,
    refine,
    same_bytes,
)
from rocm_audit.tree.inventory import (
    TEMP_PREFIX,
    FileKind,
    FileRecord,
    Inventory,
    ListedFile,
    ProgressCallback,
    build_inventory,
    classify,
)
from rocm_audit.tree.keeper import KeeperRule

MANIFEST_DIR = ".rocm-audit"
MANIFEST_NAME = "dedup-manifest.jsonl"
MANIFEST_FORMAT = 1
_TEMP_NAME = re.compile(re.escape(TEMP_PREFIX) + r"[0-9a-f]{12}")


# --------------------------------------------------------------------------------------------
# Plan


@dataclass(frozen=True, slots=True)
class PlannedLink:
    record: FileRecord  # the duplicate as the plan saw it
    link_text: str  # relative symlink text, as `ln -sr` would write it
    hardlink: bool  # shares the keeper's inode


@dataclass(slots=True)
class DedupGroup:
    keeper: FileRecord
    duplicates: list[PlannedLink]
    reason: str  # "identical-content" or "hardlink"
    status: dict[str, str] = field(default_factory=dict)  # duplicate path -> planned/replaced/...

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


def make_plan(inventory: Inventory, *, exact: bool = True) -> DedupPlan:
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
    candidates = [r for r in inventory.files if r.sdk_tree is not None and (r.kind is None or r.kind in kinds)]
    paths_by_inode = _paths_by_inode(candidates)
    with keeping_open():  # a file compared in pieces is opened once, by all processes together
        groups = _groups_among(paths_by_inode, inventory, findings, stats, exact=exact, kinds=kinds)
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
    return DedupPlan(inventory, groups, findings, stats, exact)


# Below this many candidate bytes a plan compares in this process alone: a fork costs more.
PARALLEL_MIN_BYTES = 64 << 20
# With helpers, a bucket that would read more than this is compared in pieces of about this many
# bytes (after its head and tail, here), so that the processes share even one pair of 1 GB
# libraries evenly. Alone, a bucket is compared whole: a difference then stops all reading.
PIECE_BYTES = 64 << 20


@dataclass(slots=True)
class _BucketOutcome:
    """One size bucket, or one piece of one, compared (possibly in a forkmap helper, hence plain
    picklable data)."""

    classes: list[list[str]]  # paths of members equal over what was compared
    failures: list[ReadFailure]
    findings: list[Finding]  # malformed files met while classifying
    bytes_read: int


@dataclass(frozen=True, slots=True)
class _Piece:
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
) -> list[DedupGroup]:
    """Groups of identical inodes (and of paths of one inode), each with its keeper chosen.
    ``kinds``: classify the files the inventory did not open, and keep only these kinds."""
    # Size buckets of distinct inodes; never read anything for a singleton (peers.md 1).
    inodes_by_size: dict[tuple[str, int, int], list[FileRecord]] = defaultdict(list)
    for records in paths_by_inode.values():
        first = records[0]
        inodes_by_size[(first.root, first.dev, first.size)].append(first)
    buckets = [sorted(reps, key=lambda r: r.ino) for _, reps in sorted(inodes_by_size.items()) if len(reps) > 1]

    def compare(item: list[FileRecord] | _Piece, *, full: bool = exact) -> _BucketOutcome:
        failures: list[ReadFailure] = []
        found: list[Finding] = []
        before = stats.bytes_read
        if isinstance(item, _Piece):
            classes = equal_over(item.members, item.byte_range, stats, failures)
        else:
            unread = kinds is not None and any(r.kind is None for r in item)
            classes = partition_identical(
                [Candidate(r.path, r.size, r.head_digest) for r in item],
                stats,
                failures,
                _kind_filter(kinds, found) if unread and kinds else None,
                full=full,
            )
        return _BucketOutcome([[c.path for c in cls] for cls in classes], failures, found, stats.bytes_read - before)

    # What each bucket will read: everything when exact; else head and tail (a file that fits one
    # chunk is read whole).
    weights = [len(b) * (b[0].size if exact else min(b[0].size, CHUNK_BYTES)) for b in buckets]
    workers = worker_count(sum(weights), PARALLEL_MIN_BYTES)
    keeper_rule = KeeperRule.from_policy()
    realdir = functools.lru_cache(maxsize=None)(os.path.realpath)  # one realpath per directory
    reldir = functools.lru_cache(maxsize=None)(os.path.relpath)  # one relpath per directory pair
    groups: list[DedupGroup] = []
    grouped: set[tuple[str, int, int]] = set()
    found_by_bucket: dict[int, list[Finding]] = defaultdict(list)  # merged in bucket order: the same each run
    bytes_before = stats.bytes_read
    bytes_read = 0

    def take(bucket_number: int, outcome: _BucketOutcome) -> None:
        """Record what a comparison found; classes that are final become groups at once."""
        nonlocal bytes_read
        bytes_read += outcome.bytes_read  # helpers count in their own copy of stats
        found = found_by_bucket[bucket_number]
        found.extend(outcome.findings)
        for failure in outcome.failures:
            found.append(make_finding("SCAN001", failure.path, f"cannot read: {failure.error.strerror}"))

    def group(bucket_number: int, classes: list[list[str]]) -> None:
        by_path = {r.path: r for r in buckets[bucket_number]}
        for paths in classes:
            keys = [(r.root, r.dev, r.ino) for r in (by_path[p] for p in paths)]
            grouped.update(keys)
            made = _group_from(
                [r for key in keys for r in paths_by_inode[key]],
                inventory,
                keeper_rule,
                found_by_bucket[bucket_number],
                realdir,
                reldir,
            )
            if made is not None:
                groups.append(made)

    # Items: whole buckets, and pieces of the large ones once their heads and tails agree.
    items: list[list[FileRecord] | _Piece] = []
    item_weights: list[int] = []
    item_buckets: list[int] = []
    probable: list[tuple[int, tuple[Candidate, ...], int]] = []  # (bucket number, members, pieces)
    for number, bucket in enumerate(buckets):
        if workers < 2 or not exact or weights[number] <= PIECE_BYTES or len(bucket) > MAX_LOCKSTEP_MEMBERS:
            items.append(bucket)
            item_weights.append(weights[number])
            item_buckets.append(number)
            continue
        outcome = compare(bucket, full=False)
        take(number, outcome)
        by_path = {r.path: r for r in bucket}
        if not outcome.failures:  # members in no probable class differ in head or tail from all others
            in_classes = {p for cls in outcome.classes for p in cls}
            inventory.identical.record([r.identity for r in bucket if r.path not in in_classes], [])
        for paths in outcome.classes:
            members = tuple(Candidate(p, by_path[p].size, None) for p in paths)
            ranges = middle_pieces(bucket[0].size, PIECE_BYTES // len(members))
            probable.append((number, members, len(ranges)))
            for byte_range in ranges:
                items.append(_Piece(len(probable) - 1, members, byte_range))
                item_weights.append(len(members) * (byte_range[1] - byte_range[0]))
                item_buckets.append(number)
            if not ranges:  # head and tail were all of it
                group(number, [list(paths)])
    pieces_in: dict[int, list[list[list[Candidate]]]] = defaultdict(list)
    # Groups are built as answers come in, while helpers still compare the rest; heaviest first
    # keeps the end of the run balanced.
    for index, outcome in fork_imap(compare, items, item_weights, workers):
        item, number = items[index], item_buckets[index]
        take(number, outcome)
        if not isinstance(item, _Piece):
            if exact and not outcome.failures:  # compared in full: later checks need not read again
                identity_of = {r.path: r.identity for r in buckets[number]}
                inventory.identical.record(
                    [r.identity for r in buckets[number]], [[identity_of[p] for p in cls] for cls in outcome.classes]
                )
            group(number, outcome.classes)
            continue
        _, members, expected = probable[item.probable]
        member_by_path = {one.path: one for one in members}
        partitions = pieces_in[item.probable]
        partitions.append([[member_by_path[p] for p in cls] for cls in outcome.classes])
        if len(partitions) == expected:
            refined = refine(members, partitions)
            if not any(f.rule == "SCAN001" for f in found_by_bucket[number]):  # no piece failed to read
                identity_of = {r.path: r.identity for r in buckets[number]}
                inventory.identical.record(
                    [identity_of[one.path] for one in members],
                    [[identity_of[one.path] for one in cls] for cls in refined],
                )
            group(number, [[one.path for one in cls] for cls in refined])
            del pieces_in[item.probable]
    stats.bytes_read = bytes_before + bytes_read
    for number in sorted(found_by_bucket):
        findings.extend(found_by_bucket[number])
    # A single inode with several paths in the trees is a hardlink group on its own.
    for key, records in paths_by_inode.items():
        if key not in grouped and len(records) > 1:
            made = _group_from(records, inventory, keeper_rule, findings, realdir, reldir)
            if made is not None:
                groups.append(made)
    return groups


def _group_from(
    records: list[FileRecord],
    inventory: Inventory,
    keeper_rule: KeeperRule,
    findings: list[Finding],
    realdir: Callable[[str], str] = os.path.realpath,
    reldir: Callable[[str, str], str] = os.path.relpath,
) -> DedupGroup | None:
    soname = None
    if keeper_rule.needs_soname([r.sdk_tree for r in records]):
        try:
            soname = inventory.dynamic(records[0]).soname
        except (OSError, Exception) as exc:  # noqa: BLE001 - a malformed dynamic section only loses the SONAME tie-break
            findings.append(make_finding("SCAN002", records[0].path, f"cannot read the dynamic section: {exc}"))
    ordered = sorted(records, key=lambda r: keeper_rule.sort_key(r.path, r.sdk_tree, soname))
    keeper = ordered[0]
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
    for record in ordered[1:]:
        link_text = relative_link_text(keeper_real, record.path, realdir, reldir)
        duplicates.append(PlannedLink(record, link_text, hardlink=record.identity == keeper.identity))
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
    reason = "hardlink" if all(d.hardlink for d in duplicates) else "identical-content"
    group = DedupGroup(keeper, duplicates, reason)
    for planned in duplicates:
        group.status[planned.record.path] = "planned"
    return group


# --------------------------------------------------------------------------------------------
# Apply


class _Skip(Exception):
    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule, self.message = rule, message


def _same_snapshot(current: os.stat_result, planned: FileRecord) -> bool:
    # Not st_ctime: replacing one hardlink of an inode changes the inode's link count and ctime.
    return (
        stat.S_ISREG(current.st_mode)
        and (current.st_dev, current.st_ino) == planned.identity
        and current.st_size == planned.size
        and current.st_mtime_ns == planned.mtime_ns
        and current.st_mode == planned.mode
    )


class _NoManifest(Exception):
    """The revert manifest could not be written: nothing may change."""


@dataclass(frozen=True, slots=True)
class _Before:
    """A pair as it was just before its comparison began (both files still as planned).

    st_ctime_ns of a file with a single link: no rename of ours can change it and nobody can set
    it back, so a change after this moment shows at the last look even when the size and mtime
    were restored. None for an inode with several links (replacing one of them changes it)."""

    victim_ctime_ns: int | None
    keeper_ctime_ns: int | None


def _ctime_if_single(st: os.stat_result) -> int | None:
    return st.st_ctime_ns if st.st_nlink == 1 else None


def _look_before(group: DedupGroup, planned: PlannedLink) -> _Before:
    """Re-check a pair against the plan just before its comparison. Raises _Skip."""
    keeper, victim = group.keeper, planned.record
    try:
        keeper_now = os.lstat(keeper.path)
        victim_now = os.lstat(victim.path)
    except FileNotFoundError as exc:
        raise _Skip("DUP003", f"{exc.filename} vanished since the plan") from None
    if not _same_snapshot(keeper_now, keeper):
        raise _Skip("DUP003", "the keeper changed since the plan")
    if not stat.S_ISREG(victim_now.st_mode):
        raise _Skip("DUP003", "no longer a regular file")
    if not _same_snapshot(victim_now, victim):
        raise _Skip("DUP003", "the file changed since the plan")
    if os.stat(os.path.dirname(victim.path)).st_dev != keeper_now.st_dev:
        raise _Skip("DUP005", "refusing to link across filesystems")
    return _Before(_ctime_if_single(victim_now), _ctime_if_single(keeper_now))


@dataclass(frozen=True, slots=True)
class _PairPiece:
    """One range of a duplicate's bytes, to compare with the keeper's (in any process)."""

    keeper: str
    victim: str
    size: int
    byte_range: tuple[int, int]


_DIFFERS = "differs"  # a piece's verdict besides None (equal) and a read failure's text


def _compare_piece(piece: _PairPiece, stats: CompareStats) -> tuple[str | None, int]:
    """(None when the range is equal, else _DIFFERS or why it could not be read; bytes read)."""
    before = stats.bytes_read
    try:
        same = same_bytes(piece.keeper, piece.victim, piece.size, stats, piece.byte_range)
    except ReadFailure as failure:
        return f"cannot re-read {failure.path}: {failure.error.strerror}", stats.bytes_read - before
    return (None if same else _DIFFERS), stats.bytes_read - before


def _link(group: DedupGroup, planned: PlannedLink, before: _Before) -> None:
    """Make the symlink under a temporary name beside the duplicate and, after a last look, rename
    it over the duplicate. Raises _Skip."""
    keeper, victim = group.keeper, planned.record
    directory = os.path.dirname(victim.path)
    try:
        resolved = os.stat(os.path.join(directory, planned.link_text))
    except OSError:
        raise _Skip("DUP005", f"link text {planned.link_text!r} would not resolve") from None
    if (resolved.st_dev, resolved.st_ino) != keeper.identity:
        raise _Skip("DUP005", f"link text {planned.link_text!r} would not resolve to the keeper")
    temp_path = os.path.join(directory, f"{TEMP_PREFIX}{os.urandom(6).hex()}")
    try:
        os.symlink(planned.link_text, temp_path)
    except OSError as exc:
        raise _Skip("DUP005", f"cannot create a link in {directory}: {exc.strerror}") from None
    try:
        # Last look right before the rename: the window left is one syscall wide.
        victim_now, keeper_now = os.lstat(victim.path), os.lstat(keeper.path)
        if not _same_snapshot(victim_now, victim) or not _same_snapshot(keeper_now, keeper):
            raise _Skip("DUP003", "the file changed during the comparison")
        if before.victim_ctime_ns not in (None, victim_now.st_ctime_ns) or before.keeper_ctime_ns not in (
            None,
            keeper_now.st_ctime_ns,
        ):
            raise _Skip("DUP003", "the file changed after the comparison (its ctime moved)")
        os.replace(temp_path, victim.path)
    except OSError as exc:
        _unlink_quietly(temp_path)
        raise _Skip("DUP005", f"cannot rename the link into place: {exc.strerror}") from None
    except BaseException:
        _unlink_quietly(temp_path)
        raise


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


@contextlib.contextmanager
def _tree_locks(trees: list[str]) -> Iterator[list[str]]:
    """Hold an exclusive flock on each SDK tree directory; yield the trees already locked by others."""
    held: list[int] = []
    busy: list[str] = []
    try:
        for tree in sorted(trees):
            fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                busy.append(tree)
                continue
            held.append(fd)
        yield busy
    finally:
        for fd in held:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def default_manifest_path(plan: DedupPlan) -> str:
    """`.rocm-audit/dedup-manifest.jsonl` in the directory holding the (first) SDK tree."""
    trees = sorted({g.keeper.sdk_tree for g in plan.groups if g.keeper.sdk_tree})
    base = os.path.dirname(trees[0]) if trees else plan.inventory.roots[0].path
    return os.path.join(base, MANIFEST_DIR, MANIFEST_NAME)


def _journal(manifest_path: str, groups: list[DedupGroup], run_id: str, *, header: bool) -> None:
    """Append every planned change to the manifest and fsync it before any of them is made."""
    import json

    if not groups:
        return
    os.makedirs(os.path.dirname(os.path.abspath(manifest_path)), exist_ok=True)
    lines = (
        [
            json.dumps(
                {
                    "rocm_audit_manifest": MANIFEST_FORMAT,
                    "run": run_id,
                    "tool_version": __version__,
                    "created_unix": int(time.time()),
                }
            )
        ]
        if header
        else []
    )
    for group in groups:
        keeper = group.keeper
        for planned in group.duplicates:
            victim = planned.record
            lines.append(
                json.dumps(
                    {
                        "run": run_id,
                        "path": victim.path,
                        "keeper": keeper.path,
                        "link_text": planned.link_text,
                        "hardlink": planned.hardlink,
                        "mode": stat.S_IMODE(victim.mode),
                        "uid": victim.uid,
                        "gid": victim.gid,
                        "mtime_ns": victim.mtime_ns,
                        "size": victim.size,
                        "keeper_dev": keeper.dev,
                        "keeper_ino": keeper.ino,
                        "keeper_size": keeper.size,
                        "keeper_mtime_ns": keeper.mtime_ns,
                    }
                )
            )  # ASCII escapes keep undecodable file-name bytes exact (\udcXX round-trips)
    with open(manifest_path, "a", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


@dataclass(frozen=True, slots=True)
class _NeededBefore:
    dynamic: elfread.DynamicInfo  # read from the duplicate's own bytes, which its keeper's equal
    resolved: dict[str, str | None]  # DT_NEEDED name -> the path glibc would load


def _needed_before(paths: Sequence[str]) -> dict[str, _NeededBefore]:
    """DT_NEEDED resolution of each library, as the loader sees it now (read-only: any process)."""
    from rocm_audit.tree.loader import LoaderModel

    loader = LoaderModel()
    snapshot: dict[str, _NeededBefore] = {}
    for path in paths:
        dynamic = loader.dynamic_of(path)
        if dynamic is not None:
            resolutions = loader.resolve_all(path, dynamic)
            snapshot[path] = _NeededBefore(dynamic, {n: r.path for n, r in resolutions.items()})
    return snapshot


@dataclass(frozen=True, slots=True)
class _SnapshotShare:
    """Some of the duplicates whose DT_NEEDED resolution is recorded before the first change."""

    paths: tuple[str, ...]


SNAPSHOT_SHARE = 256  # libraries per share: each is a few ms of reading dynamic sections


@dataclass(slots=True)
class _BeforeChanges:
    """What an applying run's first round does before its first change: journal the plan (in this
    process, once the comparisons have begun) and record DT_NEEDED resolutions (in any process;
    the resolutions arrive in ``snapshot``)."""

    journal: Callable[[], None]
    snapshot_paths: list[str]
    snapshot: dict[str, _NeededBefore] = field(default_factory=dict)


def _verify(plan: DedupPlan, before: dict[str, _NeededBefore], findings: list[Finding]) -> bool:
    """Every path still resolves to the same bytes; DT_NEEDED of replaced libraries resolve alike."""
    from rocm_audit.tree.loader import LoaderModel

    ok = True
    for group in plan.groups:
        keeper = group.keeper
        try:
            keeper_now = os.stat(keeper.path)
        except OSError as exc:
            findings.append(make_finding("DUP006", keeper.path, f"keeper no longer resolves: {exc.strerror}"))
            ok = False
            continue
        if (keeper_now.st_dev, keeper_now.st_ino) != keeper.identity or keeper_now.st_size != keeper.size:
            findings.append(make_finding("DUP006", keeper.path, "keeper changed during the run"))
            ok = False
        for planned in group.duplicates:
            path = planned.record.path
            expected = keeper.identity if group.status[path] == "replaced" else planned.record.identity
            try:
                now = os.stat(path)
            except OSError as exc:
                findings.append(make_finding("DUP006", path, f"path no longer resolves: {exc.strerror}"))
                ok = False
                continue
            if (now.st_dev, now.st_ino) != expected or now.st_size != planned.record.size:
                findings.append(
                    make_finding(
                        "DUP006", path, "path resolves to a different file than planned", related=[keeper.path]
                    )
                )
                ok = False
    # Every path was just shown to resolve to its planned inode, whose bytes were compared with the
    # duplicate's: the dynamic section read before the change is the one the loader reads now.
    after_loader = LoaderModel()
    for path, needed in sorted(before.items()):
        resolved_before = needed.resolved
        resolved_after = {n: r.path for n, r in after_loader.resolve_all(path, needed.dynamic).items()}
        if resolved_after != resolved_before:
            changed = sorted(
                n for n in set(resolved_before) | set(resolved_after) if resolved_before.get(n) != resolved_after.get(n)
            )
            findings.append(
                make_finding(
                    "DUP006",
                    path,
                    f"DT_NEEDED resolution changed for {', '.join(changed)}",
                    data={"before": resolved_before, "after": resolved_after},
                )
            )
            ok = False
    return ok


@dataclass(slots=True)
class ApplyResult:
    replaced: int = 0
    skipped: int = 0
    bytes_freed: int = 0
    verified: bool | None = None
    manifest: str | None = None


def apply_plan(plan: DedupPlan, manifest_path: str | None, findings: list[Finding]) -> ApplyResult:
    """Carry out the plan; every skip or failure becomes a finding and the run goes on."""
    result = ApplyResult()
    if not plan.groups:
        return result
    trees = sorted(
        {r.sdk_tree for g in plan.groups for r in (g.keeper, *(d.record for d in g.duplicates)) if r.sdk_tree}
    )
    with _tree_locks(trees) as busy:
        if busy:
            for tree in busy:
                findings.append(make_finding("DUP008", tree, "another rocm-audit run holds this tree; nothing changed"))
            _skip_all(plan.groups, result)
            return result
        result.manifest = manifest = os.path.abspath(manifest_path or default_manifest_path(plan))
        run_id = os.urandom(8).hex()

        def journal() -> None:
            try:
                _journal(manifest, plan.groups, run_id, header=True)
            except OSError as exc:
                raise _NoManifest(exc.strerror) from None
            _remove_leftovers(plan.inventory, findings)

        first = _BeforeChanges(journal, [d.record.path for g in plan.groups for d in g.duplicates])
        try:
            pending = _regrouped(
                _apply_groups(plan.groups, plan, result, findings, first), plan, result, findings, run_id
            )
        except _NoManifest as missing:  # no manifest, no way back (a read-only tree fails here too)
            findings.append(
                make_finding("DUP005", manifest, f"cannot write the revert manifest: {missing}; nothing changed")
            )
            _skip_all(plan.groups, result)
            result.manifest = None
            return result
        while pending:
            pending = _regrouped(_apply_groups(pending, plan, result, findings), plan, result, findings, run_id)
        plan.groups[:] = sorted((g for g in plan.groups if g.duplicates), key=lambda g: g.keeper.path)
        result.verified = _verify(plan, first.snapshot, findings)
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
    first: _BeforeChanges | None = None,
) -> list[tuple[DedupGroup, list[PlannedLink]]]:
    """Re-check and byte-compare every planned pair, and replace each duplicate as soon as its
    comparison is in: forked helpers share the reading while this process renames. ``first``
    (the first round) is done before the first change: its snapshot shares go first to whoever is
    free, its journal runs here meanwhile, and pairs compared before both are done wait. Returns
    the members whose bytes differ from their keeper's, by group (only an inexact plan has them:
    they agreed on size, head and tail)."""
    pairs: list[tuple[DedupGroup, PlannedLink, _Before]] = []
    for group in groups:
        for planned in group.duplicates:
            if group.status[planned.record.path] != "planned":
                continue  # skipped when its manifest entries could not be written
            try:
                pairs.append((group, planned, _look_before(group, planned)))
            except _Skip as skip:
                _record_skip(group, planned, skip, result, findings)
    differing: dict[int, tuple[DedupGroup, list[PlannedLink]]] = {}

    def finish(number: int, problem: str | None) -> None:
        group, planned, before = pairs[number]
        if problem == _DIFFERS and not plan.exact:
            differing.setdefault(id(group), (group, []))[1].append(planned)
            return
        try:
            if problem == _DIFFERS:
                raise _Skip("DUP003", "bytes differ from the keeper at apply time")
            if problem is not None:
                raise _Skip("DUP005", problem)
            _link(group, planned, before)
        except _Skip as skip:
            _record_skip(group, planned, skip, result, findings)
            return
        group.status[planned.record.path] = "replaced"
        result.replaced += 1
        if not planned.hardlink:
            result.bytes_freed += group.size

    # Pieces of about PIECE_BYTES each, so that processes share even one pair of 1 GB libraries.
    # Smallest pairs first, each pair's pieces one after another: pairs complete from the start,
    # and this process, which alone makes the links, has a steady supply of them while helpers
    # read the large pairs (largest first, the first link waited for every 1 GB pair's last piece).
    compared: list[_PairPiece] = []
    owners: list[int] = []
    for number in sorted(range(len(pairs)), key=lambda n: pairs[n][0].size):
        group, planned, _ = pairs[number]
        if planned.hardlink:
            continue  # one inode: nothing to compare
        for byte_range in pieces(group.keeper.size, PIECE_BYTES // 2):
            compared.append(_PairPiece(group.keeper.path, planned.record.path, group.keeper.size, byte_range))
            owners.append(number)
    workers = worker_count(sum(2 * (p.byte_range[1] - p.byte_range[0]) for p in compared), PARALLEL_MIN_BYTES)
    items: list[_PairPiece | _SnapshotShare] = list(compared)
    priorities = list(range(len(compared), 0, -1))  # in the order just built
    shares_left = 0
    if first is not None:  # the snapshot shares go before every piece: no link is made without them
        paths = first.snapshot_paths
        for start in range(0, len(paths), SNAPSHOT_SHARE):
            items.append(_SnapshotShare(tuple(paths[start : start + SNAPSHOT_SHARE])))
            priorities.append(len(compared) + 1)
            shares_left += 1
    outstanding = Counter(owners)
    problems: dict[int, str] = {}
    waiting: list[int] = []  # pairs compared before the snapshot was complete
    stats = plan.stats
    bytes_before, bytes_read = stats.bytes_read, 0

    def work(item: _PairPiece | _SnapshotShare) -> Any:
        return _needed_before(item.paths) if isinstance(item, _SnapshotShare) else _compare_piece(item, stats)

    for index, answer in fork_imap(work, items, priorities, workers, meanwhile=first.journal if first else None):
        item = items[index]
        if isinstance(item, _SnapshotShare):
            assert first is not None  # only the first round has shares
            first.snapshot.update(answer)
            shares_left -= 1
            if not shares_left:
                for number in waiting:
                    finish(number, problems.get(number))
            continue
        problem, count = answer
        bytes_read += count  # helpers count in their own copy of stats
        number = owners[index]
        if problem is not None:
            problems.setdefault(number, problem)
        outstanding[number] -= 1
        if outstanding[number]:
            continue
        if shares_left:
            waiting.append(number)
        else:
            finish(number, problems.get(number))
    stats.bytes_read = bytes_before + bytes_read
    for number, (_, planned, _) in enumerate(pairs):
        if planned.hardlink:  # one inode: nothing to compare
            finish(number, None)
    return list(differing.values())


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
        pending.extend(_regroup(group, different, plan, findings))
    try:
        _journal(result.manifest or "", pending, run_id, header=False)
    except OSError as exc:
        findings.append(
            make_finding("DUP005", result.manifest or "", f"cannot write the revert manifest: {exc.strerror}")
        )
        _skip_all(pending, result)
    return pending


def _record_skip(
    group: DedupGroup, planned: PlannedLink, skip: _Skip, result: ApplyResult, findings: list[Finding]
) -> None:
    findings.append(make_finding(skip.rule, planned.record.path, skip.message, related=[group.keeper.path]))
    group.status[planned.record.path] = "skipped" if skip.rule == "DUP003" else "failed"
    result.skipped += 1


def _regroup(
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
    regrouped = _groups_among(paths_by_inode, plan.inventory, findings, plan.stats, exact=True, kinds=kinds)
    plan.groups.extend(regrouped)
    return regrouped


def _remove_leftovers(inventory: Inventory, findings: list[Finding]) -> None:
    """Remove temporary links and copies an interrupted run left (fixed prefix, inside SDK trees only)."""
    leftovers = [r.path for r in inventory.files if r.sdk_tree and os.path.basename(r.path).startswith(TEMP_PREFIX)]
    leftovers += [
        link.path for link in inventory.links if link.sdk_tree and os.path.basename(link.path).startswith(TEMP_PREFIX)
    ]
    for path in leftovers:
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            findings.append(make_finding("SCAN004", path, f"cannot remove leftover: {exc.strerror}"))
            continue
    # The inventory reported them (SCAN004); once removed they are no longer a problem.
    removed = set(leftovers)
    inventory.findings[:] = [
        f for f in inventory.findings if not (f.rule == "SCAN004" and f.path in removed and not os.path.lexists(f.path))
    ]


# --------------------------------------------------------------------------------------------
# Command


def _group_json(group: DedupGroup) -> dict[str, Any]:
    return {
        "keeper": group.keeper.path,
        "duplicates": [
            {
                "path": d.record.path,
                "link_text": d.link_text,
                "hardlink": d.hardlink,
                "status": group.status[d.record.path],
            }
            for d in group.duplicates
        ],
        "size": group.size,
        "reason": group.reason,
    }


def shell_preview(groups: list[DedupGroup]) -> list[str]:
    """An equivalent shell script for --dry-run (without rocm-audit's re-checks)."""
    import shlex

    lines = []
    for group in groups:
        for d in group.duplicates:
            lines.append(
                f"cmp -s -- {shlex.quote(group.keeper.path)} {shlex.quote(d.record.path)} && "
                f"ln -sfn -- {shlex.quote(d.link_text)} {shlex.quote(d.record.path)}"
            )
    return lines


def _human_bytes(count: int) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if count < 1000 or unit == "TB":
            return f"{count:,.0f} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1000  # type: ignore[assignment]
    raise AssertionError("unreachable")


def dedup_section(plan: DedupPlan, mode: str, result: ApplyResult, elapsed_s: float) -> dict[str, Any]:
    """The `dedup` section of the JSON report."""
    planned_freed = sum(g.bytes_freed_if_done() for g in plan.groups)
    return {
        "mode": mode,
        "groups": [_group_json(g) for g in plan.groups],
        "bytes_freed": result.bytes_freed if mode == "apply" else planned_freed,
        "replaced": result.replaced,
        "skipped": result.skipped,
        "manifest": result.manifest,
        "verified": result.verified,
        "shell_preview": shell_preview(plan.groups) if mode == "dry-run" else [],
        "files_scanned": len(plan.inventory.files),
        "bytes_compared": plan.stats.bytes_read,
        "elapsed_s": round(elapsed_s, 3),
    }


def check_mode_findings(plan: DedupPlan) -> list[Finding]:
    """DUP001/DUP002 for every group a plain run would change (what --check and `check` report)."""
    findings = []
    for group in plan.groups:
        rule = "DUP002" if group.reason == "hardlink" else "DUP001"
        findings.append(
            make_finding(
                rule,
                group.keeper.path,
                f"{len(group.duplicates)} other path(s) hold the same {group.size:,}-byte library"
                + (" through hardlinks" if group.reason == "hardlink" else " under another inode"),
                related=[d.record.path for d in group.duplicates],
                data={"size": group.size},
            )
        )
    return findings


def run_dedup(
    paths: list[str] | None, *, mode: str, manifest_path: str | None = None, progress: ProgressCallback | None = None
) -> CommandOutcome:
    """Discover, plan, and (mode == "apply") apply. Returns the outcome for the CLI."""
    started = time.monotonic()
    roots, looked = resolve_roots(paths, for_dedup=True)
    inventory = build_inventory(roots, progress, worth_reading=hardlinked)
    findings = list(inventory.findings)
    if not inventory.sdk_trees:
        findings.append(
            make_finding(
                "SCAN003",
                looked[0] if len(looked) == 1 else ", ".join(looked),
                f"no ROCm SDK tree (_rocm_sdk_*) found; looked in: {', '.join(looked)}",
                data={"looked_in": looked},
            )
        )
    plan = make_plan(inventory, exact=mode != "apply")
    findings.extend(plan.findings)
    result = ApplyResult()
    if mode == "apply":
        result = apply_plan(plan, manifest_path, findings)
        findings = [f for f in findings if not (f.rule == "SCAN004" and not os.path.lexists(f.path))]
    elif mode == "check":
        findings.extend(check_mode_findings(plan))
    planned_freed = sum(g.bytes_freed_if_done() for g in plan.groups)
    elapsed = time.monotonic() - started
    replaced_or_planned = result.replaced if mode == "apply" else sum(len(g.duplicates) for g in plan.groups)
    sections: dict[str, Any] = {"sdk_trees": inventory.sdk_trees, "dedup": dedup_section(plan, mode, result, elapsed)}
    verb = {"apply": "replaced", "dry-run": "to be replaced", "check": "to be replaced"}[mode]
    freed = result.bytes_freed if mode == "apply" else planned_freed
    summary = (
        f"dedup ({mode}): {len(plan.groups)} group(s), {replaced_or_planned} file(s) {verb} by symlinks, "
        f"{_human_bytes(freed)} {'freed' if mode == 'apply' else 'to free'}, "
        f"{len(inventory.files)} files scanned in {elapsed:.2f} s"
    )
    if not inventory.sdk_trees:
        summary = f"dedup: no ROCm SDK tree (_rocm_sdk_*) found; looked in: {', '.join(looked)}"
    return CommandOutcome(
        command="dedup",
        findings=findings,
        inputs=[r.path for r in roots],
        sections=sections,
        force_failure=(mode == "check" and bool(plan.groups)),
        summary=summary,
    )


# --------------------------------------------------------------------------------------------
# Revert


def _read_manifest(path: str) -> list[dict[str, Any]]:
    import json

    from rocm_audit.errors import UsageError

    entries = []
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError as exc:
                    # A run killed while appending leaves a partial last line: ignore only that one.
                    if not handle.readline():
                        break
                    raise UsageError(f"{path}:{number}: not a rocm-audit manifest line: {exc.msg}") from None
                if not isinstance(entry, dict):
                    raise UsageError(f"{path}:{number}: not a rocm-audit manifest line: not a JSON object")
                if "rocm_audit_manifest" in entry:
                    if entry["rocm_audit_manifest"] != MANIFEST_FORMAT:
                        raise UsageError(f"{path}:{number}: unsupported manifest format {entry['rocm_audit_manifest']}")
                    continue
                if (
                    not all(isinstance(entry.get(k), str) and entry[k] for k in ("path", "keeper", "link_text"))
                    or not isinstance(entry.get("mode"), int)
                    or isinstance(entry.get("mode"), bool)
                ):
                    raise UsageError(f"{path}:{number}: manifest entry lacks path/keeper/link_text/mode")
                for key in (
                    "uid",
                    "gid",
                    "mtime_ns",
                    "size",
                    "keeper_dev",
                    "keeper_ino",
                    "keeper_size",
                    "keeper_mtime_ns",
                ):
                    if key in entry and (not isinstance(entry[key], int) or isinstance(entry[key], bool)):
                        raise UsageError(f"{path}:{number}: manifest field {key} must be an integer")
                entries.append(entry)
    except OSError as exc:
        raise UsageError(f"cannot read manifest {path}: {exc.strerror}") from None
    return entries


def _restore_one(entry: dict[str, Any]) -> str:
    """Turn one manifest link back into a regular file. Returns "restored" or "original". Raises _Skip."""
    path, keeper_path = entry["path"], entry["keeper"]
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        raise _Skip("DUP007", "path is missing") from None
    if stat.S_ISREG(now.st_mode):
        return "original"  # never replaced, or already reverted
    if not stat.S_ISLNK(now.st_mode) or os.readlink(path) != entry["link_text"]:
        raise _Skip("DUP007", "path is no longer the link rocm-audit made")
    try:
        keeper_now = os.stat(keeper_path)
        through_link = os.stat(path)
    except OSError as exc:
        raise _Skip("DUP007", f"keeper does not resolve: {exc.strerror}") from None
    if (through_link.st_dev, through_link.st_ino) != (keeper_now.st_dev, keeper_now.st_ino):
        raise _Skip("DUP007", "link no longer resolves to the keeper")
    if keeper_now.st_size != entry.get("keeper_size", entry.get("size")) or (
        "keeper_mtime_ns" in entry and keeper_now.st_mtime_ns != entry["keeper_mtime_ns"]
    ):
        raise _Skip("DUP007", "the keeper changed since dedup; its bytes are not the original bytes")
    directory = os.path.dirname(path)
    temp_path = os.path.join(directory, f"{TEMP_PREFIX}{os.urandom(6).hex()}")
    try:
        if entry.get("hardlink") and (keeper_now.st_dev, keeper_now.st_ino) == (
            entry.get("keeper_dev"),
            entry.get("keeper_ino"),
        ):
            os.link(keeper_path, temp_path)  # it was a hardlink of the keeper: make it one again
        else:
            _copy_file(keeper_path, temp_path, entry)
        os.replace(temp_path, path)
    except OSError as exc:
        _unlink_quietly(temp_path)
        raise _Skip("DUP007", f"cannot restore: {exc.strerror}") from None
    except BaseException:
        _unlink_quietly(temp_path)
        raise
    return "restored"


def _copy_file(source: str, destination: str, entry: dict[str, Any]) -> None:
    with open(source, "rb") as src:
        fd = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as dst:
            remaining = os.fstat(src.fileno()).st_size
            while remaining:
                sent = os.sendfile(dst.fileno(), src.fileno(), None, min(remaining, 1 << 30))
                if sent == 0:
                    raise OSError(5, "short copy")
                remaining -= sent
            if os.geteuid() == 0:
                os.fchown(dst.fileno(), entry.get("uid", -1), entry.get("gid", -1))
            os.fchmod(dst.fileno(), entry["mode"])
            dst.flush()
            os.fsync(dst.fileno())
    if "mtime_ns" in entry:
        os.utime(destination, ns=(entry["mtime_ns"], entry["mtime_ns"]), follow_symlinks=False)
    if os.path.getsize(destination) != entry.get("size", os.path.getsize(destination)):
        raise OSError(5, "restored size differs from the recorded size")


def _remove_temporaries_in(directories: set[str], findings: list[Finding]) -> None:
    """Remove rocm-audit's own temporary names (TEMP_PREFIX + 12 hex digits) from directories."""
    for directory in sorted(directories):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            if _TEMP_NAME.fullmatch(name):
                path = os.path.join(directory, name)
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    findings.append(make_finding("SCAN004", path, f"cannot remove leftover: {exc.strerror}"))


def revert_manifests(manifest_paths: list[str]) -> CommandOutcome:
    """Undo the replacements recorded in the manifests, newest first."""
    findings: list[Finding] = []
    restored: list[str] = []
    already = failed = 0
    entries = [e for path in manifest_paths for e in _read_manifest(path)]
    # A run killed between creating a temporary name and renaming it leaves it behind.
    _remove_temporaries_in({os.path.dirname(e["path"]) for e in entries}, findings)
    for entry in reversed(entries):
        try:
            outcome = _restore_one(entry)
        except _Skip as skip:
            findings.append(make_finding(skip.rule, entry["path"], skip.message, related=[entry["keeper"]]))
            failed += 1
            continue
        if outcome == "restored":
            restored.append(entry["path"])
        else:
            already += 1
    summary = (
        f"dedup --revert: {len(restored)} file(s) restored, {already} already original, {failed} could not be restored"
    )
    return CommandOutcome(
        command="dedup",
        findings=findings,
        inputs=[os.path.abspath(p) for p in manifest_paths],
        sections={
            "revert": {
                "manifests": [os.path.abspath(p) for p in manifest_paths],
                "restored": sorted(restored),
                "already_original": already,
                "failed": failed,
            }
        },
        summary=summary,
    )
