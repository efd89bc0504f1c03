"""Target IDs, e_flags decoding and HIP-runtime matching (formats.md 2.3, 2.7-2.9)."""

from __future__ import annotations

import pytest

from rocm_audit.errors import UsageError
from rocm_audit.formats import amdgpu_elf
from rocm_audit.formats.offload_bundle import parse_entry_id
from rocm_audit.tree.targets import (
    MatchKind,
    TargetId,
    arch_tokens,
    choose_entry,
    match_code_object,
    parse_target_id,
    resolve_required,
    split_target_args,
)


@pytest.mark.parametrize(
    ("flags", "abi", "expected", "generic"),
    [
        (0x0100055F, 4, "gfx9-4-generic", 1),  # formats.md 2.7 worked value: any/any, generic v1
        (0x549, 4, "gfx1250", 0),
        (0x54F, 4, "gfx950", 0),  # llvmlite gfx950: xnack any, sramecc any
        (0xA4F, 4, "gfx950:sramecc-:xnack-", 0),  # zig gfx950 (corpus kz_gfx950.o)
        (0xF4C, 2, "gfx942:sramecc+:xnack+", 0),  # V4 encodings ON/ON
        (0x34C, 2, "gfx942:xnack+", 0),  # xnack on, sramecc unsupported
        (0x32F, 1, "gfx906:sramecc+:xnack+", 0),  # V3: one bit per feature, set = on
        (0x02F, 1, "gfx906:sramecc-:xnack-", 0),  # V3: clear = off
        # V3 names a feature only for a processor that has it (CLR getTripleTargetIDFromCodeObject;
        # cupy-rocm-4-0's e_flags): no sramecc for gfx1010 or gfx801, neither for gfx803.
        (0x033, 1, "gfx1010:xnack-", 0),
        (0x128, 1, "gfx801:xnack+", 0),
        (0x22A, 1, "gfx803", 0),
        # V2 with a processor number (hcc's, tensorflow-rocm 1.15): bit 0 is the number's, not xnack.
        (0x02F, 0, "gfx906", 0),
    ],
)
def test_e_flags_decode_like_comgr(flags, abi, expected, generic):
    identity = amdgpu_elf.identity_from_header(flags, amdgpu_elf.ELFOSABI_AMDGPU_HSA, abi, 3)
    assert identity.target_id == expected
    assert identity.code_object_version == abi + 2
    assert identity.generic_version == generic


def test_unknown_mach_gives_no_target_instead_of_a_crash():
    identity = amdgpu_elf.identity_from_header(0x04D, amdgpu_elf.ELFOSABI_AMDGPU_HSA, 4, 3)
    assert identity.processor is None and identity.target_id is None


def test_mach_table_matches_formats_md_spot_values():
    assert amdgpu_elf.EF_AMDGPU_MACH_NAMES[0x04F] == "gfx950"
    assert amdgpu_elf.EF_AMDGPU_MACH_NAMES[0x04C] == "gfx942"
    assert amdgpu_elf.EF_AMDGPU_MACH_NAMES[0x03F] == "gfx90a"
    assert amdgpu_elf.EF_AMDGPU_MACH_NAMES[0x05F] == "gfx9-4-generic"
    assert amdgpu_elf.EF_AMDGPU_MACH_NAMES[0x0EB] == "gfx1250-strict"
    # LLVM's elf-header-flags-mach.ll, 2026: the gfx117x parts and the two newest generic families.
    assert [amdgpu_elf.EF_AMDGPU_MACH_NAMES[v] for v in (0x05C, 0x05E, 0x062, 0x063)] == [
        "gfx1172",
        "gfx1171",
        "gfx11-7-generic",
        "gfx13-generic",
    ]
    assert 0x04D not in amdgpu_elf.EF_AMDGPU_MACH_NAMES and 0x027 not in amdgpu_elf.EF_AMDGPU_MACH_NAMES


@pytest.mark.parametrize(
    ("raw", "kind", "target"),
    [
        ("hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-", "hipv4", "gfx942:sramecc+:xnack-"),
        ("hipv4-amdgcn-amd-amdhsa-unknown-gfx942", "hipv4", "gfx942"),  # Tensile spelling
        ("hipv4-amdgcn-amd-amdhsa--gfx950-", "hipv4", "gfx950"),  # LLVM 19 bundler artefact
        ("hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-\0", "hipv4", "gfx90a:xnack-"),  # NUL-padded id
        ("hip-amdgcn-amd-amdhsa--gfx9-4-generic", "hip", "gfx9-4-generic"),
        ("hipv4-spirv64-amd-amdhsa--amdgcnspirv", "hipv4", "amdgcnspirv"),
        ("host-x86_64-unknown-linux--", "host", None),
        ("host-x86_64-unknown-linux-gnu-", "host", None),
    ],
)
def test_bundle_entry_ids_in_every_spelling(raw, kind, target):
    parsed = parse_entry_id(raw)
    assert (parsed.kind, parsed.target) == (kind, target)


def test_required_targets_get_the_usual_device_configuration():
    assert str(resolve_required("gfx950").agent) == "gfx950:sramecc+:xnack-"
    assert str(resolve_required("gfx942:xnack+").agent) == "gfx942:sramecc+:xnack+"
    assert str(resolve_required("gfx1100").agent) == "gfx1100"
    assert str(resolve_required("gfx900").agent) == "gfx900:xnack-"
    with pytest.raises(UsageError, match="no sramecc feature"):
        resolve_required("gfx1100:sramecc+")
    with pytest.raises(UsageError, match="unknown GPU target 'gfx9999'") as unknown:
        resolve_required("gfx9999")
    assert unknown.value.hint is not None and "--list-targets" in unknown.value.hint
    with pytest.raises(UsageError, match="generic code-object target, not a GPU") as generic:
        resolve_required("gfx9-4-generic")  # a code-object family, not a device
    assert generic.value.hint == "it serves gfx942, gfx950, and its code counts for each of them"


def test_target_lists_split_like_gpu_arch():
    assert split_target_args(["gfx942;gfx950", "gfx90a", "gfx942"]) == [
        "gfx942",
        "gfx950",
        "gfx90a",
    ]


def _match(code: str, agent: str, cov: int = 5, generic: int | None = None) -> MatchKind | None:
    code_id = parse_target_id(code)
    assert code_id is not None
    return match_code_object(code_id, resolve_required(agent).agent, code_object_version=cov, generic_version=generic)


def test_matching_follows_comgr_and_rocr():
    assert _match("gfx942", "gfx942") is MatchKind.NATIVE  # unspecified features match either
    assert _match("gfx942:sramecc+:xnack-", "gfx942") is MatchKind.NATIVE
    assert _match("gfx942:xnack+", "gfx942") is None  # the usual MI300 setting is xnack-
    assert _match("gfx942:xnack+", "gfx942:xnack+") is MatchKind.NATIVE
    assert _match("gfx950:sramecc-:xnack-", "gfx950") is None
    assert _match("gfx940", "gfx942") is None  # different processor
    assert _match("gfx9-4-generic", "gfx950", cov=6, generic=1) is MatchKind.GENERIC
    assert _match("gfx9-4-generic", "gfx942", cov=6, generic=1) is MatchKind.GENERIC
    assert _match("gfx9-4-generic", "gfx950", cov=6, generic=0) is None  # generic version >= 1
    assert _match("gfx9-4-generic", "gfx950", cov=5, generic=1) is None  # needs code object V6
    assert _match("gfx9-generic", "gfx90a", cov=6, generic=1) is None  # gfx90a has no generic
    assert _match("gfx11-generic", "gfx1151", cov=6, generic=1) is MatchKind.GENERIC
    # CLR asks for gfx9-generic:sramecc+:xnack- on a gfx906: not a target id (gfx9-generic has no
    # sramecc; clang-19 --offload-arch=gfx9-generic:sramecc+ is refused), so nothing matches.
    assert _match("gfx9-generic", "gfx906", cov=6, generic=1) is None
    assert _match("gfx9-generic", "gfx900", cov=6, generic=1) is MatchKind.GENERIC
    assert _match("amdgcnspirv", "gfx950") is MatchKind.SPIRV


def test_gfx1250_strict_is_a_target_of_its_own():
    """A0 silicon of gfx1250 is reported as gfx1250-strict and loads only its own code: neither
    gfx1250 nor gfx12-5-generic code (CLR maps only gfx1250 to that family), which gfx1250 loads."""
    assert str(resolve_required("gfx1250-strict").agent) == "gfx1250-strict"
    assert _match("gfx1250-strict", "gfx1250-strict") is MatchKind.NATIVE
    assert _match("gfx1250", "gfx1250-strict") is None
    assert _match("gfx1250-strict", "gfx1250") is None
    assert _match("gfx12-5-generic", "gfx1250", cov=6, generic=1) is MatchKind.GENERIC
    assert _match("gfx12-5-generic", "gfx1250-strict", cov=6, generic=1) is None
    assert _match("gfx12-5-generic", "gfx1251", cov=6, generic=1) is None
    assert arch_tokens("TensileLibrary_lazy_gfx1250-strict.dat") == ["gfx1250-strict"]
    assert arch_tokens("TensileLibrary_lazy_gfx1250.dat") == ["gfx1250"]


def test_arch_tokens_in_database_names():
    assert arch_tokens("TensileLibrary_lazy_gfx942.dat") == ["gfx942"]
    assert arch_tokens("Kernels_gfx90a-xnack+.co") == ["gfx90a:xnack+"]
    assert arch_tokens("libMIOpenCKfoo_gfx950.so") == ["gfx950"]
    assert arch_tokens("TensileLibrary_fallback.dat") == []
    assert TargetId("gfx942", True, False).__str__() == "gfx942:sramecc+:xnack-"


def test_the_entry_chosen_is_comgrs_first_compatible_one():
    """comgr's lookUpCodeObject gives each query the first compatible entry in file order, and CLR
    prefers the native query's entry to the generic's: no preference for the entry that spells more
    features (a gfx90a entry before gfx90a:xnack- is what an xnack- device gets)."""
    agent = resolve_required("gfx90a:xnack-").agent
    assert choose_entry(["gfx90a", "gfx90a:xnack-"], agent) == (0, MatchKind.NATIVE)
    assert choose_entry(["gfx90a:xnack+", "gfx90a"], agent) == (1, MatchKind.NATIVE)
    assert choose_entry([None, "gfx9-4-generic", "gfx942"], resolve_required("gfx942").agent) == (2, MatchKind.NATIVE)
    assert choose_entry(["amdgcnspirv", "gfx9-4-generic"], resolve_required("gfx950").agent) == (1, MatchKind.GENERIC)


def test_a_v2_code_object_is_told_apart_from_an_unknown_processor(tmp_path):
    """Code object V2 (EI_ABIVERSION 0) names its ISA in a note and leaves EF_AMDGPU_MACH 0, as
    ROCr's blit kernels in libhsa-runtime64 do: ARCH006 says so instead of 'not a known processor'."""
    from support.gpu.arch_writers import amdgpu_header, scan_path

    old = tmp_path / "blit.co"
    old.write_bytes(amdgpu_header(0x000, abi_version=0) + bytes(192))
    unknown = tmp_path / "future.co"
    unknown.write_bytes(amdgpu_header(0x04D) + bytes(192))
    (found,) = [f.message for f in scan_path(old).findings if f.rule == "ARCH006"]
    assert "an old code object (V2 or older) names its GPU in a note" in found, found
    (found,) = [f.message for f in scan_path(unknown).findings if f.rule == "ARCH006"]
    assert "EF_AMDGPU_MACH 0x4d in its ELF header is no GPU rocm-audit knows" in found, found
