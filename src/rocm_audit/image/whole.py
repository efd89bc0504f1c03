"""What trimming leaves for after the last layer (image/trim.py keeps only the blocks the checks
read of a large ELF file): trimmed files made whole again where a byte comparison may read them
(``make_whole``, from image/merge.py's ``finish``), and the facts read while trimming handed to
the checks (``facts_still_shown``) or forgotten when the view drops their file (``forget_facts``)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Protocol, cast

from rocm_audit.errors import FormatError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.image import tarstream
from rocm_audit.image.digests import Copy, Jobs, Trimmed, new_identity


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
        if place is None or not peers:
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


def start_trim(state: WholeState, path: str, fd: int, size: int) -> tuple[int, int]:
    """Have the blocks of the file open at ``fd`` that no check reads punched out (image/trim.py),
    beside the merge (image/offload.py); the file's inode. The facts read on the way are kept for
    the checks (``read_facts``) unless the file leaves the view meanwhile (``forget_facts``). The
    copy counts as trimmed from now on, even if no block goes: a trimmed copy is only ever made
    whole, before a byte comparison, from bytes of its own identity."""
    info = os.fstat(fd)
    inode = (info.st_dev, info.st_ino)
    state.facts_due[inode] = path

    def done(answer: object) -> None:
        facts = cast("tuple[tuple[int, int], int, dict[str, object]]", answer)[2] if answer is not None else None
        if state.facts_due.get(inode) == path:
            del state.facts_due[inode]
            if facts:
                state.read_facts[inode] = (path, facts)

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
    """Forget the facts read while trimming the file at ``target`` (every file under it with
    ``below``) before it goes: ext4 gives a freed inode number to the next file it creates, often
    the one a later layer puts at the same path, and ``read_facts`` is keyed by inode."""
    if below:
        prefix = target + os.sep
        for identity in [i for i, (path, _) in state.read_facts.items() if path.startswith(prefix)]:
            del state.read_facts[identity]
        for identity in [i for i, path in state.facts_due.items() if path.startswith(prefix)]:
            del state.facts_due[identity]
        return
    try:
        info = os.lstat(target)
    except OSError:
        return
    inode = (info.st_dev, info.st_ino)
    known = state.read_facts.get(inode)
    if known is not None and known[0] == target:
        del state.read_facts[inode]
    if state.facts_due.get(inode) == target:
        del state.facts_due[inode]
