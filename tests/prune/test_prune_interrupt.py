"""Ctrl-C during an applying prune: a real SIGINT (strace, on entry to the nth unlink), never a
hook in the code. A unit is removed whole or not at all; the message's count is the count of units
gone from disk; exit 130; its undo line brings the tree back byte for byte; a rerun finishes."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rocm_audit.tree.inventory import TEMP_PREFIX
from support.killpoints import interrupted, rocm_audit
from support.prune_units import REMOVED, tree_state

UNLINKS = ("unlink", "unlinkat")  # each unit here holds one file, removed by one unlink
MESSAGE = re.compile(
    r"rocm-audit: prune interrupted: (\d+) of (\d+) changes made, each one complete;\n"
    r"the others are untouched\. To finish, run the same command again\. To undo, run:\n"
    r"  (rocm-audit prune --revert .+)\n$"
)


@pytest.mark.parametrize("nth", [1, 5])
def test_ctrl_c_between_units_says_how_many_went_and_the_undo_restores_them(pristine_units, tmp_path, nth):
    site = tmp_path / "site-packages"
    shutil.copytree(pristine_units, site, symlinks=True)
    original = tree_state(site)
    args = ["prune", "gfx942", "-p", str(site), "--backup", str(tmp_path / "backup")]
    stopped = interrupted(args, UNLINKS, nth)
    assert stopped.returncode == 130, stopped.stderr
    said = MESSAGE.search(stopped.stderr)
    assert said, stopped.stderr
    made, planned = int(said.group(1)), int(said.group(2))
    assert (made, planned) == (nth, len(REMOVED))
    gone = [rel for rel in REMOVED if not os.path.lexists(site / rel)]
    assert len(gone) == made
    now = tree_state(site)
    assert {rel: v for rel, v in original.items() if not any(rel.startswith(g) for g in gone)} == now
    assert not [n for _, _, names in os.walk(site) for n in names if n.startswith(TEMP_PREFIX)]

    words = shlex.split(said.group(3))
    assert words[:3] == ["rocm-audit", "prune", "--revert"]
    assert words[3] == str(site / ".rocm-audit" / "prune-manifest.jsonl")
    undone = subprocess.run(
        [sys.executable, "-m", "rocm_audit", *words[1:], "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert undone.returncode == 0, undone.stderr
    restored = json.loads(undone.stdout)["prune_revert"]["restored"]
    assert sorted(os.path.relpath(p, site) for p in restored) == sorted(  # the file of each unit that went
        os.path.relpath(os.path.join(folder, name), site)
        for rel in gone
        for folder, _, names in (os.walk(site / rel) if (pristine_units / rel).is_dir() else [(site, [], [rel])])
        for name in names
    )
    assert tree_state(site) == original

    again = rocm_audit("prune", "gfx942", "-p", str(site), "--backup", str(tmp_path / "backup2"))
    assert again.returncode == 0, again.stderr
    assert not any(os.path.lexists(site / rel) for rel in REMOVED)


def test_ctrl_c_before_the_first_removal_says_nothing_changed(pristine_units: Path, tmp_path):
    site = tmp_path / "site-packages"
    shutil.copytree(pristine_units, site, symlinks=True)
    original = tree_state(site)
    stopped = interrupted(["prune", "gfx942", "-p", str(site)], ("flock",), 1)
    assert stopped.returncode == 130, stopped.stderr
    assert stopped.stderr == "rocm-audit: prune interrupted before its first change: nothing was changed.\n"
    assert tree_state(site) == original


def test_ctrl_c_during_revert_says_how_many_were_restored_and_a_rerun_finishes(pristine_units: Path, tmp_path):
    site = tmp_path / "site-packages"
    shutil.copytree(pristine_units, site, symlinks=True)
    original = tree_state(site)
    pruned = rocm_audit("prune", "gfx942", "-p", str(site), "--backup", str(tmp_path / "backup"))
    assert pruned.returncode == 0, pruned.stderr
    manifest = site / ".rocm-audit" / "prune-manifest.jsonl"
    stopped = interrupted(["prune", "--revert", str(manifest)], ("rename", "renameat", "renameat2"), 3)
    assert stopped.returncode == 130, stopped.stderr
    said = re.fullmatch(
        r"rocm-audit: prune --revert interrupted: 3 of (\d+) changes made, each one complete;\n"
        r"the others are untouched\. To finish, run the same command again\.\n",
        stopped.stderr,
    )
    assert said and int(said.group(1)) == len(REMOVED), stopped.stderr
    # one file per unit, each restored by one rename (a unit's folders are made again first)
    back = [rel for rel in REMOVED if any(names for _, _, names in os.walk(site / rel)) or (site / rel).is_file()]
    assert len(back) == 3
    again = rocm_audit("prune", "--revert", str(manifest))
    assert again.returncode == 0, again.stderr
    assert tree_state(site) == original
