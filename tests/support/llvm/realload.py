"""The truth the differential tests compare against: real loads, each in its own child process.

Independent of rocm-audit's probe code on purpose (a shared bug must not agree with itself): a
child `python -I -S` runs ``ctypes.CDLL(path, mode)`` for each step (RTLD_NOW, as ctypes always
asks) and exits; the parent keeps the status, the signal and where it happened, with a time bound
after which the whole process group is killed. Verdicts: abort (LLVM's double-registration
message), crash (any other signal, or glibc's heap checks), hang (time bound reached), clean,
load-error (a dependency the test set-up failed to provide).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

HANG_AFTER_S = 30.0
PARALLEL = 2  # two loads at a time (a 2-CPU machine)

_CHILD = r"""
import ctypes, os, resource, sys
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
for index, step in enumerate(sys.argv[1:]):
    mode, path = step.split(":", 1)
    sys.stderr.write("step %d\n" % index)
    sys.stderr.flush()
    try:
        ctypes.CDLL(path, mode=os.RTLD_GLOBAL if mode == "G" else os.RTLD_LOCAL)
    except OSError as exc:
        sys.stderr.write("load error: %s\n" % exc)
        os._exit(97)
sys.stderr.write("loaded\n")
sys.stderr.flush()
"""

MESSAGES = ("registered more than once", "inconsistency in registered CommandLine options", "already exists!")


@dataclass(frozen=True)
class Load:
    steps: tuple[tuple[str, bool], ...]  # (path, RTLD_GLOBAL)
    verdict: str  # abort, crash, hang, clean, load-error
    returncode: int | None
    step: int | None  # the step it died in (len(steps): at exit)
    detail: str
    seconds: float


def load(steps: Sequence[tuple[str, bool]], timeout_s: float = HANG_AFTER_S) -> Load:
    args = [f"{'G' if g else 'L'}:{p}" for p, g in steps]
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _CHILD, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
        start_new_session=True,
    )
    try:
        _out, err = process.communicate(timeout=timeout_s)
        returncode: int | None = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _out, err = process.communicate()
        returncode = None
    text = err.decode("utf-8", "replace")
    steps_seen = [int(line.split()[1]) for line in text.splitlines() if line.startswith("step ")]
    loaded = "loaded" in text.splitlines()
    step = len(steps) if loaded else (steps_seen[-1] if steps_seen else None)
    tail = " | ".join(line for line in text.splitlines()[-3:] if not line.startswith("step "))[-300:]
    if returncode is None:
        verdict = "hang"
    elif any(m in text for m in MESSAGES):
        verdict = "abort"
    elif returncode == 97:
        verdict = "load-error"
    elif returncode == 0 and loaded:
        verdict = "clean"
    else:
        verdict = "crash"
    return Load(tuple(steps), verdict, returncode, step, tail, round(time.monotonic() - started, 2))


def load_all(sequences: Sequence[Sequence[tuple[str, bool]]], timeout_s: float = HANG_AFTER_S) -> list[Load]:
    """Each sequence in its own child, PARALLEL at a time, results in input order."""
    with ThreadPoolExecutor(PARALLEL) as pool:
        return list(pool.map(lambda s: load(s, timeout_s), sequences))
