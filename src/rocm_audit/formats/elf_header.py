"""The ELF file header after its 16-byte e_ident, for either class and byte order.

Layout: System V gABI, "ELF Header" [LLVM: llvm/include/llvm/BinaryFormat/ELF.h, Elf32_Ehdr and
Elf64_Ehdr]. elf/read.py (any ELF) and amdgpu_elf.py (64-bit little-endian code objects) check
e_ident each their own way, then unpack the rest here.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

ELF32_HEADER_SIZE, ELF64_HEADER_SIZE = 52, 64


class HeaderFields(NamedTuple):
    e_type: int
    e_machine: int
    e_version: int
    e_entry: int
    e_phoff: int
    e_shoff: int
    e_flags: int
    e_ehsize: int
    e_phentsize: int
    e_phnum: int
    e_shentsize: int
    e_shnum: int
    e_shstrndx: int


def unpack_header_fields(head: bytes, *, is_64: bool, little_endian: bool) -> HeaderFields:
    """The fields after e_ident; head holds the whole header (52 or 64 bytes, the caller checks)."""
    layout = ("<" if little_endian else ">") + ("HHIQQQIHHHHHH" if is_64 else "HHIIIIIHHHHHH")
    return HeaderFields._make(struct.unpack_from(layout, head, 16))
