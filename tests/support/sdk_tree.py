"""Build TheRock-shaped SDK trees of real ELF files (gcc, ld) for the dedup tests."""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

from support.run import run_checked

LIB_SOURCE = """
int {name}_value(void) {{ return {value}; }}
"""
EXE_SOURCE = """
#include <stdio.h>
int main(void) { puts("tool"); return 0; }
"""


def build_library(
    directory: Path,
    name: str,
    soname: str,
    *,
    value: int = 1,
    needed: tuple[str, ...] = (),
    rpath: str | None = None,
    runpath: str | None = None,
    payload: bytes | None = None,
    link_dir: Path | None = None,
) -> Path:
    """A real gcc shared library; ``payload`` is added as a non-alloc section (objcopy)."""
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / f".{soname}.c"
    source.write_text(LIB_SOURCE.format(name=name.replace("-", "_").replace(".", "_"), value=value))
    output = directory / soname
    argv = ["gcc", "-shared", "-fPIC", "-O1", "-o", str(output), str(source), f"-Wl,-soname,{soname}"]
    if needed:
        argv += [f"-L{link_dir or directory}", "-Wl,--no-as-needed"] + [f"-l:{n}" for n in needed]
    if rpath:
        argv.append(f"-Wl,--disable-new-dtags,-rpath,{rpath}")
    if runpath:
        argv.append(f"-Wl,--enable-new-dtags,-rpath,{runpath}")
    run_checked(argv, timeout=120)
    source.unlink()
    if payload is not None:
        blob = directory / f".{soname}.payload"
        blob.write_bytes(payload)
        run_checked(["objcopy", "--add-section", f".rocm_test_payload={blob}", output], timeout=120)
        blob.unlink()
    return output


def build_executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.parent / ".tool.c"
    source.write_text(EXE_SOURCE)
    run_checked(["gcc", "-O1", "-o", path, source], timeout=120)
    source.unlink()
    return path


@dataclass
class SdkTree:
    site: Path
    core: Path
    libraries: Path
    devel: Path

    def p(self, rel: str) -> Path:
        return self.site / rel


def build_sdk_tree(site: Path) -> SdkTree:
    """A site-packages dir with _rocm_sdk_core, _rocm_sdk_libraries_gfx94X_dcgpu and _rocm_sdk_devel.

    Duplicates: devel copies of core and libraries libraries (distinct inodes, as after a split
    hardlink), one hardlinked pair, an identical executable pair, an identical data pair, a same-size
    pair differing in the middle, and one differing only in the last block.
    """
    rng = random.Random(7818)
    core = site / "_rocm_sdk_core"
    libraries = site / "_rocm_sdk_libraries_gfx94X_dcgpu"
    devel = site / "_rocm_sdk_devel"
    core_lib = core / "lib"
    build_library(core_lib, "sysdep", "librocm_sysdeps_z.so.1", value=3, payload=rng.randbytes(20_000))
    build_library(
        core_lib,
        "comgr",
        "libamd_comgr.so.3",
        value=7,
        needed=("librocm_sysdeps_z.so.1",),
        rpath="$ORIGIN",
        payload=rng.randbytes(150_000),
    )
    build_library(core_lib, "hip", "libamdhip64.so.7", value=8, needed=("libamd_comgr.so.3",), rpath="$ORIGIN")
    build_library(core_lib / "llvm" / "lib", "llvm", "libLLVMdemo.so.1", value=9, payload=rng.randbytes(300_000))
    build_library(core_lib, "hard", "libhard.so.1", value=11)
    libs_lib = libraries / "lib"
    build_library(
        libs_lib,
        "rocblas",
        "librocblas.so.5",
        value=12,
        needed=("libamdhip64.so.7",),
        rpath="$ORIGIN/../../_rocm_sdk_core/lib",
        payload=rng.randbytes(90_000),
        link_dir=core_lib,
    )
    # Same size, different bytes in the middle; and same size differing only in the last block.
    middle = rng.randbytes(40_000)
    build_library(libs_lib, "pair", "libpair_a.so.1", value=1, payload=middle)
    changed = bytearray(middle)
    changed[20_000] ^= 0xFF
    build_library(libs_lib, "pair", "libpair_b.so.1", value=1, payload=bytes(changed))
    build_executable(core / "bin" / "amd-tool")
    (core / "share" / "therock").mkdir(parents=True)
    (core / "share" / "therock" / "dist_info.json").write_text('{"dist_amdgpu_targets": "gfx942;gfx950"}\n')

    devel_lib = devel / "lib"
    devel_lib.mkdir(parents=True)
    for name in ("librocm_sysdeps_z.so.1", "libamd_comgr.so.3", "libamdhip64.so.7"):
        shutil.copy2(core_lib / name, devel_lib / name)
    (devel_lib / "llvm" / "lib").mkdir(parents=True)
    shutil.copy2(core_lib / "llvm" / "lib" / "libLLVMdemo.so.1", devel_lib / "llvm" / "lib" / "libLLVMdemo.so.1")
    shutil.copy2(libs_lib / "librocblas.so.5", devel_lib / "librocblas.so.5")
    os.link(core_lib / "libhard.so.1", devel_lib / "libhard.so.1")
    # The devel copy of libpair_b is the same size as core's but differs in the last block only.
    pair_b = (libs_lib / "libpair_b.so.1").read_bytes()
    tail_changed = bytearray(pair_b)
    tail_changed[-3] ^= 0x01
    (devel_lib / "libpair_b.so.1").write_bytes(bytes(tail_changed))
    # Symlink chain, as the devel tarball holds SONAME aliases: libamdhip64.so -> .so.7.
    os.symlink("libamdhip64.so.7", devel_lib / "libamdhip64.so")
    os.symlink("libamdhip64.so", devel_lib / "libamdhip64.so.dev")
    build_executable(devel / "bin" / "amd-tool")
    shutil.copy2(core / "bin" / "amd-tool", devel / "bin" / "amd-tool")
    (devel / "share" / "therock").mkdir(parents=True)
    shutil.copy2(core / "share" / "therock" / "dist_info.json", devel / "share" / "therock" / "dist_info.json")
    # Something outside the SDK trees that is byte-identical too: never touched by dedup.
    (site / "torch" / "lib").mkdir(parents=True)
    shutil.copy2(core_lib / "libamdhip64.so.7", site / "torch" / "lib" / "libamdhip64.so.7")
    return SdkTree(site, core, libraries, devel)


def snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    """Every path under root: (type, link text or content bytes, mode) — to prove nothing changed."""
    state: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if os.path.islink(path):
                state[path] = ("link", os.readlink(path), st.st_ino)
            elif os.path.isfile(path):
                with open(path, "rb") as handle:
                    state[path] = ("file", handle.read(), st.st_mode, st.st_ino, st.st_mtime_ns)
            else:
                state[path] = ("dir", st.st_mode)
    return state


def resolved_bytes(root: Path) -> dict[str, bytes]:
    """What every file path resolves to, by content (rocm-audit's own manifest directory excluded)."""
    out = {}
    for dirpath, dirs, filenames in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".rocm-audit"]
        for name in filenames:
            path = os.path.join(dirpath, name)
            if os.path.isfile(path):
                with open(path, "rb") as handle:
                    out[path] = handle.read()
    return out
