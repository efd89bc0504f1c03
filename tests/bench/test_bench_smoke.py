"""The benchmark cannot rot: run `bench/run --smoke` (a few MB, one run, no timing assertions).

It must print its table, find the same duplicate groups as jdupes, rdfind and util-linux hardlink,
list the bundler's entries for its small CCOB library, and write its results to the given temporary
location, never to the committed bench/RESULTS.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.tools import require_tool

pytestmark = pytest.mark.toolchain  # builds the benchmark's trees and libraries

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "bench" / "run"
COMMITTED = ROOT / "bench" / "RESULTS.md"


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def test_bench_smoke(tmp_path):
    for tool in ("jdupes", "rdfind", "hardlink", "gcc", "objcopy", "clang++-19", "clang-offload-bundler-19"):
        require_tool(tool)
    committed_before = _digest(COMMITTED)
    results = tmp_path / "RESULTS.md"
    raw = tmp_path / "results.json"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(
        [
            sys.executable,
            str(RUN),
            "--smoke",
            "--no-install",
            "--work",
            str(tmp_path / "work"),
            "--results",
            str(results),
            "--json",
            str(raw),
        ],
        capture_output=True,
        text=True,
        timeout=55,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr

    # the table and one verdict line per target
    assert "| figure" in done.stdout and "dedup: cat floor" in done.stdout, done.stdout
    assert "dedup: rocm-audit dedup --check" in done.stdout and "jdupes -r" in done.stdout
    for target in (
        "dedup --check <= 1.25x cat floor",
        "dedup (apply) <= 2.2x cat floor",
        "dedup peak RSS <= 100 MB",
        "rocm-audit --help <= 0.3 s",
    ):
        assert any(target in line for line in done.stdout.splitlines() if line.startswith(("PASS", "FAIL"))), target

    data = json.loads(raw.read_text())
    groups = data["dedup"]["groups"]
    assert data["dedup"]["groups_all_equal"], data["dedup"]["group_problems"]
    assert set(groups) >= {
        "rocm-audit dedup --check",
        "jdupes -r",
        "rdfind -dryrun true",
        "hardlink -n -c",
        "rocm-audit dedup (apply)",
    }
    counts = {g["library_groups"] for g in groups.values()}
    assert len(counts) == 1 and counts.pop() == data["dedup"]["tree"]["expected_groups"] > 0
    assert data["dedup"]["tree"]["classification_ok"], data["dedup"]["tree"]["classification"]
    # where the applying runs copied the tree is on record (a scratch ext4 as root, else the work dir)
    assert data["dedup"]["apply_filesystem"].startswith(("a fresh ext4", "the work directory's filesystem"))
    # every figure was measured once, with its peak RSS
    for name, series in data["dedup"]["series"].items():
        assert len(series["walls_s"]) == 1 and series["peak_rss_mb"] > 0, name
    # bench/phases.py ran in both modes (it failed on every run once, unnoticed) and timed the run
    for mode in ("check", "apply"):
        phases = data["dedup"]["phases"][mode]
        assert "error" not in phases and phases["run_dedup"] > 0 and phases["make_plan"] > 0, (mode, phases)
    ccob = [v for k, v in data["codeobjects"].items() if k.startswith("CCOB")]
    assert ccob and ccob[0]["agreement"] is True, ccob

    # results went to the temporary location, the committed file is untouched
    text = results.read_text()
    assert "## Machine" in text and "## Targets (issue 7)" in text and "jdupes" in text
    assert _digest(COMMITTED) == committed_before
    # the big work trees are cleaned up (no --keep)
    assert not (tmp_path / "work" / "tree-smoke").exists()
