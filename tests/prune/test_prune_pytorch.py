"""PyTorch's split (`amd-torch-device-<gfx>` device wheels beside a torch wheel with AOTriton image
folders), as wheels built here and installed by pip from a local index into a fresh venv."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.therock.artifacts import amdgpu_code_object, kpack_archive
from support.therock.packaging import Package, write_wheel

pytestmark = pytest.mark.toolchain  # PyTorch-shaped wheels built and installed by pip

TORCH = "2.9.0+rocm7.13"


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_pytorch_device_wheels_and_aotriton_folders(tmp_path, run_cli):
    index = tmp_path / "index"
    index.mkdir()
    torch = Package("torch", "torch", None, tmp_path / "stage-torch")
    lib = torch.pure_dir / "lib"
    for arch in ("gfx90a", "gfx942"):
        folder = lib / "aotriton.images" / f"amd-{arch}" / "flash"
        folder.mkdir(parents=True)
        (folder / "attn_fwd.aks2").write_bytes(os.urandom(4096))
        device = Package(f"amd-torch-device-{arch}", "torch", None, tmp_path / f"stage-{arch}")
        code = amdgpu_code_object(tmp_path / "objects" / arch, arch, "k.hsaco", 1)
        kpack = device.pure_dir / "lib" / ".kpack"
        kpack.mkdir(parents=True)
        (kpack / f"torch_hip_{arch}.kpack").write_bytes(
            kpack_archive("torch_hip", arch, [("torch/lib/libtorch_hip.so#0", code.read_bytes())], "torch")
        )
        device.requires = [f"torch=={TORCH}"]
        write_wheel(device, TORCH, index)
    (torch.pure_dir / "__init__.py").write_text("")
    write_wheel(torch, TORCH, index)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    _pip(
        python,
        "install",
        "--no-index",
        "--find-links",
        str(index),
        "amd-torch-device-gfx90a",
        "amd-torch-device-gfx942",
    )
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )

    plan = run_cli("prune", "gfx942", "-p", str(site), "--dry-run", "--format", "json", expect=0).report["prune"]
    by_kind = {(r["kind"], r["distribution"] or os.path.relpath(r["path"], site)) for r in plan["removals"]}
    assert by_kind == {
        ("device-distribution", "amd-torch-device-gfx90a"),
        ("aotriton", "torch/lib/aotriton.images/amd-gfx90a"),
    }
    applied = run_cli("prune", "gfx942", "-p", str(site), "--format", "json", expect=0).report["prune"]
    installed = _pip(python, "list", "--format=freeze").stdout
    assert "amd-torch-device-gfx90a" not in installed and "amd-torch-device-gfx942" in installed
    assert not (site / "torch/lib/.kpack/torch_hip_gfx90a.kpack").exists()
    assert (site / "torch/lib/.kpack/torch_hip_gfx942.kpack").exists()
    assert not (site / "torch/lib/aotriton.images/amd-gfx90a").exists()
    assert (site / "torch/lib/aotriton.images/amd-gfx942/flash/attn_fwd.aks2").exists()
    _pip(python, "check")
    reverted = run_cli("prune", "--revert", applied["manifest"], "--format", "json", expect=1).report
    assert sorted(reverted["prune_revert"]["reinstall"]) == [
        f"{python} -m pip install --force-reinstall --no-deps amd-torch-device-gfx90a=={TORCH}",
        f"{python} -m pip install --force-reinstall --no-deps torch=={TORCH}",
    ]
