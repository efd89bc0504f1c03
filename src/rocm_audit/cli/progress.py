"""A progress line on stderr for long work: only on a terminal, never in CI logs or with --quiet.

The library says which phase it is in and how far (rocm_audit.progress.Progress); this draws it
as one line, ``check: reading GPU code objects: 840/3138 files``, cut to the terminal's width,
redrawn at most 10 times a second, and cleared before the report is written. With -v (logging
at INFO), each phase is also logged when it ends, with its count and time, in CI logs too.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from rocm_audit.output.escape import display
from rocm_audit.progress import SILENT, Progress
from rocm_audit.units import size_text

REDRAW_S = 0.1  # at most 10 redraws a second
# The tests' way to see every phase of a run over a small tree (each lasts milliseconds there):
# a shorter interval (0: every call draws). Not for users; not in --help.
_REDRAW_ENV = "ROCM_AUDIT_TEST_REDRAW_S"


def progress_enabled(quiet: bool, stream: TextIO | None = None) -> bool:
    stream = stream or sys.stderr
    if quiet or os.environ.get("CI") or os.environ.get("TERM") == "dumb":
        return False
    return stream.isatty() and sys.stdout.isatty()


def _singular(unit: str) -> str:
    """ "1 file", "1 entry": the units this line shows are plain English plurals."""
    return unit[:-3] + "y" if unit.endswith("ies") else unit.removesuffix("s")


class ProgressLine:
    """Draws the phase and count the library reports; rate-limited, one terminal line."""

    def __init__(self, command: str, stream: TextIO | None = None, redraw_s: float = REDRAW_S) -> None:
        self.command = command
        self.redraw_s = redraw_s
        self.stream = stream or sys.stderr
        self.label = ""
        self.total: int | None = None
        self.unit = ""
        self.done: int | None = None
        self.size_bytes: int | None = None
        self._last_draw = 0.0
        self._drawn = False

    def phase(self, label: str, total: int | None = None, unit: str = "") -> None:
        self.label, self.total, self.unit = label, total, unit
        self.done = self.size_bytes = None
        self._maybe_draw()

    def update(self, done: int, size_bytes: int | None = None) -> None:
        self.done, self.size_bytes = done, size_bytes
        self._maybe_draw()

    def text(self) -> str:
        """The line as drawn, before it is cut to the terminal's width."""
        shown = f"{self.command}: {self.label}" if self.label else self.command
        counts = []
        if self.total is not None:
            counts.append(f"{self.done or 0}/{self.total}" + (f" {self.unit}" if self.unit else ""))
        elif self.done is not None and self.unit:
            counts.append(f"{self.done} {_singular(self.unit) if self.done == 1 else self.unit}")
        if self.size_bytes is not None:
            counts.append(size_text(self.size_bytes))
        return display(shown + (": " + ", ".join(counts) if counts else ""))

    def _maybe_draw(self) -> None:
        now = time.monotonic()
        if now - self._last_draw < self.redraw_s:
            return
        self._last_draw = now
        # One column short of the width: a character in the last column makes some terminals wrap.
        width = max(shutil.get_terminal_size((80, 24)).columns - 1, 1)
        self.stream.write("\r" + self.text()[:width] + "\x1b[K")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


class PhaseLog:
    """-v: each phase logged as it ends (``check: listing files: 5,945 files in 0.12 s``), then
    handed on to ``inner`` (the drawn line, or SILENT)."""

    def __init__(self, command: str, inner: Progress) -> None:
        import logging  # only a -v run logs: --help stays fast without it

        self._log = logging.getLogger(f"rocm_audit.{command}")
        self._inner = inner
        self._label: str | None = None
        self._unit = ""
        self._done: int | None = None
        self._size: int | None = None
        self._started = 0.0

    def phase(self, label: str, total: int | None = None, unit: str = "") -> None:
        self.close()
        self._label, self._unit, self._done, self._size = label, unit, None, None
        self._started = time.monotonic()
        self._inner.phase(label, total, unit)

    def update(self, done: int, size_bytes: int | None = None) -> None:
        self._done, self._size = done, size_bytes
        self._inner.update(done, size_bytes)

    def close(self) -> None:
        """Log the phase under way, if any."""
        if self._label is None:
            return
        counts = []
        if self._done and self._unit:  # a phase that counted nothing says only its time
            counts.append(f"{self._done:,} {_singular(self._unit) if self._done == 1 else self._unit}")
        if self._size is not None:
            counts.append(size_text(self._size))
        said = f": {', '.join(counts)}" if counts else ""
        self._log.info("%s%s in %.2f s", display(self._label), said, time.monotonic() - self._started)
        self._label = None


def _logging_phases() -> bool:
    """-v asked for logging at INFO (start_logging imported logging only then)."""
    logging = sys.modules.get("logging")
    return logging is not None and logging.getLogger().isEnabledFor(logging.INFO)


@contextmanager
def progress_line(command: str, quiet: bool) -> Iterator[Progress]:
    """A ProgressLine when progress_enabled(quiet), cleared afterwards (on error and Ctrl-C too);
    else SILENT. With -v, a PhaseLog in front of either."""
    line = (
        ProgressLine(command, redraw_s=float(os.environ.get(_REDRAW_ENV) or REDRAW_S))
        if progress_enabled(quiet)
        else None
    )
    shown: Progress = line if line is not None else SILENT
    phases = PhaseLog(command, shown) if _logging_phases() else None
    try:
        yield phases if phases is not None else shown
    finally:
        if line is not None:
            line.close()
        if phases is not None:
            phases.close()
