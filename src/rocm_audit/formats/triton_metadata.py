"""Triton's compiled-kernel metadata: the ``<name>.json`` written beside ``<name>.hsaco``.

Triton 3.x writes it into its kernel cache (``~/.triton/cache/<hash>/``) and AOT flows ship it with
the code object (amd-aiter's ``ops/triton/configs/gemm/aot/<kernel>_M=..-N=..-K=../``). For the
HIP backend it names the GPU the kernel was compiled for::

    {"hash": "...", "target": {"backend": "hip", "arch": "gfx950", "warp_size": 64}, ...}

Triton finds a compiled kernel by a key that includes that target, so the code object is launched
only on the GPU it names; on another GPU Triton compiles the kernel from source at first use.
"""

from __future__ import annotations

import re

# Larger than any metadata Triton writes (a few KiB: options, shared memory, the kernel's name);
# a bigger file is not one, and is never read whole.
MAX_METADATA_BYTES = 1 << 20

_ARCH = re.compile(r"^gfx[0-9a-z]+(?::(?:sramecc|xnack)[+-])*$")


def hip_target(data: bytes) -> str | None:
    """The ``target.arch`` of HIP-backend Triton metadata (``gfx950``), or None for anything else."""
    import json  # noqa: PLC0415 - only for the few .hsaco files that have metadata beside them

    if len(data) > MAX_METADATA_BYTES:
        return None
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError; RecursionError: nesting
        return None
    if not isinstance(document, dict):
        return None
    target = document.get("target")
    if not isinstance(target, dict) or target.get("backend") != "hip":
        return None
    arch = target.get("arch")
    if not isinstance(arch, str) or not _ARCH.match(arch):
        return None
    return arch
