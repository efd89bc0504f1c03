"""A progress line on stderr for long scans: only on a terminal, never in CI logs or with --quiet."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


def progress_enabled(quiet: bool, stream: TextIO | None = None) -> bool:
    stream = stream or sys.stderr
    if quiet or os.environ.get("CI") or os.environ.get("TERM") == "dumb":
        return False
    return stream.isatty() and sys.stdout.isatty()


class ProgressLine:
    """Counts files and bytes; redraws at most 10 times a second."""

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.files = 0
        self.bytes = 0
        self._last_draw = 0.0

    def __call__(self, files: int, size: int) -> None:
        self.files = files
        self.bytes += size
        now = time.monotonic()
        if now - self._last_draw >= 0.1:
            self._last_draw = now
            self.stream.write(f"\r{self.label}: {self.files} files, {self.bytes / 1e6:,.0f} MB ")
            self.stream.flush()

    def close(self) -> None:
        if self._last_draw:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


@contextmanager
def progress_line(label: str, quiet: bool) -> Iterator[ProgressLine | None]:
    """A ProgressLine when progress_enabled(quiet), cleared afterwards; else None."""
    line = ProgressLine(label) if progress_enabled(quiet) else None
    try:
        yield line
    finally:
        if line is not None:
            line.close()
