"""A site-packages of per-arch units built at test time: real AMDGPU code objects (clang-19 +
ld.lld-19), a HIP fat-binary library (clang++-19), kpack archives in rocm-kpack's layout, gcc-built
MIOpen-CK-shaped plugins, and a RECORD that owns part of it."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from support.aotriton import aks2
from support.therock.artifacts import amdgpu_code_object, kpack_archive
from support.tools import require_tool

HIP_TU = """\
struct dim3 { unsigned x, y, z; };
typedef struct ihipStream_t* hipStream_t;
extern "C" int hipLaunchKernel(const void*, dim3, dim3, void**, unsigned long, hipStream_t);
extern "C" __attribute__((global)) void kfat(int* out) { *out = 3; }
"""
HIP_FLAGS = ["-x", "hip", "-nogpulib", "-nogpuinc", "-no-hip-rt", "-fPIC"]


def _run(argv: list[str], cwd: Path | None = None) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stderr}"


def _gcc_library(path: Path, symbol: str, *, needed: Path | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.parent / f".{path.name}.c"
    source.write_text(f"int {symbol}(void) {{ return 1; }}\n")
    argv = ["gcc", "-shared", "-fPIC", "-o", str(path), str(source), f"-Wl,-soname,{path.name}"]
    if needed is not None:
        argv += [f"-L{needed.parent}", "-Wl,--no-as-needed", f"-l:{needed.name}"]
    _run(argv)
    source.unlink()


def _record_row(site: Path, path: Path) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
    return f"{path.relative_to(site).as_posix()},sha256={digest},{path.stat().st_size}"


@pytest.fixture(scope="session")
def pristine_units(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prune-units")
    site = out / "site-packages"
    objects = out / "objects"
    code = {
        arch: amdgpu_code_object(objects / arch, arch, "k.hsaco", i + 1) for i, arch in enumerate(("gfx90a", "gfx942"))
    }
    code["gfx942x"] = amdgpu_code_object(objects / "gfx942x", "gfx942:xnack+", "k.hsaco", 9)

    mylib = site / "mylib"
    images = mylib / "lib/aotriton.images"
    for folder, size in (("amd-gfx90a/flash", 5000), ("amd-gfx942/flash", 4000)):
        (images / folder).mkdir(parents=True)
        (images / folder / "attn_fwd.aks2").write_bytes(os.urandom(size))
    # A family folder names no processor: what its archive holds decides (gfx1100 and gfx1151 here).
    (images / "amd-gfx11xx/flash").mkdir(parents=True)
    family = [
        (f"attn_fwd--Arch_{arch}", amdgpu_code_object(objects / arch, arch, "k.hsaco", 3).read_bytes())
        for arch in ("gfx1100", "gfx1151")
    ]
    (images / "amd-gfx11xx/flash/attn_fwd.aks2").write_bytes(aks2(family))
    library = mylib / "lib/rocblas/library"
    library.mkdir(parents=True)
    shutil.copyfile(code["gfx90a"], library / "TensileLibrary_gfx90a.co")
    shutil.copyfile(code["gfx942"], library / "TensileLibrary_gfx942.co")
    shutil.copyfile(code["gfx942"], library / "TensileLibrary_gfx1100.co")  # misnamed: gfx942 code inside
    shutil.copyfile(code["gfx90a"], library / "Kernels.so-000-gfx90a-xnack+.hsaco")
    shutil.copyfile(code["gfx942x"], library / "Kernels.so-000-gfx942-xnack+.hsaco")
    (library / "TensileLibrary_lazy_gfx90a.dat").write_bytes(b"\x81\xa4arch\xa6gfx90a")
    (library / "TensileLibrary_lazy_gfx942.dat").write_bytes(b"\x81\xa4arch\xa6gfx942")
    (library / "TensileLibrary_lazy_fallback.dat").write_bytes(b"\x81\xa8fallback\xc3")
    (mylib / "alias.dat").symlink_to("lib/rocblas/library/TensileLibrary_lazy_gfx90a.dat")
    (mylib / "kernels").mkdir()
    shutil.copyfile(code["gfx90a"], mylib / "kernels/Kernels_gfx90a.hsaco")
    (out / "fat.hip").write_text(HIP_TU)
    _run(
        [
            require_tool("clang++-19"),
            *HIP_FLAGS,
            "-shared",
            "--offload-arch=gfx90a",
            "--offload-arch=gfx942",
            "fat.hip",
            "-o",
            str(mylib / "libfat.so"),
        ],
        cwd=out,
    )
    dist_info = site / "mylib-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: mylib\nVersion: 1.0\n")
    owned = sorted(p for p in mylib.rglob("*") if p.is_file() and not p.is_symlink())
    (dist_info / "RECORD").write_text(
        "\n".join(
            [*(_record_row(site, p) for p in owned), "mylib-1.0.dist-info/METADATA,,", "mylib-1.0.dist-info/RECORD,,"]
        )
        + "\n"
    )

    libraries = site / "_rocm_sdk_libraries"
    prefix = "math-libs/BLAS/rocBLAS/stage"
    (libraries / ".kpack").mkdir(parents=True)
    for arch in ("gfx90a", "gfx942"):
        archive = kpack_archive(
            "blas_lib", arch, [(f"{prefix}/lib/librocblas.so.5.0.0", code[arch].read_bytes())], prefix
        )
        (libraries / f".kpack/blas_lib_{arch}.kpack").write_bytes(archive)
    db = libraries / "share/miopen/db"
    db.mkdir(parents=True)
    (db / "gfx90a68.kdb").write_bytes(b"SQLite format 3\x00" + os.urandom(2000))
    (db / "gfx942130.kdb").write_bytes(b"SQLite format 3\x00" + os.urandom(2000))
    lib = libraries / "lib"
    _gcc_library(lib / "libMIOpenCKConv_gfx90a.so", "ck_conv_gfx90a")
    _gcc_library(lib / "libMIOpenCKConv_gfx942.so", "ck_conv_gfx942")
    _gcc_library(lib / "libMIOpenCKNeeded_gfx90a.so", "ck_needed_gfx90a")
    _gcc_library(lib / "libuser.so", "user", needed=lib / "libMIOpenCKNeeded_gfx90a.so")
    shutil.rmtree(objects)
    return site


@pytest.fixture()
def units(pristine_units: Path, tmp_path: Path) -> Path:
    site = tmp_path / "site-packages"
    shutil.copytree(pristine_units, site, symlinks=True)
    return site
