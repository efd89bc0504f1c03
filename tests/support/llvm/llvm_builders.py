"""Builders for the llvm tests: gcc-compiled libraries and hardlinked placements."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from support.run import run_checked
from support.toolchain import gcc_compile
from support.tools import require_tool


def place(source: Path, target: Path) -> Path:
    """Hardlink a store copy into a scenario tree (keeps its inode)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    os.link(source, target)
    return target


def cc_shared(output: Path, source: str, *flags: str) -> Path:
    """Compile C source into a shared library with gcc (tests/apt-packages.txt)."""
    return gcc_compile(output, source, "-shared", "-fPIC", "-O1", *flags)


def stub(directory: Path, soname: str) -> Path:
    """An empty library whose SONAME a test library links against, to get that DT_NEEDED entry."""
    return cc_shared(directory / soname, "int rocm_audit_stub;\n", f"-Wl,-soname,{soname}")


LIBLLVM15 = Path("/usr/lib/x86_64-linux-gnu/libLLVM-15.so.1")  # libllvm15
LIBLLVM16 = Path("/usr/lib/x86_64-linux-gnu/libLLVM-16.so.1")  # libllvm16
LIBCLANG_CPP15 = Path("/usr/lib/llvm-15/lib/libclang-cpp.so.15")  # libclang-cpp15


def require_file(path: Path, package: str) -> Path:
    real = Path(os.path.realpath(path))
    assert real.is_file(), f"{path} missing: install the Debian package {package} (tests/apt-packages.txt)"
    return real


def llvmlite_library() -> Path:
    spec = importlib.util.find_spec("llvmlite")
    assert spec is not None and spec.origin, "llvmlite missing: pip install -e '.[test]'"
    library = Path(spec.origin).parent / "binding" / "libllvmlite.so"
    assert library.is_file(), f"{library} missing from the llvmlite wheel"
    return library


# A miniature LLVM: the registry lives in the exported data symbol TopLevelSubCommand, reached
# through the GOT (R_X86_64_GLOB_DAT under -fPIC), and a constructor registers one option,
# aborting with LLVM's own words when the name is taken: formats.md 3.1 in 30 lines.
FAKE_LLVM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
struct registry { const char *names[16]; int count; };
struct registry _ZN4llvm2cl18TopLevelSubCommandE;
static void add(const char *name);
/* Like LLVM's: a static cl::opt's initialiser calls Option::addArgument(), which files the option
   under the TopLevelSubCommand its own GOT slot binds to. */
void _ZN4llvm2cl6Option11addArgumentEv(void) { add("fake-opt"); }
static void add(const char *name) {
    struct registry *top = &_ZN4llvm2cl18TopLevelSubCommandE;
    for (int i = 0; i < top->count; i++) {
        if (strcmp(top->names[i], name) == 0) {
            fprintf(stderr, ": CommandLine Error: Option '%s' registered more than once!\n", name);
            fprintf(stderr, "LLVM ERROR: inconsistency in registered CommandLine options\n");
            abort();
        }
    }
    top->names[top->count++] = name;
}
__attribute__((constructor)) static void register_options(void) { _ZN4llvm2cl6Option11addArgumentEv(); }
"""


def cxx_shared(output: Path, source: str, *flags: str) -> Path:
    """Compile C++ source into a shared library with g++ (gcc's C++ driver, tests/apt-packages.txt)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    source_path = output.with_name(output.name + ".cpp")
    source_path.write_text(source)
    run_checked(
        [require_tool("g++"), "-shared", "-fPIC", "-O1", "-std=c++17", "-o", output, source_path, *flags], timeout=180
    )
    source_path.unlink()
    return output
