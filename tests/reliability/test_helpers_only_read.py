"""With forked helpers sharing the comparison, only the main process changes anything, and only
after its revert manifest is on disk.

The run is traced with `strace -f -y` (every process, file descriptors decorated with what they
are) over the system calls that change a tree: a helper may only write its answers into a pipe.
The helper thresholds are lowered in the traced interpreter itself (no test hook in the code), so
that even this small tree is compared by helpers, in one-chunk pieces.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys

from support.killpoints import DEDUP_SYSCALLS, state
from support.sdk_tree import build_sdk_tree
from support.tools import require_tool

FORCE_HELPERS = (
    "import os\n"
    "from rocm_audit.dedup import tuning\n"
    "tuning.PARALLEL_MIN_BYTES = 0\n"
    "tuning.PIECE_BYTES = 1\n"
    "os.sched_getaffinity = lambda pid: {0, 1, 2}\n"
    "from rocm_audit.cli.app import entry\n"
    "entry()\n"
)


def test_helpers_only_write_answers_and_the_manifest_is_synced_before_the_first_change(tmp_path):
    site = tmp_path / "site-packages"
    tree = build_sdk_tree(site)
    body = (tree.core / "lib" / "libamdhip64.so.7").read_bytes() + random.Random(5).randbytes(3 << 20)
    for owner in (tree.libraries, tree.devel):  # a pair of several pieces
        (owner / "lib" / "libpieces.so.1").write_bytes(body)
    before = state(site)
    log = tmp_path / "strace.log"
    done = subprocess.run(
        [
            require_tool("strace"),
            "-f",
            "-y",
            "-qq",
            "-o",
            str(log),
            "-e",
            "trace=" + ",".join(DEDUP_SYSCALLS),
            sys.executable,
            "-c",
            FORCE_HELPERS,
            "dedup",
            "-p",
            str(site),
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    calls = [
        (int(pid), name, args)
        for pid, name, args in re.findall(r"^(\d+)\s+(\w+)\((.*)$", log.read_text(), re.MULTILINE)
        if name in DEDUP_SYSCALLS
    ]
    main_pid = calls[0][0]  # the traced interpreter makes the first call
    helpers = {pid for pid, _, _ in calls if pid != main_pid}
    assert helpers, "no helper answered: the comparison was not shared"
    for pid, name, args in calls:
        if pid in helpers:
            assert name == "write" and args.startswith(tuple(f"{fd}<pipe:" for fd in range(1024))), (name, args)
    main_calls = [(name, args) for pid, name, args in calls if pid == main_pid]
    manifest_synced = next(
        i for i, (name, args) in enumerate(main_calls) if name == "fsync" and "dedup-manifest.jsonl" in args
    )
    first_change = next(
        i
        for i, (name, args) in enumerate(main_calls)
        if name in ("symlink", "symlinkat", "rename", "renameat", "renameat2")
    )
    assert manifest_synced < first_change
    # And the run did its job: the pair of several pieces is one library now, every byte kept.
    after = state(site)
    assert after["_rocm_sdk_devel/lib/libpieces.so.1"][0] == "link"
    assert {rel: content for rel, (_, content, _) in after.items()} == {
        rel: content for rel, (_, content, _) in before.items()
    }
