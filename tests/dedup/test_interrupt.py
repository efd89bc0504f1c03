"""Ctrl-C during an applying dedup: a real SIGINT, delivered by strace on entry to a chosen system
call (tests/support/killpoints.py), never by a hook in the code.

What a person is told must be what happened: the message's count of changes made equals the links
found on disk, every path still reads its original bytes, no temporary name is left, the exit code
is 130, and the undo command it prints restores byte-identical files, counting exactly the paths of
that manifest.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rocm_audit.tree.inventory import TEMP_PREFIX
from support.killpoints import interrupted, rocm_audit, state

RENAMES = ("rename", "renameat", "renameat2")  # each link is put in place by one rename
PLANNED = 6  # the SDK fixture's devel copies and hardlink (tests/support/sdk_tree.py)
MESSAGE = re.compile(
    r"rocm-audit: dedup interrupted: (\d+) of (\d+) changes made, each one complete;\n"
    r"the others are untouched\. To finish, run the same command again\. To undo, run:\n"
    r"  (rocm-audit dedup --revert .+)\n$"
)


def _files(site: Path) -> dict[str, tuple[int, int]]:
    """Relative path -> (st_dev, st_ino) of every regular file (the manifest folder left out)."""
    out = {}
    for folder, dirs, names in os.walk(site):
        dirs[:] = [d for d in dirs if d != ".rocm-audit"]
        for name in names:
            st = os.lstat(os.path.join(folder, name))
            if not os.path.islink(os.path.join(folder, name)):
                out[os.path.relpath(os.path.join(folder, name), site)] = (st.st_dev, st.st_ino)
    return out


def _changed_on_disk(site: Path, before: dict[str, tuple[int, int]]) -> int:
    """How many of the regular files there were are now another file (a link, or another inode)."""
    now = _files(site)
    return sum(1 for rel, identity in before.items() if now.get(rel) != identity)


def _leftovers(site: Path) -> list[str]:
    return [name for _, _, names in os.walk(site) for name in names if name.startswith(TEMP_PREFIX)]


def _undo(command: str) -> subprocess.CompletedProcess[str]:
    """Run the undo line the message printed, word for word (rocm-audit through this Python)."""
    words = shlex.split(command)
    assert words[0] == "rocm-audit"
    return subprocess.run([sys.executable, "-m", "rocm_audit", *words[1:]], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("nth", [1, 4])
def test_ctrl_c_between_links_says_how_many_were_made_and_the_undo_restores_every_byte(sdk, nth):
    site = sdk.site
    original, files_before = state(site), _files(site)
    stopped = interrupted(["dedup", "-p", str(site)], RENAMES, nth)
    assert stopped.returncode == 130, stopped.stderr
    said = MESSAGE.search(stopped.stderr)
    assert said, stopped.stderr
    made, planned = int(said.group(1)), int(said.group(2))
    # The signal came as the nth link was renamed into place: that link is finished, no other begun.
    assert (made, planned) == (nth, PLANNED)
    assert _changed_on_disk(site, files_before) == made
    assert (
        sum(1 for kind, _, _ in state(site).values() if kind == "link")
        - sum(1 for kind, _, _ in original.values() if kind == "link")
        == made
    )
    assert {rel: v[1:] for rel, v in state(site).items()} == {rel: v[1:] for rel, v in original.items()}
    assert not _leftovers(site)
    assert said.group(3) == f"rocm-audit dedup --revert {site / '.rocm-audit' / 'dedup-manifest.jsonl'}"

    undone = _undo(said.group(3))
    assert undone.returncode == 0, undone.stderr
    files = "file" if made == 1 else "files"
    assert f"dedup --revert: {made} {files} restored, {PLANNED - made} already original, 0 could not" in undone.stdout
    assert state(site) == original  # every path a regular file again, byte for byte, mode for mode


def _revert(manifest: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "rocm_audit", "dedup", "--revert", str(manifest)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_rerun_finishes_and_a_revert_counts_each_path_of_the_manifest_once(sdk):
    """The manifest now holds two runs' entries (6 planned, then the 4 left): the revert speaks of
    6 files, all restored (it counted entries: '6 restored, 4 already original'), and a second
    revert finds the same 6 already original."""
    site = sdk.site
    original = state(site)
    stopped = interrupted(["dedup", "-p", str(site)], RENAMES, 2)
    assert stopped.returncode == 130 and MESSAGE.search(stopped.stderr), stopped.stderr
    finished = rocm_audit("dedup", "-p", str(site))
    assert finished.returncode == 0, finished.stderr
    links_before = sum(1 for kind, _, _ in original.values() if kind == "link")
    assert sum(1 for kind, _, _ in state(site).values() if kind == "link") == links_before + PLANNED
    manifest = site / ".rocm-audit" / "dedup-manifest.jsonl"
    entries = [line for line in manifest.read_text().splitlines() if '"path"' in line]
    assert len(entries) == PLANNED + PLANNED - 2
    assert "dedup --revert: 6 files restored, 0 already original, 0 could not be restored" in _revert(manifest)
    assert state(site) == original
    assert "dedup --revert: 0 files restored, 6 already original, 0 could not be restored" in _revert(manifest)
    assert state(site) == original


@pytest.mark.parametrize(("syscalls", "why"), [(("flock",), "locking the trees"), (("fsync",), "journalling")])
def test_ctrl_c_before_the_first_change_says_nothing_changed(sdk, syscalls, why):
    site = sdk.site
    original = state(site)
    stopped = interrupted(["dedup", "-p", str(site)], syscalls, 1)
    assert stopped.returncode == 130, (why, stopped.stderr)
    assert stopped.stderr == "rocm-audit: dedup interrupted before its first change: nothing was changed.\n", why
    assert state(site) == original and not _leftovers(site)


def test_ctrl_c_during_revert_says_how_many_were_restored_and_a_rerun_finishes(sdk):
    site = sdk.site
    original = state(site)
    assert rocm_audit("dedup", "-p", str(site)).returncode == 0
    manifest = site / ".rocm-audit" / "dedup-manifest.jsonl"
    files_before = _files(site)
    stopped = interrupted(["dedup", "--revert", str(manifest)], RENAMES, 2)
    assert stopped.returncode == 130, stopped.stderr
    assert stopped.stderr == (
        "rocm-audit: dedup --revert interrupted: 2 of 6 changes made, each one complete;\n"
        "the others are untouched. To finish, run the same command again.\n"
    )
    assert len(_files(site)) - len(files_before) == 2  # two links are regular files again
    assert {rel: v[1:] for rel, v in state(site).items()} == {rel: v[1:] for rel, v in original.items()}
    assert not _leftovers(site)
    assert "dedup --revert: 4 files restored, 2 already original, 0 could not be restored" in _revert(manifest)
    assert state(site) == original
