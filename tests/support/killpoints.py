"""Kill points: a real SIGKILL on entry to the n-th call of a system call, through strace.

strace's fault injection (`-e inject=SYSCALL:signal=KILL:when=N`) kills the process itself, so no
test hook lives in the code. A crash-safety test lists the kill points of one run (every call of
the syscalls through which that command changes the tree), then reruns the command killed at each
(or at a sample of them: ROCM_AUDIT_SLOW=1 runs every one).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from support.tools import require_tool

FULL = os.environ.get("ROCM_AUDIT_SLOW") == "1"
SAMPLE = 8

KillPoint = tuple[str, int]  # (syscall, n): killed on entry to the n-th call of syscall

# The system calls through which both dedup and prune (and their reverts) change a tree or a manifest.
_CHANGE_A_TREE = (
    "write",
    "fsync",
    "mkdir",
    "mkdirat",
    "flock",
    "link",
    "linkat",
    "rename",
    "renameat",
    "renameat2",
    "unlink",
    "unlinkat",
    "fchmod",
    "fchown",
    "utimensat",
)
# dedup also makes symlinks and copies files back (revert); prune --backup also removes directories.
DEDUP_SYSCALLS = (*_CHANGE_A_TREE, "symlink", "symlinkat", "sendfile")
PRUNE_SYSCALLS = (*_CHANGE_A_TREE, "rmdir")


def _command(args: tuple[str, ...] | list[str], *strace_options: str) -> list[str]:
    """`rocm-audit ARGS -q`, under strace (following children) when strace options are given."""
    argv = [sys.executable, "-m", "rocm_audit", *args, "-q"]
    return [require_tool("strace"), "-f", "-qq", *strace_options, *argv] if strace_options else argv


def rocm_audit(*args: str, inject: KillPoint | None = None) -> subprocess.CompletedProcess[str]:
    """Run `rocm-audit ARGS -q`; with inject, under strace, killed at that point."""
    if inject is None:
        argv = _command(args)
    else:
        syscall, nth = inject
        argv = _command(
            args, "-o", "/dev/null", "-e", f"trace={syscall}", "-e", f"inject={syscall}:signal=KILL:when={nth}"
        )
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def count_calls(args: list[str], syscalls: tuple[str, ...]) -> list[KillPoint]:
    """Run `rocm-audit ARGS` once under strace and list every (syscall, n) kill point of that run."""
    log = subprocess.run(
        _command(args, "-o", "/dev/stderr", "-e", "trace=" + ",".join(syscalls)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert log.returncode == 0, log.stdout + log.stderr[-2000:]
    counts: dict[str, int] = {}
    for match in re.finditer(r"^(?:\d+\s+)?(\w+)\(", log.stderr, re.MULTILINE):
        if match.group(1) in syscalls:
            counts[match.group(1)] = counts.get(match.group(1), 0) + 1
    return [(name, n) for name in sorted(counts) for n in range(1, counts[name] + 1)]


def pick(points: list[KillPoint]) -> list[KillPoint]:
    """Every kill point under ROCM_AUDIT_SLOW=1, else SAMPLE of them, evenly spread."""
    if FULL or len(points) <= SAMPLE:
        return points
    return [points[int(i * len(points) / SAMPLE)] for i in range(SAMPLE)]


def state(site: Path) -> dict[str, tuple[object, ...]]:
    """Relative path -> (kind, bytes it resolves to, mode); the manifest directory excluded."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirs, files in os.walk(site):
        dirs[:] = [d for d in dirs if d != ".rocm-audit"]
        for name in files:
            path = os.path.join(dirpath, name)
            kind = "link" if os.path.islink(path) else "file"
            with open(path, "rb") as handle:  # follows links: what a loader would read
                out[os.path.relpath(path, site)] = (kind, handle.read(), os.stat(path).st_mode)
    return out


def interrupted(
    args: tuple[str, ...] | list[str], syscalls: tuple[str, ...], nth: int
) -> subprocess.CompletedProcess[str]:
    """`rocm-audit ARGS -q` sent SIGINT, as Ctrl-C at a terminal would, on entry to the nth call of
    any of ``syscalls`` (counted in the process that makes it; the call itself still runs)."""
    names = ",".join(syscalls)
    argv = _command(args, "-o", "/dev/null", "-e", f"trace={names}", "-e", f"inject={names}:signal=INT:when={nth}")
    # A shell runs a background job with SIGINT ignored, and the child would inherit that: give it
    # the terminal's default, as an interactive user's rocm-audit has.
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, preexec_fn=default_sigint)


def default_sigint() -> None:
    """In the child before exec: SIGINT back to its default disposition (Python then installs its
    KeyboardInterrupt handler; an inherited SIG_IGN would make it ignore Ctrl-C)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
