"""GPU product names (MI300X, Radeon RX 7900 XTX) and the processor each one is, so that a user
may name the card instead of its gfx number.

Every row cites where it comes from (``sources``, keys of ``PRODUCT_SOURCES``): the ROCm
documentation's "GPU hardware specifications" tables give each product's "LLVM target name", and
LLVM's AMDGPU backend guide lists "Example Products" per processor. Only products one of them
names are here; a product missing from both is not guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ROCM_SPECS = "rocm-gpu-specs"
LLVM_USAGE = "llvm-amdgpu-usage"

# Read for this table: the ROCm page's source docs/reference/gpu-arch-specs.rst (ROCm/ROCm; the
# copy in ROCm/legacy-rocm-build at 089d7513, whose Instinct rows the page of 2026-02 repeats),
# columns "Model" and "LLVM target name"; llvm/docs/AMDGPUUsage.rst (llvm/llvm-project at
# 001388cf), table "AMDGPU Processors", columns "Processor" and "Example Products".
PRODUCT_SOURCES: dict[str, str] = {
    ROCM_SPECS: ("ROCm GPU hardware specifications, https://rocm.docs.amd.com/en/latest/reference/gpu-arch-specs.html"),
    LLVM_USAGE: "LLVM AMDGPU Processors table, https://llvm.org/docs/AMDGPUUsage.html#processors",
}


@dataclass(frozen=True, slots=True)
class GpuProduct:
    """A product as its source spells it, the processor (``--offload-arch`` name) it is, and the
    sources (keys of PRODUCT_SOURCES) that say so."""

    name: str
    processor: str
    sources: tuple[str, ...]


_R, _L, _RL = (ROCM_SPECS,), (LLVM_USAGE,), (ROCM_SPECS, LLVM_USAGE)

GPU_PRODUCTS: tuple[GpuProduct, ...] = (
    # AMD Instinct (ROCm's table names them by model alone: MI300X)
    GpuProduct("MI355X", "gfx950", _R),
    GpuProduct("MI350X", "gfx950", _R),
    GpuProduct("MI325X", "gfx942", _R),
    GpuProduct("MI300X", "gfx942", _R),
    GpuProduct("MI300A", "gfx942", _R),
    GpuProduct("MI250X", "gfx90a", _RL),
    GpuProduct("MI250", "gfx90a", _RL),
    GpuProduct("MI210", "gfx90a", _RL),
    GpuProduct("MI100", "gfx908", _RL),
    GpuProduct("MI60", "gfx906", _RL),
    GpuProduct("MI50", "gfx906", _RL),
    GpuProduct("MI25", "gfx900", _RL),
    GpuProduct("MI8", "gfx803", _RL),
    GpuProduct("MI6", "gfx803", _RL),
    # AMD Radeon PRO
    GpuProduct("Radeon AI PRO R9700", "gfx1201", _R),
    GpuProduct("Radeon PRO V710", "gfx1101", _R),
    GpuProduct("Radeon PRO W7900", "gfx1100", _R),
    GpuProduct("Radeon PRO W7800", "gfx1100", _R),
    GpuProduct("Radeon PRO W7700", "gfx1101", _R),
    GpuProduct("Radeon PRO W6800", "gfx1030", _R),
    GpuProduct("Radeon PRO W6600", "gfx1032", _R),
    GpuProduct("Radeon PRO V620", "gfx1030", _R),
    GpuProduct("Radeon PRO W5500", "gfx1012", _R),
    GpuProduct("Radeon PRO V520", "gfx1011", _L),
    GpuProduct("Radeon Pro VII", "gfx906", _RL),
    # AMD Radeon
    GpuProduct("Radeon RX 9070 XT", "gfx1201", _R),
    GpuProduct("Radeon RX 9070 GRE", "gfx1201", _R),
    GpuProduct("Radeon RX 9070", "gfx1201", _R),
    GpuProduct("Radeon RX 9060 XT", "gfx1200", _R),
    GpuProduct("Radeon RX 7900 XTX", "gfx1100", _R),
    GpuProduct("Radeon RX 7900 XT", "gfx1100", _R),
    GpuProduct("Radeon RX 7900 GRE", "gfx1100", _R),
    GpuProduct("Radeon RX 7800 XT", "gfx1101", _R),
    GpuProduct("Radeon RX 7700 XT", "gfx1101", _R),
    GpuProduct("Radeon RX 7600", "gfx1102", _R),
    GpuProduct("Radeon RX 6950 XT", "gfx1030", _R),
    GpuProduct("Radeon RX 6900 XT", "gfx1030", _RL),
    GpuProduct("Radeon RX 6800 XT", "gfx1030", _RL),
    GpuProduct("Radeon RX 6800", "gfx1030", _RL),
    GpuProduct("Radeon RX 6750 XT", "gfx1031", _R),
    GpuProduct("Radeon RX 6700 XT", "gfx1031", _RL),
    GpuProduct("Radeon RX 6700", "gfx1031", _R),
    GpuProduct("Radeon RX 6650 XT", "gfx1032", _R),
    GpuProduct("Radeon RX 6600 XT", "gfx1032", _R),
    GpuProduct("Radeon RX 6600", "gfx1032", _R),
    GpuProduct("Radeon RX 5700 XT", "gfx1010", _L),
    GpuProduct("Radeon RX 5700", "gfx1010", _L),
    GpuProduct("Radeon RX 5500 XT", "gfx1012", _L),
    GpuProduct("Radeon RX 5500", "gfx1012", _L),
    GpuProduct("Radeon VII", "gfx906", _RL),
)

# Words a user may add or leave out: the maker, the brand, the kind of part.
_NOISE_PREFIX = re.compile(r"^(?:amd)?")
_NOISE_SUFFIX = re.compile(r"(?:accelerator|gpu)$")
_BRANDS = re.compile(r"^(?:radeon|instinct)+")


def product_key(text: str) -> str:
    """The spelling-free form of a product name: case, spaces, dashes and the maker dropped, and the
    brand (Instinct, Radeon) too when a model number follows it. ``Instinct MI300X``, ``mi300x``
    and ``MI-300X`` give ``mi300x``; ``RX 7900 XTX`` and ``Radeon RX 7900 XTX`` give ``rx7900xtx``;
    ``Radeon Instinct MI50`` gives ``mi50``; ``Radeon VII`` stays ``radeonvii`` (no number follows
    the brand: "VII" alone names nothing)."""
    key = re.sub(r"[^0-9a-z]", "", text.lower())
    key = _NOISE_SUFFIX.sub("", _NOISE_PREFIX.sub("", key, count=1), count=1)
    rest = _BRANDS.sub("", key, count=1)
    return rest if re.search(r"\d", rest) else key


def _keys(product: GpuProduct) -> list[str]:
    key = product_key(product.name)
    keys = [key]
    # "Radeon PRO W7900" is also written "W7900", "Radeon AI PRO R9700" "R9700".
    short = re.sub(r"^(?:ai)?pro(?=[a-z]\d)", "", key)
    if short != key:
        keys.append(short)
    return keys


PRODUCTS_BY_KEY: dict[str, GpuProduct] = {key: p for p in GPU_PRODUCTS for key in _keys(p)}


def find_product(text: str) -> GpuProduct | None:
    """The product ``text`` names in any usual spelling; None when it names none."""
    return PRODUCTS_BY_KEY.get(product_key(text))
