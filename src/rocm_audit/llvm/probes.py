"""Load probes: dlopen candidate libraries in a fresh, sandboxed child process (formats.md 5).

Never in rocm-audit's own process: loading runs the library's constructors. Each probe is one
``python -I -S`` child in its own session with a clean environment, core dumps off, a timeout after
which its whole process group is killed; stderr is kept to a bounded prefix, stdout is drained and
dropped, and the child reports through a private pipe.
"""

from __future__ import annotations

import enum
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_TIMEOUT_S = 60.0
OUTPUT_LIMIT_BYTES = 64 << 10

LOADED_MARKER = "all loaded"
LOAD_ERROR_EXIT = 97
LOAD_ERROR_PREFIX = "load error: "
MAPPED_PREFIX = "mapped "
STATUS_LIMIT_BYTES = 4 << 20  # the child's own report: one line per mapped file

# formats.md 3.1: the exact texts of CommandLine.cpp and CommandLine.h.
_REGISTERED_TWICE = re.compile(r"CommandLine Error: Option '([^'\n]*)' registered more than once!")
_ALREADY_EXISTS = re.compile(r"Option '([^'\n]*)' already exists!")
_INCONSISTENT = "inconsistency in registered CommandLine options"

# The child: no site, no user paths (-I -S); no core dump (a core of libLLVM is 100s of MB and a
# piped core_pattern ignores RLIMIT_CORE, PR_SET_DUMPABLE=0 does not); then dlopen each step.
# Results go to a private pipe (argv[1]), so a library flooding stdout cannot hide them. It runs
# under the audited interpreter, whatever its version: Python 3.6 code (tests run it under 3.6-3.8).
_CHILD = r"""
import ctypes, os, resource, sys
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
status = int(sys.argv[1])
memory, cpu = int(sys.argv[2]), int(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
try:
    libc.prctl(4, 0, 0, 0, 0)
except Exception:
    pass
isolation = "host network"
if os.geteuid() == 0:
    if libc.unshare(0x40000000) == 0:  # CLONE_NEWNET: no interface but a down loopback
        isolation = "network namespace"
os.write(status, ("isolation %s\n" % isolation).encode())
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
for index, step in enumerate(sys.argv[4:]):
    mode, path = step.split(":", 1)
    flags = os.RTLD_GLOBAL if mode == "G" else os.RTLD_LOCAL
    os.write(status, ("step %d\n" % index).encode())
    try:
        ctypes.CDLL(path, mode=flags)
    except OSError as exc:
        os.write(status, ("load error: %s\n" % exc).encode("utf-8", "replace")[:4096])
        os._exit(97)
identities = set()
with open("/proc/self/maps") as maps:
    for line in maps:
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/") and fields[4] != "0":
            identities.add("%s %s" % (fields[3], fields[4]))
report = "".join("mapped %s\n" % i for i in sorted(identities)) + "all loaded\n"
os.write(status, report.encode())
os.close(status)
"""


MEMORY_LIMIT_BYTES = 16 << 30  # address space of a child: two libLLVMs and a libtriton fit
NETWORK_NAMESPACE = "network namespace"


class ProbeVerdict(str, enum.Enum):
    """What the probe saw, in the words of the static verdicts (verdicts.py); conclusive except
    the last two."""

    ABORT = "abort"  # LLVM's double-registration message
    CRASH = "crash"  # a signal while loading or at exit
    HANG = "hang"  # the time bound was reached
    CLEAN = "clean"
    LOAD_ERROR = "load-error"
    INCONCLUSIVE = "inconclusive"

    @property
    def conclusive(self) -> bool:
        return self not in (ProbeVerdict.LOAD_ERROR, ProbeVerdict.INCONCLUSIVE)


class ProbeOutcome(str, enum.Enum):
    CONFIRMED = "confirmed"  # aborted with LLVM's double-registration message
    CRASH_AT_EXIT = "crash-at-exit"  # every library loaded, then the process died by a signal
    CLEAN = "clean"  # loaded and exited with status 0
    LOAD_ERROR = "load-error"  # dlopen failed (missing dependency, wrong class): says nothing
    INCONCLUSIVE = "inconclusive"  # timeout, or a crash without LLVM's message


@dataclass(frozen=True, slots=True)
class LoadStep:
    path: str
    rtld_global: bool


@dataclass(frozen=True, slots=True)
class ProbeResult:
    mode: str
    outcome: ProbeOutcome
    option: str | None  # the option name LLVM printed, when confirmed
    returncode: int | None  # None after a timeout
    detail: str
    stderr_tail: str
    instances: int | None  # distinct inodes mapped among the probed files (None: not reached)
    elapsed_s: float
    preload: tuple[str, ...] = ()  # loaded RTLD_GLOBAL before the steps
    steps: tuple[str, ...] = ()  # what the child loaded, in order: "global:PATH" or "local:PATH"
    verdict: ProbeVerdict = ProbeVerdict.INCONCLUSIVE
    signal: str | None = None  # the signal that ended the child (SIGSEGV ...)
    step: str | None = None  # where it ended: "global:PATH" being loaded, or "exit"
    isolation: str = NETWORK_NAMESPACE


def probe_environment(ld_library_path: Sequence[str] = ()) -> dict[str, str]:
    """The child's whole environment: nothing inherited (formats.md 5)."""
    env = {
        "PATH": "/usr/bin:/bin",
        "LC_ALL": "C",
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if ld_library_path:
        env["LD_LIBRARY_PATH"] = ":".join(ld_library_path)
    return env


@dataclass(frozen=True, slots=True)
class _Finished:
    returncode: int | None  # None: killed at the timeout
    status: str  # what the child wrote to its private pipe
    stderr: str
    truncated: bool


def _run_bounded(load_args: list[str], env: dict[str, str], timeout_s: float, python: str | None = None) -> _Finished:
    """Run the child script on load_args under ``python`` (None: this interpreter) in its own
    session; keep a bounded prefix of each stream.

    stdout is drained and dropped; stderr keeps OUTPUT_LIMIT_BYTES; the status pipe
    STATUS_LIMIT_BYTES. At the deadline the child's whole process group is killed.
    """
    status_read, status_write = os.pipe()
    try:
        process = subprocess.Popen(
            [python or sys.executable, "-I", "-S", "-c", _CHILD, str(status_write), *load_args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
            close_fds=True,
            pass_fds=(status_write,),
        )
    finally:
        os.close(status_write)
    assert process.stdout is not None and process.stderr is not None
    limits = {
        process.stdout.fileno(): 0,
        process.stderr.fileno(): OUTPUT_LIMIT_BYTES,
        status_read: STATUS_LIMIT_BYTES,
    }
    kept: dict[int, bytearray] = {fd: bytearray() for fd in limits}
    truncated = False
    deadline = time.monotonic() + timeout_s
    timed_out = False
    with selectors.DefaultSelector() as selector:
        for fd in limits:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _events in selector.select(timeout=remaining):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                room = limits[key.fd] - len(kept[key.fd])
                if room < len(chunk) and key.fd != process.stdout.fileno():
                    truncated = True
                kept[key.fd].extend(chunk[: max(room, 0)])
    if timed_out:
        _kill_group(process)
    returncode: int | None = None
    try:
        returncode = process.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:  # the child closed its pipes but kept running
        timed_out = True
        _kill_group(process)
        process.wait()
    status = kept[status_read].decode("utf-8", "replace")
    stderr = kept[process.stderr.fileno()].decode("utf-8", "replace")
    process.stdout.close()
    process.stderr.close()
    os.close(status_read)
    return _Finished(None if timed_out else returncode, status, stderr, truncated)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the child leads its own session (start_new_session)
    except ProcessLookupError:
        pass


def extract_option(stderr: str) -> str | None:
    """The option name from LLVM's double-registration message, if present."""
    for pattern in (_REGISTERED_TWICE, _ALREADY_EXISTS):
        found = pattern.search(stderr)
        if found:
            return found.group(1)
    return None


def classify(
    returncode: int | None, status: str, stderr: str, timeout_s: float
) -> tuple[ProbeOutcome, str | None, str]:
    """(outcome, option, detail) of one finished child (formats.md 5).

    status is what the child reported on its private pipe: "load error: ..." or the mapped files
    followed by LOADED_MARKER.
    """
    option = extract_option(stderr)
    if returncode is None:
        return (
            ProbeOutcome.INCONCLUSIVE,
            option,
            f"timed out after {timeout_s:g} s; process group killed",
        )
    if option is not None or _INCONSISTENT in stderr:
        return (
            ProbeOutcome.CONFIRMED,
            option,
            f"aborted with LLVM's double-registration message (status {returncode})",
        )
    loaded = LOADED_MARKER in status.splitlines()
    load_error = next((line for line in status.splitlines() if line.startswith(LOAD_ERROR_PREFIX)), None)
    if returncode == LOAD_ERROR_EXIT and load_error is not None:
        return ProbeOutcome.LOAD_ERROR, None, load_error.strip()
    if returncode == 0 and loaded:
        return ProbeOutcome.CLEAN, None, "loaded and exited cleanly"
    if returncode < 0 and loaded:
        return (
            ProbeOutcome.CRASH_AT_EXIT,
            None,
            f"loaded, then killed by {_signal_name(-returncode)} at exit",
        )
    if returncode < 0:
        return (
            ProbeOutcome.INCONCLUSIVE,
            None,
            f"killed by {_signal_name(-returncode)} while loading",
        )
    return (
        ProbeOutcome.INCONCLUSIVE,
        None,
        f"exit status {returncode} before every library was loaded",
    )


def verdict_of(outcome: ProbeOutcome, returncode: int | None, status: str) -> ProbeVerdict:
    """The conclusive reading of one child (formats.md 5): a signal while loading is a crash,
    a timeout is a hang, both as conclusive as an abort."""
    if outcome is ProbeOutcome.CONFIRMED:
        return ProbeVerdict.ABORT
    if outcome is ProbeOutcome.CRASH_AT_EXIT:
        return ProbeVerdict.CRASH
    if outcome is ProbeOutcome.CLEAN:
        return ProbeVerdict.CLEAN
    if outcome is ProbeOutcome.LOAD_ERROR:
        return ProbeVerdict.LOAD_ERROR
    if returncode is None:
        return ProbeVerdict.HANG
    if returncode < 0 and _last_step(status) is not None:
        return ProbeVerdict.CRASH
    return ProbeVerdict.INCONCLUSIVE


def _last_step(status: str) -> int | None:
    steps = [line.split()[1] for line in status.splitlines() if line.startswith("step ")]
    return int(steps[-1]) if steps and steps[-1].isdigit() else None


def _isolation(status: str) -> str:
    for line in status.splitlines():
        if line.startswith("isolation "):
            return line[len("isolation ") :]
    return "unknown"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _instances(status: str, identities: set[tuple[int, int]]) -> int | None:
    lines = status.splitlines()
    if LOADED_MARKER not in lines:
        return None
    mapped: set[tuple[int, int]] = set()
    for line in lines:
        if not line.startswith(MAPPED_PREFIX):
            continue
        try:
            device_text, inode_text = line[len(MAPPED_PREFIX) :].split()
            major, minor = device_text.split(":")
            mapped.add((os.makedev(int(major, 16), int(minor, 16)), int(inode_text)))
        except ValueError:
            continue
    return len(mapped & identities)


def run_probe(
    mode: str,
    steps: Sequence[LoadStep],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    preload: Sequence[str] = (),
    ld_library_path: Sequence[str] = (),
    watch: Sequence[str] = (),
    python: str | None = None,
) -> ProbeResult:
    """Load ``preload`` (RTLD_GLOBAL, like rocm_sdk.preload_libraries), then ``steps``, in a child
    run by ``python`` (None: this interpreter). Python extension modules take the CPython API from
    the process that loads them, so the child must be the audited interpreter (issue "First contact").

    ``instances`` in the result counts the distinct inodes mapped among the steps and ``watch``.
    """
    cpu_seconds = max(1, int(timeout_s) + 1)
    load_args = [str(MEMORY_LIMIT_BYTES), str(cpu_seconds)]
    load_args += [f"G:{os.path.abspath(p)}" for p in preload]
    load_args += [f"{'G' if s.rtld_global else 'L'}:{os.path.abspath(s.path)}" for s in steps]
    identities: set[tuple[int, int]] = set()
    for watched in [s.path for s in steps] + list(watch):
        try:
            st = os.stat(watched)
            identities.add((st.st_dev, st.st_ino))
        except OSError:
            pass
    started = time.monotonic()
    finished = _run_bounded(load_args, probe_environment(ld_library_path), timeout_s, python)
    elapsed = time.monotonic() - started
    outcome, option, detail = classify(finished.returncode, finished.status, finished.stderr, timeout_s)
    if finished.truncated:
        detail += f"; output cut at {OUTPUT_LIMIT_BYTES} bytes"
    tail = "\n".join(finished.stderr.splitlines()[-5:])[-2000:]
    verdict = verdict_of(outcome, finished.returncode, finished.status)
    every_step = [f"global:{os.path.abspath(p)}" for p in preload]
    every_step += [f"{'global' if s.rtld_global else 'local'}:{os.path.abspath(s.path)}" for s in steps]
    last = _last_step(finished.status)
    if LOADED_MARKER in finished.status.splitlines():
        where: str | None = "exit"
    else:
        where = every_step[last] if last is not None and last < len(every_step) else None
    signal_name = (
        _signal_name(-finished.returncode) if finished.returncode is not None and finished.returncode < 0 else None
    )
    if verdict is ProbeVerdict.CRASH and outcome is ProbeOutcome.INCONCLUSIVE:
        detail = f"killed by {signal_name} while loading {where}"
    elif verdict is ProbeVerdict.HANG:
        detail = f"hang: timed out after {timeout_s:g} s while loading {where}; process group killed"
    return ProbeResult(
        mode=mode,
        outcome=outcome,
        option=option,
        returncode=finished.returncode,
        detail=detail,
        stderr_tail=tail,
        instances=_instances(finished.status, identities),
        elapsed_s=round(elapsed, 3),
        preload=tuple(os.path.abspath(p) for p in preload),
        steps=tuple(f"{'global' if s.rtld_global else 'local'}:{os.path.abspath(s.path)}" for s in steps),
        verdict=verdict,
        signal=signal_name,
        step=where,
        isolation=_isolation(finished.status),
    )


PAIR_MODES = {
    "global-global": (True, True),
    "global-local": (True, False),
    "local-local": (False, False),
}
CLOSURE_MODES = {"global": True, "local": False}


def probe_pair(
    first: str,
    second: str,
    mode: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    preload: Sequence[str] = (),
    ld_library_path: Sequence[str] = (),
    python: str | None = None,
) -> ProbeResult:
    """Load first, then second, with the RTLD flags of mode (a key of PAIR_MODES)."""
    first_global, second_global = PAIR_MODES[mode]
    return run_probe(
        mode,
        [LoadStep(first, first_global), LoadStep(second, second_global)],
        timeout_s=timeout_s,
        preload=preload,
        ld_library_path=ld_library_path,
        python=python,
    )


def probe_closure(
    root: str,
    mode: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    preload: Sequence[str] = (),
    ld_library_path: Sequence[str] = (),
    watch: Sequence[str] = (),
    python: str | None = None,
) -> ProbeResult:
    """dlopen root alone ("global" or "local"); its DT_NEEDED closure comes with it."""
    return run_probe(
        mode,
        [LoadStep(root, CLOSURE_MODES[mode])],
        timeout_s=timeout_s,
        preload=preload,
        ld_library_path=ld_library_path,
        watch=watch,
        python=python,
    )
