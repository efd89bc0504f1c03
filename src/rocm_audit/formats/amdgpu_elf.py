"""AMDGPU code-object ELF: identity (EF_AMDGPU_MACH, xnack/sramecc, versions) and metadata notes.

Layout and constants: formats.md 2.7 [LLVM: llvm/include/llvm/BinaryFormat/ELF.h; ROCm-LLVM:
amd/comgr/src/comgr-metadata.cpp]. Parsers take a buffer and the buffer's offset in its file (for
error messages), do no I/O and raise ``FormatError``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from rocm_audit.errors import FormatError

# ELF64_HEADER_SIZE is re-exported ("as"): elf/codeobject.py reads it from here.
from rocm_audit.formats.elf_header import ELF64_HEADER_SIZE as ELF64_HEADER_SIZE
from rocm_audit.formats.elf_header import unpack_header_fields

FMT = "AMDGPU ELF"

EM_AMDGPU = 224
ELFOSABI_AMDGPU_HSA, ELFOSABI_AMDGPU_PAL, ELFOSABI_AMDGPU_MESA3D = 64, 65, 66
ET_REL, ET_EXEC, ET_DYN = 1, 2, 3
PT_NOTE = 4
SHT_NOTE = 7
ELF64_PHDR_SIZE = 56
ELF64_SHDR_SIZE = 64

EF_AMDGPU_MACH = 0x0FF
EF_AMDGPU_FEATURE_XNACK_V2 = 0x01
EF_AMDGPU_FEATURE_XNACK_V3 = 0x100
EF_AMDGPU_FEATURE_SRAMECC_V3 = 0x200
EF_AMDGPU_FEATURE_XNACK_V4 = 0x300
EF_AMDGPU_FEATURE_XNACK_UNSUPPORTED_V4 = 0x000
EF_AMDGPU_FEATURE_XNACK_ANY_V4 = 0x100
EF_AMDGPU_FEATURE_XNACK_OFF_V4 = 0x200
EF_AMDGPU_FEATURE_XNACK_ON_V4 = 0x300
EF_AMDGPU_FEATURE_SRAMECC_V4 = 0xC00
EF_AMDGPU_FEATURE_SRAMECC_UNSUPPORTED_V4 = 0x000
EF_AMDGPU_FEATURE_SRAMECC_ANY_V4 = 0x400
EF_AMDGPU_FEATURE_SRAMECC_OFF_V4 = 0x800
EF_AMDGPU_FEATURE_SRAMECC_ON_V4 = 0xC00
EF_AMDGPU_GENERIC_VERSION = 0xFF000000
EF_AMDGPU_GENERIC_VERSION_OFFSET = 24

# e_ident[EI_ABIVERSION] for ELFOSABI_AMDGPU_HSA: V2=0 ... V6=4 (formats.md 2.7).
ELFABIVERSION_AMDGPU_HSA_V2, ELFABIVERSION_AMDGPU_HSA_V3 = 0, 1
ELFABIVERSION_AMDGPU_HSA_V4, ELFABIVERSION_AMDGPU_HSA_V5, ELFABIVERSION_AMDGPU_HSA_V6 = 2, 3, 4

NT_AMDGPU_METADATA = 32
NT_AMD_HSA_ISA_NAME = 11

# EF_AMDGPU_MACH_AMDGCN_* values [LLVM ELF.h and test/CodeGen/AMDGPU/elf-header-flags-mach.ll;
# ROCm-LLVM fork additions], formats.md 2.7. 0x0eb is the fork's A0 stepping of gfx1250: named
# gfx125f in its 2025 ELF.h, gfx1250-strict (EF_AMDGPU_MACH_AMDGCN_GFX1250_STRICT) in the 2026
# comgr and ROCr tests, which is also the name the runtime reports for such an agent.
EF_AMDGPU_MACH_NAMES: dict[int, str] = {
    0x020: "gfx600",
    0x021: "gfx601",
    0x022: "gfx700",
    0x023: "gfx701",
    0x024: "gfx702",
    0x025: "gfx703",
    0x026: "gfx704",
    0x028: "gfx801",
    0x029: "gfx802",
    0x02A: "gfx803",
    0x02B: "gfx810",
    0x02C: "gfx900",
    0x02D: "gfx902",
    0x02E: "gfx904",
    0x02F: "gfx906",
    0x030: "gfx908",
    0x031: "gfx909",
    0x032: "gfx90c",
    0x033: "gfx1010",
    0x034: "gfx1011",
    0x035: "gfx1012",
    0x036: "gfx1030",
    0x037: "gfx1031",
    0x038: "gfx1032",
    0x039: "gfx1033",
    0x03A: "gfx602",
    0x03B: "gfx705",
    0x03C: "gfx805",
    0x03D: "gfx1035",
    0x03E: "gfx1034",
    0x03F: "gfx90a",
    0x040: "gfx940",
    0x041: "gfx1100",
    0x042: "gfx1013",
    0x043: "gfx1150",
    0x044: "gfx1103",
    0x045: "gfx1036",
    0x046: "gfx1101",
    0x047: "gfx1102",
    0x048: "gfx1200",
    0x049: "gfx1250",
    0x04A: "gfx1151",
    0x04B: "gfx941",
    0x04C: "gfx942",
    0x04E: "gfx1201",
    0x04F: "gfx950",
    0x050: "gfx1310",
    0x051: "gfx9-generic",
    0x052: "gfx10-1-generic",
    0x053: "gfx10-3-generic",
    0x054: "gfx11-generic",
    0x055: "gfx1152",
    0x057: "gfx1154",
    0x058: "gfx1153",
    0x059: "gfx12-generic",
    0x05A: "gfx1251",
    0x05B: "gfx12-5-generic",
    0x05C: "gfx1172",
    0x05D: "gfx1170",
    0x05E: "gfx1171",
    0x05F: "gfx9-4-generic",
    0x062: "gfx11-7-generic",
    0x063: "gfx13-generic",
    0x0EB: "gfx1250-strict",
}
EF_AMDGPU_MACH_AMDGCN_GFX950 = 0x04F
EF_AMDGPU_MACH_AMDGCN_GFX942 = 0x04C


@dataclass(frozen=True, slots=True)
class CodeObjectIdentity:
    """What the ELF header says about one code object."""

    mach: int
    processor: str | None  # None when EF_AMDGPU_MACH is unknown (e.g. 0 in code object V2)
    xnack: bool | None  # None = any / unsupported (matches either agent setting)
    sramecc: bool | None
    osabi: int
    abi_version: int
    e_type: int
    generic_version: int  # 0 when not generic / not V6

    @property
    def code_object_version(self) -> int | None:
        """Code object version 2..6 for the HSA OS ABI (EI_ABIVERSION + 2), else None."""
        if self.osabi != ELFOSABI_AMDGPU_HSA:
            return None
        return self.abi_version + 2

    @property
    def target_id(self) -> str | None:
        """Canonical target ID (features sorted, only specified ones), comgr's spelling."""
        if self.processor is None:
            return None
        text = self.processor
        if self.sramecc is not None:
            text += ":sramecc" + ("+" if self.sramecc else "-")
        if self.xnack is not None:
            text += ":xnack" + ("+" if self.xnack else "-")
        return text


FEATURES = ("sramecc", "xnack")  # canonical (alphabetical) order

# Features each processor supports [ROCr isa.cpp registry, formats.md 2.9].
_BOTH_FEATURES = {
    "gfx906",
    "gfx908",
    "gfx90a",
    "gfx940",
    "gfx941",
    "gfx942",
    "gfx950",
    "gfx9-4-generic",
}
_XNACK_ONLY = {
    "gfx801",
    "gfx810",
    "gfx900",
    "gfx902",
    "gfx904",
    "gfx909",
    "gfx90c",
    "gfx1010",
    "gfx1011",
    "gfx1012",
    "gfx1013",
    "gfx9-generic",
    "gfx10-1-generic",
}


def supported_features(processor: str) -> tuple[str, ...]:
    if processor in _BOTH_FEATURES:
        return FEATURES
    if processor in _XNACK_ONLY:
        return ("xnack",)
    return ()


def _feature_v4(flags: int, mask: int, off: int, on: int) -> bool | None:
    value = flags & mask
    if value == on:
        return True
    if value == off:
        return False
    return None  # ANY or UNSUPPORTED: comgr adds nothing to the ISA name


def identity_from_header(e_flags: int, osabi: int, abi_version: int, e_type: int) -> CodeObjectIdentity:
    """Decode e_flags the way comgr does for the code object version the header declares."""
    mach = e_flags & EF_AMDGPU_MACH
    processor = EF_AMDGPU_MACH_NAMES.get(mach)
    generic_version = 0
    if osabi == ELFOSABI_AMDGPU_HSA and abi_version >= ELFABIVERSION_AMDGPU_HSA_V4:
        xnack = _feature_v4(
            e_flags,
            EF_AMDGPU_FEATURE_XNACK_V4,
            EF_AMDGPU_FEATURE_XNACK_OFF_V4,
            EF_AMDGPU_FEATURE_XNACK_ON_V4,
        )
        sramecc = _feature_v4(
            e_flags,
            EF_AMDGPU_FEATURE_SRAMECC_V4,
            EF_AMDGPU_FEATURE_SRAMECC_OFF_V4,
            EF_AMDGPU_FEATURE_SRAMECC_ON_V4,
        )
        if abi_version >= ELFABIVERSION_AMDGPU_HSA_V6:
            generic_version = (e_flags & EF_AMDGPU_GENERIC_VERSION) >> EF_AMDGPU_GENERIC_VERSION_OFFSET
    elif osabi == ELFOSABI_AMDGPU_HSA and abi_version == ELFABIVERSION_AMDGPU_HSA_V3:
        # V3 has one bit per feature: set = on, clear = off (no "any"), named only for a processor
        # that has the feature (CLR getTripleTargetIDFromCodeObject; comgr likewise): a gfx1010
        # object is gfx1010:xnack-, never gfx1010:sramecc-:xnack-, which no device is.
        supported = supported_features(processor) if processor else ()
        xnack = bool(e_flags & EF_AMDGPU_FEATURE_XNACK_V3) if "xnack" in supported else None
        sramecc = bool(e_flags & EF_AMDGPU_FEATURE_SRAMECC_V3) if "sramecc" in supported else None
    elif osabi == ELFOSABI_AMDGPU_HSA:
        # V2: only an xnack bit; a clear bit does not mean "off" reliably. It is bit 0, which the
        # processor number shares in the V2 objects hcc wrote with one (gfx906 = 0x2f): there it
        # says nothing.
        xnack = True if e_flags & EF_AMDGPU_FEATURE_XNACK_V2 and not mach else None
        sramecc = None
    else:
        # Not the HSA ABI (which the HIP runtime alone loads): no feature bits to read as HSA's.
        xnack = sramecc = None
    return CodeObjectIdentity(mach, processor, xnack, sramecc, osabi, abi_version, e_type, generic_version)


@dataclass(frozen=True, slots=True)
class ElfLayout:
    """The parts of a 64-bit little-endian AMDGPU ELF header needed to find notes and its extent."""

    identity: CodeObjectIdentity
    e_phoff: int
    e_phnum: int
    e_shoff: int
    e_shnum: int
    e_shstrndx: int

    @property
    def min_size(self) -> int:
        """Bytes the header says the object spans at least (header, phdr and shdr tables)."""
        ends = [ELF64_HEADER_SIZE]
        if self.e_phnum:
            ends.append(self.e_phoff + self.e_phnum * ELF64_PHDR_SIZE)
        if self.e_shnum:
            ends.append(self.e_shoff + self.e_shnum * ELF64_SHDR_SIZE)
        return max(ends)


def is_amdgpu_elf(head: bytes) -> bool:
    """Cheap test: ELF magic, 64-bit LSB, e_machine EM_AMDGPU."""
    return (
        len(head) >= 20
        and head[:4] == b"\x7fELF"
        and head[4] == 2
        and head[5] == 1
        and struct.unpack_from("<H", head, 18)[0] == EM_AMDGPU
    )


def parse_header(buf: bytes | memoryview, base: int = 0) -> ElfLayout:
    """Parse the 64-byte header of an AMDGPU code object. Raises FormatError."""
    if len(buf) < ELF64_HEADER_SIZE:
        raise FormatError(FMT, base + len(buf), "code object shorter than a 64-byte ELF header")
    head = bytes(buf[:ELF64_HEADER_SIZE])
    if head[:4] != b"\x7fELF":
        raise FormatError(FMT, base, "no ELF magic")
    if head[4] != 2 or head[5] != 1:
        raise FormatError(FMT, base + 4, "AMDGPU code objects are 64-bit little-endian")
    fields = unpack_header_fields(head, is_64=True, little_endian=True)
    e_machine, e_phnum, e_shnum = fields.e_machine, fields.e_phnum, fields.e_shnum
    if e_machine != EM_AMDGPU:
        raise FormatError(FMT, base + 18, f"e_machine {e_machine} is not EM_AMDGPU (224)")
    if e_phnum and fields.e_phentsize != ELF64_PHDR_SIZE:
        raise FormatError(FMT, base + 0x36, f"e_phentsize {fields.e_phentsize} is not 56")
    if e_shnum and fields.e_shentsize != ELF64_SHDR_SIZE:
        raise FormatError(FMT, base + 0x3A, f"e_shentsize {fields.e_shentsize} is not 64")
    identity = identity_from_header(fields.e_flags, head[7], head[8], fields.e_type)
    return ElfLayout(identity, fields.e_phoff, e_phnum, fields.e_shoff, e_shnum, fields.e_shstrndx)


def note_ranges_from_phdrs(table: bytes | memoryview, base: int, count: int) -> list[tuple[int, int]]:
    """(offset, size) of each PT_NOTE segment, from the program header table bytes."""
    if len(table) < count * ELF64_PHDR_SIZE:
        raise FormatError(FMT, base + len(table), "program header table is truncated")
    ranges = []
    for index in range(count):
        p_type, _flags, p_offset, _vaddr, _paddr, p_filesz = struct.unpack_from(
            "<IIQQQQ", table, index * ELF64_PHDR_SIZE
        )
        if p_type == PT_NOTE and p_filesz:
            ranges.append((p_offset, p_filesz))
    return ranges


def note_ranges_from_shdrs(table: bytes | memoryview, base: int, count: int) -> list[tuple[int, int]]:
    """(offset, size) of each SHT_NOTE section, from the section header table bytes."""
    if len(table) < count * ELF64_SHDR_SIZE:
        raise FormatError(FMT, base + len(table), "section header table is truncated")
    ranges = []
    for index in range(count):
        _name, sh_type, _flags, _addr, sh_offset, sh_size = struct.unpack_from(
            "<IIQQQQ", table, index * ELF64_SHDR_SIZE
        )
        if sh_type == SHT_NOTE and sh_size:
            ranges.append((sh_offset, sh_size))
    return ranges


@dataclass(frozen=True, slots=True)
class Note:
    name: bytes
    note_type: int
    desc: bytes


def iter_notes(buf: bytes | memoryview, base: int) -> list[Note]:
    """Split a note segment or section into notes (namesz, descsz, type, name, desc; 4-aligned)."""
    notes = []
    pos = 0
    while pos + 12 <= len(buf):
        namesz, descsz, note_type = struct.unpack_from("<III", buf, pos)
        name_start = pos + 12
        desc_start = name_start + ((namesz + 3) & ~3)
        desc_end = desc_start + descsz
        if desc_end > len(buf):
            raise FormatError(FMT, base + pos, f"note of {descsz} bytes runs past its segment")
        notes.append(
            Note(
                bytes(buf[name_start : name_start + namesz]).rstrip(b"\0"),
                note_type,
                bytes(buf[desc_start:desc_end]),
            )
        )
        pos = desc_start + ((descsz + 3) & ~3)
    return notes


@dataclass(frozen=True, slots=True)
class CodeObjectMetadata:
    """The parts of NT_AMDGPU_METADATA (MessagePack) the auditor uses."""

    target: str | None  # amdhsa.target, e.g. "amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-"
    version: tuple[int, ...]
    kernel_count: int


MAX_METADATA_BYTES = 16 << 20


def parse_metadata(notes: list[Note], base: int) -> CodeObjectMetadata | None:
    """Merge every NT_AMDGPU_METADATA note (comgr's mergeNoteRecords); None when there is none.

    Only ``amdhsa.target``, ``amdhsa.version`` and the number of kernels are needed, so the map is
    walked with msgpack's streaming Unpacker and everything else is skipped in C, never decoded:
    decoding every kernel's argument list took 0.6 s of a 1 s listing of librocsparse (88,137
    kernels; bench/RESULTS.md).
    """
    import msgpack  # noqa: PLC0415 - heavy module, loaded on first use (style.md 3)

    target: str | None = None
    version: tuple[int, ...] = ()
    kernel_count = 0
    found = False
    for note in notes:
        if note.name != b"AMDGPU" or note.note_type != NT_AMDGPU_METADATA:
            continue
        found = True
        if len(note.desc) > MAX_METADATA_BYTES:
            raise FormatError(FMT, base, "metadata note is larger than 16 MiB")
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=MAX_METADATA_BYTES)
        unpacker.feed(note.desc)
        try:
            entries = unpacker.read_map_header()
            for _ in range(entries):
                key = unpacker.unpack()
                if key == "amdhsa.target":
                    value = unpacker.unpack()
                    if isinstance(value, str):
                        target = target or value
                elif key == "amdhsa.version":
                    value = unpacker.unpack()
                    if isinstance(value, list) and all(isinstance(v, int) for v in value):
                        version = version or tuple(value)
                elif key == "amdhsa.kernels":
                    count = unpacker.read_array_header()
                    for _ in range(count):
                        unpacker.skip()
                    kernel_count += count
                else:
                    unpacker.skip()
        except msgpack.exceptions.StackError:
            raise FormatError(FMT, base, "metadata note nests too deeply") from None
        except (ValueError, TypeError, msgpack.exceptions.UnpackException) as exc:
            # read_map_header() on a non-map, truncated data (OutOfData), bad bytes.
            raise FormatError(FMT, base, f"metadata note is not a valid MessagePack map: {exc!r}") from None
    if not found:
        return None
    return CodeObjectMetadata(target, version, kernel_count)


def target_id_from_isa_name(isa: str) -> str | None:
    """``amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-`` -> ``gfx942:sramecc+:xnack-``."""
    prefix = "amdgcn-amd-amdhsa-"
    if not isa.startswith(prefix):
        return None
    rest = isa[len(prefix) :]
    # Environment component: empty ("--gfx") or "unknown".
    for env in ("-", "unknown-"):
        if rest.startswith(env):
            return rest[len(env) :] or None
    return rest or None
