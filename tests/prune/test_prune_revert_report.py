"""What `prune --revert` says: the reinstall command run by the audited venv's own interpreter,
once, on the distribution's .dist-info (PRUNE007); what it restored or why nothing; the runs it
restored marked in the manifest; a distribution uninstalled since the prune (PRUNE010, info, exit 0).
On the prune unit tree (tests/prune/conftest.py) inside a real venv."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.prune_units import tree_state, unwrapped


@pytest.fixture
def venv(pristine_units: Path, tmp_path: Path) -> Path:
    """A venv (no pip of its own) whose site-packages holds the unit tree."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=120)
    site = next((tmp_path / "venv" / "lib").glob("python3*/site-packages"))
    shutil.rmtree(site)
    shutil.copytree(pristine_units, site, symlinks=True)
    return tmp_path / "venv"


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def _said(output: str) -> str:
    return " ".join(output.split())  # as one line, whatever the wrapping at 100 columns


def test_the_reinstall_line_names_the_audited_interpreter_once(run_cli, venv, monkeypatch):
    monkeypatch.chdir(venv.parent)
    site = _site(venv)
    python = str(venv / "bin" / "python")
    run_cli("prune", "gfx942", "--fatbins", "--python", "venv/bin/python", expect=0)  # relative, as typed
    manifest = str(site / ".rocm-audit" / "prune-manifest.jsonl")
    line = f"{python} -m pip install --force-reinstall --no-deps mylib==1.0"
    for extra in (["--python", "venv/bin/python"], []):  # without --python: the one the manifest recorded
        report = run_cli("prune", "--revert", manifest, *extra, "--format", "json", expect=1).report
        assert line in report["prune_revert"]["reinstall"]
        mylib = [f for f in report["findings"] if f["rule"] == "PRUNE007" and f["data"].get("distribution") == "mylib"]
        assert len(mylib) == 1
        assert mylib[0]["path"] == str(site / "mylib-1.0.dist-info")
        assert mylib[0]["message"].count("pip install") == 1 and f"`{line}`" in mylib[0]["message"]
    text = run_cli("prune", "--revert", manifest, expect=1).output
    assert _said(text).count("pip install") == 1  # the command said once, in its finding
    assert any(f"`{line}`" in row for row in text.splitlines())  # on one line: it pastes whole
    assert "WARNING PRUNE007 mylib-1.0.dist-info: no backup holds 6 files of mylib 1.0: reinstall" in _said(  # relative
        text
    )


def test_revert_says_what_it_did_marks_the_run_and_frees_the_backup(run_cli, units, tmp_path):
    before = tree_state(units)
    backup = tmp_path / "backup"
    run_cli("prune", "gfx942", "--fatbins", "-p", str(units), "--backup", str(backup), expect=0)
    manifest = units / ".rocm-audit" / "prune-manifest.jsonl"
    done = unwrapped(run_cli("prune", "--revert", str(manifest), expect=0).output)
    restored = [line for line in done if line.startswith("restored ")]
    assert len(restored) == 9 and done[-4] == "prune --revert: restored 9 paths"
    assert done[-3] == f"everything is back: the backup {backup} is no longer needed and can be removed"
    assert done[-2] == "" and done[-1].startswith("prune: 0 errors")  # what it did, a paragraph above the counts
    assert tree_state(units).keys() == before.keys()
    marks = [json.loads(line) for line in manifest.read_text().splitlines() if '"reverted"' in line]
    runs = {
        json.loads(line)["run"] for line in manifest.read_text().splitlines() if "rocm_audit_prune_manifest" in line
    }
    assert {m["run"] for m in marks} == runs and len(runs) == 2  # the whole-unit run and the --fatbins run
    again = run_cli("prune", "--revert", str(manifest), "--format", "json", expect=0).report["prune_revert"]
    assert again["restored"] == [] and again["backups_done"] == []
    assert again["nothing_done"] == "an earlier --revert restored everything this manifest journalled"
    text = run_cli("prune", "--revert", str(manifest), expect=0).output
    assert _said(text).startswith("prune --revert: nothing to restore: an earlier --revert restored everything")


def test_revert_of_a_run_that_changed_nothing_says_so(run_cli, units, tmp_path):
    run_cli("prune", "gfx942", "--fatbins", "-p", str(units), "--backup", str(tmp_path / "b1"), expect=0)
    manifest = tmp_path / "second.jsonl"  # a second run: it journals the library, then slims nothing
    run_cli("prune", "gfx942", "--fatbins", "-p", str(units), "--manifest", str(manifest), expect=0)
    report = run_cli("prune", "--revert", str(manifest), "--format", "json", expect=0).report["prune_revert"]
    assert report["restored"] == [] and report["nothing_done"].startswith("every journalled path is as it was")


def test_a_distribution_uninstalled_since_the_prune_is_no_error(run_cli, venv, tmp_path):
    site = _site(venv)
    python = str(venv / "bin" / "python")
    run_cli("prune", "gfx942", "--fatbins", "--python", python, "--backup", str(tmp_path / "bk"), expect=0)
    uninstall = [sys.executable, "-m", "pip", "--python", python, "uninstall", "-y", "mylib"]
    subprocess.run(uninstall, check=True, capture_output=True, timeout=300)
    assert not (site / "mylib-1.0.dist-info").exists() and not (site / "mylib/libfat.so").exists()
    manifest = str(site / ".rocm-audit" / "prune-manifest.jsonl")
    report = run_cli("prune", "--revert", manifest, "--format", "json", expect=0).report
    gone = [f for f in report["findings"] if f["rule"] == "PRUNE010"]
    assert [(f["severity"], f["path"]) for f in gone] == [("info", str(site / "mylib-1.0.dist-info"))]
    assert gone[0]["message"].startswith("mylib 1.0 is no longer installed: nothing to restore for it")
    assert not [f for f in report["findings"] if f["severity"] == "error"]
    assert report["prune_revert"]["uninstalled"] == [{"distribution": "mylib", "version": "1.0"}]
    assert not (site / "mylib/libfat.so").exists()  # none of its files came back without it
    assert not (site / "mylib/kernels/Kernels_gfx90a.hsaco").exists()
    # what no uninstall touched came back: the SDK tree's units, which no distribution owns
    assert (site / "_rocm_sdk_libraries/.kpack/blas_lib_gfx90a.kpack").exists()
    closing = unwrapped(run_cli("prune", "--revert", manifest, expect=0).output)  # and again: the true reason
    assert closing[-3] == (
        "prune --revert: nothing to restore: an earlier --revert restored everything this manifest "
        "journalled, but for distributions uninstalled since (mylib)"
    )


def test_a_library_gone_while_its_distribution_is_installed_is_still_an_error(run_cli, units):
    run_cli("prune", "gfx942", "--fatbins", "-p", str(units), expect=0)
    (units / "mylib/libfat.so").unlink()
    report = run_cli("prune", "--revert", str(units / ".rocm-audit/prune-manifest.jsonl"), "--format", "json").report
    errors = [f for f in report["findings"] if f["rule"] == "PRUNE006"]
    assert [f["message"] for f in errors if f["path"].endswith("libfat.so")] == [
        "not restored: No such file or directory, though mylib is still installed"
    ]
