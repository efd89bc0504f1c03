"""SIGKILL at sampled mutating syscalls of `dedup` on a split TheRock install (tests/support/therock),
where a run makes hardlinks (mirrored files, device-reconciled paths) as well as symlinks and lists
its manifest in devel's RECORD: no byte is ever lost, a revert from the interrupted state gives the
split trees back, and a rerun converges to what an uninterrupted run makes."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from support.killpoints import DEDUP_SYSCALLS, count_calls, pick, rocm_audit
from support.therock import build_therock_install
from support.tools import require_tool

pytestmark = pytest.mark.killpoints  # a process killed at every mutating syscall


def trees_state(site: Path) -> dict[str, tuple]:
    """Relative path -> (kind, bytes it resolves to, mode) inside the `_rocm_sdk_*` trees."""
    out = {}
    for tree in sorted(site.glob("_rocm_sdk_*")):
        for dirpath, _dirs, files in os.walk(tree):
            for name in files:
                path = os.path.join(dirpath, name)
                kind = "link" if os.path.islink(path) else "file"
                with open(path, "rb") as handle:
                    out[os.path.relpath(path, site)] = (kind, handle.read(), os.stat(path).st_mode)
    return out


def restore(snapshot: Path, site: Path) -> None:
    shutil.rmtree(site)
    subprocess.run(["cp", "-a", str(snapshot), str(site)], check=True)  # keeps the snapshot's hardlinks


def test_sigkill_during_dedup_of_a_split_therock_install(tmp_path):
    require_tool("strace")
    install = build_therock_install(tmp_path / "install", init=True)
    install.split("per-tree")
    site = install.site_packages
    snapshot = tmp_path / "snapshot"
    subprocess.run(["cp", "-a", str(site), str(snapshot)], check=True)
    original = trees_state(site)
    points = count_calls(["dedup", "-p", str(site)], DEDUP_SYSCALLS)
    assert any(name in ("link", "linkat") for name, _ in points)  # hardlinks are made too
    expected_final = trees_state(site)
    for point in pick(points):
        restore(snapshot, site)
        killed = rocm_audit("dedup", "-p", str(site), inject=point)
        assert killed.returncode == -9, (point, killed.returncode, killed.stderr)
        now = trees_state(site)
        for rel, (_kind, content, _mode) in original.items():
            assert rel in now and now[rel][1] == content, (point, rel)
        manifest = site / ".rocm-audit" / "dedup-manifest.jsonl"
        if manifest.exists():
            done = rocm_audit("dedup", "--revert", str(manifest))
            assert done.returncode == 0, (point, done.stdout)
        assert trees_state(site) == original, point
        done = rocm_audit("dedup", "-p", str(site))
        assert done.returncode == 0, (point, done.stdout)
        assert trees_state(site) == expected_final, point
    tested = install.run_rocm_sdk("test")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert install.preload_after_devel_hip().returncode == 0
