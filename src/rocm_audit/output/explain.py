"""`rocm-audit explain RULE` as text or JSON: what a rule means, why it matters, how to fix it.

Pure: a catalogue rule in, one string out; every text passes through output/escape.py."""

from __future__ import annotations

import textwrap
from typing import Any

from rocm_audit.output.escape import display
from rocm_audit.output.report import to_json
from rocm_audit.rulebook.catalogue import Rule

WIDTH = 100  # text people read fits 100 columns
_INDENT = "  "


def explanation_record(rule: Rule) -> dict[str, Any]:
    """The rule as a JSON-ready mapping (what ``--format json`` prints)."""
    return {
        "id": rule.id,
        "title": rule.title,
        "severity": rule.severity.value,
        **({"graded": rule.graded} if rule.graded else {}),
        "reported_by": list(rule.reported_by),
        "rationale": rule.rationale,
        "fix": rule.fix,
        "defined_in": rule.source,
    }


def _wrap(text: str, indent: str = "", subsequent_indent: str = _INDENT) -> list[str]:
    # Never split a word: a file name (rocm-sdk-device-<gfx>) or an option stays whole.
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent=indent,
        subsequent_indent=subsequent_indent,
        break_long_words=False,
        break_on_hyphens=False,
    )


def _paragraph(heading: str, text: str) -> list[str]:
    return [heading, *_wrap(display(text), _INDENT)]


def render_explanation(rule: Rule) -> str:
    """The rule for people: its id and title, default severity, the commands that report it, then
    why it matters and how to fix it, wrapped at 100 columns."""
    commands = ", ".join(f"rocm-audit {display(c)}" for c in rule.reported_by) or "none"
    lines = _wrap(f"{rule.id}: {display(rule.title)}")
    lines.append("")
    lines += _wrap(f"Default severity: {rule.severity.value}")
    if rule.graded:
        lines += _wrap(f"Severity per finding: {rule.graded}")
    lines += _wrap(f"Reported by: {commands}")
    lines.append("")
    lines += _paragraph("Why it matters:", rule.rationale)
    lines.append("")
    lines += _paragraph("How to fix it:", rule.fix)
    return "\n".join(lines) + "\n"


def render_explanation_json(rule: Rule) -> str:
    return to_json(explanation_record(rule))
