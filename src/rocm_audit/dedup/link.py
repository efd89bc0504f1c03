"""Safety of one change: re-check a pair against the plan, compare it, and rename a relative symlink over the
duplicate after a last look; tree locks so two runs never change one tree."""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass

from rocm_audit.dedup.plan import DedupGroup, PlannedLink
from rocm_audit.findings import Finding, make_finding
from rocm_audit.tree.identical import CompareStats, ReadFailure, same_bytes
from rocm_audit.tree.inventory import TEMP_PREFIX, FileRecord


class Skip(Exception):
    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule, self.message = rule, message


def same_snapshot(current: os.stat_result, planned: FileRecord) -> bool:
    # Not st_ctime: replacing one hardlink of an inode changes the inode's link count and ctime.
    return (
        stat.S_ISREG(current.st_mode)
        and (current.st_dev, current.st_ino) == planned.identity
        and current.st_size == planned.size
        and current.st_mtime_ns == planned.mtime_ns
        and current.st_mode == planned.mode
    )


@dataclass(frozen=True, slots=True)
class PairBefore:
    """A pair as it was just before its comparison began (both files still as planned).

    st_ctime_ns of a file with a single link: no rename of ours can change it and nobody can set
    it back, so a change after this moment shows at the last look even when the size and mtime
    were restored. None for an inode with several links (replacing one of them changes it)."""

    victim_ctime_ns: int | None
    keeper_ctime_ns: int | None


def _ctime_if_single(st: os.stat_result) -> int | None:
    return st.st_ctime_ns if st.st_nlink == 1 else None


def look_before(group: DedupGroup, planned: PlannedLink) -> PairBefore:
    """Re-check a pair against the plan just before its comparison. Raises Skip."""
    keeper, victim = group.keeper, planned.record
    try:
        keeper_now = os.lstat(keeper.path)
        victim_now = os.lstat(victim.path)
    except FileNotFoundError as exc:
        raise Skip("DUP003", f"{exc.filename} vanished since the plan") from None
    if not same_snapshot(keeper_now, keeper):
        raise Skip("DUP003", "the keeper changed since the plan")
    if not stat.S_ISREG(victim_now.st_mode):
        raise Skip("DUP003", "no longer a regular file")
    if not same_snapshot(victim_now, victim):
        raise Skip("DUP003", "the file changed since the plan")
    if os.stat(os.path.dirname(victim.path)).st_dev != keeper_now.st_dev:
        raise Skip("DUP005", "refusing to link across filesystems")
    return PairBefore(_ctime_if_single(victim_now), _ctime_if_single(keeper_now))


@dataclass(frozen=True, slots=True)
class PairPiece:
    """One range of a duplicate's bytes, to compare with the keeper's (in any process)."""

    keeper: str
    victim: str
    size: int
    byte_range: tuple[int, int]


DIFFERS = "differs"  # a piece's verdict besides None (equal) and a read failure's text


def compare_piece(piece: PairPiece, stats: CompareStats) -> tuple[str | None, int]:
    """(None when the range is equal, else DIFFERS or why it could not be read; bytes read)."""
    before = stats.bytes_read
    try:
        same = same_bytes(piece.keeper, piece.victim, piece.size, stats, piece.byte_range)
    except ReadFailure as failure:
        return f"cannot re-read {failure.path}: {failure.error.strerror}", stats.bytes_read - before
    return (None if same else DIFFERS), stats.bytes_read - before


def replace_with_link(group: DedupGroup, planned: PlannedLink, before: PairBefore) -> None:
    """Make the link (``planned.make``: the relative symlink, or a hardlink of the keeper) under a
    temporary name beside the duplicate and, after a last look, rename it over the duplicate.
    Raises Skip."""
    keeper, victim = group.keeper, planned.record
    directory = os.path.dirname(victim.path)
    hard = planned.make == "hardlink"
    if not hard:
        try:
            resolved = os.stat(os.path.join(directory, planned.link_text))
        except OSError:
            raise Skip("DUP005", f"link text {planned.link_text!r} would not resolve") from None
        if (resolved.st_dev, resolved.st_ino) != keeper.identity:
            raise Skip("DUP005", f"link text {planned.link_text!r} would not resolve to the keeper")
    temp_path = os.path.join(directory, f"{TEMP_PREFIX}{os.urandom(6).hex()}")

    def last_look() -> None:
        victim_now, keeper_now = os.lstat(victim.path), os.lstat(keeper.path)
        if not same_snapshot(victim_now, victim) or not same_snapshot(keeper_now, keeper):
            raise Skip("DUP003", "the file changed during the comparison")
        # The keeper's ctime is as it was before the comparison, or as this run's last hardlink of it left it.
        keeper_unmoved = before.keeper_ctime_ns is None or keeper_now.st_ctime_ns in (
            before.keeper_ctime_ns,
            group.keeper_ctime_ns_ours,
        )
        if before.victim_ctime_ns not in (None, victim_now.st_ctime_ns) or not keeper_unmoved:
            raise Skip("DUP003", "the file changed after the comparison (its ctime moved)")

    if hard:
        # A hardlink moves the keeper's ctime itself: its last look comes just before the link.
        try:
            last_look()
        except OSError as exc:
            raise Skip("DUP003", f"cannot look at the pair again: {exc.strerror}") from None
    try:
        if hard:
            os.link(keeper.path, temp_path, follow_symlinks=False)
        else:
            os.symlink(planned.link_text, temp_path)
    except OSError as exc:
        raise Skip("DUP005", f"cannot create a link in {directory}: {exc.strerror}") from None
    try:
        if not hard:
            last_look()  # right before the rename: the window left is one syscall wide
        os.replace(temp_path, victim.path)
        if hard:
            group.keeper_ctime_ns_ours = os.lstat(keeper.path).st_ctime_ns
    except OSError as exc:
        unlink_quietly(temp_path)
        raise Skip("DUP005", f"cannot rename the link into place: {exc.strerror}") from None
    except BaseException:
        unlink_quietly(temp_path)
        raise


def unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def remove_leftover(path: str, findings: list[Finding]) -> None:
    """Remove a temporary an interrupted run left; one that cannot be removed is SCAN004."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        findings.append(make_finding("SCAN004", path, f"cannot remove leftover: {exc.strerror}"))
