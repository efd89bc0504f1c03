"""GitHub Actions workflow commands: one ``::error file=...::message`` line per finding.

Escapes as the runner reads them back (actions/runner ActionCommand.cs, UnescapeData and
UnescapeProperty): data escapes %, CR and LF; a property also escapes ':' and ','. '%' goes first,
so a name holding "%0A" stays those three characters. GitHub places an annotation on a file by its
path relative to the repository, so a path under ``$GITHUB_WORKSPACE`` (the checkout) is written
relative to it (the related paths in the message too); any other path stays absolute (the
annotation then shows without a file link).
"""

from __future__ import annotations

import os

from rocm_audit.findings import Severity
from rocm_audit.outcome import CommandOutcome
from rocm_audit.output.escape import display

_COMMAND = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def _escape_data(text: str) -> str:
    """Workflow-command data escapes (%, CR, LF); names inside were already made one line by display()."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def workspace_relative(path: str, workspace: str | None) -> str:
    """``path`` relative to the workspace when it lies under it (as given or resolved), else as is."""
    if not workspace or not os.path.isabs(path):
        return path
    for root in dict.fromkeys([os.path.normpath(workspace), os.path.realpath(workspace)]):
        if root != "/" and path.startswith(root + "/"):
            return path[len(root) + 1 :]
    return path


def render_github(outcome: CommandOutcome, workspace: str | None = None) -> str:
    """One workflow command per finding, errors first as in the text report; ``workspace`` is
    ``$GITHUB_WORKSPACE`` when set."""
    lines = []
    for one in sorted(outcome.findings, key=lambda f: (-f.severity.rank, f.sort_key())):
        message = display(one.message)
        if one.related_paths:
            related = (display(workspace_relative(p, workspace)) for p in one.related_paths)
            message += "\nrelated: " + ", ".join(related)
        where = display(workspace_relative(one.path, workspace))
        lines.append(
            f"::{_COMMAND[one.severity]} file={_escape_property(where)},"
            f"title={_escape_property(one.rule)}::{_escape_data(message)}"
        )
    return "\n".join(lines) + ("\n" if lines else "")
