"""Sizes, counts and clipped texts as people read them: one style for every report, message and
progress line.

Binary units (KiB, MiB, GiB, TiB), as `du -h`, `ls -lh` and the kernel print them, so a size in a
report can be compared with what those tools show for the same file. JSON keeps exact byte counts.
"""

from __future__ import annotations

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def size_text(nbytes: int) -> str:
    """``nbytes`` as ``"512 B"``, ``"1.5 KiB"``, ``"628.9 MiB"`` or ``"3.2 GiB"`` (one decimal)."""
    if nbytes < 1024:
        return f"{nbytes} B"
    value = float(nbytes)
    for unit in _UNITS:
        value /= 1024
        if value < 1024 or unit == _UNITS[-1]:
            return f"{value:,.1f} {unit}"
    raise AssertionError("unreachable")


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 error``, ``4 errors``, ``1,250 files`` (``nouns`` for irregular plurals)."""
    return f"{count:,} {noun if count == 1 else (nouns or noun + 's')}"


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, its end replaced by ``...`` when it was longer."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
