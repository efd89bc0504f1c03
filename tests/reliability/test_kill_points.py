"""Crash safety of `dedup` and `dedup --revert`: SIGKILL at every mutating system call.

strace's fault injection (tests/support/killpoints.py) delivers a real SIGKILL when the process
enters the n-th call of a chosen system call, so no test hook lives in the code.
After each kill: every original path exists, resolves, and holds its original bytes; `--revert`
from that state restores the original tree; a rerun finishes the job and leaves no temporary file.

The default run samples kill points evenly; ROCM_AUDIT_SLOW=1 runs every kill point (>= 200).
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from rocm_audit.tree.inventory import TEMP_PREFIX
from support.killpoints import DEDUP_SYSCALLS, FULL, count_calls, pick, rocm_audit, state
from support.sdk_tree import build_sdk_tree

pytestmark = pytest.mark.killpoints  # a process killed at every mutating syscall

EXTRA_DUPLICATES = 40 if FULL else 6


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """The dedup fixture tree plus extra devel duplicates, so a full sweep has >= 200 kill points."""
    site = tmp_path_factory.mktemp("kill") / "site-packages"
    tree = build_sdk_tree(site)
    base = (tree.core / "lib" / "libamdhip64.so.7").read_bytes()
    rng = random.Random(1)
    for index in range(EXTRA_DUPLICATES):
        name = f"libextra{index}.so.1"
        # Trailing bytes keep a valid shared library and make each pair's content unique.
        body = base + rng.randbytes(4096 + index * 512)
        (tree.libraries / "lib" / name).write_bytes(body)
        (tree.devel / "lib" / name).write_bytes(body)
    return site


def fresh_copy(pristine: Path, destination: Path) -> Path:
    site = destination / "site-packages"
    shutil.copytree(pristine, site, symlinks=True)
    hard = site / "_rocm_sdk_devel" / "lib" / "libhard.so.1"
    hard.unlink()
    os.link(site / "_rocm_sdk_core" / "lib" / "libhard.so.1", hard)
    return site


def assert_original_bytes(site: Path, original: dict[str, tuple], point: tuple[str, int]) -> None:
    """Every original path resolves to its original bytes; the only extra names are our temporaries."""
    now = state(site)
    for rel, (_kind, content, _mode) in original.items():
        assert rel in now and now[rel][1] == content, (point, rel)
    extra = [rel for rel in now if rel not in original]
    assert all(os.path.basename(rel).startswith(TEMP_PREFIX) for rel in extra), (point, extra)


def no_temporaries(site: Path) -> bool:
    return not [p for p in site.rglob("*") if p.name.startswith(TEMP_PREFIX)]


def test_sigkill_during_dedup_never_loses_a_byte_and_revert_or_rerun_recovers(pristine, tmp_path):
    original = state(pristine)
    probe_site = fresh_copy(pristine, tmp_path / "probe")
    points = count_calls(["dedup", "-p", str(probe_site)], DEDUP_SYSCALLS)
    assert sum(1 for name, _ in points if name in ("rename", "renameat", "renameat2")) >= 6
    expected_final = state(probe_site)
    if FULL:
        assert len(points) >= 100, len(points)
    for index, point in enumerate(pick(points)):
        site = fresh_copy(pristine, tmp_path / f"kill{index}")
        killed = rocm_audit("dedup", "-p", str(site), inject=point)
        assert killed.returncode == -9, (point, killed.returncode, killed.stderr)
        assert_original_bytes(site, original, point)
        # Revert from the interrupted state gives back the original tree, file types included.
        manifest = site / ".rocm-audit" / "dedup-manifest.jsonl"
        if manifest.exists():
            done = rocm_audit("dedup", "--revert", str(manifest))
            assert done.returncode == 0, (point, done.stdout)
        assert state(site) == original, point
        # A rerun from there finishes the job with nothing left behind.
        done = rocm_audit("dedup", "-p", str(site))
        assert done.returncode == 0, (point, done.stdout)
        assert state(site) == expected_final, point
        assert no_temporaries(site), point


def test_sigkill_during_revert_never_loses_a_byte_and_a_rerun_finishes(pristine, tmp_path):
    original = state(pristine)
    probe_site = fresh_copy(pristine, tmp_path / "probe")
    assert rocm_audit("dedup", "-p", str(probe_site)).returncode == 0
    deduplicated = state(probe_site)
    manifest_rel = Path(".rocm-audit") / "dedup-manifest.jsonl"
    points = count_calls(["dedup", "--revert", str(probe_site / manifest_rel)], DEDUP_SYSCALLS)
    if FULL:
        assert len(points) >= 100, len(points)
    for index, point in enumerate(pick(points)):
        site = fresh_copy(pristine, tmp_path / f"kill{index}")
        assert rocm_audit("dedup", "-p", str(site)).returncode == 0
        assert state(site) == deduplicated
        killed = rocm_audit("dedup", "--revert", str(site / manifest_rel), inject=point)
        assert killed.returncode == -9, (point, killed.returncode, killed.stderr)
        assert_original_bytes(site, original, point)
        done = rocm_audit("dedup", "--revert", str(site / manifest_rel))
        assert done.returncode == 0, (point, done.stdout)
        assert state(site) == original, point
        assert no_temporaries(site), point
