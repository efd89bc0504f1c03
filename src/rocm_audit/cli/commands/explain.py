"""`rocm-audit explain RULE`: what one rule means, why it matters and how to fix it."""

from __future__ import annotations

import enum
import sys
from typing import Annotated

import typer

from rocm_audit.cli.common import REPORT_PANEL, run


class ExplainFormat(str, enum.Enum):
    text = "text"
    json = "json"


def command(
    rule: Annotated[
        str, typer.Argument(metavar="RULE", help="A rule id as findings show it, in any case: LLVM002, dup001.")
    ],
    fmt: Annotated[
        ExplainFormat,
        typer.Option("--format", metavar="FORMAT", help="text, or json for tools.", rich_help_panel=REPORT_PANEL),
    ] = ExplainFormat.text,
) -> None:
    """Explain a rule: what it means, why it matters, how to fix it.

    Also shows its default severity (a --rules file can change it) and the commands that report it.
    `rocm-audit rules` lists every rule.

    \b
    Examples:
      rocm-audit explain LLVM002
      rocm-audit explain dup001 --format json
    """

    def body() -> int:
        from rocm_audit.output.explain import render_explanation, render_explanation_json
        from rocm_audit.rulebook.explain import find_rule

        found = find_rule(rule)
        text = render_explanation_json(found) if fmt is ExplainFormat.json else render_explanation(found)
        sys.stdout.write(text)
        return 0

    run(body)
