"""forkmap: results never depend on the helpers (order, helper failures, helper deaths), and no
helper outlives a call."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from rocm_audit.forkmap import _shares, fork_map, worker_count


def _no_children_left() -> bool:
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_results_come_back_in_item_order_from_several_processes():
    items = list(range(40))
    answers = fork_map(lambda n: (n * n, os.getpid()), items, weights=[1] * 40, workers=3)
    assert [square for square, _ in answers] == [n * n for n in items]
    assert len({pid for _, pid in answers}) == 3  # this process and two helpers did the work
    assert os.getpid() in {pid for _, pid in answers}
    assert _no_children_left()


@pytest.mark.parametrize("how", ["raises", "dies", "garbles"])
def test_what_a_helper_fails_to_deliver_is_computed_here(how):
    parent = os.getpid()

    def square(n: int) -> tuple[int, int]:
        if os.getpid() != parent:
            if how == "raises":
                raise RuntimeError("helper trouble")
            if how == "dies":
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "garbles":
                return (n, lambda: None)  # type: ignore[return-value]  # cannot be pickled
        return n * n, os.getpid()

    answers = fork_map(square, list(range(20)), weights=list(range(20)), workers=2)
    assert [square for square, _ in answers] == [n * n for n in range(20)]
    assert {pid for _, pid in answers} == {parent}
    assert _no_children_left()


def test_an_exception_here_still_reaps_the_helpers():
    parent = os.getpid()

    def work(n: int) -> int:
        if os.getpid() == parent and n == 0:
            raise KeyError("here")
        return n

    with pytest.raises(KeyError):
        fork_map(work, list(range(10)), weights=[1] * 10, workers=3)
    assert _no_children_left()


def test_shares_balance_by_weight_and_cover_every_item_once():
    weights = [100, 1, 1, 1, 50, 50, 3]
    shares = _shares(weights, 2)
    assert sorted(i for share in shares for i in share) == list(range(len(weights)))
    loads = [sum(weights[i] for i in share) for share in shares]
    assert max(loads) - min(loads) <= max(weights) - min(weights)
    assert abs(loads[0] - loads[1]) <= 3  # 100+3 against 1+1+1+50+50


def test_no_helpers_for_small_jobs_or_while_other_threads_run(monkeypatch):
    from rocm_audit import forkmap

    with monkeypatch.context() as patched:  # as in the CLI: no thread but this one
        patched.setattr(forkmap.threading, "active_count", lambda: 1)
        assert worker_count(10, min_weight=100) == 1
        assert worker_count(1000, min_weight=100) == min(4, len(os.sched_getaffinity(0)))
    started, stop = threading.Event(), threading.Event()
    other = threading.Thread(target=lambda: (started.set(), stop.wait()))
    other.start()
    started.wait()
    try:
        assert worker_count(1000, min_weight=100) == 1  # forking beside a thread is unsafe
    finally:
        stop.set()
        other.join()
