"""Run a read-only function over many items in forked helper processes as well as this one.

Why processes: comparing files is a copy out of the page cache (kernel, no GIL) and a ``memcmp``
(which holds the GIL). Two threads gain nothing end to end (bench: 0.22 s serial, 0.26 s threaded),
while a forked helper that reads half of the buckets takes the plan's comparison from 0.19 s to
0.13 s on two CPUs (README "Benchmark").

Rules that keep this safe with other people's files: the function must only read; helpers are
forked only while this process has a single thread (no lock can be held by a thread that does
not exist in the child); a helper reports through a pipe and leaves with ``os._exit`` (no atexit
handlers, no flushing of inherited stdio buffers); whatever a helper fails to deliver (it died, it
raised, its answer is unreadable) is computed again here, so the results never depend on helpers.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

_Item = TypeVar("_Item")
_Result = TypeVar("_Result")

MAX_WORKERS = 4  # processes in all, this one included; memory bandwidth caps the gain beyond


def worker_count(total_weight: int, min_weight: int) -> int:
    """How many processes a job of total_weight deserves (1: do not fork)."""
    if total_weight < min_weight or threading.active_count() != 1 or not hasattr(os, "fork"):
        return 1
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


def fork_map(function: Callable[[_Item], _Result], items: Sequence[_Item], weights: Sequence[int],
             workers: int) -> list[_Result]:
    """``[function(item) for item in items]``, with the items shared out by weight between this
    process and ``workers - 1`` forked helpers. Results must be picklable."""
    if workers < 2 or len(items) < 2:
        return [function(item) for item in items]
    shares = _shares(weights, workers)
    helpers: list[tuple[int, int, list[int]]] = []  # (pid, read end, item indices)
    results: dict[int, _Result] = {}
    try:
        for share in shares[1:]:
            helper = _start(function, items, share)
            if helper is not None:
                helpers.append(helper)
            else:  # could not fork: do that share here
                shares[0] = shares[0] + share
        for index in shares[0]:
            results[index] = function(items[index])
        for pid, read_end, share in helpers:
            delivered = _collect(pid, read_end)
            for index in share:
                results[index] = delivered[index] if delivered and index in delivered else function(items[index])
    finally:
        for pid, read_end, _ in helpers:
            _reap(pid, read_end)
    return [results[index] for index in range(len(items))]


def _shares(weights: Sequence[int], workers: int) -> list[list[int]]:
    """Item indices per worker, heaviest first to the lightest worker (balanced by weight)."""
    shares: list[list[int]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for index in sorted(range(len(weights)), key=lambda i: -weights[i]):
        lightest = loads.index(min(loads))
        shares[lightest].append(index)
        loads[lightest] += weights[index]
    return [sorted(share) for share in shares]


def _start(function: Callable[[_Item], _Result], items: Sequence[_Item],
           share: list[int]) -> tuple[int, int, list[int]] | None:
    try:
        read_end, write_end = os.pipe()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return None
    if pid == 0:  # the helper
        status = 1
        try:
            import pickle

            os.close(read_end)
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends a helper at once
            payload = pickle.dumps({index: function(items[index]) for index in share},
                                   protocol=pickle.HIGHEST_PROTOCOL)
            view = memoryview(payload)
            while view:
                view = view[os.write(write_end, view):]
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    return pid, read_end, share


def _collect(pid: int, read_end: int) -> dict[int, object] | None:
    """The helper's results, or None when it did not deliver them whole."""
    chunks = []
    try:
        while chunk := os.read(read_end, 1 << 20):
            chunks.append(chunk)
    except OSError:
        return None
    _, status = os.waitpid(pid, 0)
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        return None
    import pickle

    try:
        delivered = pickle.loads(b"".join(chunks))  # our own child's bytes, never user input
    except Exception:  # noqa: BLE001 - a truncated answer is computed again
        return None
    return delivered if isinstance(delivered, dict) else None


def _reap(pid: int, read_end: int) -> None:
    """Close the pipe and make sure the helper is gone (it may still run after an exception)."""
    try:
        os.close(read_end)
    except OSError:
        pass
    try:
        if os.waitpid(pid, os.WNOHANG) == (0, 0):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # already reaped by _collect
