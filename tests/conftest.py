"""Fixtures shared by every test area: report validation and the CLI runner."""

from __future__ import annotations

import json
import os
import shutil

import jsonschema
import pytest
from typer.testing import CliRunner

from rocm_audit.output.report import load_schema
from support.sdk_tree import SdkTree, build_sdk_tree


@pytest.fixture(scope="session")
def report_validator() -> jsonschema.Draft202012Validator:
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture()
def run_cli(report_validator):
    """Run the CLI in-process; JSON output is parsed and validated against the shipped schema."""
    from rocm_audit.cli.app import app

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


@pytest.fixture(scope="session")
def pristine_tree(tmp_path_factory) -> SdkTree:
    return build_sdk_tree(tmp_path_factory.mktemp("pristine") / "site-packages")


@pytest.fixture()
def sdk(pristine_tree, tmp_path) -> SdkTree:
    """A fresh copy of the SDK-shaped site-packages; hardlinks and symlinks are preserved."""
    site = tmp_path / "site-packages"
    shutil.copytree(pristine_tree.site, site, symlinks=True)
    # copytree splits hardlinks; restore the one hardlinked pair the fixture promises.
    devel_hard = site / "_rocm_sdk_devel" / "lib" / "libhard.so.1"
    devel_hard.unlink()
    os.link(site / "_rocm_sdk_core" / "lib" / "libhard.so.1", devel_hard)
    return SdkTree(site, site / "_rocm_sdk_core", site / "_rocm_sdk_libraries_gfx94X_dcgpu", site / "_rocm_sdk_devel")
