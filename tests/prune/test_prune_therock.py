"""prune on a TheRock-faithful multi-arch install: `rocm[libraries,devel,device-gfx90a,device-gfx942]`
installed by pip from a local index, expanded by `rocm-sdk init` (devel links of the device files)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support.prune_units import tree_state
from support.therock import TheRockInstall, build_therock_install

pytestmark = pytest.mark.toolchain  # venvs made and installed by pip from a local index


@pytest.fixture()
def install(tmp_path: Path) -> TheRockInstall:
    return build_therock_install(tmp_path, init=True)


def _state(site: Path) -> dict[str, tuple]:
    # pip drops the byte-code of what it uninstalls; Python writes it again on import
    return {k: v for k, v in tree_state(site).items() if "__pycache__" not in k}


def _verdicts(report) -> set[tuple[str, str]]:
    return {(c["path"], json.dumps(c["matches"])) for c in report["carriers"] if os.path.lexists(c["path"])}


def _named_for(site: Path, arch: str) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, n), site)
        for d, _dirs, files in os.walk(site)
        for n in files
        if arch in n and ".rocm-audit" not in d
    )


def test_device_wheel_of_a_pruned_arch_goes_through_pip_with_its_devel_links(install, run_cli, tmp_path):
    site = install.site_packages
    before = _state(site)
    assert _named_for(site, "gfx90a"), "the fixture installs gfx90a device files"
    verdicts = run_cli("verify-arch", "gfx942", "-p", str(site), "--format", "json", expect=0).report

    dry = run_cli("prune", "gfx942", "-p", str(site), "--dry-run", "--format", "json", expect=0).report["prune"]
    [removal] = dry["removals"]
    assert (removal["kind"], removal["distribution"]) == ("device-distribution", "rocm-sdk-device-gfx90a")
    assert removal["devel_links"] and all("_rocm_sdk_devel" in p for p in removal["devel_links"])
    assert dry["shell_preview"][0] == "python -m pip uninstall -y rocm-sdk-device-gfx90a"
    weight = {(r["distribution"], r["target"]): r for r in dry["weight"]}
    assert weight[("rocm-sdk-device-gfx90a", "gfx90a")]["removable_bytes"] > 0
    assert weight[("rocm-sdk-device-gfx942", "gfx942")]["needed"] is True

    applied = run_cli("prune", "gfx942", "-p", str(site), "--backup", str(tmp_path / "bk"), "--format", "json")
    assert applied.exit_code == 0, applied.output
    assert applied.report["prune"]["removals"][0]["status"] == "removed"
    assert not list(site.glob("rocm_sdk_device_gfx90a-*.dist-info"))
    assert _named_for(site, "gfx90a") == [], "every gfx90a unit and devel link is gone"
    assert (site / "_rocm_sdk_libraries" / "__init__.py").is_file()  # listed by both wheels: put back
    after = _state(site)
    assert all(before[rel] == after[rel] for rel in after if rel in before)
    assert run_cli("verify-arch", "gfx942", "-p", str(site), "--format", "json", expect=0).report
    assert _verdicts(run_cli("verify-arch", "gfx942", "-p", str(site), "--format", "json").report) == _verdicts(
        verdicts
    )
    tested = install.run_rocm_sdk("test")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    install.pip("check")  # the `rocm` meta package asks for device wheels only through extras
    run_cli("prune", "gfx942", "-p", str(site), "--check", expect=0)

    reverted = run_cli("prune", "--revert", applied.report["prune"]["manifest"], "--format", "json", expect=0)
    assert reverted.report["prune_revert"]["reinstall"] == []
    assert list(site.glob("rocm_sdk_device_gfx90a-*.dist-info"))
    assert {k: v for k, v in _state(site).items() if k in before} == before
    shown = install.pip("show", "rocm-sdk-device-gfx90a")
    assert f"Version: {install.version}" in shown.stdout


def test_without_a_backup_revert_prints_the_exact_pip_line(install, run_cli):
    site = install.site_packages
    applied = run_cli("prune", "gfx942", "-p", str(site), "--format", "json", expect=0).report
    reverted = run_cli("prune", "--revert", applied["prune"]["manifest"], "--format", "json", expect=1).report
    assert (
        # run by the audited venv's own interpreter, which pip uninstalled the wheel with
        f"{install.python} -m pip install --force-reinstall --no-deps rocm-sdk-device-gfx90a=={install.version}"
        in (reverted["prune_revert"]["reinstall"])
    )
    assert not [f for f in reverted["findings"] if f["rule"] == "PRUNE006"]


def test_targets_from_dist_info_keep_every_installed_arch(install, run_cli):
    report = run_cli("prune", "-p", str(install.site_packages), "--dry-run", "--format", "json", expect=0).report
    assert report["prune"]["targets"] == ["gfx90a", "gfx942"] and report["prune"]["removals"] == []
    assert report["prune"]["totals"]["unused_bytes"] == 0
    assert not [f for f in report["findings"] if f["rule"] == "PRUNE001"]  # nothing to say


@pytest.mark.parametrize("dedup_first", [False, True])
def test_split_copies_and_deduplicated_trees_prune_clean(tmp_path, run_cli, dedup_first):
    """One COPY --from per tree splits TheRock's devel hardlinks into copies: prune removes the devel
    copies of the pruned device files too (same bytes, sha256-checked), with or without a dedup first."""
    install = build_therock_install(tmp_path, init=True)
    install.split("per-tree")
    site = install.site_packages
    if dedup_first:
        run_cli("dedup", "-p", str(site), expect=0)
    run_cli("prune", "gfx942", "-p", str(site), expect=0)
    assert _named_for(site, "gfx90a") == []
    assert _named_for(site, "gfx942"), "kept arch untouched"
    run_cli("prune", "gfx942", "-p", str(site), "--check", expect=0)
    if dedup_first:  # a split tree fails TheRock's mirror test until dedup restores the links
        tested = install.run_rocm_sdk("test")
        assert tested.returncode == 0, tested.stdout + tested.stderr
        run_cli("dedup", "-p", str(site), "--check", expect=0)
