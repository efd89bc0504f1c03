"""Run a read-only function over many items in forked helper processes as well as this one.

Why processes: comparing files is a copy out of the page cache (kernel, no GIL) and a ``memcmp``
(which holds the GIL). Two threads gain nothing end to end (bench: 0.22 s serial, 0.26 s threaded),
while a forked helper that takes half of the work takes the plan's comparison from 0.19 s to 0.13 s
on two CPUs (README "Benchmark").

How work is shared: every item is a ticket in one pipe, in the caller's order of priority (the
heaviest first balances the end of a run; dedup's apply wants pairs to finish early), written
before any helper exists; whoever is free (a helper, or this process between the results it hands
back) takes the next ticket with one 4-byte read, which the kernel serves whole to one reader. A
helper streams each answer back as a frame through its own pipe as soon as it has it, so the caller
can act on answers while the comparison goes on (dedup renames while helpers compare), and no one
idles while another still holds a long list of work given out in advance.

Rules that keep this safe with other people's files: the function must only read; helpers are
forked only while this process has a single thread (no lock can be held by a thread that does
not exist in the child); a helper leaves with ``os._exit`` (no atexit handlers, no flushing of
inherited stdio buffers); whatever a helper fails to deliver (it died, it raised, a frame is cut
short or unreadable) is computed again here, so the results never depend on helpers; no helper
outlives the call, even when the caller stops early or raises.
"""

from __future__ import annotations

import os
import select
import signal
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

_Item = TypeVar("_Item")
_Result = TypeVar("_Result")

MAX_WORKERS = 4  # processes in all, this one included; memory bandwidth caps the gain beyond

_TICKET = struct.Struct("<I")  # a position in the order of priority
FRAME = struct.Struct("<IQ")  # item index, length of the pickled answer that follows
_RESULT_PIPE_BYTES = 1 << 20  # answers a helper may have in flight before it waits for us


def worker_count(total_weight: int, min_weight: int) -> int:
    """How many processes a job of total_weight deserves (1: do not fork)."""
    if total_weight < min_weight or threading.active_count() != 1 or not hasattr(os, "fork"):
        return 1
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


def fork_imap(
    function: Callable[[_Item], _Result],
    items: Sequence[_Item],
    priorities: Sequence[int],
    workers: int,
    meanwhile: Callable[[], None] | None = None,
) -> Iterator[tuple[int, _Result]]:
    """``(index, function(items[index]))`` for every item exactly once, as answers come in; items
    are taken highest priority first (ties in item order).

    Between two answers it yields, this process either hands back what helpers have delivered or,
    when nothing is waiting, computes the next item itself: a caller that spends time on each
    answer gets proportionally fewer items to compute. With ``workers < 2`` it is a plain loop.
    ``meanwhile`` runs here once the helpers have started and before the first answer: work that
    needs no answer overlaps the helpers' first items (an exception from it stops everything)."""
    import pickle  # before forking: each helper needs it too

    order = sorted(range(len(items)), key=lambda i: -priorities[i])
    pool: _Pool | None = None
    if workers > 1 and len(items) > 1:
        pool = _Pool(order, min(workers - 1, len(items) - 1))
        try:
            pool.start(lambda index: pickle.dumps(function(items[index]), protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:  # no pipe for the tickets: no helpers
            pool.close()
            pool = None
    try:
        if meanwhile is not None:
            meanwhile()
        if pool is None:
            for index in order:
                yield index, function(items[index])
            return
        done: set[int] = set()
        while True:
            for index, payload in pool.delivered(wait=False):
                done.add(index)
                yield index, pickle.loads(payload)  # our own child's bytes, never user input
            claimed = pool.claim()
            if claimed is None:
                break
            done.add(claimed)
            yield claimed, function(items[claimed])
        for index, payload in pool.delivered(wait=True):
            done.add(index)
            yield index, pickle.loads(payload)
        for index in order:  # what a helper claimed but never delivered
            if index not in done:
                yield index, function(items[index])
    finally:
        if pool is not None:
            pool.close()


class _Pool:
    """The ticket pipe and the helpers' answer pipes of one fork_imap call."""

    def __init__(self, order: list[int], helpers: int) -> None:
        self.order = order
        self.helpers = helpers
        self.tickets = -1
        self.answers: dict[int, tuple[int, bytearray]] = {}  # read end -> (pid, bytes not yet framed)
        self.pids: list[int] = []

    def start(self, answer: Callable[[int], bytes]) -> None:
        self.tickets = _ticket_pipe(len(self.order))
        if threading.active_count() != 1:  # a thread started since worker_count: no helpers after all
            return
        for _ in range(self.helpers):
            try:
                read_end, write_end = os.pipe()
            except OSError:
                return  # fewer helpers; this process takes their share
            try:
                pid = os.fork()
            except OSError:
                os.close(read_end)
                os.close(write_end)
                return
            if pid == 0:  # the helper
                status = 1
                try:
                    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends a helper at once
                    for fd in (read_end, *self.answers):
                        os.close(fd)
                    _serve(self.tickets, self.order, answer, write_end)
                    status = 0
                finally:
                    os._exit(status)
            os.close(write_end)
            os.set_blocking(read_end, False)
            self.answers[read_end] = (pid, bytearray())
            self.pids.append(pid)

    def claim(self) -> int | None:
        return _claim(self.tickets, self.order)

    def delivered(self, *, wait: bool) -> Iterator[tuple[int, bytes]]:
        """Complete answers the helpers have sent: those waiting now, or (wait) all until every helper
        has closed its pipe."""
        while self.answers:
            ready, _, _ = select.select(list(self.answers), [], [], None if wait else 0)
            if not ready:
                return
            for fd in ready:
                pid, pending = self.answers[fd]
                try:
                    chunk = os.read(fd, _RESULT_PIPE_BYTES)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:  # the helper is done (or dead): a cut-short frame is dropped
                    del self.answers[fd]
                    os.close(fd)
                    continue
                pending += chunk
                yield from read_frames(pending)

    def close(self) -> None:
        """Close every pipe and make sure every helper is gone (it may still run after an exception)."""
        for fd in [*self.answers, self.tickets]:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.answers.clear()
        self.tickets = -1
        for pid in self.pids:
            try:
                if os.waitpid(pid, os.WNOHANG) == (0, 0):
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        self.pids.clear()


def _ticket_pipe(count: int) -> int:
    """A pipe holding tickets 0..count-1, write end closed: a read past the last one returns EOF."""
    read_end, write_end = os.pipe()
    try:
        needed = count * _TICKET.size
        if needed > 65536:  # the default capacity; beyond it the write below would block
            import fcntl

            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, needed)  # EPERM past pipe-max-size (1 MiB)
        view = memoryview(b"".join(_TICKET.pack(position) for position in range(count)))
        while view:  # fits the pipe whole: never blocks
            view = view[os.write(write_end, view) :]
    except OSError:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return read_end


def _claim(tickets: int, order: list[int]) -> int | None:
    """The next item index, or None when every ticket is taken."""
    ticket = os.read(tickets, _TICKET.size)
    if len(ticket) < _TICKET.size:
        return None
    position: int = _TICKET.unpack(ticket)[0]
    return order[position]


def _serve(tickets: int, order: list[int], answer: Callable[[int], bytes], out: int) -> None:
    while (index := _claim(tickets, order)) is not None:
        payload = answer(index)
        view = memoryview(FRAME.pack(index, len(payload)) + payload)
        while view:
            view = view[os.write(out, view) :]


def read_frames(pending: bytearray) -> Iterator[tuple[int, bytes]]:
    """Take every complete frame off the front of pending."""
    while len(pending) >= FRAME.size:
        index, length = FRAME.unpack_from(pending)
        end = FRAME.size + length
        if len(pending) < end:
            return
        payload = bytes(pending[FRAME.size : end])
        del pending[:end]
        yield index, payload
