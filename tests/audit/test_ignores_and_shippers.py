"""Findings people can act on: who ships the file, ignores by rule glob, path and distribution, and
a baseline that survives another root.

The site is made by pip itself: a small project holding a real gcc library (one DT_NEEDED that
nothing provides: POST002) is installed with ``pip install --target``, so its RECORD (hashes) and
METADATA (Project-URL) are pip's own. A second library beside it is the user's (no RECORD names it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.sdk_tree import build_library

pytestmark = pytest.mark.toolchain  # a project built by gcc and installed by pip

PROJECT_TOML = """
[build-system]
requires = ["setuptools>=70.1"]
build-backend = "setuptools.build_meta"

[project]
name = "Vendor_Pkg"
version = "1.4.2"

[project.urls]
Homepage = "https://example.org/vendor-pkg"
Issues = "https://example.org/vendor-pkg/issues"

[tool.setuptools]
packages = ["vendorpkg"]

[tool.setuptools.package-data]
vendorpkg = ["*.so"]
"""


def _add_missing_needed(library: Path, name: str) -> None:
    subprocess.run(["patchelf", "--add-needed", name, str(library)], check=True, timeout=60)


@pytest.fixture(scope="module")
def pip_site(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("shippers")
    project = work / "project"
    (project / "vendorpkg").mkdir(parents=True)
    (project / "pyproject.toml").write_text(PROJECT_TOML)
    (project / "vendorpkg" / "__init__.py").write_text("")
    vendor = build_library(project / "vendorpkg", "vendor", "libvendor.so")
    _add_missing_needed(vendor, "libgone_vendor.so.1")
    (project / "vendorpkg" / "libcut.so").write_bytes(vendor.read_bytes()[:40])  # SCAN002: the header ends early
    site = work / "site-packages"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site)] + [str(project)],
        check=True,
        timeout=300,
    )
    assert (site / "vendorpkg" / "libvendor.so").is_file()
    mine = build_library(site / "mine", "mine", "libmine.so")
    _add_missing_needed(mine, "libgone_mine.so.1")
    return site


def _post002(report: dict) -> dict[str, dict]:
    return {Path(f["path"]).name: f for f in report["findings"] if f["rule"] == "POST002"}


def test_a_finding_names_the_distribution_that_ships_its_file(run_cli, pip_site):
    report = run_cli("check", "-p", str(pip_site), "--skip", "llvm", "--format", "json").report
    found = _post002(report)
    assert found["libvendor.so"]["shipped_by"] == {
        "name": "Vendor_Pkg",
        "version": "1.4.2",
        "report_to": "https://example.org/vendor-pkg/issues",  # the issue tracker before the home page
    }
    assert "shipped_by" not in found["libmine.so"]  # the user's own file: no RECORD lists it
    text = " ".join(run_cli("check", "-p", str(pip_site), "--skip", "llvm").stdout.split())
    # A malformed library is the shipper's to fix: the text says where to report it. A library no
    # search path finds is most often one the user did not install: who ships it, not where to report.
    cut = "libcut.so: " + next(f["message"] for f in report["findings"] if f["rule"] == "SCAN002")
    assert f"{cut} [shipped by Vendor_Pkg 1.4.2 (report to https://example.org/vendor-pkg/issues)]" in text
    assert "libvendor.so: needs libgone_vendor.so.1, which no search path finds [shipped by Vendor_Pkg 1.4.2]" in text


def test_an_image_names_the_shippers_its_own_records_list(run_cli, pip_site, tmp_path):
    """The same site-packages as image layers: `image` names the same distribution, read from
    the image's RECORDs while its merged view exists (its paths are not this machine's), for the
    checks' findings and for the image's own (copies of a file in two layers)."""
    from support.image.layer_writers import docker_save_of_directories

    # Twice, as two SDK trees in two layers (copies the waste reports), the vendor's library padded
    # past the size the waste lists (its RECORD still lists it).
    site = tmp_path / "site"
    shutil.copytree(pip_site, site, symlinks=True)
    with (site / "vendorpkg" / "libvendor.so").open("ab") as library:
        library.write(os.urandom(100_000))
    sdk = "usr/lib/python3/site-packages/_rocm_sdk_"
    archive = docker_save_of_directories(tmp_path / "save.tar", [[(site, sdk + "core")], [(site, sdk + "devel")]])
    assert not Path("/" + sdk + "core").exists()  # nothing on this machine to find them by
    report = run_cli("image", "--archive", str(archive), "--skip", "llvm", "--format", "json").report
    post002 = [f for f in report["findings"] if f["rule"] == "POST002"]
    vendor = [f for f in post002 if f["path"].endswith("/vendorpkg/libvendor.so")]
    assert {f["path"] for f in vendor} == {f"/{sdk}{tree}/vendorpkg/libvendor.so" for tree in ("core", "devel")}
    assert all(f["shipped_by"]["name"] == "Vendor_Pkg" for f in vendor), vendor
    assert all(f["shipped_by"]["report_to"] == "https://example.org/vendor-pkg/issues" for f in vendor)
    assert all("shipped_by" not in f for f in post002 if f["path"].endswith("/libmine.so"))
    waste = [f for f in report["findings"] if f["rule"] == "IMG008" and f["path"].endswith("libvendor.so")]
    assert waste and all(f["shipped_by"]["name"] == "Vendor_Pkg" for f in waste), waste


def test_ignores_take_rule_globs_relative_paths_and_distributions(run_cli, pip_site, tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text(
        '[[ignore]]\nrule = "POST00*"\ndistribution = "vendor-pkg"\nreason = "the vendor knows"\n\n'
        '[[ignore]]\nrule = "post002"\npath = "mine/*"\nreason = "built here on purpose"\n'
    )
    result = run_cli("check", "-p", str(pip_site), "--skip", "llvm", "--rules", str(rules), "--format", "json")
    assert not _post002(result.report)
    sources = {s["path"].rsplit("/", 1)[1]: s["source"] for s in result.report["suppressed"]}
    assert sources["libvendor.so"].endswith("rules.toml:2") and sources["libmine.so"].endswith("rules.toml:7")
    assert result.report["summary"]["suppressed"]["total"] == 2
    text = run_cli("check", "-p", str(pip_site), "--skip", "llvm", "--rules", str(rules)).stdout
    assert f"2 findings suppressed: 2 by {rules}" in text
    # A distribution glob that names another distribution suppresses nothing of this one.
    rules.write_text('[[ignore]]\ndistribution = "other-*"\nreason = "not this one"\n')
    kept = run_cli("check", "-p", str(pip_site), "--skip", "llvm", "--rules", str(rules), "--format", "json")
    assert set(_post002(kept.report)) == {"libvendor.so", "libmine.so"}


@pytest.mark.parametrize(
    ("ignore", "said"),
    [
        ('rule = "NOPE*"', "no rule matches"),
        ('reason = "x"', "must name a rule, a path or a distribution"),
        ('distribution = ""', "distribution must be a non-empty name or glob"),
    ],
)
def test_a_bad_ignore_is_a_usage_error_naming_the_file(run_cli, pip_site, tmp_path, ignore, said):
    rules = tmp_path / "rules.toml"
    rules.write_text(f"[[ignore]]\n{ignore}\n" + ("" if "reason" in ignore else 'reason = "r"\n'))
    result = run_cli("check", "-p", str(pip_site), "--rules", str(rules), expect=2)
    assert said in result.output and str(rules) in result.output


def test_a_baseline_made_in_one_root_holds_in_another(run_cli, pip_site, tmp_path):
    baseline = tmp_path / "baseline.json"
    first = run_cli(
        "check", "-p", str(pip_site), "--skip", "llvm", "--write-baseline", str(baseline), "--format", "json"
    )
    keys = {f["fingerprint"] for f in first.report["findings"]}
    assert keys == {e["fingerprint"] for e in json.loads(baseline.read_text())["findings"]}
    moved = tmp_path / "elsewhere" / "site-packages"
    shutil.copytree(pip_site, moved, symlinks=True)
    again = run_cli("check", "-p", str(moved), "--skip", "llvm", "--baseline", str(baseline), "--format", "json")
    assert again.exit_code == 0 and again.report["findings"] == []
    assert again.report["summary"]["suppressed"]["baseline"] == len(keys)
    # A new problem in the moved tree fails the run; the old ones stay suppressed.
    _add_missing_needed(moved / "vendorpkg" / "libvendor.so", "libgone_new.so.1")
    new = run_cli("check", "-p", str(moved), "--skip", "llvm", "--baseline", str(baseline), "--format", "json")
    assert [Path(f["path"]).name for f in new.report["findings"]] == ["libvendor.so"]
    # SARIF says the same with baselineState: the new finding "new", the baseline's "unchanged".
    sarif = json.loads(
        run_cli("check", "-p", str(moved), "--skip", "llvm", "--baseline", str(baseline), "--format", "sarif").stdout
    )
    states = {(r["ruleId"], r["baselineState"]) for r in sarif["runs"][0]["results"]}
    assert ("POST002", "new") in states and ("POST002", "unchanged") in states
    assert all(
        len(r["partialFingerprints"]["rocmAuditFingerprint/v1"]) == 16
        for r in sarif["runs"][0]["results"]
        if r["baselineState"] == "new"
    )
    # A baseline that is not one is a usage error.
    bogus = tmp_path / "bogus.json"
    bogus.write_text("{}")
    assert "not a baseline" in run_cli("check", "-p", str(moved), "--baseline", str(bogus), expect=2).output
    bogus.write_text("[" * 100_000)  # nested past Python's recursion limit
    assert "nested too deeply" in run_cli("check", "-p", str(moved), "--baseline", str(bogus), expect=2).output
