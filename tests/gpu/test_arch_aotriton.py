"""AOTriton archives read for real: hipengine 0.8.3 ships 12 ``.aks2`` archives under
``aotriton.images/amd-gfx11xx/`` holding 1,632 code objects for gfx1100-1103 and gfx1150-1153 only.
verify-arch, scan --targets and prune take their facts from the ELF headers inside, never from the
folder's name; a broken archive is a finding naming the file and offset, and the run goes on."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from support.vendor import HIPENGINE_AOTRITON, install_aotriton_images

pytestmark = pytest.mark.vendor  # hipengine 0.8.3's sdist, sha256-pinned (20 MB)

GFX11 = ["gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153"]
FAMILY = "aotriton.images/amd-gfx11xx"


@pytest.fixture(scope="module")
def pristine_hipengine(cache_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("hipengine") / "site-packages"
    install_aotriton_images(cache_dir, site / HIPENGINE_AOTRITON)
    return site


@pytest.fixture()
def hipengine(pristine_hipengine: Path, tmp_path: Path) -> Path:
    site = tmp_path / "site-packages"
    shutil.copytree(pristine_hipengine, site)
    return site


def _lib(site: Path) -> Path:
    return site / HIPENGINE_AOTRITON


def test_verify_arch_judges_the_processors_inside(run_cli, pristine_hipengine: Path) -> None:
    missing = run_cli("verify-arch", "gfx1170", "-p", str(pristine_hipengine), "--format", "json", expect=1)
    (carrier,) = missing.report["carriers"]
    assert carrier["kind"] == "kernel-database:aotriton" and carrier["missing"] == ["gfx1170"]
    assert [f["rule"] for f in missing.report["findings"]] == ["ARCH008"]
    native = run_cli("verify-arch", "gfx1100", "gfx1153", "-p", str(pristine_hipengine), "--format", "json", expect=0)
    (carrier,) = native.report["carriers"]
    assert carrier["missing"] == []
    assert {(m["target"], m["how"]) for m in carrier["matches"]} >= {("gfx1100", "native"), ("gfx1153", "native")}
    text = run_cli("verify-arch", "gfx1170", "-p", str(pristine_hipengine), expect=1)
    assert "no code object for gfx1170; found: gfx1100, gfx1101" in " ".join(text.stdout.split())


def test_scan_lists_every_code_object_in_the_archives(run_cli, pristine_hipengine: Path) -> None:
    archives = sorted(_lib(pristine_hipengine).rglob("*.aks2"))
    declared = sum(struct.unpack_from("<I", path.read_bytes(), 8)[0] for path in archives)
    report = run_cli("scan", "--targets", "-p", str(pristine_hipengine), "--format", "json", expect=0).report
    objects = report["code_objects"]
    assert len(objects) == declared == 1632
    assert sorted({o["target"] for o in objects}) == GFX11
    assert {o["target_source"] for o in objects} == {"e_flags"} and {o["container"] for o in objects} == {"aks2"}
    assert len(report["code_object_files"]) == 12


def test_prune_weighs_and_removes_by_the_processors_inside(run_cli, hipengine: Path) -> None:
    family = str(_lib(hipengine) / FAMILY)
    pruned = run_cli("prune", "gfx1170", "-p", str(hipengine), "--dry-run", "--format", "json", expect=0).report
    removals = {r["path"]: r for r in pruned["prune"]["removals"]}
    assert removals[family]["arches"] == GFX11
    weights = {row["target"]: row for row in pruned["prune"]["weight"]}
    assert sorted(weights) == GFX11 and not any(row["needed"] for row in weights.values())
    on_disk = sum(path.stat().st_size for path in _lib(hipengine).rglob("*.aks2"))
    assert sum(row["bytes"] for row in weights.values()) == on_disk == pruned["prune"]["totals"]["removable_bytes"]
    assert sum(row["compressed_bytes"] for row in weights.values()) == on_disk
    assert all(row["inflated_bytes"] > row["compressed_bytes"] for row in weights.values())
    kept = run_cli("prune", "gfx1151", "-p", str(hipengine), "--dry-run", "--format", "json", expect=0).report
    assert family not in {r["path"] for r in kept["prune"]["removals"]}
    assert {row["target"] for row in kept["prune"]["weight"] if row["needed"]} == {"gfx1151"}


def test_broken_archives_are_findings_and_the_run_goes_on(run_cli, hipengine: Path) -> None:
    folder = _lib(hipengine) / FAMILY / "flash" / "attn_fwd"
    real = sorted(folder.glob("*.aks2"))[0].read_bytes()
    (folder / "truncated.aks2").write_bytes(real[: len(real) // 3])
    absurd = bytearray(real)
    struct.pack_into("<I", absurd, 8, 0xFFFFFF)
    (folder / "absurd-count.aks2").write_bytes(bytes(absurd))
    report = run_cli("scan", "--targets", "-p", str(hipengine), "--format", "json", expect=1).report
    broken = {Path(f["path"]).name: f for f in report["findings"] if f["rule"] == "ARCH004"}
    assert sorted(broken) == ["absurd-count.aks2", "truncated.aks2"]
    assert broken["absurd-count.aks2"]["data"]["offset"] == 8
    assert "kernel count 16777215" in broken["absurd-count.aks2"]["message"]
    assert "truncated" in broken["truncated.aks2"]["message"]
    assert 16 < broken["truncated.aks2"]["data"]["offset"] <= len(real) // 3
    assert len(report["code_objects"]) == 1632  # the 12 good archives are all read
