"""Real device code made at test time with Debian's clang-19 and ld.lld-19."""

from __future__ import annotations

import subprocess
from pathlib import Path

from support.tools import require_tool


def gfx942_code_object(directory: Path, name: str = "kernels.hsaco") -> Path:
    """A real, linked AMDGPU code object (ET_DYN) for gfx942 only."""
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / f".{name}.c"
    source.write_text("void k(int *p) { *p = 1; }\n")
    relocatable = directory / f".{name}.o"
    subprocess.run(
        [
            require_tool("clang-19"),
            "-target",
            "amdgcn-amd-amdhsa",
            "-mcpu=gfx942",
            "-nogpulib",
            "-c",
            "-o",
            str(relocatable),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    output = directory / name
    subprocess.run(
        [require_tool("ld.lld-19"), "-shared", "-o", str(output), str(relocatable)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    source.unlink()
    relocatable.unlink()
    return output
