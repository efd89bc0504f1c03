"""`--python PATH`: audit another interpreter's site-packages, so rocm-audit can live in its own venv."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rocm_audit.tree.discovery import (
    ChosenBy,
    default_site_packages,
    inspect_interpreter,
    interpreter_for,
    owning_interpreter,
    site_packages_of,
)
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
    assert failed.exit_code == 2
    assert failed.output == (
        f"rocm-audit: error: --python {not_python}: not a Python interpreter "
        "(it exited 0 without reporting a Python version)\n"
    )


# --python that is not a working Python: one line on stderr, exit 2, no traceback and nothing of
# rocm-audit's own helper script (`ls -c SCRIPT` and a shim that quotes its arguments print it back).


def _console_script() -> str:
    script = shutil.which("rocm-audit", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    assert script, "the rocm-audit console script is not installed"
    return script


def _run_script(*argv: str, cwd: Path | None = None, path: str | None = None) -> subprocess.CompletedProcess[str]:
    environment = dict(os.environ)
    if path is not None:
        environment["PATH"] = path
    return subprocess.run(
        [_console_script(), *argv], capture_output=True, text=True, timeout=120, cwd=cwd, env=environment, check=False
    )


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr and "sysconfig" not in done.stderr and "import" not in done.stderr
    return lines[0]


def _shim(directory: Path, name: str, body: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    shim = directory / name
    shim.write_text("#!/bin/sh\n" + body)
    shim.chmod(0o755)
    return shim


def test_a_program_that_is_no_python_is_one_line():
    line = _one_error_line(_run_script("llvm", "--python", "/bin/ls"))
    # GNU ls: -c is a sort order, the helper script a file it cannot access (exit 2)
    assert line == (
        "rocm-audit: error: --python /bin/ls: not a Python interpreter (it exited 2 without reporting a Python version)"
    )


def test_a_shim_that_refuses_to_run_shows_its_first_line(tmp_path):
    # what a pyenv shim prints for a version that is not selected (exit 127)
    shims = tmp_path / "shims"
    _shim(
        shims,
        "python3.12",
        'echo "pyenv: python3.12: command not found" >&2\necho >&2\n'
        "echo \"The \\`python3.12' command exists in these Python versions:\" >&2\necho '  3.12.1' >&2\nexit 127\n",
    )
    line = _one_error_line(_run_script("check", "--python", "python3.12", path=f"{shims}{os.pathsep}/usr/bin:/bin"))
    assert line == "rocm-audit: error: --python python3.12: it did not run (pyenv: python3.12: command not found)"
    by_path = _one_error_line(_run_script("scan", "--python", str(shims / "python3.12")))
    assert (
        by_path
        == f"rocm-audit: error: --python {shims / 'python3.12'}: it did not run (pyenv: python3.12: command not found)"
    )


def test_a_shim_that_quotes_the_helper_script_does_not_show_it(tmp_path):
    quoting = _shim(tmp_path, "python", 'echo "$0: cannot run: $2" >&2\nexit 126\n')
    line = _one_error_line(_run_script("llvm", "--python", str(quoting)))
    assert line == f"rocm-audit: error: --python {quoting}: it did not run (exit 126)"


def test_missing_and_unexecutable_interpreters(tmp_path):
    assert _one_error_line(_run_script("scan", "--python", "venv/bin/python", cwd=tmp_path)) == (
        "rocm-audit: error: --python venv/bin/python: no such file"
    )
    assert _one_error_line(_run_script("scan", "--python", "no-such-python-here", path="/usr/bin:/bin")) == (
        "rocm-audit: error: --python no-such-python-here: no such command on PATH"
    )
    text = tmp_path / "python"
    text.write_text("not a program\n")
    assert _one_error_line(_run_script("scan", "--python", str(text))) == (
        f"rocm-audit: error: --python {text}: not an executable file"
    )


def test_a_relative_path_and_a_bare_name_on_path(app_venv):
    venv, site = app_venv
    relative = _run_script("scan", "--python", "venv/bin/python", "--format", "json", cwd=venv.parent)
    assert relative.returncode == 0, relative.stderr
    assert json.loads(relative.stdout)["inputs"] == [str(site)]
    from_subdir = _run_script("scan", "--python", "../bin/python", "--format", "json", cwd=venv / "lib")
    assert from_subdir.returncode == 0, from_subdir.stderr
    assert json.loads(from_subdir.stdout)["inputs"] == [str(site)]
    by_name = _run_script(
        "scan", "--python", "python3", "--format", "json", path=f"{venv / 'bin'}{os.pathsep}/usr/bin:/bin"
    )
    assert by_name.returncode == 0, by_name.stderr
    assert json.loads(by_name.stdout)["inputs"] == [str(site)]


def test_the_venv_python_is_kept_as_named_not_resolved(app_venv, tmp_path, monkeypatch):
    venv, site = app_venv
    link = venv / "bin" / "python"
    assert link.is_symlink()  # to the base interpreter, whose site-packages are not the venv's
    monkeypatch.chdir(venv.parent)
    named = inspect_interpreter("venv/bin/python")
    assert named.executable == str(link) and named.site_dirs == (str(site),)
    assert named.version == ".".join(map(str, sys.version_info[:3]))
    owner = owning_interpreter(str(site / "_rocm_sdk_core"))
    assert owner is not None and owner.executable == str(link)
    assert interpreter_for(None, [str(site)]).chosen_by is ChosenBy.OWNER
    lone = tmp_path / "lone"
    lone.mkdir()
    fallback = interpreter_for(None, [str(lone)])
    assert fallback.chosen_by is ChosenBy.OWN and fallback.executable == sys.executable
    assert "no interpreter found" in fallback.reason
