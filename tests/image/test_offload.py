"""image/offload.py: trims and hashes of the merged view's files in forked helper processes.

What is checked, with real forks and real descriptors handed over Unix sockets: a job reads the
inode the merge handed over, whatever its path holds by then; answers arrive in this process and
equal those of running the job here; a helper that dies or raises costs nothing but time (its jobs
run here, an exception is raised here); and a merge with helpers leaves exactly the state (merged
view, digests, trimmed files, LLVM facts) a merge without them leaves.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import blake3
import pytest

from rocm_audit.image import merge, offload, trim, waste, whole
from rocm_audit.image.audit import ImageOptions, extract_archive, new_state
from support.image.layer_writers import docker_save, layer
from support.image.libraries import build

SP = "usr/lib/python3/dist-packages"
SDK = f"{SP}/_rocm_sdk_core/lib"


def _alone(request: pytest.FixtureRequest) -> bool:
    """Whether this process has one thread, so helpers can fork. A session fixture of another
    test (a package index's server thread) may be running here: then the test runs again in a
    fresh interpreter of its own, and passes or fails there."""
    if threading.active_count() == 1:
        return True
    assert not os.environ.get("ROCM_AUDIT_TEST_ALONE"), threading.enumerate()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", request.node.nodeid],
        cwd=request.config.rootpath,
        env={**os.environ, "ROCM_AUDIT_TEST_ALONE": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "1 passed" in result.stdout, result.stdout[-2000:]
    return False


def _hash_where(kind: str, fd: int, path: str, size: int) -> object:
    """A job that says which process ran it."""
    return os.getpid(), offload.merge_jobs(kind, fd, path, size)


def test_a_job_reads_the_inode_it_was_given_not_what_its_path_holds_later(request, tmp_path):
    if not _alone(request):
        return
    path = tmp_path / "lib.so"
    path.write_bytes(b"first" * 5000)
    answers = []
    with offload.Offload(2, run=_hash_where) as jobs:
        assert len(jobs.helpers) == 2, threading.enumerate()
        fd = os.open(path, os.O_RDONLY)
        jobs.submit("blake2b+identity", fd, str(path), 0, answers.append)
        path.unlink()
        path.write_bytes(b"second" * 5000)  # a later layer's file at the same path
        jobs.settle()
    ((pid, (digest, identity)),) = answers
    assert pid != os.getpid()
    assert digest == hashlib.blake2b(b"first" * 5000, digest_size=32).digest()
    assert identity == blake3.blake3(b"first" * 5000).digest()  # the test extra installs blake3


def test_answers_equal_those_of_running_here_and_come_once_each(request, tmp_path):
    if not _alone(request):
        return
    files = []
    for i in range(9):
        files.append(tmp_path / f"f{i}")
        files[-1].write_bytes(os.urandom(1000 + 50_000 * i))
    got: dict[int, object] = {}
    with offload.Offload(2) as jobs:
        for i, file in enumerate(files):
            jobs.submit("blake2b", os.open(file, os.O_RDONLY), str(file), 0, lambda a, i=i: got.setdefault(i, a))
            jobs.poll()
        jobs.settle()
    here = offload.Offload()  # no helpers: each job runs at once
    for i, file in enumerate(files):
        here.submit("blake2b", os.open(file, os.O_RDONLY), str(file), 0, lambda a, i=i: got.__setitem__(i, (got[i], a)))
    assert len(got) == len(files)
    for i, (there, local) in got.items():
        assert there == local == (hashlib.blake2b(files[i].read_bytes(), digest_size=32).digest(), None)


def _slow(kind: str, fd: int, path: str, size: int) -> object:
    """A job that takes half a second and says which it was."""
    time.sleep(0.5)
    return kind


def _bound_of_1000_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A bound of 1,000 bytes in flight; the file every job of the test opens."""
    monkeypatch.setattr(offload, "MAX_FLIGHT_BYTES", 1000)
    file = tmp_path / "data"
    file.write_bytes(b"x")
    return file


def test_files_in_flight_stay_within_their_byte_bound(request, tmp_path, monkeypatch):
    """A file waiting for a helper holds its blocks on the scratch disk: the next job waits for
    room, and a file larger than the bound still goes, alone."""
    if not _alone(request):
        return
    file = _bound_of_1000_bytes(tmp_path, monkeypatch)
    answers: list[object] = []
    with offload.Offload(2, run=_slow) as jobs:
        jobs.submit("first", os.open(file, os.O_RDONLY), str(file), 800, answers.append)
        assert jobs.flight_bytes == 800
        jobs.submit("second", os.open(file, os.O_RDONLY), str(file), 800, answers.append)
        assert answers == ["first"], "the second file went while the first held the bound"
        jobs.submit("huge", os.open(file, os.O_RDONLY), str(file), 5000, answers.append)
        assert answers == ["first", "second"]
        jobs.settle()
        assert jobs.flight_bytes == 0
    assert answers == ["first", "second", "huge"]


def test_a_helper_killed_with_jobs_in_flight_costs_only_time(request, tmp_path):
    if not _alone(request):
        return
    gate = tmp_path / "gate"
    gate.write_bytes(b"")

    def stalled(kind: str, fd: int, path: str, size: int) -> object:
        while os.getpid() != owner and not os.path.getsize(gate):
            pass  # a helper waits for the gate; this process never does
        return os.getpid(), os.pread(fd, 16, 0)

    owner = os.getpid()
    file = tmp_path / "data"
    file.write_bytes(b"0123456789abcdef")
    answers = []
    with offload.Offload(1, run=stalled) as jobs:
        (helper,) = jobs.helpers
        jobs.submit("x", os.open(file, os.O_RDONLY), str(file), 0, answers.append)
        jobs.submit("x", os.open(file, os.O_RDONLY), str(file), 0, answers.append)
        os.kill(helper.pid, signal.SIGKILL)
        jobs.settle()
        assert jobs.helpers == []
    assert answers == [(owner, b"0123456789abcdef")] * 2


def test_a_helper_that_raises_raises_here(request, tmp_path):
    if not _alone(request):
        return
    file = tmp_path / "data"
    file.write_bytes(b"x")

    def broken(kind: str, fd: int, path: str, size: int) -> object:
        raise LookupError(f"no job {kind}")

    with offload.Offload(1, run=broken) as jobs, pytest.raises(LookupError, match="no job y"):
        jobs.submit("y", os.open(file, os.O_RDONLY), str(file), 0, lambda a: None)
        jobs.settle()


def test_an_unreadable_file_gets_no_answer_but_the_merge_goes_on(tmp_path):
    directory = os.open(tmp_path, os.O_RDONLY)  # read(2) on a directory: EISDIR
    assert offload.merge_jobs("blake2b", directory, str(tmp_path), 0) is None
    os.close(directory)


def _merged(tmp_path: Path, name: str, layers: list[bytes], helpers: int) -> merge.MergeState:
    work = tmp_path / name
    work.mkdir()
    with offload.Offload(helpers) as jobs:
        assert len(jobs.helpers) == helpers
        state = new_state(str(work), ImageOptions(), helpers=jobs)
        extract_archive(str(docker_save(tmp_path / f"{name}.tar", layers)), str(work), state)
        merge.finish(state)
    return state


def _view(state: merge.MergeState) -> dict[str, tuple[bytes, int]]:
    out = {}
    for directory, _dirs, files in os.walk(state.root):
        for name in files:
            path = os.path.join(directory, name)
            out[os.path.relpath(path, state.root)] = (Path(path).read_bytes(), os.lstat(path).st_blocks)
    return out


def _facts(state: merge.MergeState) -> dict[str, str]:
    """The facts read while trimming, by path in the view (the facts name their file's full path)."""
    return {
        os.path.relpath(state.read_facts[inode][0], state.root): repr(facts).replace(state.root, "")
        for inode, facts in whole.facts_still_shown(state).items()
    }


def test_a_hash_of_a_file_the_view_shows_waits_for_no_room_until_its_path_leaves(request, tmp_path, monkeypatch):
    """The view keeps a shown file's blocks anyway: hashing it holds nothing more, so it goes at
    once; when its path (or a directory above it) leaves the view, its bytes count."""
    if not _alone(request):
        return
    file = _bound_of_1000_bytes(tmp_path, monkeypatch)
    answers: list[object] = []

    def submit(jobs: offload.Offload, kind: str, path: str, size: int, *, shown: bool = False) -> None:
        jobs.submit(kind, os.open(file, os.O_RDONLY), path, size, answers.append, shown=shown)

    with offload.Offload(2, run=_slow) as jobs:
        submit(jobs, "trim", "/a/lib.so", 800)
        submit(jobs, "hash", "/a/copy.bin", 800, shown=True)
        submit(jobs, "hash below", "/b/c/copy.bin", 800, shown=True)
        assert answers == [], "a hash of a shown file waited for room"
        assert jobs.flight_bytes == 800
        jobs.left_view("/a/copy.bin")
        jobs.left_view("/b/c")  # a file, not a directory: nothing below it is meant
        jobs.left_view("/b/c/copy.bi")
        assert jobs.flight_bytes == 1600
        jobs.left_view("/b", below=True)
        assert jobs.flight_bytes == 2400
        submit(jobs, "late", "/d/lib.so", 100)
        assert answers, "a file went while the bytes held were above the bound"
        jobs.settle()
        assert jobs.flight_bytes == 0
    assert sorted(map(str, answers)) == ["hash", "hash below", "late", "trim"]


def test_a_merge_with_helpers_leaves_what_a_merge_without_them_leaves(request, tmp_path, monkeypatch):
    """Trimmed libraries (one replaced by a later layer, one duplicated inside SDK trees, one
    outside them), copies of one size read back for their digest, a removal while jobs run."""
    if not _alone(request):
        return
    monkeypatch.setattr(trim, "TRIM_MIN_BYTES", 0)
    big = build(tmp_path / "src", "libbig.so").read_bytes()
    other = build(tmp_path / "src", "libother.so", functions=300, seed=3).read_bytes()
    plain = os.urandom(200_000)
    layers = [
        layer((f"{SP}/a/libbig.so", big), (f"{SDK}/libother.so", other), (f"{SP}/data.bin", plain)),
        layer((f"{SP}/a/libbig.so", other), (f"{SP}/_rocm_sdk_devel/lib/libother.so", other)),
        layer((f"{SP}/c/libbig.so", big), (f"{SP}/copy.bin", plain), (f"{SP}/.wh.data.bin", b"")),
    ]
    forked = _merged(tmp_path, "forked", layers, 2)
    here = _merged(tmp_path, "here", layers, 0)
    assert forked.trimmed
    assert forked.copies == here.copies
    assert all(c.digest is not None for c in here.copies if c.size in (len(big), len(other), len(plain)))
    assert sorted(forked.trimmed) == sorted(here.trimmed)
    assert _view(forked) == _view(here)
    assert _facts(forked) == _facts(here) != {}
    assert waste.analyse(forked)[0] == waste.analyse(here)[0]


def test_facts_of_a_trim_that_ends_after_its_file_left_the_view_are_dropped(request, tmp_path, monkeypatch):
    """A trim still running when a later layer removes its library: its facts never reach the
    file then at that path (ext4 reuses inode numbers; whole.forget_facts must see running trims)."""
    if not _alone(request):
        return
    library = build(tmp_path / "src", "libbig.so")
    gate = tmp_path / "gate"
    gate.write_bytes(b"")

    def gated(kind: str, fd: int, path: str, size: int) -> object:
        while not os.path.getsize(gate):
            pass
        return offload.merge_jobs(kind, fd, path, size)

    work = tmp_path / "work"
    work.mkdir()
    with offload.Offload(1, run=gated) as jobs:
        state = new_state(str(work), ImageOptions(), helpers=jobs)
        target = os.path.join(state.root, "libbig.so")
        with open(target, "w+b") as out:
            out.write(library.read_bytes())
            out.flush()
            whole.start_trim(state, target, out.fileno(), len(library.read_bytes()))
        assert state.facts_due
        whole.forget_facts(state, target)  # the merge drops the file ...
        os.unlink(target)
        Path(target).write_bytes(b"\x7fELF later")  # ... and a later layer writes its own
        gate.write_bytes(b"open")
        jobs.settle()
    assert state.read_facts == {} and state.facts_due == {}
