"""What trimming leaves for after the last layer (image/trim.py keeps only the blocks the checks
read of a large ELF file): trimmed files made whole again where a byte comparison may read them
(``make_whole``, from image/merge.py's ``finish``), and the facts read while trimming handed to
the checks (``facts_still_shown``) or forgotten when the view drops their file (``forget_facts``).

A trim's result is also handed on: a later layer that puts a file of the same size at the same
path (a reinstalled wheel) gets it written without the blocks the earlier trim gave back, hashed
whole as it streams, and, when its identity shows the same content, takes that trim's result as
its own (trimming is a function of the path and the bytes). A different content is made whole
from its layer after the last layer, like a trimmed file a byte comparison may read."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, cast

from rocm_audit.errors import FormatError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.image import tarstream
from rocm_audit.image.digests import Copy, Jobs, StreamedHashes, Trimmed, new_identity


class WholeState(Protocol):
    """What ``make_whole`` uses of image/merge.py's MergeState."""

    root: str
    copies: list[Copy]
    visible: dict[str, int]
    hardlinked: dict[str, int]
    sparse: set[str]
    findings: list[Finding]
    trimmed: dict[int, Trimmed]
    read_facts: dict[tuple[int, int], tuple[str, dict[str, object]]]
    facts_due: dict[tuple[int, int], str]
    punched: dict[tuple[int, int], tuple[str, list[tuple[int, int]]]]
    incomplete: dict[tuple[int, int], str]
    again: dict[int, tuple[str, Callable[[], AbstractContextManager[tarstream.Readable]]]]

    @property
    def offload(self) -> Jobs: ...

    @property
    def keep(self) -> Callable[[str], bool]: ...


def same_inode(path: str, inode: tuple[int, int]) -> bool:
    """Whether ``path`` is (not through a link) the regular file ``inode``."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) == inode


def make_whole(state: WholeState, drop: Callable[[str], None]) -> None:
    """Give every trimmed file the merged view still shows, and another shown file shares the size
    of, its whole bytes back: a byte comparison (dedup's, in ``_rocm_sdk_*`` trees; llvm/'s, of
    LLVM carriers anywhere) must see every byte. They come from a whole file of the view with the
    same digest (a duplicate: the usual case), else from its layer,
    read again once for all such files of that layer. A file whose layer cannot give them is left
    out of the merged view (``drop`` removes an image path from it), with a finding."""
    shown: dict[int, list[str]] = {}  # copy index -> image paths the view shows it at
    for table in (state.visible, state.hardlinked):
        for path, copy_index in table.items():
            if state.keep(path) and path not in state.sparse:
                shown.setdefault(copy_index, []).append(path)
    by_size: dict[int, list[int]] = {}
    for copy_index in shown:
        by_size.setdefault(state.copies[copy_index].size, []).append(copy_index)
    from_layer: dict[int, dict[int, int]] = {}  # layer -> tar offset -> copy index
    for copy_index, trimmed in list(state.trimmed.items()):
        copy = state.copies[copy_index]
        place = _shown_at(state, shown.get(copy_index, []), trimmed.inode)
        peers = [i for i in by_size.get(copy.size, []) if i != copy_index]
        if place is None or (not peers and trimmed.inode not in state.incomplete):
            continue
        source = next(
            (
                state.copies[i].path
                for i in peers
                if i not in state.trimmed and state.copies[i].digest == copy.digest and copy.digest is not None
            ),
            None,
        )
        if source is not None and _copy_whole(state, source, place, copy.size):
            del state.trimmed[copy_index]
        else:
            from_layer.setdefault(copy.layer, {})[copy.offset] = copy_index
    for layer, wanted in sorted(from_layer.items()):
        _read_layer_again(state, layer, wanted, shown, drop)


def _shown_at(state: WholeState, paths: list[str], inode: tuple[int, int]) -> str | None:
    return next((p for p in paths if same_inode(os.path.join(state.root, p[1:]), inode)), None)


def _copy_whole(state: WholeState, source: str, place: str, size: int) -> bool:
    """Copy the whole file at image path ``source`` over the trimmed one at ``place`` (same inode)."""
    try:
        src = os.open(os.path.join(state.root, source[1:]), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if os.fstat(src).st_size != size:
            return False
        dst = os.open(os.path.join(state.root, place[1:]), os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            position = 0
            while position < size:
                moved = os.copy_file_range(src, dst, size - position, position, position)
                if moved == 0:
                    return False
                position += moved
        finally:
            os.close(dst)
    finally:
        os.close(src)
    return True


def _read_layer_again(
    state: WholeState, layer: int, wanted: dict[int, int], shown: dict[int, list[str]], drop: Callable[[str], None]
) -> None:
    """Write the whole bytes of the trimmed files ``wanted`` (tar offset -> copy index) as a second
    reading of their layer gives them; drop, with a finding, those it does not give."""
    where, again = state.again[layer]
    try:
        with again() as stream:
            for entry, data in tarstream.iter_entries(stream):
                found = wanted.get(entry.offset)
                if found is None or not _same_member(state.copies[found], entry):
                    continue
                place = _shown_at(state, shown.get(found, []), state.trimmed[found].inode)
                if place is not None and _write_whole(state, place, data, state.trimmed[found].identity):
                    del wanted[entry.offset]
                    del state.trimmed[found]
                if not wanted:
                    break
    except FormatError:
        pass
    for copy_index in wanted.values():
        copy = state.copies[copy_index]
        place = _shown_at(state, shown.get(copy_index, []), state.trimmed[copy_index].inode)
        for path in shown.get(copy_index, []) if place is not None else []:
            drop(path)
        state.findings.append(
            make_finding(
                "IMG001",
                f"{where}:{copy.path}",
                f"layer {layer} did not give the bytes of {copy.path} again; the file is left out of the audited view",
                data={"layer": layer, "offset": copy.offset, "format": "tar"},
            )
        )


def _same_member(copy: Copy, entry: tarstream.TarEntry) -> bool:
    """Whether the second reading's member at the copy's offset may be the copy (its identity then
    decides: ``_write_whole``)."""
    return entry.kind == tarstream.REGULAR and entry.size == copy.size


def _write_whole(state: WholeState, place: str, data: Iterable[bytes], identity: bytes) -> bool:
    """Write a member's bytes over the trimmed file at image path ``place``; False (the file then
    holds bytes of another content) when their identity (digests.py ``new_identity``) is not
    ``identity``."""
    hasher = new_identity()
    descriptor = os.open(os.path.join(state.root, place[1:]), os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        position = 0
        for chunk in data:
            hasher.update(chunk)
            view = memoryview(chunk)
            while view:
                written = os.pwrite(descriptor, view, position)
                view, position = view[written:], position + written
    finally:
        os.close(descriptor)
    return hasher.digest() == identity


@dataclass(frozen=True, slots=True)
class Reuse:
    """What the trim of a file the view drops leaves for its successor at the same path."""

    identity: bytes  # of the trimmed file's whole content
    punched: list[tuple[int, int]]  # the ranges its trim gave back
    facts: dict[str, object]  # the facts read while trimming it


def reusable_trim(state: WholeState, path: str, target: str, size: int) -> Reuse | None:
    """Before the view drops the file at image path ``path`` (``target`` in the view) for one of
    ``size``: what its trim found, if it is a trimmed file of that size whose trim has answered."""
    copy_index = state.visible.get(path)
    trimmed = state.trimmed.get(copy_index) if copy_index is not None else None
    if copy_index is None or trimmed is None or trimmed.inode in state.facts_due:
        return None
    if state.copies[copy_index].size != size:
        return None
    punched = state.punched.get(trimmed.inode)
    if punched is None or punched[0] != target or not same_inode(target, trimmed.inode):
        return None
    known = state.read_facts.get(trimmed.inode)
    facts = known[1] if known is not None and known[0] == target else {}
    return Reuse(trimmed.identity, punched[1], facts)


class KeptWriter:
    """A new file at ``target`` written without the bytes of the ``punched`` ranges (sorted, whole
    blocks): they stay holes, as punching them out would leave them, and take no disk."""

    def __init__(self, target: str, punched: list[tuple[int, int]]) -> None:
        self._fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self._punched = punched
        self._next = 0  # the first range that may still lie ahead
        self._position = 0

    def write(self, chunk: bytes) -> None:
        start = at = self._position
        end = start + len(chunk)
        view = memoryview(chunk)
        ranges = self._punched
        while at < end:
            while self._next < len(ranges) and ranges[self._next][1] <= at:
                self._next += 1
            hole = ranges[self._next] if self._next < len(ranges) else None
            if hole is not None and hole[0] <= at:
                at = min(end, hole[1])
                continue
            stop = min(end, hole[0]) if hole is not None else end
            piece = view[at - start : stop - start]
            while piece:
                written = os.pwrite(self._fd, piece, at)
                piece, at = piece[written:], at + written
        self._position = end

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def start_trim(
    state: WholeState, path: str, fd: int, size: int, reuse: Reuse | None = None, identity: StreamedHashes | None = None
) -> tuple[int, int]:
    """Have the blocks of the file open at ``fd`` that no check reads punched out (image/trim.py),
    beside the merge (image/offload.py); the file's inode. The facts read on the way are kept for
    the checks (``read_facts``) unless the file leaves the view meanwhile (``forget_facts``). The
    copy counts as trimmed from now on, even if no block goes: a trimmed copy is only ever made
    whole, before a byte comparison, from bytes of its own identity.

    A file written by ``KeptWriter`` from ``reuse`` takes that trim's result when its ``identity``
    is the reused one; else it is ``incomplete``, made whole from its layer by ``make_whole``."""
    info = os.fstat(fd)
    inode = (info.st_dev, info.st_ino)
    if reuse is not None and identity is not None:
        os.ftruncate(fd, size)  # a hole at the end, too
        if identity.digest() == reuse.identity:
            state.punched[inode] = (path, reuse.punched)
            if reuse.facts:
                state.read_facts[inode] = (path, reuse.facts)
        else:
            state.incomplete[inode] = path
        return inode
    state.facts_due[inode] = path

    def done(answer: object) -> None:
        result = cast("tuple[tuple[int, int], int, dict[str, object], list[tuple[int, int]]]", answer)
        if answer is None or state.facts_due.get(inode) != path:
            return
        del state.facts_due[inode]
        if result[2]:
            state.read_facts[inode] = (path, result[2])
        state.punched[inode] = (path, result[3])

    state.offload.submit("trim", os.dup(fd), path, size, done)
    return inode


def facts_still_shown(state: WholeState) -> dict[tuple[int, int], dict[str, object]]:
    """The facts read while trimming (``read_facts``) of the files the merged view still shows at
    the path they were read through, under no other name (a fact names the path it was read at)."""
    known = {}
    for identity, (path, facts) in state.read_facts.items():
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if (info.st_dev, info.st_ino) == identity and info.st_nlink == 1 and stat.S_ISREG(info.st_mode):
            known[identity] = facts
    return known


def forget_facts(state: WholeState, target: str, *, below: bool = False) -> None:
    """Forget what trimming the file at ``target`` (every file under it with ``below``) found,
    before it goes: ext4 gives a freed inode number to the next file it creates, often the one a
    later layer puts at the same path, and ``read_facts`` and ``punched`` are keyed by inode."""
    if below:
        prefix = target + os.sep
        for table in (state.read_facts, state.punched):
            for identity in [i for i, (path, _) in table.items() if path.startswith(prefix)]:
                del table[identity]
        for paths in (state.facts_due, state.incomplete):
            for identity in [i for i, path in paths.items() if path.startswith(prefix)]:
                del paths[identity]
        return
    try:
        info = os.lstat(target)
    except OSError:
        return
    inode = (info.st_dev, info.st_ino)
    for table in (state.read_facts, state.punched):
        known = table.get(inode)
        if known is not None and known[0] == target:
            del table[inode]
    for paths in (state.facts_due, state.incomplete):
        if paths.get(inode) == target:
            del paths[inode]
