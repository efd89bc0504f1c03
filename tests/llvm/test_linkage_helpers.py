"""LLVM linkage read by forked helpers as well as the main process (llvm/libfacts.py
``read_linkages``): the same report as one process reading them all, no file opened more often,
and the helpers really ran. Real LLVM libraries of Debian's packages (libLLVM-15, libclang-cpp 15),
linked into the audited tree.

Counted from outside with ``strace -f`` over the CLI; the helper threshold and the CPU count are
set in the traced interpreter itself (no test hook in the code), so the single-process run and
the forced-helpers run differ only in that.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.tools import require_tool

LIBRARIES = (  # an exporter of LLVM's option registry and a registrant into it
    "/usr/lib/x86_64-linux-gnu/libLLVM-15.so.1",
    "/usr/lib/llvm-15/lib/libclang-cpp.so.15",
)
RUN = (
    "import os, sys\n"
    "from rocm_audit.llvm import libfacts\n"
    "libfacts.PARALLEL_LINKAGE_BYTES = int(sys.argv.pop(1))\n"
    "os.sched_getaffinity = lambda pid: {0, 1, 2}\n"
    "from rocm_audit.cli.app import entry\n"
    "sys.argv[0] = 'rocm-audit'\n"
    "entry()\n"
)
_OPENAT = re.compile(r'openat\(AT_FDCWD, "([^"]+)", ([A-Z_|]+)[^)]*\) = \d+')
_FORK = re.compile(r"\b(clone3?|fork|vfork)\(.*\) = [1-9]\d*$")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("linkage") / "site-packages"
    for index, library in enumerate(LIBRARIES):
        assert os.path.isfile(library), f"{library} missing: scripts/test installs it (tests/apt-packages.txt)"
        lib = site / f"pkg{index}" / "lib"
        lib.mkdir(parents=True)
        target = lib / os.path.basename(library)
        try:
            os.link(os.path.realpath(library), target)  # no copy of 500 MB where one file system holds both
        except OSError:
            shutil.copyfile(library, target)
    return site


def _traced(tmp_path: Path, threshold: int, argv: list[str], name: str) -> tuple[dict, collections.Counter, int]:
    """(the JSON report, opens per audited file, helper processes forked) of one traced run."""
    trace, report = tmp_path / f"{name}.trace", tmp_path / f"{name}.json"
    done = subprocess.run(
        [require_tool("strace"), "-f", "-qq", "-e", "trace=openat,clone,clone3,fork,vfork", "-o", str(trace)]
        + [sys.executable, "-c", RUN, str(threshold), *argv, "-q", "--format", "json", "-o", str(report)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    opens: collections.Counter[str] = collections.Counter()
    forks = 0
    for line in trace.read_text().splitlines():
        match = _OPENAT.search(line)
        if match and "O_DIRECTORY" not in match.group(2) and ".so" in match.group(1):
            opens[match.group(1)] += 1
        forks += bool(_FORK.search(line))
    document = json.loads(report.read_text())
    for section in document.values():  # durations: the one thing two runs may differ in
        if isinstance(section, dict):
            section.pop("elapsed_s", None)
    return document, opens, forks


@pytest.mark.parametrize("command", ["check", "llvm"])
def test_helpers_read_the_same_linkage_through_the_same_opens(site, tmp_path, command):
    argv = [command, "-p", str(site)] + (["gfx942"] if command == "check" else [])
    alone, alone_opens, alone_forks = _traced(tmp_path, 1 << 62, argv, "alone")
    shared, shared_opens, shared_forks = _traced(tmp_path, 0, argv, "shared")
    assert shared == alone  # every finding and section, byte for byte as JSON
    assert shared_forks >= 1 + alone_forks, "no helper was forked"
    audited = {path: count for path, count in alone_opens.items() if path.startswith(str(site))}
    assert len(audited) == len(LIBRARIES), alone_opens
    assert {path: shared_opens[path] for path in audited} == audited
    if command == "check":
        # the walk's classification, the fact pass (whose descriptor the linkage read shares, in a
        # helper too) and POST006's symbol definitions; no sizes are shared, so no byte comparison
        assert set(audited.values()) == {3}, audited
