"""Real vendor wheels pinned by sha256, downloaded once into the test cache."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

JAX_PLUGIN = "jax-rocm7-plugin==0.12.0"
JAX_WHEEL = "jax_rocm7_plugin-0.12.0-cp312-cp312-manylinux_2_27_x86_64.whl"
JAX_WHEEL_SHA256 = "56ea9cb8b20b2155307da1c7f81941d6811954d8ce3431ffe8d56aa251b725de"

# bitsandbytes ships one library per ROCm release in one py3-none wheel: CCOB v2 + zstd (ROCm 6.4 and
# 7.0 builds) beside CCOB v3 + zstd (7.1 and later), two compressed bundles (TUs) each, and Intel
# SYCL libraries whose section is named __CLANG_OFFLOAD_BUNDLE__ (no AMD code in them).
BNB = "bitsandbytes==0.50.2"
BNB_WHEEL = "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl"
BNB_WHEEL_SHA256 = "55348a9a4a21bfd99cf8c7b32fe67b4030ae5c2a05738e03c1747f65fa6ec283"


# amd-aiter keeps hand-written assembly kernels as raw code objects in per-arch folders
# (aiter_meta/hsa/gfx942/..., hsa/gfx950/...), opened by the device's arch at run time.
AITER = "amd-aiter==0.1.7.post2.dev18"
AITER_WHEEL = "amd_aiter-0.1.7.post2.dev18-py3-none-any.whl"
AITER_WHEEL_SHA256 = "fe139d74438217c35e87e3b961166bac8db2d381eadccb371da2e63615f05a31"


# triton 3.6.0 compiles kernels for the HIP backend without a GPU (given ld.lld): the real Triton
# kernel cache entries (<name>.hsaco, <name>.json with its target, __grp__<name>.json) are made
# with it. The same file the LLVM carrier tests pin (tests/support/llvm/carriers.py), in the same place.
TRITON = "triton==3.6.0"
TRITON_WHEEL = "triton-3.6.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"
TRITON_WHEEL_SHA256 = "e8e323d608e3a9bfcc2d9efcc90ceefb764a82b99dea12a86d643c72539ad5d3"


# cupy-rocm-4-0 9.0.0 (ROCm 4.0, 2021): uncompressed bundles with the 3-field "hip-amdgcn-amd-amdhsa-gfxN" ids
# of that clang and code object V3 (one e_flags bit per feature: set on, clear off), for gfx801 to gfx1012.
CUPY_ROCM40 = "cupy-rocm-4-0==9.0.0"
CUPY_ROCM40_WHEEL = "cupy_rocm_4_0-9.0.0-cp38-cp38-manylinux1_x86_64.whl"
CUPY_ROCM40_WHEEL_SHA256 = "d1f4894c39e2c4ff51a0b3e15f8de6b7ba874e5d6b8ab5b1b2fa1ec4fa7bcf25"


def _pinned_wheel(cache_dir: str, spec: str, name: str, sha256: str, options: list[str]) -> Path:
    wheel = Path(cache_dir) / name
    if not wheel.exists():
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *options, spec]
            + ["-d", cache_dir],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, f"pip download failed:\n{done.stderr}"
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert digest == sha256, f"{wheel} has sha256 {digest}, expected the pinned {sha256}"
    return wheel


def pinned_wheel(cache_dir: str, spec: str, name: str, sha256: str, options: list[str]) -> Path:
    """The wheel ``name`` of ``spec`` in the test cache, downloaded when missing, checked by sha256."""
    return _pinned_wheel(cache_dir, spec, name, sha256, options)


def jax_plugin_wheel(cache_dir: str) -> Path:
    """jax-rocm7-plugin 0.12.0 (CCOB v3 zstd fat binaries, 27 GPU targets), checked against its pin."""
    options = ["--python-version", "3.12", "--platform", "manylinux_2_27_x86_64"]
    return _pinned_wheel(cache_dir, JAX_PLUGIN, JAX_WHEEL, JAX_WHEEL_SHA256, options)


def bitsandbytes_wheel(cache_dir: str) -> Path:
    """bitsandbytes 0.50.2 (CCOB v2 and v3 zstd libraries, SYCL bundles), checked against its pin."""
    return _pinned_wheel(cache_dir, BNB, BNB_WHEEL, BNB_WHEEL_SHA256, ["--platform", "manylinux_2_24_x86_64"])


def install_members(wheel: Path, site: Path, suffix: str = ".so") -> list[Path]:
    """Unpack the wheel's members ending in ``suffix`` into ``site`` as pip would lay them out."""
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if m.endswith(suffix)]
        archive.extractall(site, members)
    return [site / m for m in members]


def aiter_wheel(cache_dir: str) -> Path:
    """amd-aiter 0.1.7.post2.dev18 (2,501 raw code objects under hsa/<arch>/), checked against its pin."""
    return _pinned_wheel(cache_dir, AITER, AITER_WHEEL, AITER_WHEEL_SHA256, [])


def triton_wheel(cache_dir: str) -> Path:
    """triton 3.6.0 for CPython 3.11, checked against its pin."""
    options = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"]
    options += ["--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64"]
    shared = Path(cache_dir) / "llvm-carriers"
    shared.mkdir(parents=True, exist_ok=True)
    return _pinned_wheel(str(shared), TRITON, TRITON_WHEEL, TRITON_WHEEL_SHA256, options)


# triton 3.9.0 for CPython 3.12 (abi3, 285 MB): libtriton.so needs PyType_FromMetaclass, new in
# 3.12, from the process that loads it, so a probe under 3.11 cannot load it (issue "First contact").
TRITON39 = "triton==3.9.0"
TRITON39_WHEEL = "triton-3.9.0-cp312-abi3-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"
TRITON39_WHEEL_SHA256 = "5e52ab4e2f1d64f0ac494c9aa723697b793f81a91c4cae4c36608ca0bc4267bf"


def triton39_wheel(cache_dir: str) -> Path:
    """triton 3.9.0 for CPython 3.12, checked against its pin."""
    options = ["--python-version", "3.12", "--implementation", "cp", "--abi", "abi3"]
    options += ["--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64"]
    return _pinned_wheel(cache_dir, TRITON39, TRITON39_WHEEL, TRITON39_WHEEL_SHA256, options)


# pytorch-triton-rocm 2.1.0 ships a ROCm 5.6-era comgr (libamd_comgr.so + its libtinfo.so): the real
# code-object lookup the HIP runtime calls, used as an oracle (tests/gpu/test_arch_comgr.py, slow).
TRITON_ROCM = "pytorch-triton-rocm==2.1.0"
TRITON_ROCM_WHEEL = "pytorch_triton_rocm-2.1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
TRITON_ROCM_SHA256 = "ec63623c16eebe356d40460a09374a2546591dd2b0cb2122622111fc4d0f7f25"


def triton_rocm_wheel(cache_dir: str) -> Path:
    """pytorch-triton-rocm 2.1.0 for CPython 3.11 (169 MB), checked against its pin."""
    return _pinned_wheel(cache_dir, TRITON_ROCM, TRITON_ROCM_WHEEL, TRITON_ROCM_SHA256, [])


def cupy_rocm40_wheel(cache_dir: str) -> Path:
    """cupy-rocm-4-0 9.0.0 for CPython 3.8 (code object V3, 3-field bundle ids), checked against its pin."""
    options = ["--python-version", "3.8", "--platform", "manylinux1_x86_64"]
    return _pinned_wheel(cache_dir, CUPY_ROCM40, CUPY_ROCM40_WHEEL, CUPY_ROCM40_WHEEL_SHA256, options)


# hipengine 0.8.3 (an sdist only) vendors AOTriton 0.11.2b: libaotriton_v2.so and 12 .aks2 archives
# under aotriton.images/amd-gfx11xx/ holding 1,632 code objects for gfx1100-1103 and gfx1150-1153.
HIPENGINE = "hipengine==0.8.3"
HIPENGINE_SDIST = "hipengine-0.8.3.tar.gz"
HIPENGINE_SDIST_SHA256 = "887445080883119a3334f9b2ee73646f61d0551630a8e54f50e01fd887177363"
HIPENGINE_AOTRITON = "hipengine/kernels/hip_gfx1100/attention/aotriton_runtime/0.11.2b/lib/"


def hipengine_sdist(cache_dir: str) -> Path:
    """hipengine 0.8.3's source distribution (20 MB), checked against its pin."""
    sdist = Path(cache_dir) / HIPENGINE_SDIST
    if not sdist.exists():
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:", HIPENGINE, "-d", cache_dir],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, f"pip download failed:\n{done.stderr}"
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    assert digest == HIPENGINE_SDIST_SHA256, (
        f"{sdist} has sha256 {digest}, expected the pinned {HIPENGINE_SDIST_SHA256}"
    )
    return sdist


def install_aotriton_images(cache_dir: str, lib: Path) -> list[Path]:
    """hipengine's AOTriton ``aotriton.images/`` tree (its .aks2 archives) unpacked under ``lib``,
    as the wheel built from the sdist lays it out beside libaotriton_v2.so; the archives' paths."""
    sdist = hipengine_sdist(cache_dir)
    prefix = f"hipengine-0.8.3/{HIPENGINE_AOTRITON}"
    written = []
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            if not (member.isfile() and member.name.startswith(prefix + "aotriton.images/")):
                continue
            rel = member.name[len(prefix) :]
            if ".." in rel.split("/"):
                continue
            target = lib / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            source = archive.extractfile(member)
            assert source is not None
            target.write_bytes(source.read())
            written.append(target)
    return sorted(written)


# (pip spec, wheel file, sha256): the application's wheels, for CPython 3.12 on x86-64 Linux.
APP_WHEELS = [
    (
        "jax-rocm7-plugin==0.12.0",
        "jax_rocm7_plugin-0.12.0-cp312-cp312-manylinux_2_27_x86_64.whl",
        "56ea9cb8b20b2155307da1c7f81941d6811954d8ce3431ffe8d56aa251b725de",
    ),
    (
        "jax-rocm7-pjrt==0.12.0",
        "jax_rocm7_pjrt-0.12.0-py3-none-manylinux_2_27_x86_64.whl",
        "4551d0714523355f2946ca1958c3f584e95661e467a641d36b726f718a1c7934",
    ),
    (
        "cupy-rocm-7-0==14.2.0",
        "cupy_rocm_7_0-14.2.0-cp312-cp312-manylinux2014_x86_64.whl",
        "4912fcd48491adc332ebc7ed6f1d7487545ee2b9cf6fcc906b7827dbe182fe7f",
    ),
    (
        "onnxruntime-rocm==1.22.2.post3",
        "onnxruntime_rocm-1.22.2.post3-cp312-cp312-manylinux_2_34_x86_64.whl",
        "ccd3b2dba26fe73687f3a29d10fcc154c73b23d5b9ecc938b8c045471743fe52",
    ),
    (
        "triton==3.9.0",
        "triton-3.9.0-cp312-abi3-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        "5e52ab4e2f1d64f0ac494c9aa723697b793f81a91c4cae4c36608ca0bc4267bf",
    ),
    (
        "bitsandbytes==0.50.2",
        "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl",
        "55348a9a4a21bfd99cf8c7b32fe67b4030ae5c2a05738e03c1747f65fa6ec283",
    ),
    (
        "flydsl==0.5.0",
        "flydsl-0.5.0-cp312-cp312-manylinux_2_27_x86_64.whl",
        "32725cab43e62929e61c034389fb44e97f036cd989bd0c105c69cdcb14d211b1",
    ),
]
PIP_TARGET_312 = [
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    "--abi",
    "cp312",
    "--abi",
    "abi3",
    "--abi",
    "none",
]
PIP_TARGET_312 += [
    f"--platform={tag}"
    for tag in ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64")
    + ("manylinux2014_x86_64", "manylinux_2_17_x86_64")
]
