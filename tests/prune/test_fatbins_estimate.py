"""`check`, `prune --dry-run` and `image` say how much `prune --fatbins` would remove from fat
binaries of host libraries, per distribution and per layer: an estimate from the entry tables
(nothing inflated or recompressed), checked against `prune --fatbins --dry-run`'s exact figure
on a real HIP library built with clang++-19 for gfx942 and gfx90a."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rocm_audit.units import size_text
from support.hip_host import HIP_FLAGS, TU
from support.image.layer_writers import docker_save, layer
from support.run import run_checked
from support.tools import require_tool

SP = "usr/lib/python3/dist-packages"


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    cxx = require_tool("clang++-19")
    out = tmp_path_factory.mktemp("fatbins-estimate")
    objects = []
    for index in (1, 2):
        (out / f"k{index}.hip").write_text(TU % (f"k{index}", index))
        objects.append(f"k{index}.o")
        arches = ["--offload-arch=gfx942", "--offload-arch=gfx90a"]
        run_checked([cxx, *HIP_FLAGS, "-c", *arches, f"k{index}.hip", "-o", objects[-1]], out)
    run_checked([cxx, "-shared", *objects, "-o", "libfat.so"], out)
    return out / "libfat.so"


@pytest.fixture
def site(tmp_path, library) -> Path:
    root = tmp_path / "site-packages"
    (root / "hippkg").mkdir(parents=True)
    info = root / "hippkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hippkg\nVersion: 1.0\n")
    (info / "RECORD").write_text("hippkg/libfat.so,,\nhippkg-1.0.dist-info/RECORD,,\n")
    shutil.copy2(library, root / "hippkg" / "libfat.so")
    return root


def test_check_and_prune_report_what_fatbins_would_remove(run_cli, site, tmp_path):
    report = run_cli("check", "-p", str(site), "--skip", "llvm", "gfx942", "--format", "json").report
    prune = report["prune"]
    estimate = prune["totals"]["fatbins_estimate_bytes"]
    assert prune["fatbins_estimate"] == [{"distribution": "hippkg", "bytes": estimate}] and estimate > 0
    finding = next(f for f in report["findings"] if f["rule"] == "PRUNE001")
    assert (
        f"`rocm-audit prune --fatbins` can remove about {size_text(estimate)} from fat binaries" in finding["message"]
    )
    assert "0 B" not in finding["message"] and "no whole file or distribution of it can go" in finding["message"]
    assert finding["data"]["fatbins_estimate_bytes"] == estimate
    # the exact figure: a plain bundle frees each removed entry and its alignment padding, so the
    # estimate (the entries alone) is a lower bound here, and close
    exact = run_cli("prune", "gfx942", "--fatbins", "--dry-run", "-p", str(site), "--format", "json").report
    freed = exact["prune_fatbins"]["bytes"]
    assert exact["prune"]["totals"]["fatbins_estimate_bytes"] == estimate
    assert estimate <= freed <= 2 * estimate
    text = run_cli("check", "-p", str(site), "--skip", "llvm", "gfx942").stdout
    assert f"prune --fatbins: about {size_text(estimate)} removable from fat binaries of host libraries " in text
    assert f"(hippkg {size_text(estimate)})" in text
    dry = run_cli("prune", "gfx942", "--dry-run", "-p", str(site)).stdout
    assert f"prune --fatbins: about {size_text(estimate)} removable" in dry
    # a distribution kept whole by a rules file is not counted
    rules = tmp_path / "rules.toml"
    rules.write_text('[policy.prune]\nkeep_dist = ["hippkg"]\n')
    kept = run_cli("check", "-p", str(site), "--skip", "llvm", "--rules", str(rules), "gfx942", "--format", "json")
    assert (
        kept.report["prune"]["fatbins_estimate"] == [] and kept.report["prune"]["totals"]["fatbins_estimate_bytes"] == 0
    )
    # for gfx90a and gfx942 both, nothing is for another GPU
    both = run_cli("check", "-p", str(site), "--skip", "llvm", "gfx942", "gfx90a", "--format", "json").report
    assert both["prune"]["totals"]["fatbins_estimate_bytes"] == 0


def test_image_reports_the_estimate_per_layer(run_cli, library, tmp_path):
    data = library.read_bytes()
    base = layer((f"{SP}/other/readme.txt", b"nothing here\n"))
    hip = layer((f"{SP}/hippkg/libfat.so", data))
    archive = docker_save(tmp_path / "save.tar", [base, hip], env=["GPU_ARCH=gfx942"])
    report = run_cli("image", "--archive", str(archive), "--skip", "llvm", "--format", "json").report
    rows = {row["layer"]: row for row in report["image"]["prune_layers"]}
    estimate = report["prune"]["totals"]["fatbins_estimate_bytes"]
    assert estimate > 0 and rows[1]["fatbins_estimate_bytes"] == estimate and 0 not in rows
    assert rows[1]["unused_bytes"] >= estimate and rows[1]["removable_bytes"] == 0
    text = " ".join(run_cli("image", "--archive", str(archive), "--skip", "llvm").stdout.split())
    said = f"in the RUN that wrote it, prune removes 0 B and prune --fatbins about {size_text(estimate)}"
    assert said in text
