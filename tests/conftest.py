"""Fixtures shared by every test area: report validation and the CLI runner."""

from __future__ import annotations

import json
import os

import jsonschema
import pytest
from typer.testing import CliRunner

from rocm_audit.report import load_schema


@pytest.fixture(scope="session")
def report_validator() -> jsonschema.Draft202012Validator:
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture()
def run_cli(report_validator):
    """Run the CLI in-process; JSON output is parsed and validated against the shipped schema."""
    from rocm_audit.cli import app

    def invoke(*args: str, expect: int | None = None):
        runner = CliRunner()
        result = runner.invoke(app, list(args), catch_exceptions=False)
        if expect is not None:
            assert result.exit_code == expect, (result.exit_code, result.output)
        result.report = None
        if "--format" in args and args[args.index("--format") + 1] == "json" and "-o" not in args:
            result.report = json.loads(result.stdout)
            report_validator.validate(result.report)
        return result

    return invoke


@pytest.fixture(scope="session")
def cache_dir() -> str:
    path = os.environ.get("ROCM_AUDIT_TEST_CACHE", os.path.expanduser("~/.cache/rocm-audit-tests"))
    os.makedirs(path, exist_ok=True)
    return path
