"""Trim and hash files of the merged view in forked helper processes while the merge goes on.

Why: the merge's thread is what ``image`` waits for (docs/benchmarks.md, "Image layers"): it parses
the tar and writes every file, and until now it also read, inline, the LLVM facts of each large
library it trims (image/trim.py: the longest part) and read back copies for their digest
(image/digests.py), while the second CPU waited for it. Both jobs only read a file the merge has
finished writing (a trim also punches out blocks that its own reading finds unread), so they can
run beside it.

How it stays safe: the helpers are forked when the merge starts, while this process has one
thread (the layer threads start later), and leave with ``os._exit``. A job is the file's open
descriptor handed over a Unix socket (SCM_RIGHTS): a helper works on the very inode the merge
wrote, never on a path a later layer may have changed. This process keeps its own descriptor until
the answer is applied, so the inode cannot be freed and its number reused meanwhile, and a job
whose helper died is run again here on the same inode (a hash reads; a trim of a trimmed file
reads the same kept bytes and punches the same blocks). Answers are applied on this thread, by
``poll`` between tar entries and ``settle`` before anything reads the merged view; each job's
callback checks what it may still change. Without helpers (one CPU, or threads already running)
every job runs at once, here: the same answers, in the order of submission.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from rocm_audit.image import digests, trim
from rocm_audit.tree.forkmap import FRAME, read_frames

log = logging.getLogger(__name__)

MAX_HELPERS = 4
JOBS_PER_HELPER = 2  # in flight, each
# Bytes held in flight at most (one file of any size may always go): a file waiting for its trim,
# or removed from the view and waiting for its hash, holds all its blocks on the scratch disk,
# which the merge's own thread would have given back at once. Measured on the one-layer bench
# archive: bounds of 96, 192 and 384 MiB keep the peak at 879 MiB (21% of its tar), as with trims
# inline; no bound, 1,103 MiB (26%). A hash of a file the view still shows holds nothing the view
# would give back, so it counts only once its path leaves the view (``left_view``); counting it
# from the start made the merge wait 4.8 s of a 46 s run on the three-layer bench archive.
MAX_FLIGHT_BYTES = 256 << 20
_JOB_BYTES = 1 << 16  # a pickled job (kind, path, size) is a few hundred bytes

Run = Callable[[str, int, str, int], object]  # (kind, fd, path, size) -> answer


def helper_count() -> int:
    """Helpers for a merge: one per CPU this process may use (the merge's own thread shares them
    with the layer threads), at most MAX_HELPERS; none on one CPU."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return 0 if cpus < 2 else min(MAX_HELPERS, cpus)


@dataclass(slots=True)
class _Helper:
    pid: int
    jobs: socket.socket  # SOCK_SEQPACKET: one job (and its descriptor) per message
    answers: int  # read end of a pipe of FRAME-prefixed pickled answers
    pending: bytearray = field(default_factory=bytearray)
    in_flight: set[int] = field(default_factory=set)


@dataclass(slots=True)
class _Job:
    kind: str
    fd: int  # this process's descriptor, closed once the answer is applied
    path: str
    size: int
    done: Callable[[object], None]
    held: int  # bytes of the scratch disk it keeps from being given back (see MAX_FLIGHT_BYTES)


class Offload:
    """Jobs on files of the merged view: ``submit``, then ``poll`` now and then and ``settle``."""

    def __init__(self, helpers: int = 0, run: Run | None = None) -> None:
        self.run = run or merge_jobs
        self.helpers: list[_Helper] = []
        self.jobs: dict[int, _Job] = {}
        self.next_id = 0
        self.flight_bytes = 0  # what the jobs helpers hold keep on the scratch disk
        if helpers and hasattr(os, "fork") and threading.active_count() == 1:
            for _ in range(helpers):
                if not self._fork():
                    break

    def __enter__(self) -> Offload:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(
        self, kind: str, fd: int, path: str, size: int, done: Callable[[object], None], *, shown: bool = False
    ) -> None:
        """Run ``kind`` on the file open at ``fd`` (which this object now owns and closes) and hand
        the answer to ``done`` on this thread, now or at a later ``poll``/``settle``. ``shown``: the
        merged view shows the file at ``path`` and keeps its blocks anyway (until ``left_view``)."""
        job = _Job(kind, fd, path, size, done, held=0 if shown else size)
        while self.helpers:
            helper = min(self.helpers, key=lambda h: len(h.in_flight))
            full = len(helper.in_flight) >= JOBS_PER_HELPER
            if full or (job.held and self.flight_bytes and self.flight_bytes + job.held > MAX_FLIGHT_BYTES):
                self._collect(wait=True)
                continue
            job_id, self.next_id = self.next_id, self.next_id + 1
            try:
                socket.send_fds(helper.jobs, [pickle.dumps((job_id, kind, path, size))], [fd])
            except OSError:
                self._lost(helper)
                continue
            self.jobs[job_id] = job
            self.flight_bytes += job.held
            helper.in_flight.add(job_id)
            return
        self._here(job)

    def left_view(self, path: str, *, below: bool = False) -> None:
        """The merged view no longer shows ``path`` (nor, with ``below``, anything under it): the
        jobs submitted as ``shown`` there now hold its blocks, and count."""
        for job in self.jobs.values():
            if not job.held and (job.path == path or below and job.path.startswith(path + "/")):
                job.held = job.size
                self.flight_bytes += job.size

    def poll(self) -> None:
        """Apply the answers that have arrived, without waiting."""
        if self.jobs:
            self._collect(wait=False)

    def settle(self) -> None:
        """Wait for every job submitted and apply its answer."""
        while self.jobs:
            self._collect(wait=True)

    def close(self) -> None:
        """End every helper (at once: answers not applied are dropped) and close every descriptor."""
        for helper in self.helpers:
            helper.jobs.close()
            os.close(helper.answers)
            try:
                if os.waitpid(helper.pid, os.WNOHANG) == (0, 0):
                    os.kill(helper.pid, signal.SIGKILL)
                    os.waitpid(helper.pid, 0)
            except ChildProcessError:
                pass
        self.helpers.clear()
        for job in self.jobs.values():
            os.close(job.fd)
        self.jobs.clear()
        self.flight_bytes = 0

    # -- this process --
    def _here(self, job: _Job) -> None:
        try:
            answer = self.run(job.kind, job.fd, job.path, job.size)
        finally:
            os.close(job.fd)
        job.done(answer)

    def _collect(self, *, wait: bool) -> None:
        by_fd = {h.answers: h for h in self.helpers if h.in_flight}
        if not by_fd:
            return
        ready, _, _ = select.select(list(by_fd), [], [], None if wait else 0)
        for fd in ready:
            helper = by_fd[fd]
            if helper not in self.helpers:
                continue  # lost while an earlier answer of this round was applied
            try:
                chunk = os.read(fd, 1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                self._lost(helper)
                continue
            helper.pending += chunk
            for job_id, payload in read_frames(helper.pending):
                job = self.jobs.pop(job_id, None)
                helper.in_flight.discard(job_id)
                if job is None:
                    continue
                self.flight_bytes -= job.held
                ok, answer = pickle.loads(payload)  # our own child's bytes, never user input
                if ok:
                    os.close(job.fd)
                    job.done(answer)
                else:  # the helper raised: run here, so the exception comes where the caller expects it
                    log.info("a merge helper failed (%s); %s of %s runs here", answer, job.kind, job.path)
                    self._here(job)

    def _lost(self, helper: _Helper) -> None:
        """A helper is gone: its jobs run here, on the descriptors this process kept."""
        if helper not in self.helpers:
            return
        self.helpers.remove(helper)
        helper.jobs.close()
        os.close(helper.answers)
        try:
            os.waitpid(helper.pid, 0)
        except ChildProcessError:
            pass
        for job_id in sorted(helper.in_flight):
            job = self.jobs.pop(job_id, None)
            if job is not None:
                self.flight_bytes -= job.held
                log.info("a merge helper ended early; %s of %s runs here", job.kind, job.path)
                self._here(job)

    def _fork(self) -> bool:
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            read_end, write_end = os.pipe()
        except OSError:
            return False
        try:
            pid = os.fork()
        except OSError:
            for fd in (read_end, write_end):
                os.close(fd)
            ours.close()
            theirs.close()
            return False
        if pid == 0:  # the helper
            status = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends a helper at once
                ours.close()
                os.close(read_end)
                for other in self.helpers:
                    other.jobs.close()
                    os.close(other.answers)
                _serve(theirs, write_end, self.run)
                status = 0
            finally:
                os._exit(status)
        theirs.close()
        os.close(write_end)
        self.helpers.append(_Helper(pid, ours, read_end))
        return True


def _serve(jobs: socket.socket, answers: int, run: Run) -> None:
    """A helper's loop: a job in, its answer (or its exception) out, until the socket closes."""
    while True:
        message, fds, _flags, _address = socket.recv_fds(jobs, _JOB_BYTES, 1)
        if not message:
            return
        job_id, kind, path, size = pickle.loads(message)  # our parent's bytes
        try:
            answer: tuple[bool, object] = (True, run(kind, fds[0], path, size))
        except Exception as exc:  # noqa: BLE001 - this process runs the job again and raises it
            answer = (False, repr(exc))
        finally:
            for fd in fds:
                os.close(fd)
        payload = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(FRAME.pack(job_id, len(payload)) + payload)
        while view:
            view = view[os.write(answers, view) :]


def merge_jobs(kind: str, fd: int, path: str, size: int) -> object:
    """The jobs of a merge: ``trim`` (image/trim.py ``trim_file``), ``blake2b`` and
    ``blake2b+identity`` (image/digests.py ``hash_descriptor``). A file of the private view that
    cannot be read or punched (an I/O error) keeps its bytes or gets no digest: logged, no more."""
    try:
        if kind == "trim":
            return trim.trim_file(path, fd, size)
        if kind in ("blake2b", "blake2b+identity"):
            return digests.hash_descriptor(fd, with_identity=kind.endswith("identity"))
    except OSError as exc:
        log.warning("%s of %s in the private view failed: %s", kind, path, exc.strerror)
        return None
    raise ValueError(f"unknown merge job {kind!r}")
