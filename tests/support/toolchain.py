"""Real ELF files made at test time: host code with gcc, device code with Debian's clang-19 and ld.lld-19."""

from __future__ import annotations

import textwrap
from pathlib import Path

from support.run import run_checked
from support.tools import require_tool


def gcc_compile(output: Path, source: str, *flags: str) -> Path:
    """Compile C source (dedented) to output with gcc and the given flags; the source file is removed."""
    output.parent.mkdir(parents=True, exist_ok=True)
    source_path = output.with_name(output.name + ".c")
    source_path.write_text(textwrap.dedent(source))
    run_checked([require_tool("gcc"), "-o", output, source_path, *flags], timeout=120)
    source_path.unlink()
    return output


def gfx942_object(output: Path) -> Path:
    """A relocatable AMDGPU object (ET_REL) for gfx942 only, one kernel; the source file is removed."""
    output.parent.mkdir(parents=True, exist_ok=True)
    source = output.with_name(f".{output.name}.c")
    source.write_text("void k(int *p) { *p = 1; }\n")
    run_checked(
        [require_tool("clang-19"), "-target", "amdgcn-amd-amdhsa", "-mcpu=gfx942", "-nogpulib", "-c"]
        + ["-o", str(output), str(source)],
        timeout=120,
    )
    source.unlink()
    return output


def gfx942_code_object(directory: Path, name: str = "kernels.hsaco") -> Path:
    """A real, linked AMDGPU code object (ET_DYN) for gfx942 only."""
    relocatable = gfx942_object(directory / f".{name}.o")
    output = directory / name
    run_checked([require_tool("ld.lld-19"), "-shared", "-o", output, relocatable], timeout=120)
    relocatable.unlink()
    return output
