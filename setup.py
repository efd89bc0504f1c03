"""The one compiled part: the zstd frame index (src/rocm_audit/formats/_zstdindex.c).

Optional: where no C compiler or Python headers are at hand the install goes on without it, and
rocm-audit reads compressed offload bundles by streaming them (same verdicts, more memory:
README, "Dependencies"). Everything else is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "rocm_audit.formats._zstdindex",
            ["src/rocm_audit/formats/_zstdindex.c"],
            depends=["src/rocm_audit/formats/_zstdindex_core.h"],
            extra_compile_args=["-O2", "-std=c99", "-fno-strict-aliasing"],
            optional=True,
        )
    ]
)
