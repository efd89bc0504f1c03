"""Linkage facts (llvm/linkage.py) of libraries built here with the real LLVM 15 headers."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rocm_audit.llvm.linkage import (
    ADD_ARGUMENT,
    MACHINE_SCHED_REGISTRY,
    WATCHED_PREFIXES,
    read_linkage,
    registry_name,
)
from rocm_audit.tree.inventory import read_dynamic_info
from support.llvm.llvm_builders import LIBLLVM15, LIBLLVM16, require_file

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


def test_a_whole_llvm_keeps_its_objects_and_registries_by_name_and_its_functions_as_a_digest():
    """Issue 36 (memory): a libLLVM's 20 000 exported functions are never looked up by name by a
    verdict, so Linkage keeps them only as a count and a digest; the objects two copies can share
    and the registries' entry points stay by name. Read again, the digest is the same; another LLVM
    version has another one."""
    release = require_file(LIBLLVM15, "libllvm15").resolve()
    linkage = read_linkage(str(release), read_dynamic_info(str(release)))
    exported = subprocess.run(
        ["nm", "-D", "--defined-only", "--without-symbol-versions", str(release)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split("\n")
    # nm: a type letter T (code), D/B/R/V/u (data, weak object, unique), then the name.
    kinds = {line.split()[-1]: line.split()[-2] for line in exported if len(line.split()) >= 2}
    watched = {
        name: kind for name, kind in kinds.items() if name.startswith(tuple(p.decode() for p in WATCHED_PREFIXES))
    }
    functions = {name for name, kind in watched.items() if kind in "TtWwi"}
    assert len(functions) > 10_000  # the test is about a table of that size
    assert linkage.export_count == len(watched)
    assert set(linkage.exports) == {n for n in watched if n not in functions or registry_name(n)}
    assert ADD_ARGUMENT in linkage.exports and MACHINE_SCHED_REGISTRY in linkage.exports
    assert len(linkage.exports) < len(watched) // 4  # the structure a run keeps per library stays small
    assert all(name in linkage.exports or name in functions for name in linkage.binds)

    again = read_linkage(str(release), read_dynamic_info(str(release)))
    assert again.same_exports(linkage) and again.exports_digest == linkage.exports_digest
    other = require_file(LIBLLVM16, "libllvm16").resolve()
    assert not read_linkage(str(other), read_dynamic_info(str(other))).same_exports(linkage)
