"""How text reports are laid out: 100 columns, paths relative to the audited roots, never split.

Pure string functions shared by the text and Markdown renderers. Paths pass through
``PathView.path`` (display-escaped, then their spaces held together) and lines through ``wrap``.
A held-together space is NUL while a line is laid out: ``display`` escapes every NUL a name or a
message could hold, so the only NULs in laid-out text are the ones put there here.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence

from rocm_audit.output.escape import COMMAND, display
from rocm_audit.units import plural

__all__ = ["WIDTH", "PathView", "hold", "plural", "wrap"]

WIDTH = 100
_HELD = "\x00"
_QUANTITY = re.compile(r"(?<![\w.])[0-9][0-9,.]* (?:B|KiB|MiB|GiB|TiB|PiB|s)(?![\w])")  # a number and its unit


def hold(text: str) -> str:
    """``text`` as one unbreakable word for ``wrap``."""
    return text.replace(" ", _HELD)


def wrap(text: str, indent: str | None = None, rest: str | None = None, width: int = WIDTH) -> list[str]:
    """``text`` broken at spaces into lines of at most ``width`` columns. The first line starts
    with ``indent`` (default: the text's own leading spaces), the others with ``rest`` (default:
    the indent and four more spaces). A word longer than a line (a long path) stands alone on its
    line, whole."""
    if indent is None:
        stripped = text.lstrip(" ")
        indent, text = text[: len(text) - len(stripped)], stripped
    if rest is None:
        rest = indent + "    " if not indent.strip() and len(indent) < 8 else indent
    text = _QUANTITY.sub(lambda m: hold(m.group()), text)  # never "0.01" at a line's end, "s" below
    lines: list[str] = []
    line = indent
    fresh = True  # nothing but the indent on the line yet
    for word in text.split(" "):
        if fresh:
            if not word and lines:
                continue  # a run of spaces at a break
            line += word
            fresh = False
        elif len(line) + 1 + len(word) <= width:
            line += " " + word
        else:
            lines.append(line.rstrip(" "))
            line = rest + word
            fresh = not word
    lines.append(line.rstrip(" ") if lines else line)
    return [one.replace(_HELD, " ") for one in lines]


class PathView:
    """Paths as a report shows them: relative to the audited root that holds them.

    One root: paths relative to it, and the header names it once. Several: each is numbered once
    in the header, and a path is shown as ``[n] relative/path``."""

    def __init__(self, roots: Iterable[str]) -> None:
        self.roots = sorted({r.rstrip("/") for r in roots if r and r != "/"})
        by_depth = sorted(self.roots, key=len, reverse=True)
        self._labels = {r: ("" if len(self.roots) == 1 else f"[{self.roots.index(r) + 1}] ") for r in by_depth}
        self._by_depth = by_depth
        self._in_text = re.compile("|".join(rf"(?<![\w./-]){re.escape(r)}/" for r in by_depth)) if by_depth else None

    def relative(self, path: str) -> str:
        for root in self._by_depth:
            if path.startswith(root + "/"):
                return self._labels[root] + path[len(root) + 1 :]
        return path

    def path(self, path: str) -> str:
        """The path as shown, escaped and held together."""
        return hold(display(self.relative(path)))

    def relative_text(self, text: str) -> str:
        """``text`` with every audited root in it shown as the paths are (not yet escaped), but for
        the commands in backticks: they are to be pasted, from wherever the reader stands."""
        if self._in_text is None:
            return text
        pattern = self._in_text
        pieces = COMMAND.split(text)
        commands = COMMAND.findall(text)
        shown = [pattern.sub(lambda m: self._labels[m.group()[:-1]], piece) for piece in pieces]
        return "".join(part for pair in itertools.zip_longest(shown, commands, fillvalue="") for part in pair)

    def in_text(self, text: str, paths: Sequence[str] = ()) -> str:
        """A message with every audited root in it shown as the paths are, and the named ``paths``
        and every command in backticks held together (a command split over lines does not paste)."""
        shown = display(self.relative_text(text))
        for path in sorted({display(self.relative(p)) for p in paths}, key=len, reverse=True):
            if " " in path:
                shown = shown.replace(path, hold(path))
        return COMMAND.sub(lambda m: hold(m.group()), shown)

    def header(self) -> list[str]:
        if not self.roots:
            return []
        if len(self.roots) == 1:
            return [hold("paths relative to " + display(self.roots[0]))]
        return ["paths relative to the audited directory holding them:"] + [
            f"  [{n}] {hold(display(root))}" for n, root in enumerate(self.roots, 1)
        ]
