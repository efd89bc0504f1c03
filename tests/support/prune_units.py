"""What the prune tests' unit tree holds (tests/prune/conftest.py builds it) and how a test looks at a tree."""

from __future__ import annotations

import os
from pathlib import Path

# What the fixture's plan for `prune gfx942` removes, kept for safety, and never looks at (relative paths).
REMOVED = (
    "mylib/lib/aotriton.images/amd-gfx90a",
    "mylib/lib/aotriton.images/amd-gfx11xx",
    "mylib/lib/rocblas/library/TensileLibrary_gfx90a.co",
    "mylib/lib/rocblas/library/Kernels.so-000-gfx90a-xnack+.hsaco",
    "mylib/kernels/Kernels_gfx90a.hsaco",
    "_rocm_sdk_libraries/.kpack/blas_lib_gfx90a.kpack",
    "_rocm_sdk_libraries/share/miopen/db/gfx90a68.kdb",
    "_rocm_sdk_libraries/lib/libMIOpenCKConv_gfx90a.so",
)
KEPT_FOR_SAFETY = (
    "mylib/lib/rocblas/library/TensileLibrary_gfx1100.co",  # holds gfx942 code
    "_rocm_sdk_libraries/lib/libMIOpenCKNeeded_gfx90a.so",  # DT_NEEDED by libuser.so
    "mylib/lib/rocblas/library/TensileLibrary_lazy_gfx90a.dat",  # a link points to it
)


def tree_state(site: Path) -> dict[str, tuple[object, ...]]:
    """Relative path -> (kind, content or link text, mode, mtime_ns); the manifest folder left out."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirs, files in os.walk(site):
        dirs[:] = [d for d in dirs if d != ".rocm-audit"]
        for name in [*files, *(d for d in dirs if os.path.islink(os.path.join(dirpath, d)))]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if os.path.islink(path):
                out[os.path.relpath(path, site)] = ("link", os.readlink(path), 0, 0)
            else:
                with open(path, "rb") as handle:
                    out[os.path.relpath(path, site)] = ("file", handle.read(), st.st_mode, st.st_mtime_ns)
    return out


def unwrapped(text: str) -> list[str]:
    """A text report's lines, each wrapped line joined back to the one it continues."""
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("    ") and lines:
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return lines
