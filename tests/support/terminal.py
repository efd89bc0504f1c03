"""Run rocm-audit on a real pseudo-terminal (stdout and stderr both on it), as a person would."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass


@dataclass
class TerminalRun:
    output: str  # everything written to the terminal, raw (carriage returns, escapes)
    returncode: int
    elapsed_s: float

    def drawn(self) -> list[str]:
        """Each progress line drawn, in order: the text between a carriage return and the
        erase-to-end-of-line that ends every draw (an empty string for a clearing)."""
        return re.findall(r"\r([^\r\n\x1b]*)\x1b\[K", self.output)

    def report(self) -> str:
        """What follows the last clearing of the progress line: the report and its summary."""
        return self.output.rsplit("\r\x1b[K", 1)[-1]


def run_on_terminal(
    *args: str,
    env: dict[str, str] | None = None,
    columns: int = 200,
    timeout_s: float = 120,
    stdout_elsewhere: bool = False,
) -> TerminalRun:
    """``python -m rocm_audit ARGS`` with stdout and stderr on a pseudo-terminal ``columns`` wide
    (``stdout_elsewhere``: stdout to /dev/null, stderr alone on the terminal).
    ``env`` adds to (or with value "" removes from) an environment without CI and with TERM=xterm."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    environ = {k: v for k, v in os.environ.items() if k not in ("CI", "COLUMNS", "ROCM_AUDIT_TEST_REDRAW_S")}
    environ["TERM"] = "xterm"
    for key, value in (env or {}).items():
        if value == "":
            environ.pop(key, None)
        else:
            environ[key] = value
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rocm_audit", *args],
        stdout=subprocess.DEVNULL if stdout_elsewhere else follower,
        stderr=follower,
        stdin=subprocess.DEVNULL,
        env=environ,
    )
    os.close(follower)
    chunks = []
    deadline = started + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO once the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    try:
        returncode = proc.wait(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    finally:
        os.close(leader)
    return TerminalRun(b"".join(chunks).decode(errors="replace"), returncode, time.monotonic() - started)
