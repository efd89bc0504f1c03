"""Fixtures of the `rocm-audit llvm` tests: real LLVM libraries, copied once per session.

Debian's libllvm15, libclang-cpp15 and libllvm16 (tests/apt-packages.txt) and PyPI llvmlite (the
`test` extra) are required: a missing one is a broken set-up, so the fixtures fail, never skip.
Copies are made once into a session store; scenario trees hardlink those copies in, so a tree's
two "copies" are two inodes exactly when the test says so.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import cli
from support.llvm.llvm_builders import (
    FAKE_LLVM,
    LIBCLANG_CPP15,
    LIBLLVM15,
    LIBLLVM16,
    cc_shared,
    llvmlite_library,
    place,
    require_file,
    stub,
)


@pytest.fixture(scope="session")
def llvm_cli(report_validator):
    """Run `rocm-audit llvm ...` in-process; JSON output is parsed and schema-validated."""

    def invoke(*args: str, expect: int | None = None):
        return cli.invoke_cli(report_validator, ["llvm", *args], expect)

    return invoke


@pytest.fixture(scope="session")
def store(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("llvm-store")


def _copy_once(store: Path, source: Path, name: str) -> Path:
    target = store / name / source.name
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return target


@pytest.fixture(scope="session")
def llvm15_copies(store) -> tuple[Path, Path]:
    """Two inodes holding the bytes of Debian's libLLVM-15.so.1."""
    source = require_file(LIBLLVM15, "libllvm15")
    return _copy_once(store, source, "llvm15-a"), _copy_once(store, source, "llvm15-b")


@pytest.fixture(scope="session")
def llvm16_copy(store) -> Path:
    return _copy_once(store, require_file(LIBLLVM16, "libllvm16"), "llvm16")


@pytest.fixture(scope="session")
def clang_cpp_copies(store) -> tuple[Path, Path]:
    source = require_file(LIBCLANG_CPP15, "libclang-cpp15")
    return _copy_once(store, source, "clang-a"), _copy_once(store, source, "clang-b")


@pytest.fixture(scope="session")
def llvmlite_copies(store) -> tuple[Path, Path]:
    source = llvmlite_library()
    return _copy_once(store, source, "llvmlite-a"), _copy_once(store, source, "llvmlite-b")


@dataclass(frozen=True)
class Scenario:
    root: Path
    paths: dict[str, Path]


@pytest.fixture(scope="session")
def dup_llvm15(tmp_path_factory, llvm15_copies) -> Scenario:
    """TheRock 7818 shape: core and devel hold libLLVM-15 as two inodes with the same bytes."""
    root = tmp_path_factory.mktemp("dup-llvm15")
    core = place(llvm15_copies[0], root / "_rocm_sdk_core" / "lib" / "libLLVM-15.so.1")
    devel = place(llvm15_copies[1], root / "_rocm_sdk_devel" / "lib" / "libLLVM-15.so.1")
    return Scenario(root, {"core": core, "devel": devel})


@pytest.fixture(scope="session")
def dup_clang_cpp(tmp_path_factory, clang_cpp_copies) -> Scenario:
    """Two inodes of the registrant libclang-cpp.so.15; both bind to the system libLLVM-15."""
    root = tmp_path_factory.mktemp("dup-clang")
    a = place(clang_cpp_copies[0], root / "a" / "lib" / "libclang-cpp.so.15")
    b = place(clang_cpp_copies[1], root / "b" / "lib" / "libclang-cpp.so.15")
    return Scenario(root, {"a": a, "b": b})


@pytest.fixture(scope="session")
def llvm15_and_16(tmp_path_factory, llvm15_copies, llvm16_copy) -> Scenario:
    root = tmp_path_factory.mktemp("llvm15-16")
    v15 = place(llvm15_copies[0], root / "lib" / "libLLVM-15.so.1")
    v16 = place(llvm16_copy, root / "lib" / "libLLVM-16.so.1")
    return Scenario(root, {"v15": v15, "v16": v16})


@pytest.fixture(scope="session")
def llvmlite_twice(tmp_path_factory, llvmlite_copies) -> Scenario:
    root = tmp_path_factory.mktemp("llvmlite")
    a = place(llvmlite_copies[0], root / "env-a" / "llvmlite" / "binding" / "libllvmlite.so")
    b = place(llvmlite_copies[1], root / "env-b" / "llvmlite" / "binding" / "libllvmlite.so")
    return Scenario(root, {"a": a, "b": b})


@pytest.fixture(scope="session")
def same_inode(tmp_path_factory, llvm15_copies) -> Scenario:
    """One libLLVM-15 inode at three paths: the file, a hardlink and a symlink."""
    root = tmp_path_factory.mktemp("same-inode")
    core = place(llvm15_copies[0], root / "_rocm_sdk_core" / "lib" / "libLLVM-15.so.1")
    hardlink = place(core, root / "_rocm_sdk_devel" / "lib" / "libLLVM-15.so.1")
    symlink = root / "_rocm_sdk_libraries" / "lib" / "libLLVM-15.so.1"
    symlink.parent.mkdir(parents=True)
    symlink.symlink_to(os.path.relpath(core, symlink.parent))
    return Scenario(root, {"core": core, "hardlink": hardlink, "symlink": symlink})


@pytest.fixture(scope="session")
def runpath_closures(tmp_path_factory, llvm15_copies, llvm16_copy) -> Scenario:
    """Libraries whose DT_RUNPATH pulls two LLVMs into one closure.

    app/libtwo.so needs libLLVM-15.so.1 and libLLVM-16.so.1; app/libcopies.so needs
    libLLVM-15.so.1 and libLLVM-15-bis.so.1, a second libLLVM-15 inode under another file name
    (glibc matches the request by name, not by the SONAME inside the file).
    """
    root = tmp_path_factory.mktemp("runpath")
    lib = root / "lib"
    v15 = place(llvm15_copies[0], lib / "libLLVM-15.so.1")
    bis = place(llvm15_copies[1], lib / "libLLVM-15-bis.so.1")
    v16 = place(llvm16_copy, lib / "libLLVM-16.so.1")
    stubs = root / "stubs"
    needs = {name: stub(stubs, name) for name in ("libLLVM-15.so.1", "libLLVM-15-bis.so.1", "libLLVM-16.so.1")}
    runpath = ["-Wl,--enable-new-dtags,-rpath,$ORIGIN/../lib", "-Wl,--no-as-needed"]
    source = "int app_entry(void) { return 1; }\n"
    two = cc_shared(
        root / "app" / "libtwo.so",
        source,
        *runpath,
        str(needs["libLLVM-15.so.1"]),
        str(needs["libLLVM-16.so.1"]),
    )
    copies = cc_shared(
        root / "app" / "libcopies.so",
        source,
        *runpath,
        str(needs["libLLVM-15.so.1"]),
        str(needs["libLLVM-15-bis.so.1"]),
    )
    shutil.rmtree(stubs)
    return Scenario(root, {"two": two, "copies": copies, "v15": v15, "bis": bis, "v16": v16})


@pytest.fixture(scope="session")
def fake_llvms(tmp_path_factory) -> Scenario:
    """Different miniature LLVMs: unversioned, same version node, distinct nodes, -Bsymbolic."""
    root = tmp_path_factory.mktemp("fake-llvm")
    scripts = root / "scripts"
    scripts.mkdir()
    for node in ("FAKE_1", "FAKE_2"):
        (scripts / f"{node}.map").write_text(f"{node} {{ global: *; }};\n")
    built = {}
    for name, flags in {
        "plain-a": (),
        "plain-b": (),
        "node1-a": (f"-Wl,--version-script={scripts / 'FAKE_1.map'}",),
        "node1-b": (f"-Wl,--version-script={scripts / 'FAKE_1.map'}",),
        "node2": (f"-Wl,--version-script={scripts / 'FAKE_2.map'}",),
        "symbolic": ("-Wl,-Bsymbolic",),
    }.items():
        soname = f"libfakellvm-{name}.so"
        built[name] = cc_shared(root / name / soname, FAKE_LLVM, f"-Wl,-soname,{soname}", *flags)
    shutil.rmtree(scripts)
    return Scenario(root, built)


@pytest.fixture(scope="session")
def fake_comgr_split(tmp_path_factory) -> Scenario:
    """TheRock 7818 with a miniature LLVM in comgr: core and devel copies, two inodes."""
    root = tmp_path_factory.mktemp("fake-comgr")
    core = cc_shared(
        root / "_rocm_sdk_core" / "lib" / "libamd_comgr.so.3",
        FAKE_LLVM,
        "-Wl,-soname,libamd_comgr.so.3",
    )
    devel = root / "_rocm_sdk_devel" / "lib" / "libamd_comgr.so.3"
    devel.parent.mkdir(parents=True)
    shutil.copyfile(core, devel)
    return Scenario(root, {"core": core, "devel": devel})
