"""Real vendor wheels pinned by sha256, downloaded once into the test cache."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

JAX_PLUGIN = "jax-rocm7-plugin==0.12.0"
JAX_WHEEL = "jax_rocm7_plugin-0.12.0-cp312-cp312-manylinux_2_27_x86_64.whl"
JAX_WHEEL_SHA256 = "56ea9cb8b20b2155307da1c7f81941d6811954d8ce3431ffe8d56aa251b725de"


def jax_plugin_wheel(cache_dir: str) -> Path:
    """jax-rocm7-plugin 0.12.0 (CCOB v3 zstd fat binaries, 27 GPU targets), checked against its pin."""
    wheel = Path(cache_dir) / JAX_WHEEL
    if not wheel.exists():
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12"]
            + ["--platform", "manylinux_2_27_x86_64", JAX_PLUGIN, "-d", cache_dir],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, f"pip download failed:\n{done.stderr}"
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert digest == JAX_WHEEL_SHA256, f"{wheel} has sha256 {digest}, expected the pinned {JAX_WHEEL_SHA256}"
    return wheel


def install_members(wheel: Path, site: Path, suffix: str = ".so") -> list[Path]:
    """Unpack the wheel's members ending in ``suffix`` into ``site`` as pip would lay them out."""
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if m.endswith(suffix)]
        archive.extractall(site, members)
    return [site / m for m in members]
