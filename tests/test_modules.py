"""Every module under src/rocm_audit imports, and tests/ mirrors src/rocm_audit (one folder of tests
per capability folder). Part of the fast loop (`scripts/test --fast`): no module goes untouched."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import rocm_audit

PACKAGE = Path(rocm_audit.__file__).resolve().parent
TESTS = Path(__file__).resolve().parent
# Capability folders whose tests live elsewhere, and where: the format parsers are exercised through
# the GPU code-object tests (real bundles, CCOBs, kpack archives) and fuzzed in tests/reliability.
TESTED_ELSEWHERE = {"formats": ("gpu", "reliability")}


def _modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue  # runs the CLI on import: test_main_module_runs_the_cli
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = _modules()


def test_the_module_list_is_the_package():
    # a wrong glob would make the import test below vacuous
    assert {"rocm_audit", "rocm_audit.cli.app", "rocm_audit.elf.read", "rocm_audit.tree.inventory"} <= set(MODULES)
    assert len(MODULES) > 100


@pytest.mark.parametrize("name", MODULES)
def test_every_module_imports(name):
    module = importlib.import_module(name)
    assert Path(module.__file__ or "").resolve().is_relative_to(PACKAGE)


def test_main_module_runs_the_cli():
    done = subprocess.run([sys.executable, "-m", "rocm_audit", "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and rocm_audit.__version__ in done.stdout, done


def test_tests_mirror_the_capability_folders():
    folders = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert "gpu" in folders and "tree" in folders
    for folder in folders:
        homes = TESTED_ELSEWHERE.get(folder, (folder,))
        for home in homes:
            assert any((TESTS / home).glob("test_*.py")), f"src/rocm_audit/{folder}: no tests/{home}/test_*.py"
