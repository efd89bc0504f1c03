"""Text rendering of a command outcome: the command's own section, then the findings."""

from __future__ import annotations

import os
import re
import sys

from rocm_audit.findings import Severity, sorted_findings
from rocm_audit.outcome import CommandOutcome

_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f\udc80-\udcff]")


def display(text: str, *, keep_newlines: bool = False) -> str:
    """Text safe for a terminal or a log line: control characters and undecodable bytes of a file
    name (held as surrogates by os.fsdecode) become backslash escapes, so one finding stays one line."""
    def escape(match: re.Match[str]) -> str:
        char = match.group()
        if keep_newlines and char in "\r\n":
            return char
        if "\udc80" <= char <= "\udcff":
            return f"\\x{ord(char) - 0xDC00:02x}"
        return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(char, f"\\x{ord(char):02x}")

    if text.isprintable():  # the common case, in C: no control character and no surrogate
        return text
    return _UNPRINTABLE.sub(escape, text)


_COLOURS = {Severity.ERROR: "\x1b[31m", Severity.WARNING: "\x1b[33m", Severity.INFO: "\x1b[36m"}


def use_colour() -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (no-color.org)."""
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def severity_label(severity: Severity, colour: bool) -> str:
    label = severity.value.upper()
    return f"{_COLOURS[severity]}{label}\x1b[0m" if colour else label


def render_findings(outcome: CommandOutcome, colour: bool) -> list[str]:
    lines = []
    for one in sorted_findings(outcome.findings):
        lines.append(f"{severity_label(one.severity, colour)} {one.rule} {display(one.path)}: {display(one.message)}")
        lines.extend(f"    related: {display(p)}" for p in one.related_paths)
    return lines


def render_text(outcome: CommandOutcome) -> str:
    colour = use_colour()
    parts: list[str] = []
    if outcome.render_text is not None:
        body = outcome.render_text(outcome)
        if body:
            parts.append(body.rstrip("\n"))
    findings = render_findings(outcome, colour)
    if findings:
        parts.append("\n".join(findings))
    counts = {s: sum(1 for f in outcome.findings if f.severity is s) for s in Severity}
    parts.append(f"{outcome.command}: {counts[Severity.ERROR]} error(s), {counts[Severity.WARNING]} warning(s), "
                 f"{counts[Severity.INFO]} info")
    return "\n".join(parts) + "\n"
