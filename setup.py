"""The one compiled part: the zstd frame index (src/rocm_audit/formats/_zstdindex.c).

Optional: where no C compiler or Python headers are at hand the install goes on without it, and
rocm-audit reads compressed offload bundles by streaming them (same verdicts, more memory:
docs/dependencies.md). Everything else is in pyproject.toml.
"""

import os

from setuptools import Extension, setup

# ROCM_AUDIT_PURE_WHEEL=1: a wheel without the C part (py3-none-any), which installs on any
# Python >= 3.10 and platform: what the README's Dockerfile stage installs, whatever the Python
# of the machine that built the wheel.
PURE = os.environ.get("ROCM_AUDIT_PURE_WHEEL") == "1"

setup(
    ext_modules=[]
    if PURE
    else [
        Extension(
            "rocm_audit.formats._zstdindex",
            ["src/rocm_audit/formats/_zstdindex.c"],
            depends=["src/rocm_audit/formats/_zstdindex_core.h"],
            # The compiler's own C standard, not -std=c99: CPython 3.11+ is C11 (PEP 7).
            extra_compile_args=["-O2", "-fno-strict-aliasing"],
            optional=True,
        )
    ]
)
