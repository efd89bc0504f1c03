"""Crash safety of `prune --backup` and `prune --revert`: a real SIGKILL at mutating system calls.

strace's fault injection (tests/support/killpoints.py) kills the process on entry to the n-th call.
After each kill every original path either holds its original bytes, or is journalled in the
manifest with a backup holding exactly those bytes (sha256); `--revert` from that state gives back
the original tree, and a rerun finishes the job. ROCM_AUDIT_SLOW=1 runs every kill point.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from support.killpoints import PRUNE_SYSCALLS, KillPoint, count_calls, pick, rocm_audit
from support.prune_units import REMOVED, tree_state

pytestmark = pytest.mark.killpoints  # a process killed at sampled syscalls


def _kill_points(args: list[str]) -> list[KillPoint]:
    return pick(count_calls(args, PRUNE_SYSCALLS))


def _journalled_backups(site: Path) -> dict[str, bytes]:
    """Relative path -> the bytes its backup holds, for every journalled file whose backup is whole."""
    manifest = site / ".rocm-audit" / "prune-manifest.jsonl"
    found: dict[str, bytes] = {}
    if not manifest.exists():
        return found
    for line in manifest.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # the partial last line of a killed append
        backup = entry.get("backup")
        if backup and os.path.isfile(backup):
            data = Path(backup).read_bytes()
            if hashlib.sha256(data).hexdigest() == entry["sha256"]:
                found[os.path.relpath(entry["path"], site)] = data
    return found


def _assert_nothing_lost(site: Path, original: dict[str, tuple], point: tuple[str, int]) -> None:
    now = tree_state(site)
    backed_up = _journalled_backups(site)
    for rel, (kind, content, _mode, _mtime) in original.items():
        if rel in now and now[rel][:2] == (kind, content):
            continue
        if kind == "link":
            assert any(rel.startswith(r) for r in REMOVED), (point, rel)  # journalled with its text
            continue
        assert rel not in now, (point, rel, "a path holds other bytes")
        assert backed_up.get(rel) == content, (point, rel, "neither original nor journalled and backed up")


def test_sigkill_during_prune_loses_nothing_and_revert_recovers(pristine_units, tmp_path):
    probe = tmp_path / "probe"
    shutil.copytree(pristine_units, probe / "site-packages", symlinks=True)
    args = ["prune", "gfx942", "-p", str(probe / "site-packages"), "--backup", str(probe / "backup")]
    points = _kill_points(args)
    assert len(points) >= 8
    original = tree_state(pristine_units)
    for index, point in enumerate(points):
        work = tmp_path / f"run{index}"
        site = work / "site-packages"
        shutil.copytree(pristine_units, site, symlinks=True)
        killed = rocm_audit("prune", "gfx942", "-p", str(site), "--backup", str(work / "backup"), inject=point)
        assert killed.returncode != 0, point
        _assert_nothing_lost(site, original, point)
        manifest = site / ".rocm-audit" / "prune-manifest.jsonl"
        if manifest.exists():
            reverted = rocm_audit("prune", "--revert", str(manifest))
            assert reverted.returncode == 0, (point, reverted.stdout, reverted.stderr)
        assert tree_state(site) == original, point
        rerun = rocm_audit("prune", "gfx942", "-p", str(site), "--backup", str(work / "backup2"))
        assert rerun.returncode == 0, (point, rerun.stdout, rerun.stderr)
        assert not any(os.path.lexists(site / rel) for rel in REMOVED), point


def test_sigkill_during_revert_loses_nothing_and_a_rerun_finishes(pristine_units, tmp_path):
    original = tree_state(pristine_units)

    def pruned(work: Path) -> Path:
        site = work / "site-packages"
        shutil.copytree(pristine_units, site, symlinks=True)
        done = rocm_audit("prune", "gfx942", "-p", str(site), "--backup", str(work / "backup"))
        assert done.returncode == 0, done.stdout + done.stderr
        return site / ".rocm-audit" / "prune-manifest.jsonl"

    points = _kill_points(["prune", "--revert", str(pruned(tmp_path / "probe"))])
    for index, point in enumerate(points):
        manifest = pruned(tmp_path / f"run{index}")
        site = manifest.parent.parent
        killed = rocm_audit("prune", "--revert", str(manifest), inject=point)
        assert killed.returncode != 0, point
        _assert_nothing_lost(site, original, point)
        again = rocm_audit("prune", "--revert", str(manifest))
        assert again.returncode == 0, (point, again.stdout, again.stderr)
        assert tree_state(site) == original, point
