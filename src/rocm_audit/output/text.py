"""Text rendering of a command outcome: the command's own section, then the findings, then the counts.

Pure: the outcome's data in, one string out; every name passes through output/escape.py."""

from __future__ import annotations

import os
import sys

from rocm_audit.findings import Severity, sorted_findings
from rocm_audit.outcome import CommandOutcome
from rocm_audit.output.escape import display
from rocm_audit.output.text_sections import Shorten, relative_to_roots, section_lines

_COLOURS = {Severity.ERROR: "\x1b[31m", Severity.WARNING: "\x1b[33m", Severity.INFO: "\x1b[36m"}


def use_colour() -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (no-color.org)."""
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def severity_label(severity: Severity, colour: bool) -> str:
    label = severity.value.upper()
    return f"{_COLOURS[severity]}{label}\x1b[0m" if colour else label


def render_findings(outcome: CommandOutcome, colour: bool, shorten: Shorten | None = None) -> list[str]:
    shorten = shorten or relative_to_roots(outcome.roots)
    lines = []
    for one in sorted_findings(outcome.findings):
        lines.append(
            f"{severity_label(one.severity, colour)} {one.rule} {display(shorten(one.path))}: {display(one.message)}"
        )
        lines.extend(f"    related: {display(shorten(p))}" for p in one.related_paths)
    return lines


def render_text(outcome: CommandOutcome) -> str:
    colour = use_colour()
    parts: list[str] = []
    shorten = relative_to_roots(outcome.roots)
    body = section_lines(outcome.command, outcome.sections, shorten)
    shown_roots = [r for r in outcome.roots if r != "/"]
    if shown_roots and (body or outcome.findings):
        body.insert(0, "paths relative to " + ", ".join(display(r) for r in shown_roots))
    if outcome.command == "dedup" and outcome.summary:  # dedup closes its own section with the summary
        body.append(display(outcome.summary))
    if body:
        parts.append("\n".join(body).rstrip("\n"))
    findings = render_findings(outcome, colour, shorten)
    if findings:
        parts.append("\n".join(findings))
    counts = {s: sum(1 for f in outcome.findings if f.severity is s) for s in Severity}
    parts.append(
        f"{outcome.command}: {counts[Severity.ERROR]} error(s), {counts[Severity.WARNING]} warning(s), "
        f"{counts[Severity.INFO]} info"
    )
    return "\n".join(parts) + "\n"
