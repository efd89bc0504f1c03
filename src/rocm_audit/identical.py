"""Find byte-identical files among same-size candidates at the cost of reading them once.

The funnel of peers.md 1 without the full hash: files already agree on size and on a digest of
their first 4 KiB (taken during the inventory); then the last 4 KiB split them further; then all
survivors of a class are read in lockstep, chunk by chunk, and compared with ``==`` (memcmp), so a
difference stops the reading of that file at the chunk where it appears. No hashing pass runs over
full files: comparing is cheaper than hashing and exact. Classes too large to hold one buffer per
member fall back to a streamed BLAKE2b digest (the apply step byte-compares before any change).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass

HEAD_BYTES = 4096
TAIL_BYTES = 4096
CHUNK_BYTES = 1 << 20
BUFFER_BUDGET_BYTES = 64 << 20  # lockstep buffers, summed over the members of one class
MAX_LOCKSTEP_MEMBERS = 64


@dataclass(frozen=True, slots=True)
class Candidate:
    path: str
    size: int
    head_digest: bytes


@dataclass(slots=True)
class CompareStats:
    bytes_read: int = 0


class ReadFailure(Exception):
    def __init__(self, path: str, error: OSError) -> None:
        super().__init__(path)
        self.path, self.error = path, error


def _open(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ReadFailure(path, exc) from None


def _pread(fd: int, path: str, size: int, offset: int) -> bytes:
    try:
        return os.pread(fd, size, offset)
    except OSError as exc:
        raise ReadFailure(path, exc) from None


def _read_block(fd: int, path: str, buffer: bytearray, offset: int) -> bytes | bytearray:
    """Fill ``buffer`` from ``offset`` with one preadv (no allocation per chunk: a fresh 1 MiB
    ``bytes`` per pread made glibc map, fault in and trim memory on every chunk, 5-7x slower).
    Returns the buffer, or a copy of the bytes read when the file ended early."""
    try:
        count = os.preadv(fd, [buffer], offset)
    except OSError as exc:
        raise ReadFailure(path, exc) from None
    return buffer if count == len(buffer) else bytes(buffer[:count])


def partition_identical(candidates: Sequence[Candidate], stats: CompareStats,
                        failures: list[ReadFailure]) -> list[list[Candidate]]:
    """Classes (of 2 or more) of byte-identical candidates; all candidates must share one size.

    Files that cannot be read are appended to ``failures`` and left out.
    """
    if len(candidates) < 2:
        return []
    size = candidates[0].size
    by_head: dict[bytes, list[Candidate]] = {}
    for one in candidates:
        by_head.setdefault(one.head_digest, []).append(one)
    classes = [c for c in by_head.values() if len(c) > 1]
    if size <= HEAD_BYTES:
        # The head digest covered every byte; the lockstep pass below re-reads these tiny files to
        # make the classes exact rather than digest-based.
        return [c for cls in classes for c in _lockstep(cls, 0, size, stats, failures) if len(c) > 1]
    tail_start = max(HEAD_BYTES, size - TAIL_BYTES)
    refined: list[list[Candidate]] = []
    for cls in classes:
        by_tail: dict[bytes, list[Candidate]] = {}
        for one in cls:
            fd = None
            try:
                fd = _open(one.path)
                tail = _pread(fd, one.path, size - tail_start, tail_start)
            except ReadFailure as failure:
                failures.append(failure)
                continue
            finally:
                if fd is not None:
                    os.close(fd)
            stats.bytes_read += len(tail)
            by_tail.setdefault(tail, []).append(one)
        refined.extend(c for c in by_tail.values() if len(c) > 1)
    result: list[list[Candidate]] = []
    for cls in refined:
        if tail_start <= HEAD_BYTES:
            result.append(cls)  # head and tail together covered the whole file
            continue
        if len(cls) > MAX_LOCKSTEP_MEMBERS:
            result.extend(c for c in _by_digest(cls, stats, failures) if len(c) > 1)
        else:
            result.extend(c for c in _lockstep(cls, HEAD_BYTES, tail_start, stats, failures) if len(c) > 1)
    return result


def _lockstep(members: list[Candidate], start: int, end: int, stats: CompareStats,
              failures: list[ReadFailure]) -> list[list[Candidate]]:
    """Split members into classes equal over bytes [start, end), reading each file once."""
    fds: dict[int, int] = {}
    chunk = max(64 << 10, min(CHUNK_BYTES, BUFFER_BUDGET_BYTES // max(1, len(members))))
    try:
        live: list[int] = []
        for index, one in enumerate(members):
            try:
                fds[index] = _open(one.path)
                live.append(index)
            except ReadFailure as failure:
                failures.append(failure)
        classes: list[list[int]] = [live] if live else []
        buffers: dict[int, bytearray] = {}  # one reused buffer per member
        offset = start
        while offset < end and any(len(c) > 1 for c in classes):
            length = min(chunk, end - offset)
            next_classes: list[list[int]] = []
            for cls in classes:
                if len(cls) < 2:
                    next_classes.append(cls)
                    continue
                representatives: list[tuple[bytes | bytearray, list[int]]] = []
                for index in cls:
                    buffer = buffers.get(index)
                    if buffer is None or len(buffer) != length:
                        buffer = buffers[index] = bytearray(length)
                    try:
                        block = _read_block(fds[index], members[index].path, buffer, offset)
                    except ReadFailure as failure:
                        failures.append(failure)
                        continue
                    stats.bytes_read += len(block)
                    for rep_block, rep_members in representatives:
                        if rep_block == block:
                            rep_members.append(index)
                            break
                    else:
                        representatives.append((block, [index]))
                for _, rep_members in representatives:
                    if len(rep_members) == 1:  # no partner left: stop reading this file
                        os.close(fds.pop(rep_members[0]))
                        buffers.pop(rep_members[0], None)
                    next_classes.append(rep_members)
            classes = next_classes
            offset += length
        return [[members[i] for i in cls] for cls in classes if len(cls) > 1]
    finally:
        for fd in fds.values():
            os.close(fd)


def _by_digest(members: list[Candidate], stats: CompareStats,
               failures: list[ReadFailure]) -> list[list[Candidate]]:
    by_digest: dict[bytes, list[Candidate]] = {}
    for one in members:
        try:
            digest = file_digest(one.path, stats)
        except ReadFailure as failure:
            failures.append(failure)
            continue
        by_digest.setdefault(digest, []).append(one)
    return list(by_digest.values())


def file_digest(path: str, stats: CompareStats) -> bytes:
    hasher = hashlib.blake2b(digest_size=32)
    buffer = bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    fd = _open(path)
    try:
        offset = 0
        while True:
            try:
                count = os.preadv(fd, [buffer], offset)
            except OSError as exc:
                raise ReadFailure(path, exc) from None
            if count == 0:
                break
            hasher.update(view[:count])
            stats.bytes_read += count
            offset += count
    finally:
        os.close(fd)
    return hasher.digest()


def same_bytes(path_a: str, path_b: str, size: int, stats: CompareStats) -> bool:
    """Byte-for-byte comparison of two files of the given size. Raises ReadFailure."""
    fd_a = _open(path_a)
    try:
        fd_b = _open(path_b)
    except ReadFailure:
        os.close(fd_a)
        raise
    try:
        offset = 0
        buffer_a = buffer_b = bytearray()
        while offset < size:
            length = min(CHUNK_BYTES, size - offset)
            if len(buffer_a) != length:
                buffer_a, buffer_b = bytearray(length), bytearray(length)
            block_a = _read_block(fd_a, path_a, buffer_a, offset)
            block_b = _read_block(fd_b, path_b, buffer_b, offset)
            stats.bytes_read += len(block_a) + len(block_b)
            if block_a != block_b or len(block_a) != length:
                return False
            offset += length
        # Nothing may follow: a file that grew is not the file we compared.
        return not os.pread(fd_a, 1, size) and not os.pread(fd_b, 1, size)
    finally:
        os.close(fd_a)
        os.close(fd_b)
