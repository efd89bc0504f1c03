"""Find byte-identical files among same-size candidates at the cost of reading them once.

The funnel of peers.md 1 without the full hash: files already agree on size; all members of a class
are read in lockstep, chunk by chunk, and compared with memcmp, so a difference stops the reading of
that file at the chunk where it appears. The order is head (4 KiB, unless the inventory already
digested it), tail (4 KiB: build ids and signatures differ there), then the rest, and each file is
opened once. No hashing pass runs over full files: comparing is cheaper than hashing and exact.
Classes too large to hold one buffer per member fall back to a streamed BLAKE2b digest (the apply
step byte-compares before any change).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

HEAD_BYTES = 4096
TAIL_BYTES = 4096
# Two 256 KiB buffers stay in a 1 MiB L2 cache between the read and the compare; 1 MiB chunks
# measured 20% slower on the bench tree, 4 MiB ones much slower still.
CHUNK_BYTES = 256 << 10
MAX_LOCKSTEP_MEMBERS = 64  # one buffer per member: 16 MiB at most


@dataclass(frozen=True, slots=True)
class Candidate:
    path: str
    size: int
    head_digest: bytes | None  # of the first HEAD_BYTES, when the inventory read them


# Asked once per class of files whose first HEAD_BYTES agree, with one member's path, open file and
# those bytes: False drops the class before anything more is read (dedup: "not a shared library").
HeadFilter = Callable[[str, int, memoryview], bool]


# Reads land at page-aligned addresses. The kernel copies out of the page cache with `rep movsb`,
# which on the bench machine (AMD EPYC, KVM) is slow when the destination starts 1-31 bytes past a
# page boundary (the source, a cached page, starts on one): reading the bench tree's candidates
# took 0.6-0.67 s 16 bytes past and 1.45-1.8 s 8 bytes past, against 0.32-0.42 s at 0, 32 and
# more. malloc serves a block this large from its own mmap, 16 bytes past a page boundary, so a
# plain bytearray(CHUNK_BYTES) sits right in the slow zone.
BUFFER_ALIGNMENT = 4096


def _address_of(buffer: bytearray) -> int | None:
    try:
        import ctypes  # 2 ms, once per process that compares; nothing else here needs it
    except ImportError:  # an interpreter built without ctypes: unaligned buffers still work
        return None
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


@dataclass(frozen=True, slots=True)
class ReadBuffer:
    """CHUNK_BYTES of memory starting at a page-aligned address inside ``storage``."""

    storage: bytearray
    start: int  # where the aligned bytes begin inside storage
    view: memoryview  # storage[start:start + CHUNK_BYTES]

    @classmethod
    def allocate(cls) -> ReadBuffer:
        storage = bytearray(CHUNK_BYTES + BUFFER_ALIGNMENT)
        address = _address_of(storage)
        start = 0 if address is None else -address % BUFFER_ALIGNMENT
        return cls(storage, start, memoryview(storage)[start : start + CHUNK_BYTES])

    def begins_with(self, other: memoryview) -> bool:
        """Whether this buffer's first len(other) bytes equal other's (one memcmp, no copy)."""
        return self.storage.startswith(other, self.start)


@dataclass(slots=True)
class CompareStats:
    bytes_read: int = 0
    # Read buffers, allocated once and reused for every class: a fresh buffer per file costs a
    # calloc (often an mmap plus page faults) for every candidate.
    _buffers: list[ReadBuffer] = field(default_factory=list, repr=False)

    def buffers(self, count: int) -> list[ReadBuffer]:
        while len(self._buffers) < count:
            self._buffers.append(ReadBuffer.allocate())
        return self._buffers[:count]


class ReadFailure(Exception):
    def __init__(self, path: str, error: OSError) -> None:
        super().__init__(path)
        self.path, self.error = path, error

    def __reduce__(self) -> tuple[type[ReadFailure], tuple[str, OSError]]:
        return ReadFailure, (self.path, self.error)  # crosses the pipe of a forkmap helper


class _Descriptors:
    """Descriptors kept open across the comparisons of one plan (``keeping_open``).

    A plan reads a large pair's head and tail here, then its middle in pieces, some in forked
    helpers: without this each piece opened the files again. Inside the scope a path is opened
    once; forked helpers inherit the descriptors (pread leaves the shared offset alone) and open
    nothing for what the parent already holds. Outside the scope every open is fresh, as dedup's
    apply needs: the comparison just before a change must read the file that is there now.
    """

    LIMIT = 256  # descriptors held at most; idle ones beyond it are closed, oldest first

    def __init__(self) -> None:
        self.active = 0
        self.fds: dict[str, int] = {}
        self.in_use: dict[int, int] = {}

    def take(self, path: str) -> int:
        fd = self.fds.pop(path, None)
        if fd is None:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            self._make_room()
        self.fds[path] = fd  # most recently used last
        self.in_use[fd] = self.in_use.get(fd, 0) + 1
        return fd

    def release(self, fd: int) -> bool:
        """False when fd is not one of ours (the caller closes it)."""
        count = self.in_use.get(fd)
        if count is None:
            return False
        if count > 1:
            self.in_use[fd] = count - 1
        else:
            del self.in_use[fd]
        return True

    def _make_room(self) -> None:
        idle = [path for path, fd in self.fds.items() if fd not in self.in_use]
        for path in idle[: max(0, len(self.fds) + 1 - self.LIMIT)]:
            os.close(self.fds.pop(path))

    def close_all(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        self.in_use.clear()


_HELD = _Descriptors()


@contextlib.contextmanager
def keeping_open() -> Iterator[None]:
    """Within this scope each compared file is opened once (see _Descriptors)."""
    _HELD.active += 1
    try:
        yield
    finally:
        _HELD.active -= 1
        if not _HELD.active:
            _HELD.close_all()


def _open(path: str) -> int:
    try:
        if _HELD.active:
            return _HELD.take(path)
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ReadFailure(path, exc) from None


def _close(fd: int) -> None:
    if not _HELD.release(fd):
        os.close(fd)


def _fill(fd: int, path: str, view: memoryview, offset: int) -> bool:
    """Read len(view) bytes at offset into view; False when the file ended early (it changed)."""
    try:
        return os.preadv(fd, [view], offset) == len(view)
    except OSError as exc:
        raise ReadFailure(path, exc) from None


def _ranges(size: int, start: int, full: bool) -> list[tuple[int, int]]:
    """Byte ranges to compare from ``start`` on: the head (when unread), the tail, then (full) the middle.
    What fits in one chunk is one read: the order pays off only where it can save bulk reads."""
    if size - start <= CHUNK_BYTES:
        return [(start, size)]
    ranges = [(0, HEAD_BYTES)] if start == 0 else []
    tail_start = max(min(size, HEAD_BYTES), size - TAIL_BYTES)
    if tail_start < size:
        ranges.append((tail_start, size))
    if full and HEAD_BYTES < tail_start:
        ranges.append((HEAD_BYTES, tail_start))
    return ranges


def partition_identical(
    candidates: Sequence[Candidate],
    stats: CompareStats,
    failures: list[ReadFailure],
    head_filter: HeadFilter | None = None,
    *,
    full: bool = True,
) -> list[list[Candidate]]:
    """Classes (of 2 or more) of byte-identical candidates; all candidates must share one size.

    Candidates with head digests are first split by them; without (files the inventory did not open),
    the heads are compared like every other byte and ``head_filter`` sees each class's head first.
    ``full=False`` stops after head and tail: the classes are then only probable, for a caller that
    byte-compares each pair itself before acting on it. Files that cannot be read are appended to
    ``failures`` and left out.
    """
    if len(candidates) < 2:
        return []
    size = candidates[0].size
    digested = all(c.head_digest is not None for c in candidates) and head_filter is None
    if not digested and len(candidates) > MAX_LOCKSTEP_MEMBERS:
        candidates = _with_head_digests(candidates, stats, failures)
    elif any(c.head_digest is None for c in candidates):
        # The inventory read the heads of some members only (hardlinked ones): a digest on one side
        # and none on the other says nothing, so every head is compared (TheRock's multi-link devel
        # aliases against a single-link runtime copy).
        candidates = [Candidate(c.path, c.size, None) for c in candidates]
    by_head: dict[bytes | None, list[Candidate]] = {}
    for one in candidates:
        by_head.setdefault(one.head_digest, []).append(one)
    # Bytes a digest covered are still compared when they are all the file has: classes are exact.
    ranges = _ranges(size, HEAD_BYTES if digested and size > HEAD_BYTES else 0, full)
    result: list[list[Candidate]] = []
    for cls in by_head.values():
        if len(cls) < 2:
            continue
        if len(cls) > MAX_LOCKSTEP_MEMBERS and full:
            result.extend(c for c in _by_digest(cls, stats, failures, head_filter) if len(c) > 1)
        elif len(cls) > MAX_LOCKSTEP_MEMBERS:
            # Probable: they agree on size and head digest, which is all a class this big gets.
            if head_filter is None or _head_passes(cls[0].path, head_filter, stats, failures):
                result.append(cls)
        else:
            result.extend(_lockstep(cls, ranges, stats, failures, None if digested else head_filter))
    return result


def middle_pieces(size: int, piece_bytes: int) -> list[tuple[int, int]]:
    """The bytes between head and tail (what ``partition_identical(full=False)`` leaves unread) in
    ranges of about piece_bytes, for processes to compare separately."""
    start, end = HEAD_BYTES, max(min(size, HEAD_BYTES), size - TAIL_BYTES)
    step = max(CHUNK_BYTES, piece_bytes - piece_bytes % CHUNK_BYTES)
    return [(offset, min(offset + step, end)) for offset in range(start, end, step)]


def equal_over(
    members: Sequence[Candidate], byte_range: tuple[int, int], stats: CompareStats, failures: list[ReadFailure]
) -> list[list[Candidate]]:
    """Classes (of 2 or more) of members whose bytes agree over byte_range; at most
    MAX_LOCKSTEP_MEMBERS members (one buffer each)."""
    if len(members) > MAX_LOCKSTEP_MEMBERS:
        raise ValueError(f"{len(members)} members: at most {MAX_LOCKSTEP_MEMBERS} compare in lockstep")
    return _lockstep(list(members), [byte_range], stats, failures, None)


def refine(members: Sequence[Candidate], partitions: Sequence[list[list[Candidate]]]) -> list[list[Candidate]]:
    """Classes (of 2 or more) of members that share a class in every partition: members equal over
    each of several byte ranges are equal over all of them."""
    classes = [list(members)]
    for partition in partitions:
        number = {one.path: n for n, cls in enumerate(partition) for one in cls}
        split: dict[tuple[int, int], list[Candidate]] = {}
        for position, cls in enumerate(classes):
            for one in cls:
                if one.path in number:  # absent: alone over that range, or unreadable
                    split.setdefault((position, number[one.path]), []).append(one)
        classes = [cls for cls in split.values() if len(cls) > 1]
    return classes


def head_digest(head: bytes) -> bytes:
    """The digest of a file's first HEAD_BYTES that splits same-size candidates (taken by the inventory)."""
    import hashlib  # here, not at the top: dedup's own runs never digest, and OpenSSL's start-up costs 3 ms

    return hashlib.blake2b(head, digest_size=16).digest()


def _with_head_digests(
    candidates: Sequence[Candidate], stats: CompareStats, failures: list[ReadFailure]
) -> list[Candidate]:
    """Candidates with their head digests read, for classes too large to read in lockstep at once."""
    digested = []
    for one in candidates:
        try:
            fd = _open(one.path)
            try:
                head = os.pread(fd, HEAD_BYTES, 0)
            except OSError as exc:
                raise ReadFailure(one.path, exc) from None
            finally:
                _close(fd)
        except ReadFailure as failure:
            failures.append(failure)
            continue
        stats.bytes_read += len(head)
        digested.append(Candidate(one.path, one.size, head_digest(head)))
    return digested


def _lockstep(
    members: list[Candidate],
    ranges: list[tuple[int, int]],
    stats: CompareStats,
    failures: list[ReadFailure],
    head_filter: HeadFilter | None,
) -> list[list[Candidate]]:
    """Split members into classes equal over the given byte ranges, reading each file once.
    ``head_filter``, when given, is asked about each class once the first range is compared."""
    fds: dict[int, int] = {}
    try:
        for index, one in enumerate(members):
            try:
                fds[index] = _open(one.path)
            except ReadFailure as failure:
                failures.append(failure)
        buffers = stats.buffers(len(members))
        classes: list[list[int]] = [list(fds)] if len(fds) > 1 else []
        for range_number, (range_start, range_end) in enumerate(ranges):
            offset = range_start
            while offset < range_end and classes:
                length = min(CHUNK_BYTES, range_end - offset)
                next_classes: list[list[int]] = []
                for cls in classes:
                    # One representative per distinct block; members equal to it join its class.
                    representatives: list[tuple[ReadBuffer, list[int]]] = []
                    for index in cls:
                        view = buffers[index].view[:length]
                        try:
                            complete = _fill(fds[index], members[index].path, view, offset)
                        except ReadFailure as failure:
                            failures.append(failure)
                            _close(fds.pop(index))
                            continue
                        stats.bytes_read += length
                        if not complete:  # shorter than its size a moment ago: not a duplicate
                            _close(fds.pop(index))
                            continue
                        for rep_block, rep_members in representatives:
                            if rep_block.begins_with(view):
                                rep_members.append(index)
                                break
                        else:
                            representatives.append((buffers[index], [index]))
                    for _, rep_members in representatives:
                        if len(rep_members) > 1:
                            next_classes.append(rep_members)
                        else:  # no partner left: stop reading this file
                            _close(fds.pop(rep_members[0]))
                classes = next_classes
                offset += length
            if range_number == 0 and head_filter is not None:
                classes = [cls for cls in classes if _keep(cls, members, fds, buffers, range_end, head_filter)]
        return [[members[i] for i in cls] for cls in classes]
    finally:
        for fd in fds.values():
            _close(fd)


def _keep(
    cls: list[int],
    members: list[Candidate],
    fds: dict[int, int],
    buffers: list[ReadBuffer],
    head_length: int,
    head_filter: HeadFilter,
) -> bool:
    first = cls[0]
    if head_filter(members[first].path, fds[first], buffers[first].view[:head_length]):
        return True
    for index in cls:
        _close(fds.pop(index))
    return False


def _by_digest(
    members: list[Candidate], stats: CompareStats, failures: list[ReadFailure], head_filter: HeadFilter | None
) -> list[list[Candidate]]:
    by_digest: dict[bytes, list[Candidate]] = {}
    for one in members:
        try:
            digest = file_digest(one.path, stats)
        except ReadFailure as failure:
            failures.append(failure)
            continue
        by_digest.setdefault(digest, []).append(one)
    classes = [c for c in by_digest.values() if len(c) > 1]
    if head_filter is not None:
        classes = [c for c in classes if _head_passes(c[0].path, head_filter, stats, failures)]
    return classes


def _head_passes(path: str, head_filter: HeadFilter, stats: CompareStats, failures: list[ReadFailure]) -> bool:
    try:
        fd = _open(path)
    except ReadFailure as failure:
        failures.append(failure)
        return False
    try:
        view = stats.buffers(1)[0].view[:HEAD_BYTES]
        count = os.preadv(fd, [view], 0)
        return head_filter(path, fd, view[:count])
    except OSError as exc:
        failures.append(ReadFailure(path, exc))
        return False
    finally:
        _close(fd)


def file_digest(path: str, stats: CompareStats) -> bytes:
    import hashlib  # only classes too large for lockstep get here

    hasher = hashlib.blake2b(digest_size=32)
    view = stats.buffers(1)[0].view
    fd = _open(path)
    try:
        offset = 0
        while True:
            try:
                count = os.preadv(fd, [view], offset)
            except OSError as exc:
                raise ReadFailure(path, exc) from None
            if count == 0:
                break
            hasher.update(view[:count])
            stats.bytes_read += count
            offset += count
    finally:
        _close(fd)
    return hasher.digest()


def same_bytes(
    path_a: str, path_b: str, size: int, stats: CompareStats, byte_range: tuple[int, int] | None = None
) -> bool:
    """Byte-for-byte comparison of two files of the given size over byte_range (default: all of
    it); the range that ends at size also proves that nothing follows. Raises ReadFailure."""
    start, end = byte_range or (0, size)
    fd_a = _open(path_a)
    try:
        fd_b = _open(path_b)
    except ReadFailure:
        _close(fd_a)
        raise
    try:
        buffer_a, buffer_b = stats.buffers(2)
        offset = start
        while offset < end:
            length = min(CHUNK_BYTES, end - offset)
            if not (
                _fill(fd_a, path_a, buffer_a.view[:length], offset)
                and _fill(fd_b, path_b, buffer_b.view[:length], offset)
            ):
                return False
            stats.bytes_read += 2 * length
            if not buffer_a.begins_with(buffer_b.view[:length]):
                return False
            offset += length
        # Nothing may follow: a file that grew is not the file we compared.
        return end < size or (not os.pread(fd_a, 1, size) and not os.pread(fd_b, 1, size))
    finally:
        _close(fd_a)
        _close(fd_b)


def pieces(size: int, piece_bytes: int) -> list[tuple[int, int]]:
    """All of a file's bytes in ranges of about piece_bytes (whole chunks; one empty range for an
    empty file), for processes to compare separately."""
    step = max(CHUNK_BYTES, piece_bytes - piece_bytes % CHUNK_BYTES)
    return [(offset, min(offset + step, size)) for offset in range(0, size, step)] or [(0, 0)]


class KnownClasses:
    """Which files one run has already compared byte for byte, and what it found, by (st_dev, st_ino).

    dedup's plan records every size bucket it compared in full; a later check over the same
    inventory (llvm's identical copies, in `rocm-audit check`) asks here first and reads again
    only what was never compared."""

    def __init__(self) -> None:
        self._class_of: dict[tuple[int, int], int] = {}

    def record(self, compared: Sequence[tuple[int, int]], classes: Sequence[Sequence[tuple[int, int]]]) -> None:
        """``compared`` were all read in full; ``classes`` are those of them with equal bytes."""
        for members in classes:
            number = len(self._class_of)
            for identity in members:
                self._class_of[identity] = number
        for identity in compared:
            if identity not in self._class_of:
                self._class_of[identity] = len(self._class_of)  # equal to nothing it was compared with

    def classes_among(self, identities: Sequence[tuple[int, int]]) -> list[list[tuple[int, int]]] | None:
        """Classes (of two or more) among files of one size, or None if any of them was never compared."""
        if not identities or any(i not in self._class_of for i in identities):
            return None
        by_class: dict[int, list[tuple[int, int]]] = {}
        for identity in identities:
            by_class.setdefault(self._class_of[identity], []).append(identity)
        return [members for members in by_class.values() if len(members) > 1]
