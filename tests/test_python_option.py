"""`--python PATH`: audit another interpreter's site-packages, so rocm-audit can live in its own venv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rocm_audit.tree.discovery import default_site_packages, site_packages_of
from support.sdk_tree import build_sdk_tree

COMMANDS = (("dedup", "--check"), ("verify-arch", "gfx942"), ("llvm",), ("check", "gfx942"), ("scan",))


@pytest.fixture(scope="module")
def app_venv(tmp_path_factory) -> tuple[Path, Path]:
    """A venv without rocm-audit whose site-packages holds an SDK-shaped tree."""
    venv = tmp_path_factory.mktemp("appvenv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (site,) = site_packages_of(str(venv / "bin" / "python"))
    shutil.rmtree(site)
    build_sdk_tree(Path(site))
    return venv, Path(site)


def test_site_packages_of_asks_the_interpreter(app_venv):
    venv, site = app_venv
    assert site_packages_of(str(venv / "bin" / "python")) == [str(site)]
    assert site.is_relative_to(venv.resolve())
    # This interpreter asked from outside agrees with the in-process answer.
    assert site_packages_of(sys.executable) == default_site_packages()
    assert str(site) not in default_site_packages()


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: a[0])
def test_every_command_audits_the_named_interpreter(run_cli, app_venv, argv):
    venv, site = app_venv
    report = run_cli(*argv, "--python", str(venv / "bin" / "python"), "--format", "json").report
    assert report["inputs"] == [str(site)], argv
    if argv[0] == "dedup":
        assert any(f["rule"] in ("DUP001", "DUP002") for f in report["findings"])


def test_python_by_name_on_path_and_errors(run_cli, app_venv, monkeypatch):
    venv, site = app_venv
    monkeypatch.setenv("PATH", f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}")
    report = run_cli("scan", "--python", "python", "--format", "json", expect=0).report
    assert report["inputs"] == [str(site)]
    assert run_cli("scan", "--python", "/nonexistent/python").exit_code == 2
    assert run_cli("scan", "--python", str(venv / "bin" / "python"), "-p", str(site)).exit_code == 2
    not_python = venv / "not-python"
    not_python.write_text("#!/bin/sh\necho hello\n")
    not_python.chmod(0o755)
    failed = run_cli("scan", "--python", str(not_python))
    assert failed.exit_code == 2 and "did not report its site directories" in failed.output
