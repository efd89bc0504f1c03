"""mkdocs hook: the three reference pages, generated at build time and never committed.

- reference/cli.md from the typer app (every command, its help, arguments and options, defaults);
- reference/rules.md from the shipped rule catalogue (rocm_audit/rules/*.toml);
- reference/report.md from the JSON Schema of the report (rocm_audit/schemas/report-v1.json).

Each page is made from what the installed package holds, so it cannot drift from the program.
"""

from __future__ import annotations

import enum
import html
import inspect
import json
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

GENERATED_NOTE = "_Generated from the program when the site is built; do not edit._\n"

# ---------------------------------------------------------------------------------------------
# Markdown helpers


def _escape(text: str) -> str:
    """Plain text for Markdown: code spans (`...`) stay as they are, other text is escaped."""
    parts = re.split(r"(`[^`\n]*`)", text)
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(part)
        else:
            escaped = html.escape(part, quote=False)
            out.append(re.sub(r"([\\*_\[\]#|])", r"\\\1", escaped))
    return "".join(out)


def _cell(text: str) -> str:
    """One table cell: escaped, on one line, with no bare column separator (a `|` inside a code
    span does not split a cell in Python-Markdown's tables, and an escaped one there would show
    its backslash)."""
    return _escape(" ".join(text.split()))


def _code(text: str) -> str:
    """A code span holding text exactly (longer fences when the text holds backticks)."""
    fence = "``" if "`" in text else "`"
    return f"{fence}{text}{fence}"


def _paragraphs(text: str) -> str:
    """A docstring as Markdown paragraphs (click's \\b marker keeps a block's line breaks)."""
    blocks = []
    for block in re.split(r"\n\s*\n", inspect.cleandoc(text or "")):
        lines = [line for line in block.splitlines() if line.strip() != "\b"]
        if block.lstrip().startswith("\b"):
            blocks.append("\n".join(_escape(line) + "  " for line in lines).rstrip())
        else:
            blocks.append(_escape(" ".join(line.strip() for line in lines)))
    return "\n\n".join(b for b in blocks if b) + "\n"


# ---------------------------------------------------------------------------------------------
# CLI reference


def _default(param: Any) -> str:
    default = param.default
    if callable(default) or default is None or default == () or default == []:
        return ""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return "" if default in (False, 0) else _code(str(default).lower())
    if isinstance(default, enum.Enum):
        default = default.value
    if isinstance(default, (list, tuple)):
        return ", ".join(_code(str(getattr(v, "value", v))) for v in default)
    return _code(str(default))


def _value(param: Any) -> str:
    choices = getattr(param.type, "choices", None)
    if getattr(param, "count", False):
        return "counted flag"
    if getattr(param, "is_flag", False):
        return "flag"
    if choices:
        return _code("|".join(str(getattr(c, "value", c)) for c in choices))
    name = param.metavar or param.type.name.upper()
    return _code(name) + (", repeatable" if param.multiple or getattr(param, "nargs", 1) == -1 else "")


def _option_rows(params: list[Any]) -> list[str]:
    rows = []
    for param in params:
        if getattr(param, "hidden", False) or getattr(param, "param_type_name", "") != "option":
            continue
        names = ", ".join(_code(o) for o in [*param.opts, *param.secondary_opts])
        help_text = _cell(param.help or "")
        if param.required:
            help_text = "**required.** " + help_text
        rows.append(f"| {names} | {_value(param)} | {_default(param)} | {help_text} |")
    return rows


def _argument_rows(params: list[Any]) -> list[str]:
    rows = []
    for param in params:
        if getattr(param, "param_type_name", "") != "argument":
            continue
        name = (param.metavar or param.name or "").upper()
        count = "one or more" if param.nargs == -1 and param.required else "any number" if param.nargs == -1 else "one"
        help_text = _cell(getattr(param, "help", None) or "")
        rows.append(f"| {_code(name)} | {count}{'' if param.required else ', optional'} | {help_text} |")
    return rows


def cli_reference() -> str:
    import typer.main

    from rocm_audit.cli.app import app

    root = typer.main.get_command(app)
    context = root.make_context("rocm-audit", [], resilient_parsing=True)
    out = ["# CLI reference\n", GENERATED_NOTE]
    out.append(_paragraphs(root.help or ""))
    out.append(f"```text\n{root.get_usage(context).replace('Usage: ', '')}\n```\n")
    if root.epilog:
        out.append(_paragraphs(root.epilog))
    out.append("## Options before the command\n")
    out.append("| option | value | default | meaning |\n|---|---|---|---|")
    out.extend(_option_rows(root.params))
    out.append("")
    commands = root.commands  # type: ignore[attr-defined]
    out.append("## Commands\n")
    out.append("| command | what it does |\n|---|---|")
    for name, command in commands.items():
        summary = (command.help or "").strip().split("\n\n")[0]
        out.append(f"| [{_code('rocm-audit ' + name)}](#{name}) | {_cell(summary)} |")
    out.append("")
    for name, command in commands.items():
        sub = command.make_context(name, [], parent=context, resilient_parsing=True)
        out.append(f"## `rocm-audit {name}` {{#{name}}}\n")
        out.append(f"```text\n{command.get_usage(sub).replace('Usage: ', '')}\n```\n")
        out.append(_paragraphs(command.help or ""))
        arguments = _argument_rows(command.params)
        if arguments:
            out.append("| argument | how many | meaning |\n|---|---|---|")
            out.extend(arguments)
            out.append("")
        options = _option_rows(command.params)
        if options:
            out.append("| option | value | default | meaning |\n|---|---|---|---|")
            out.extend(options)
            out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Rule reference


def rule_reference() -> str:
    from rocm_audit.rulebook.catalogue import shipped_catalogue

    catalogue = shipped_catalogue()
    out = ["# Rule reference\n", GENERATED_NOTE]
    out.append(
        "Every rule rocm-audit ships, from `rocm_audit/rules/*.toml`. A rules file (`--rules`, see "
        "[Rules files](../rules.md)) can change a rule's severity or ignore its findings; "
        "`rocm-audit rules` prints the rules in force with where each setting came from.\n"
    )
    out.append("| id | default severity | title |\n|---|---|---|")
    ids = sorted(catalogue.rules, key=lambda i: (re.sub(r"\d+$", "", i), i))
    for rule_id in ids:
        rule = catalogue.rules[rule_id]
        out.append(f"| [{rule_id}](#{rule_id.lower()}) | {rule.severity.value} | {_cell(rule.title)} |")
    out.append("")
    for rule_id in ids:
        rule = catalogue.rules[rule_id]
        out.append(f"## {rule_id}: {_escape(rule.title)} {{#{rule_id.lower()}}}\n")
        out.append(f"Default severity: **{rule.severity.value}**. Defined in `{rule.source}`.\n")
        if rule.graded:
            out.append(f"Severity per finding: {_escape(rule.graded)}\n")
        out.append(f"**Why.** {_escape(rule.rationale)}\n")
        out.append(f"**Fix.** {_escape(rule.fix)}\n")
        if rule.params:
            settings = ", ".join(f"`{key} = {json.dumps(value)}`" for key, value in sorted(rule.params.items()))
            out.append(f"Parameters: {settings}.\n")
    if catalogue.policy:
        out.append("## Policy settings\n")
        out.append("The shipped defaults of the `[policy.<area>]` tables a rules file may change.\n")
        out.append("| area | setting | default |\n|---|---|---|")
        for area, table in sorted(catalogue.policy.items()):
            for key, value in sorted(table.items()):
                out.append(f"| `{area}` | `{key}` | {_code(json.dumps(value))} |")
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Report fields


def _type_of(schema: dict[str, Any], nested: str = "", queue: list[tuple[str, dict[str, Any]]] | None = None) -> str:
    """The type of a field as Markdown; an inline object with fields gets a section of its own
    (named `nested`, appended to `queue`)."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_anchor(name)})"
    if "const" in schema:
        return _code(json.dumps(schema["const"]))
    if "enum" in schema:
        return " \\| ".join(_code(json.dumps(v)) for v in schema["enum"])
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return " or ".join(_type_of(s, nested, queue) for s in schema[key])
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    if kind == "array" and isinstance(schema.get("items"), dict):
        return f"array of {_type_of(schema['items'], nested, queue)}"
    if kind == "object" and schema.get("properties") and queue is not None and nested:
        queue.append((nested, schema))
        return f"[object](#{_anchor(nested)})"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {_type_of(schema['additionalProperties'], nested, queue)}"
    if "pattern" in schema:
        return f"{kind} matching {_code(schema['pattern'])}"
    return str(kind)


def _anchor(name: str) -> str:
    return "def-" + re.sub(r"[^a-z0-9]+", "-", name.lower())


def _field_table(schema: dict[str, Any], prefix: str, queue: list[tuple[str, dict[str, Any]]]) -> list[str]:
    properties = schema.get("properties", {})
    if not properties:
        return [f"Type: {_type_of(schema)}.", ""]
    required = set(schema.get("required", []))
    rows = ["| field | type | required | meaning |", "|---|---|---|---|"]
    for name, sub in properties.items():
        kind = _type_of(sub, f"{prefix}.{name}" if prefix else name, queue)
        meaning = _cell(sub.get("description", ""))
        rows.append(f"| `{name}` | {kind} | {'yes' if name in required else ''} | {meaning} |")
    rows.append("")
    if schema.get("additionalProperties") is False:
        rows.extend(["No other field is allowed.", ""])
    return rows


def _section(name: str, schema: dict[str, Any], out: list[str]) -> None:
    queue: list[tuple[str, dict[str, Any]]] = []
    out.append(f"## `{name}` {{#{_anchor(name)}}}\n")
    if schema.get("description"):
        out.append(_escape(schema["description"]) + "\n")
    out.extend(_field_table(schema, name, queue))
    while queue:
        inner, inner_schema = queue.pop(0)
        out.append(f"### `{inner}` {{#{_anchor(inner)}}}\n")
        if inner_schema.get("description"):
            out.append(_escape(inner_schema["description"]) + "\n")
        out.extend(_field_table(inner_schema, inner, queue))


def report_reference(schema_path: Path) -> str:
    schema = json.loads(schema_path.read_text(encoding="utf-8"))
    out = ["# Report fields\n", GENERATED_NOTE]
    out.append(
        f"The fields of the JSON report (`--format json`), from its shipped JSON Schema "
        f"`rocm_audit/schemas/{schema_path.name}` ({_escape(schema.get('title', ''))}; dialect "
        f"`{schema.get('$schema', '')}`). See [Reports and exit codes](../reports.md) for how the "
        "report is laid out and which other formats exist.\n"
    )
    top = {key: value for key, value in schema.items() if key != "$defs"}
    _section("report", top, out)
    for name, sub in schema.get("$defs", {}).items():
        _section(name, sub, out)
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# The hook


def on_files(files: Files, config: Any) -> Files:
    import rocm_audit

    schema = Path(rocm_audit.__file__).parent / "schemas" / "report-v1.json"
    pages = {
        "reference/cli.md": cli_reference(),
        "reference/rules.md": rule_reference(),
        "reference/report.md": report_reference(schema),
    }
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    return files
