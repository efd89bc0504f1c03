"""`image` weighs device code per layer: which layer holds the bytes no kept target loads, and
what a prune in the RUN that wrote that layer would free (a later RUN frees none of it)."""

from __future__ import annotations

import os

from rocm_audit.units import size_text
from support.image.layer_writers import docker_save, layer
from support.therock.artifacts import amdgpu_code_object, kpack_archive

SP = "usr/lib/python3/dist-packages"
PREFIX = "math-libs/BLAS/rocBLAS/stage"


def test_device_code_is_weighed_per_layer(tmp_path, run_cli):
    code = {
        arch: amdgpu_code_object(tmp_path / arch, arch, "k.hsaco", i + 1) for i, arch in enumerate(("gfx90a", "gfx942"))
    }
    archives = {
        arch: kpack_archive("blas_lib", arch, [(f"{PREFIX}/lib/librocblas.so.5.0.0", path.read_bytes())], PREFIX)
        for arch, path in code.items()
    }
    images = os.urandom(6000)
    base = layer(*((f"{SP}/_rocm_sdk_libraries/.kpack/blas_lib_{arch}.kpack", data) for arch, data in archives.items()))
    torch = layer((f"{SP}/torch/lib/aotriton.images/amd-gfx90a/flash/attn.aks2", images))
    archive = docker_save(tmp_path / "save.tar", [base, torch], env=["GPU_ARCH=gfx942"])
    report = run_cli("image", "--archive", str(archive), "--skip", "llvm", "--format", "json").report
    rows = {row["layer"]: row for row in report["image"]["prune_layers"]}
    assert rows[0]["device_bytes"] == sum(len(a) for a in archives.values())
    assert rows[0]["unused_bytes"] == rows[0]["removable_bytes"] == len(archives["gfx90a"])
    assert rows[1] == {**rows[1], "device_bytes": len(images), "unused_bytes": len(images)}
    assert "files" not in report["prune"]  # the per-file weight only feeds the per-layer one
    assert any(f["rule"] == "PRUNE001" for f in report["findings"])
    text = run_cli("image", "--archive", str(archive), "--skip", "llvm").stdout
    assert f"layer 1 holds {size_text(len(images))} of device code" in " ".join(text.split())


def test_a_file_a_later_layer_hid_still_weighs_in_its_layer(tmp_path, run_cli):
    # Layer 0 writes both targets' archives; layer 1 moves gfx90a's (a copy at a new path and a
    # whiteout of the old one): layer 0 still holds its bytes, which its own row counts.
    code = {
        arch: amdgpu_code_object(tmp_path / arch, arch, "k.hsaco", i + 1) for i, arch in enumerate(("gfx90a", "gfx942"))
    }
    archives = {
        arch: kpack_archive(  # four libraries' code: over 4 KiB, the least the waste analysis hashes
            "blas_lib", arch, [(f"{PREFIX}/lib/librocblas{n}.so.5.0.0", path.read_bytes()) for n in range(4)], PREFIX
        )
        for arch, path in code.items()
    }
    kpack = f"{SP}/_rocm_sdk_libraries/.kpack"
    base = layer(*((f"{kpack}/blas_lib_{arch}.kpack", data) for arch, data in archives.items()))
    moved = layer(
        (f"{kpack}/old/blas_lib_gfx90a.kpack", archives["gfx90a"]), (f"{kpack}/.wh.blas_lib_gfx90a.kpack", b"")
    )
    archive = docker_save(tmp_path / "save.tar", [base, moved], env=["GPU_ARCH=gfx942"])
    report = run_cli("image", "--archive", str(archive), "--skip", "llvm", "--format", "json").report
    rows = {row["layer"]: row for row in report["image"]["prune_layers"]}
    assert rows[0]["device_bytes"] == sum(len(a) for a in archives.values())
    assert rows[0]["hidden_device_bytes"] == len(archives["gfx90a"])
    assert rows[1]["device_bytes"] == len(archives["gfx90a"]) and rows[1]["hidden_device_bytes"] == 0
    text = " ".join(run_cli("image", "--archive", str(archive), "--skip", "llvm").stdout.split())
    assert f"({size_text(len(archives['gfx90a']))} in files a later layer hid)" in text
