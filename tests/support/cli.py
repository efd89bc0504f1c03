"""The one in-process CLI runner of the tests: JSON reports are parsed and validated against the schema."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import jsonschema
from typer.testing import CliRunner, Result

from rocm_audit.output.report import load_schema


def report_validator() -> jsonschema.Draft202012Validator:
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def invoke_cli(validator: jsonschema.Draft202012Validator, args: Sequence[str], expect: int | None = None) -> Result:
    """Run `rocm-audit ARGS`; result.report holds the validated JSON report when it went to stdout."""
    from rocm_audit.cli.app import app

    args = list(args)
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    if expect is not None:
        assert result.exit_code == expect, (result.exit_code, result.output)
    report = None
    if "--format" in args and args[args.index("--format") + 1] == "json" and "-o" not in args:
        report = json.loads(result.stdout)
        validator.validate(report)
        check_summary(report)
    result.report = report  # type: ignore[attr-defined]  # the tests read it as result.report
    return result


def check_summary(report: dict[str, Any]) -> None:
    """The report's summary counts what it lists: findings per severity and per rule family, and
    the suppressed entries per source (kind "baseline" for baseline:FILE, else "rules")."""
    findings, summary = report["findings"], report["summary"]
    for severity in ("error", "warning", "info"):
        assert summary["findings"][severity] == sum(f["severity"] == severity for f in findings), severity
    assert summary["findings"]["total"] == len(findings)
    families = {f["rule"].rstrip("0123456789") for f in findings}
    assert set(summary["by_family"]) == families
    for family, counts in summary["by_family"].items():
        mine = [f for f in findings if f["rule"].rstrip("0123456789") == family]
        assert counts == {
            "total": len(mine),
            **{s: sum(f["severity"] == s for f in mine) for s in ("error", "warning", "info")},
        }, family
    suppressed = report.get("suppressed", [])
    assert summary["suppressed"]["total"] == len(suppressed)
    sources = sorted({s["source"] for s in suppressed})
    assert [e["source"] for e in summary["suppressed"]["by_source"]] == sources
    for entry in summary["suppressed"]["by_source"]:
        assert entry["count"] == sum(s["source"] == entry["source"] for s in suppressed)
        assert entry["kind"] == ("baseline" if entry["source"].startswith("baseline:") else "rules")
    baseline = sum(s["source"].startswith("baseline:") for s in suppressed)
    assert (summary["suppressed"]["baseline"], summary["suppressed"]["rules"]) == (baseline, len(suppressed) - baseline)
