"""forkmap: results never depend on the helpers (order, helper failures, helper deaths), and no
helper outlives a call."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from rocm_audit.tree.forkmap import fork_imap, worker_count


def _no_children_left() -> bool:
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


@pytest.fixture
def alone(monkeypatch):
    """This process counts as single-threaded, as the CLI is: other tests of the session may have
    left threads behind, and fork_imap forks no helper beside a thread."""
    monkeypatch.setattr("rocm_audit.tree.forkmap.threading.active_count", lambda: 1)


def fork_map(function, items, priorities, workers):
    """The answers in item order (each item must come exactly once)."""
    answers = list(fork_imap(function, items, priorities, workers))
    assert sorted(index for index, _ in answers) == list(range(len(items)))
    return [answer for _, answer in sorted(answers, key=lambda pair: pair[0])]


def _slow_square(n: int) -> tuple[int, int]:
    time.sleep(0.005)  # long enough for every process to take some of the work
    return n * n, os.getpid()


def test_results_come_back_in_item_order_from_several_processes(alone):
    items = list(range(40))
    answers = fork_map(_slow_square, items, priorities=[1] * 40, workers=3)
    assert [square for square, _ in answers] == [n * n for n in items]
    assert len({pid for _, pid in answers}) == 3  # this process and two helpers did the work
    assert os.getpid() in {pid for _, pid in answers}
    assert _no_children_left()


@pytest.mark.parametrize("how", ["raises", "dies", "garbles"])
def test_what_a_helper_fails_to_deliver_is_computed_here(alone, how, tmp_path):
    parent = os.getpid()

    def square(n: int) -> tuple[int, int]:
        time.sleep(0.005)  # long enough for the helper to take some of the work
        if os.getpid() != parent:
            (tmp_path / f"helper-{os.getpid()}").touch()  # proof that a helper did run
            if how == "raises":
                raise RuntimeError("helper trouble")
            if how == "dies":
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "garbles":
                return (n, lambda: None)  # type: ignore[return-value]  # cannot be pickled
        return n * n, os.getpid()

    answers = fork_map(square, list(range(20)), priorities=list(range(20)), workers=2)
    assert [square for square, _ in answers] == [n * n for n in range(20)]
    assert {pid for _, pid in answers} == {parent}
    assert list(tmp_path.glob("helper-*"))
    assert _no_children_left()


def test_an_exception_here_still_reaps_the_helpers(alone):
    parent = os.getpid()

    def work(n: int) -> int:
        time.sleep(0.005)
        if os.getpid() == parent:  # this process takes its first item at once, before helpers run
            raise KeyError("here")
        return n

    with pytest.raises(KeyError):
        fork_map(work, list(range(10)), priorities=[1] * 10, workers=3)
    assert _no_children_left()


def test_a_caller_busy_with_each_answer_leaves_the_computing_to_the_helpers(alone):
    """Whoever is free takes the next item: while this process is busy with the answers it hands
    back, a helper computes."""
    parent = os.getpid()
    computed_by: dict[int, int] = {}
    for index, (_, pid) in fork_imap(_slow_square, list(range(30)), priorities=[1] * 30, workers=2):
        computed_by[index] = pid
        time.sleep(0.02)  # the caller's own work on an answer (dedup: the rename)
    assert sorted(computed_by) == list(range(30))  # every item exactly once
    here = sum(1 for pid in computed_by.values() if pid == parent)
    assert len(computed_by) - here >= 2 * here
    assert _no_children_left()


def test_highest_priority_goes_first_ties_in_item_order_and_every_item_comes_once():
    priorities = [5, 100, 1, 50, 7, 50]
    served = [index for index, _ in fork_imap(lambda n: n, list(range(6)), priorities, workers=1)]
    assert served == [1, 3, 5, 4, 0, 2]


def test_more_tickets_than_a_default_pipe_holds(alone):
    count = 20_000  # 80,000 bytes of tickets: the pipe is enlarged first
    answers = fork_map(lambda n: n + 1, list(range(count)), priorities=[1] * count, workers=2)
    assert answers == [n + 1 for n in range(count)]
    assert _no_children_left()


def test_a_caller_that_stops_early_leaves_no_helper_behind(alone):
    answers = fork_imap(_slow_square, list(range(50)), priorities=[1] * 50, workers=3)
    next(answers)
    answers.close()
    assert _no_children_left()


def test_no_helpers_for_small_jobs_or_while_other_threads_run(monkeypatch):
    from rocm_audit.tree import forkmap

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


def _stamped(n: int) -> tuple[int, float]:
    time.sleep(0.005)
    return os.getpid(), time.monotonic()


@pytest.mark.parametrize("workers", [1, 2])
def test_meanwhile_runs_before_the_first_answer_while_helpers_already_work(alone, workers):
    """dedup journals its plan in `meanwhile`: it must end before any answer is handed back (the
    caller changes files only on answers), while helpers have been comparing all along."""
    events: list[str] = []
    ended: list[float] = []

    def journal() -> None:
        time.sleep(0.1)
        events.append("meanwhile")
        ended.append(time.monotonic())

    answers = []
    for _, answer in fork_imap(_stamped, list(range(20)), [1] * 20, workers, meanwhile=journal):
        events.append("answer")
        answers.append(answer)
    assert events[0] == "meanwhile" and events.count("meanwhile") == 1 and len(answers) == 20
    if workers > 1:  # the helper did not wait for it
        assert any(pid != os.getpid() and done < ended[0] for pid, done in answers)
    assert _no_children_left()


def test_an_exception_in_meanwhile_stops_everything_and_reaps_the_helpers(alone):
    def refuse() -> None:
        raise OSError(30, "Read-only file system")

    with pytest.raises(OSError):
        list(fork_imap(_stamped, list(range(20)), [1] * 20, workers=3, meanwhile=refuse))
    assert _no_children_left()


def test_a_thread_started_after_worker_count_means_no_helpers():
    """The last word on forking is fork_imap's own, at the moment it would fork."""
    started, stop = threading.Event(), threading.Event()
    other = threading.Thread(target=lambda: (started.set(), stop.wait()))
    other.start()
    started.wait()
    try:
        answers = fork_map(_slow_square, list(range(6)), priorities=[1] * 6, workers=3)
    finally:
        stop.set()
        other.join()
    assert {pid for _, pid in answers} == {os.getpid()}
    assert _no_children_left()
