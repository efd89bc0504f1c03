"""Command help with the options in panels ("What to audit", "What to do", "Report").

Typer groups options by ``rich_help_panel`` only when it renders help with rich; rocm-audit keeps
rich out of its imports (``rocm-audit --help`` stays fast: tests/cli/test_cli.py), so this plain click
formatter does the grouping: each parameter's ``rich_help_panel`` names its section.
"""

from __future__ import annotations

import inspect
from typing import Any

from typer.core import TyperCommand

from rocm_audit.cli.common import ACTION_PANEL, AUDIT_PANEL, REPORT_PANEL

# Panels in this order, then any other in the order its first parameter comes.
PANEL_ORDER = ("Arguments", AUDIT_PANEL, ACTION_PANEL, REPORT_PANEL)
HELP_WIDTH = 100  # every help line fits 100 columns (click wraps to min(terminal, this) - 2)


def summary_of(command: Any) -> str:
    """The first paragraph of a command's docstring on one line: its summary in the command list."""
    return " ".join((inspect.getdoc(command) or "").partition("\n\n")[0].split())


class PanelledCommand(TyperCommand):
    """A typer command whose --help lists its parameters by panel, --help itself last."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        # typer writes a required argument as {RULE}; the usage convention is RULE (optional: [REF]).
        pieces: list[str] = super().collect_usage_pieces(ctx)
        return [p[1:-1] if p.startswith("{") and p.endswith("}") else p for p in pieces]

    def format_options(self, ctx: Any, formatter: Any) -> None:
        rows_by_panel: dict[str, list[tuple[str, str]]] = {}
        help_rows: list[tuple[str, str]] = []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            panel = getattr(param, "rich_help_panel", None)
            if panel is None and param.name == "help":
                help_rows.append(record)
                continue
            if panel is None:
                panel = "Arguments" if param.param_type_name == "argument" else "Options"
            rows_by_panel.setdefault(panel, []).append(record)
        order = [p for p in PANEL_ORDER if p in rows_by_panel]
        order += [p for p in rows_by_panel if p not in PANEL_ORDER]
        if not order:
            order = ["Options"]
        rows_by_panel.setdefault(order[-1], []).extend(help_rows)
        for panel in order:
            with formatter.section(panel):
                formatter.write_dl(rows_by_panel[panel])
