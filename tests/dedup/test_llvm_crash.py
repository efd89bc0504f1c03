"""The real crash of TheRock issue 7818, reproduced with Debian's LLVM 15 libraries, and its fix.

Two byte-identical copies of an LLVM library under _rocm_sdk_core and _rocm_sdk_devel have two
inodes, so glibc maps both and LLVM aborts with `Option '...' registered more than once!`
(formats.md 1.5, 3.2). After `rocm-audit dedup` the devel path is a symlink to the core copy and
the same loads succeed. Each load runs in a child process, never in the test process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rocm_audit.dedup.run import run_dedup

LIBLLVM15 = Path("/usr/lib/x86_64-linux-gnu/libLLVM-15.so.1")  # Debian package libllvm15
LIBCLANG_CPP15 = Path("/usr/lib/llvm-15/lib/libclang-cpp.so.15")  # Debian package libclang-cpp15

LOAD_TWO = """
import ctypes, os, sys
modes = {"global": os.RTLD_GLOBAL, "local": os.RTLD_LOCAL}
ctypes.CDLL(sys.argv[1], mode=modes[sys.argv[3]])
ctypes.CDLL(sys.argv[2], mode=modes[sys.argv[4]])
print("both loaded")
"""


def load_pair(first: Path, second: Path, first_mode: str, second_mode: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONNOUSERSITE": "1"}
    return subprocess.run(
        [sys.executable, "-c", LOAD_TWO, str(first), str(second), first_mode, second_mode],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.fixture(scope="module")
def llvm_site(tmp_path_factory):
    for library in (LIBLLVM15, LIBCLANG_CPP15):
        assert library.is_file(), f"{library} missing: scripts/test installs libllvm15 and libclang-cpp15"
    return tmp_path_factory.mktemp("llvm15")


def make_copies(site: Path, library: Path, subdir: str) -> tuple[Path, Path]:
    core = site / "_rocm_sdk_core" / subdir / library.name
    devel = site / "_rocm_sdk_devel" / subdir / library.name
    for target in (core, devel):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(library, target)  # two inodes, same bytes: a split hardlink
    return core, devel


def test_two_copies_of_libllvm_abort_until_dedup_links_them(llvm_site):
    site = llvm_site / "libllvm"
    core, devel = make_copies(site, LIBLLVM15, "lib/llvm/lib")
    assert os.stat(core).st_ino != os.stat(devel).st_ino

    crashed = load_pair(core, devel, "global", "global")
    assert crashed.returncode == -6, crashed
    assert "registered more than once!" in crashed.stderr
    assert "inconsistency in registered CommandLine options" in crashed.stderr

    outcome = run_dedup([str(site)], mode="apply")
    assert outcome.sections["dedup"]["replaced"] == 1 and outcome.sections["dedup"]["verified"] is True
    assert not [f for f in outcome.findings if f.severity.value == "error"]
    assert os.readlink(devel) == "../../../../_rocm_sdk_core/lib/llvm/lib/libLLVM-15.so.1"

    fixed = load_pair(core, devel, "global", "global")
    assert fixed.returncode == 0, fixed
    assert fixed.stdout.strip() == "both loaded"


def test_two_copies_of_a_registrant_abort_in_local_mode_until_dedup_links_them(llvm_site):
    """libclang-cpp imports addArgument() from the one libLLVM: both copies register into it."""
    site = llvm_site / "libclang"
    core, devel = make_copies(site, LIBCLANG_CPP15, "lib/llvm/lib")

    crashed = load_pair(core, devel, "local", "local")
    assert crashed.returncode == -6, crashed
    assert "registered more than once!" in crashed.stderr

    run_dedup([str(site)], mode="apply")
    assert os.path.islink(devel) and os.stat(devel).st_ino == os.stat(core).st_ino

    fixed = load_pair(core, devel, "local", "local")
    assert fixed.returncode == 0, fixed
