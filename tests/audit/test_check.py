"""`rocm-audit check`: every check over one inventory, and the exit-code contract of every command."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.toolchain import gfx942_code_object


def test_check_runs_every_check_over_one_inventory(sdk, run_cli):
    code_object = gfx942_code_object(sdk.libraries / "lib" / "hsaco")
    result = run_cli("check", "-p", str(sdk.site), "--format", "json", expect=1)
    report = result.report
    assert report["command"] == "check"
    assert report["summary"]["checks"] == ["dedup", "verify-arch", "llvm", "post-build", "prune"]
    rules = {f["rule"] for f in report["findings"]}
    assert {"DUP001", "DUP002"} <= rules
    missing = [f for f in report["findings"] if f["rule"].startswith("ARCH") and f["severity"] == "error"]
    assert [f["path"] for f in missing] == [str(code_object)]
    # Targets came from _rocm_sdk_core/share/therock/dist_info.json ("gfx942;gfx950").
    assert [t["target"] for t in report["targets"]] == ["gfx942", "gfx950"]
    carrier = next(c for c in report["carriers"] if c["path"] == str(code_object))
    assert carrier["missing"] == ["gfx950"] and "gfx942" in " ".join(carrier["targets"])
    assert report["dedup"]["mode"] == "check" and len(report["dedup"]["groups"]) == 6
    assert report["summary"]["files_scanned"] == report["dedup"]["files_scanned"]
    assert isinstance(report["libraries"], list) and isinstance(report["clashes"], list)


def test_check_with_explicit_targets_and_skips(sdk, run_cli):
    gfx942_code_object(sdk.libraries / "lib" / "hsaco")
    result = run_cli("check", "gfx942", "-p", str(sdk.site), "--skip", "dedup", "--format", "json", expect=0)
    assert result.report["summary"]["checks"] == ["verify-arch", "llvm", "post-build", "prune"]
    assert "dedup" not in result.report
    assert not [f for f in result.report["findings"] if f["severity"] == "error"]


def test_check_without_any_known_target_warns_and_still_lists_carriers(tmp_path, run_cli, monkeypatch):
    monkeypatch.delenv("GPU_ARCH", raising=False)
    code_object = gfx942_code_object(tmp_path / "pkg")
    result = run_cli("check", "-p", str(tmp_path), "--format", "json", expect=0)
    assert [f["rule"] for f in result.report["findings"]] == ["CHK001"]
    assert [c["path"] for c in result.report["carriers"]] == [str(code_object)]
    run_cli("check", "-p", str(tmp_path), "--fail-on", "warning", expect=1)


def test_check_takes_targets_from_gpu_arch(tmp_path, run_cli, monkeypatch):
    gfx942_code_object(tmp_path / "pkg")
    monkeypatch.setenv("GPU_ARCH", "gfx942;gfx950")
    result = run_cli("check", "-p", str(tmp_path), "--format", "json", expect=1)
    assert [t["target"] for t in result.report["targets"]] == ["gfx942", "gfx950"]


# The exit-code contract, command by command: 0 clean, 1 findings, 2 usage, 3 internal error.
CLEAN_AND_DIRTY = {
    "dedup": (["dedup", "--check"], ["dedup", "--check"]),
    "check": (["check", "gfx942"], ["check", "gfx950"]),
    "verify-arch": (["verify-arch", "gfx942"], ["verify-arch", "gfx950"]),
    "llvm": (["llvm"], None),
    "scan": (["scan", "--targets"], None),
}


@pytest.mark.parametrize("command", sorted(CLEAN_AND_DIRTY))
def test_exit_codes_are_the_same_on_every_command(command, tmp_path, sdk, run_cli):
    clean_args, dirty_args = CLEAN_AND_DIRTY[command]
    clean = tmp_path / "clean"
    gfx942_code_object(clean / "_rocm_sdk_core" / "lib")
    run_cli(*clean_args, "-p", str(clean), expect=0)
    if dirty_args is not None:
        dirty = sdk.site
        gfx942_code_object(sdk.libraries / "lib")
        run_cli(*dirty_args, "-p", str(dirty), expect=1)
    run_cli(*clean_args, "-p", str(tmp_path / "does-not-exist"), expect=2)
    run_cli(*clean_args, "--no-such-option", expect=2)
    done = subprocess.run(
        [sys.executable, "-m", "rocm_audit", *clean_args, "-p", str(clean), "--rules", str(tmp_path / "missing.toml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "cannot read rules file" in done.stderr, done.stderr


@pytest.mark.parametrize("command", sorted(CLEAN_AND_DIRTY))
def test_internal_errors_exit_3_on_every_command(command, tmp_path, monkeypatch):
    from rocm_audit.cli import app as cli
    from rocm_audit.tree import inventory

    def broken(*args, **kwargs):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(inventory, "build_inventory", broken)
    modules = ("rocm_audit.dedup.run", "rocm_audit.audit.check", "rocm_audit.gpu.verify", "rocm_audit.llvm.clashes")
    for module in modules:
        loaded = sys.modules.get(module) or __import__(module, fromlist=["x"])
        if hasattr(loaded, "build_inventory"):
            monkeypatch.setattr(loaded, "build_inventory", broken)
    args = CLEAN_AND_DIRTY[command][0]
    assert cli.main([*args, "-p", str(tmp_path)]) == 3
