"""How long work says how far it is, without printing: the library calls a Progress it is handed,
the CLI draws it (cli/progress.py), and everything else gets SILENT.

A phase has a label (``reading GPU code objects``), optionally a total and a unit; ``update``
gives the count done so far and, for phases that read bytes, the bytes so far. Calls must stay
cheap: a drawing Progress looks at the clock and redraws at most 10 times a second.
"""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def phase(self, label: str, total: int | None = None, unit: str = "") -> None:
        """A new phase begins: ``label`` says what it does, ``total`` how many ``unit`` it has."""

    def update(self, done: int, size_bytes: int | None = None) -> None:
        """``done`` of the phase's total so far (and ``size_bytes`` read so far, when it reads)."""


class _Silent:
    def phase(self, label: str, total: int | None = None, unit: str = "") -> None:
        pass

    def update(self, done: int, size_bytes: int | None = None) -> None:
        pass


SILENT: Progress = _Silent()
