"""``.hipFatBinSegment`` wrappers: one 24-byte record per registered fat binary (translation unit).

Layout: formats.md 2.5 [LLVM: llvm/lib/Frontend/Offloading/OffloadWrapper.cpp]; the kpack'd magic
HIPK: formats.md 1.7 [rocm-systems: shared/kpack/python/rocm_kpack/elf/kpack_transform.py].
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from rocm_audit.errors import FormatError

FMT = ".hipFatBinSegment"
WRAPPER_SIZE = 24
HIPF_MAGIC = 0x48495046  # __hipFatMAGIC2: stored as bytes "FPIH"
HIPK_MAGIC = 0x4B504948  # kpack'd wrapper: stored as bytes "HIPK"
MAX_WRAPPERS = 1 << 16


@dataclass(frozen=True, slots=True)
class FatbinWrapper:
    index: int
    magic: int
    version: int
    binary_ptr: int  # 0 in a PIC .so: filled by an R_X86_64_RELATIVE relocation
    reserved: int  # kpack: the wrapper's index (= co_index)

    @property
    def kind(self) -> str:
        return {HIPF_MAGIC: "HIPF", HIPK_MAGIC: "HIPK"}.get(self.magic, f"{self.magic:#010x}")


def parse_wrappers(buf: bytes | memoryview, base: int) -> list[FatbinWrapper]:
    """Parse the section's wrappers. Raises FormatError for a bad size or an unknown magic."""
    if len(buf) % WRAPPER_SIZE:
        raise FormatError(FMT, base, f"section size {len(buf)} is not a multiple of {WRAPPER_SIZE}")
    count = len(buf) // WRAPPER_SIZE
    if count > MAX_WRAPPERS:
        raise FormatError(FMT, base, f"{count} wrappers is absurd")
    wrappers = []
    for index in range(count):
        magic, version, pointer, reserved = struct.unpack_from("<IIQQ", buf, index * WRAPPER_SIZE)
        if magic not in (HIPF_MAGIC, HIPK_MAGIC):
            raise FormatError(FMT, base + index * WRAPPER_SIZE, f"wrapper {index} has unknown magic {magic:#010x}")
        if version != 1:
            # CLR __hipRegisterFatBinary accepts version 1 only (formats.md 1.7).
            raise FormatError(
                FMT,
                base + index * WRAPPER_SIZE + 4,
                f"wrapper {index} has version {version}; the HIP runtime accepts 1 only",
            )
        wrappers.append(FatbinWrapper(index, magic, version, pointer, reserved))
    return wrappers
