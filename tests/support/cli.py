"""The one in-process CLI runner of the tests: JSON reports are parsed and validated against the schema."""

from __future__ import annotations

import json
from collections.abc import Sequence

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
    result.report = None
    if "--format" in args and args[args.index("--format") + 1] == "json" and "-o" not in args:
        result.report = json.loads(result.stdout)
        validator.validate(result.report)
    return result
