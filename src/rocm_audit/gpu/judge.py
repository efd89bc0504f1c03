"""Judging carriers against the requested targets, as the HIP runtime selects code for a device:
per translation unit, by the name each entry's id gives, then by its ELF header (formats.md 2.9).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from rocm_audit.findings import Finding, make_finding
from rocm_audit.formats.offload_bundle import comgr_selectable, parse_entry_id
from rocm_audit.gpu.carriers import Carrier, named_target
from rocm_audit.gpu.codeobjects import CodeObject
from rocm_audit.gpu.requested import in_family
from rocm_audit.tree.targets import (
    SPIRV_PROCESSOR,
    MatchKind,
    RequiredTarget,
    TargetId,
    best_match,
    choose_entry,
    match_code_object,
    parse_target_id,
    processor_sort_key,
)


def _entry_match(obj: CodeObject, agent: TargetId) -> MatchKind | None:
    """How one entry serves ``agent`` by what its ELF header or file name says (tree/targets.py's
    ``match_code_object``, the rule prune's ``serves_kept`` asks too)."""
    if obj.target is None:
        return None
    if obj.target_source == "e_flags" and obj.code_object_version is None:
        # The header was read and its OS ABI is not HSA (PAL, Mesa3D): CLR takes an ELF image only
        # with ELFOSABI_AMDGPU_HSA (hip_fatbin.cpp IsCodeObjectElf), and so does ROCr's loader.
        return None
    code = parse_target_id(obj.target)
    if code is None:
        return None
    return match_code_object(
        code,
        agent,
        code_object_version=obj.code_object_version,
        generic_version=obj.generic_version,
    )


def unselectable(obj: CodeObject) -> bool:
    """An entry of an uncompressed bundle whose id the HIP runtime's lookup (comgr) never matches,
    whatever the device (``offload_bundle.comgr_selectable``): ROCm 4.0's 3-field
    ``hip-amdgcn-amd-amdhsa-gfxN``. CCOB entries are unbundled by comgr's bundler instead."""
    if obj.container != "offload-bundle" or obj.entry_id is None or obj.kind == "host":
        return False
    return _unmatched_id(obj.entry_id)


@functools.lru_cache(maxsize=4096)
def _unmatched_id(entry_id: str) -> bool:
    """Parsed once per id: tu_match asks for every entry, once per target."""
    return not comgr_selectable(parse_entry_id(entry_id))


def tu_match(objects: list[CodeObject], agent: TargetId) -> MatchKind | None:
    """How one translation unit serves ``agent``, as the runtime decides (``selected_entries``):
    the best kind among the entries it would load."""
    return best_match([kind for _, kind in selected_entries(objects, agent)])


def selected_entries(objects: list[CodeObject], agent: TargetId) -> list[tuple[CodeObject, MatchKind]]:
    """The entries of one translation unit the runtime would load on ``agent``, and how: it
    selects an entry by the target its id names (``choose_entry``); the loader then takes it only
    if the code object's own ELF header, when read, agrees (features, code-object version of
    generic entries). Entries whose id names no target (raw ELFs, database files) count by what
    their header or name says; an entry comgr's lookup never selects (a 3-field bundle id) does not
    count at all. prune keeps every entry this selects for any device a kept target names
    (tests/prune/test_prune_target_rule.py)."""
    objects = [obj for obj in objects if not unselectable(obj)]
    named = [named_target(obj) for obj in objects]
    found: list[tuple[CodeObject, MatchKind]] = []
    for obj, name in zip(objects, named, strict=True):
        if name is None and (kind := _entry_match(obj, agent)) is not None:
            found.append((obj, kind))
    # CLR asks kpack for the device's own name and its generic only (hip_fatbin.cpp
    # ExtractKpackBinary): a SPIR-V kernel in an archive is never looked up.
    from_kpack = [obj.container == "kpack" for obj in objects]
    named = [None if kpack and name == SPIRV_PROCESSOR else name for name, kpack in zip(named, from_kpack, strict=True)]
    chosen = choose_entry(named, agent)
    if chosen is not None:
        index, kind = chosen
        obj = objects[index]
        if obj.target_source != "e_flags" or _entry_match(obj, agent) is not None:
            found.append((obj, kind))
    return found


def judge_all(carriers: list[Carrier], required: list[RequiredTarget]) -> list[Finding]:
    """Judge every carrier. Co-installed per-family trees: a target that some installed family
    covers is asked only of that family's carriers; a target no family covers is asked of all of
    them (nothing would serve it: each carrier says so)."""
    families = {c.family for c in carriers if c.family}
    covered = {t.spelled for t in required if any(in_family(t.agent.processor, f) for f in families)}
    findings: list[Finding] = []
    for carrier in carriers:
        family = carrier.family
        asked = required
        if family is not None:
            asked = [t for t in required if t.spelled not in covered or in_family(t.agent.processor, family)]
        findings.extend(judge(carrier, asked))
    return findings


def judge(carrier: Carrier, required: list[RequiredTarget]) -> list[Finding]:
    """Fill ``matches``/``missing``; return ARCH001/ARCH002/ARCH008/ARCH009 findings."""
    findings: list[Finding] = []
    spirv_only: list[str] = []
    compiled: list[tuple[str, int]] = []  # Triton kernels compiled at first use: (target, how many)
    for target in sorted(required, key=lambda t: processor_sort_key(t.spelled)):  # gfx942 before gfx1100
        per_tu = [tu_match(tu, target.agent) for tu in carrier.tus]
        tus_without = [index for index, how in enumerate(per_tu) if how is None]
        order = [MatchKind.NATIVE, MatchKind.GENERIC, MatchKind.SPIRV]
        how = None if tus_without else max(per_tu, key=lambda k: order.index(k) if k else -1)
        jit = how is None and carrier.kind == "triton-kernels"
        carrier.matches.append(
            {
                "target": target.spelled,
                "agent": str(target.agent),
                "how": "jit" if jit else how.value if how else None,
                "tus_without": tus_without,
            }
        )
        if jit:
            compiled.append((target.spelled, len(tus_without)))
        elif how is None:
            carrier.missing.append(target.spelled)
        elif how is MatchKind.SPIRV:
            spirv_only.append(target.spelled)
    if spirv_only:  # one finding per carrier; "target" (the first) is the schema-v1 field
        findings.append(
            make_finding(
                "ARCH002",
                carrier.path,
                f"{', '.join(spirv_only)} {'is' if len(spirv_only) == 1 else 'are'} served only by SPIR-V "
                "(JIT-compiled at load time)",
                data={"target": spirv_only[0], "targets": spirv_only},
            )
        )
    if compiled:
        counts = "; ".join(f"{target}: {count} of {len(carrier.tus)}" for target, count in compiled)
        findings.append(
            make_finding(
                "ARCH009",
                carrier.path,
                f"Triton kernels built for other GPUs only, compiled at first use there ({counts}); "
                f"found: {', '.join(carrier.targets()) or 'none'}",
                data={"targets": [t for t, _ in compiled], "kernels": dict(compiled), "of": len(carrier.tus)},
            )
        )
    if carrier.missing:
        rule = (
            "ARCH008"
            if carrier.kind.startswith("kernel-database") or carrier.kind in ("per-arch-files", "per-arch-folders")
            else "ARCH001"
        )
        lacking = sorted({i for m in carrier.matches if m["how"] is None for i in m["tus_without"]})
        detail, data = _lacking_units(carrier, lacking)
        found = ", ".join(carrier.targets()) or "none"
        if any(unselectable(obj) for obj in carrier.code_objects):
            found += (
                " (uncompressed bundle ids the HIP runtime's lookup never matches, such as the 3-field"
                " hip-amdgcn-amd-amdhsa-<gfx> of ROCm 4.0's clang: those entries load on no device)"
            )
            data["unmatched_ids"] = sorted(
                {obj.entry_id.rstrip("\0") for obj in carrier.code_objects if obj.entry_id and unselectable(obj)}
            )
        findings.append(
            make_finding(
                rule,
                carrier.path,
                f"no code object for {', '.join(carrier.missing)}{detail}; found: {found}",
                data={"missing": list(carrier.missing), "targets": carrier.targets(), **data},
            )
        )
    return findings


def _lacking_units(carrier: Carrier, lacking: list[int]) -> tuple[str, dict[str, Any]]:
    """The text and data that say which units lack a target: translation units by number, images
    embedded in data sections by their place, so that one of tensorflow's 1,149 can be found. One
    finding per carrier, however many units lack it (as for TUs)."""
    images = carrier.unit_places
    tus = [i for i in lacking if i not in images]
    places = [images[i] for i in lacking if i in images]
    tu_total = len(carrier.tus) - len(images)
    parts = []
    if tus and (tu_total > 1 or images):
        parts.append(
            f"none of its {tu_total} translation units has it"
            if len(tus) == tu_total
            else f"translation units without it: {_compact(tus)} of {tu_total}"
        )
    if places:
        parts.append(f"embedded images without it: {_compact(places)} of {len(images)}")  # where they are
    detail = f" ({'; '.join(parts)})" if parts else ""
    return detail, ({"images_without": places} if images else {})


def _compact(numbers: Sequence[int | str], limit: int = 12) -> str:
    text = ", ".join(str(n) for n in numbers[:limit])
    return text + (f", ... ({len(numbers)} in all)" if len(numbers) > limit else "")
