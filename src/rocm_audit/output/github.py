"""GitHub Actions workflow commands: one ``::error file=...::message`` line per finding."""

from __future__ import annotations

from rocm_audit.findings import Severity
from rocm_audit.outcome import CommandOutcome
from rocm_audit.output.escape import display

_COMMAND = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def _escape_data(text: str) -> str:
    """Workflow-command data escapes (%, CR, LF); names inside were already made one line by display()."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(outcome: CommandOutcome) -> str:
    lines = []
    for one in outcome.findings:
        message = display(one.message)
        if one.related_paths:
            message += "\nrelated: " + ", ".join(display(p) for p in one.related_paths)
        lines.append(
            f"::{_COMMAND[one.severity]} file={_escape_property(display(one.path))},"
            f"title={_escape_property(one.rule)}::{_escape_data(message)}"
        )
    return "\n".join(lines) + ("\n" if lines else "")
