"""Linkage facts (llvm/linkage.py) of libraries built here with the real LLVM 15 headers."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rocm_audit.llvm.linkage import read_linkage
from rocm_audit.tree.inventory import read_dynamic_info

LLVM15 = Path("/usr/lib/llvm-15")  # llvm-15-dev (tests/apt-packages.txt)

# TheRock's comgr stand-in (tests/support/therock): one real cl::opt<bool>. Built at -O0, its
# initialiser calls the option's constructor (an exported template instantiation, through its own
# PLT), which calls opt<bool>::done() in libLLVM: registration through two PLT hops. Optimised, the
# constructor is inlined and the call goes straight to the imported function.
OPTION_SOURCE = """
#include "llvm/Support/CommandLine.h"
static llvm::cl::opt<bool> Step("fixture-step", llvm::cl::desc("fixture option"), llvm::cl::init(false));
extern "C" int fixture_get(void) { return Step ? 1 : 0; }
"""


def _build(tmp_path: Path, optimisation: str) -> Path:
    source = tmp_path / "option.cpp"
    source.write_text(OPTION_SOURCE)
    output = tmp_path / f"libopt{optimisation}.so"
    subprocess.run(
        ["g++", "-shared", "-fPIC", optimisation, "-std=c++17", f"-I{LLVM15 / 'include'}", "-o", str(output)]
        + [str(source), f"-L{LLVM15 / 'lib'}", "-Wl,--no-as-needed", "-l:libLLVM-15.so"],
        check=True,
        timeout=300,
    )
    return output


@pytest.mark.toolchain  # a g++ build per optimisation level
def test_a_real_cl_opt_registers_at_load_at_every_optimisation_level(tmp_path):
    for optimisation in ("-O0", "-O2"):
        library = _build(tmp_path, optimisation)
        linkage = read_linkage(str(library), read_dynamic_info(str(library)))
        assert linkage.registers_at_load is True, (optimisation, linkage.registration_path)
        # addArgument itself, or opt<bool>::done() which calls it inside libLLVM (the compiler's choice)
        assert {n for n in linkage.registration_imports if n.endswith(("E4doneEv", "11addArgumentEv"))}
        assert not linkage.defines_registry


def test_assertions_builds_are_told_by_their_import_of_assert_fail(tmp_path):
    """An assertions build (LLVM_ENABLE_ASSERTIONS) imports glibc's __assert_fail; NDEBUG removes it.
    Debian's release libLLVM imports none (verdicts.py: its registries do not abort on a repeat)."""
    source = tmp_path / "checked.c"
    source.write_text('#include <assert.h>\nint checked(int x) { assert(x > 0 && "positive"); return x; }\n')
    for flags, expected in (((), True), (("-DNDEBUG",), False)):
        library = tmp_path / f"libchecked{len(flags)}.so"
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-O2", *flags, "-o", str(library), str(source)], check=True, timeout=120
        )
        assert read_linkage(str(library), read_dynamic_info(str(library))).assertions is expected, flags
    release = (LLVM15 / "lib" / "libLLVM-15.so.1").resolve()  # read_linkage follows no link
    assert read_linkage(str(release), read_dynamic_info(str(release))).assertions is False
