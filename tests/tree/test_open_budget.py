"""One fact pass: `rocm-audit check` opens no host library more than three times, in all processes.

The three: the walk's classification (magic and ELF header), the byte comparison when another file
shares its size, and the fact pass that serves every check (tree/facts.py). Counted from outside
with strace -f over the installed console script, so helper processes count too.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from support.sdk_tree import build_sdk_tree
from support.tools import require_tool

REAL_LLVM = Path("/usr/lib/llvm-15/lib/libLLVM-15.so")
_OPENAT = re.compile(r'openat\(AT_FDCWD, "([^"]+)", ([A-Z_|]+)[^)]*\) = \d+')


def _opens_per_file(argv: list[str], tree: Path, trace: Path) -> collections.Counter[str]:
    script = shutil.which("rocm-audit", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    assert script, "the rocm-audit console script is not installed"
    done = subprocess.run(
        [require_tool("strace"), "-f", "-qq", "-e", "trace=openat", "-o", str(trace), script, *argv],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stderr
    counts: collections.Counter[str] = collections.Counter()
    for line in trace.read_text().splitlines():
        match = _OPENAT.search(line)
        if match and "O_DIRECTORY" not in match.group(2) and match.group(1).startswith(str(tree)):
            counts[match.group(1)] += 1
    return counts


def test_check_opens_each_host_library_at_most_four_times(tmp_path):
    site = tmp_path / "site-packages"
    tree = build_sdk_tree(site)
    # A real LLVM (an exporter every check looks at: dynamic section, role, versions, code
    # objects) in core, and a split copy of it in devel.
    for parent in (tree.core / "lib" / "llvm" / "lib", tree.devel / "lib" / "llvm" / "lib"):
        shutil.copyfile(REAL_LLVM.resolve(), parent / "libLLVM-15.so.1")
    counts = _opens_per_file(["check", "gfx942", "-q", "-p", str(site)], site, tmp_path / "trace")
    libraries = [path for path in counts if ".so" in os.path.basename(path)]
    assert len(libraries) >= 10, counts  # the trace saw the libraries at all
    over = {path: n for path, n in counts.items() if n > 4}
    assert not over, over
    # The comparison happened (copies share a size), so the real LLVM was opened exactly four times
    # (it defines symbols the other audited libraries need).
    assert counts[str(tree.devel / "lib" / "llvm" / "lib" / "libLLVM-15.so.1")] in (3, 4), counts
