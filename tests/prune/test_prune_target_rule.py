"""One target-compatibility rule for verify-arch and prune (tree/targets.py).

verify-arch selects, per translation unit, the entries the HIP runtime would load on a device
(gpu/judge.py ``selected_entries``); prune keeps code that some device a kept target names could
load (prune/plan.py ``serves_any`` over tree/targets.py ``serves_kept``). If the two drift, prune
removes device code verify-arch says is needed. Over generated bundles and kept targets:

- everything verify-arch selects for a kept target, for every setting of the features the user
  left open (a bare gfx942 is also run with HSA_XNACK=1), prune keeps;
- prune keeps more only where it means to: names it cannot parse, processors this release does not
  know, family names, a feature the kept processor does not have, and entries that verify-arch
  would select if the bundle held nothing better (choose_entry picks one entry per device).

The devices are built from fully spelled targets through ``resolve_required`` (what verify-arch
judges), not through ``agents_of``, so the test does not take prune's word for what a kept target
names.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocm_audit.formats.amdgpu_elf import FEATURES, supported_features
from rocm_audit.gpu.codeobjects import CodeObject
from rocm_audit.gpu.judge import selected_entries
from rocm_audit.prune.plan import Kept, serves_any
from rocm_audit.tree.targets import (
    GENERIC_OF,
    GENERIC_PROCESSORS,
    KNOWN_PROCESSORS,
    SPIRV_PROCESSOR,
    TargetId,
    is_family_name,
    kept_target,
    parse_target_id,
    resolve_required,
)

RULE = settings(max_examples=600, deadline=None, derandomize=True)

PROCESSORS = sorted(KNOWN_PROCESSORS)
GENERICS = sorted(GENERIC_PROCESSORS)
UNKNOWN = ["gfx1299", "gfx9999", "gfx1500"]  # names the processor table does not hold
FAMILIES = ["gfx11xx", "gfx110x", "gfx94x", "gfx9xx", "gfx12xx"]  # AOTriton's amd-<family> folders


def _spell(processor: str, settings_by_feature: dict[str, bool | None]) -> str:
    text = processor
    for name in FEATURES:
        value = settings_by_feature.get(name)
        if value is not None:
            text += f":{name}{'+' if value else '-'}"
    return text


# Any setting of either feature, whether or not the processor has it: bundle ids are text.
FEATURE_SETTINGS = st.fixed_dictionaries({name: st.sampled_from([None, True, False]) for name in FEATURES})


def code_targets(near: str) -> st.SearchStrategy[str]:
    """Target names an entry's id or header may give: any processor, generic or unknown name, and
    SPIR-V, with the kept processor and its generic drawn as often as all the others together (a
    random processor is rarely the one kept)."""
    related = [near] + ([GENERIC_OF[near]] if near in GENERIC_OF else [])
    return st.one_of(
        st.builds(_spell, st.sampled_from(related), FEATURE_SETTINGS),
        st.builds(_spell, st.sampled_from(PROCESSORS + GENERICS + UNKNOWN), FEATURE_SETTINGS),
        st.just(SPIRV_PROCESSOR),
    )


@st.composite
def device_entry(draw: st.DrawFn, near: str) -> CodeObject:
    """One device entry of a bundle, CCOB or kpack TOC: the target its id names and, when its ELF
    header was read, what the header says (code-object version, generic version, its own target,
    which a broken bundle may give differently from its id)."""
    container = draw(st.sampled_from(["offload-bundle", "ccob", "kpack"]))
    named = draw(code_targets(near))
    entry_id = named if container == "kpack" else f"hipv4-amdgcn-amd-amdhsa--{named}"
    if not draw(st.booleans()):  # not read: the id is all there is
        source = "kpack-toc" if container == "kpack" else "bundle-id"
        return CodeObject(container, "entry", None, 4096, 0, entry_id, "hipv4", named, source, named)
    cov = draw(st.sampled_from([4, 5, 6]))
    generic = draw(st.sampled_from([None, 0, 1, 2])) if cov >= 6 else None
    header = draw(st.one_of(st.just(named), code_targets(near)))
    return CodeObject(container, "entry", None, 4096, 0, entry_id, "hipv4", header, "e_flags", named, cov, generic)


HOST_ENTRY = CodeObject(
    "offload-bundle", "entry", None, 64, 0, "host-x86_64-unknown-linux-gnu-", "host", None, "none", None
)


@st.composite
def bundle(draw: st.DrawFn, near: str) -> list[CodeObject]:
    """The entries of one translation unit, in file order, with or without a host entry."""
    entries = draw(st.lists(device_entry(near), min_size=1, max_size=8))
    return ([HOST_ENTRY] if draw(st.booleans()) else []) + entries


@st.composite
def database_unit(draw: st.DrawFn, near: str) -> list[CodeObject]:
    """A kernel database unit (Tensile, AOTriton): files whose name gives the arch, families too."""
    names = draw(
        st.lists(
            st.one_of(
                st.sampled_from(FAMILIES + [near[:-1] + "x", near[:-2] + "xx"]),
                st.builds(_spell, st.sampled_from([near, *PROCESSORS]), FEATURE_SETTINGS),
            ),
            min_size=1,
            max_size=6,
        )
    )
    return [
        CodeObject("database:aotriton", name, None, 4096, None, None, "device", name, "file-name", name)
        for name in names
    ]


# Kept processors that have a generic family or features are where the rules can differ: drawn
# twice as often as the others.
INTERESTING = [p for p in PROCESSORS if p in GENERIC_OF or supported_features(p)]


@st.composite
def kept_spelling(draw: st.DrawFn) -> str:
    """A target a user asks prune to keep: a processor, with some of its features spelled."""
    processor = draw(st.sampled_from(INTERESTING) if draw(st.integers(0, 2)) else st.sampled_from(PROCESSORS))
    values = {name: draw(st.sampled_from([None, True, False])) for name in supported_features(processor)}
    return _spell(processor, values)


@st.composite
def case(draw: st.DrawFn) -> tuple[list[CodeObject], str]:
    """A unit of device code and a kept target."""
    spelled = draw(kept_spelling())
    near = kept_target(spelled).processor
    unit = draw(database_unit(near)) if draw(st.integers(0, 3)) == 0 else draw(bundle(near))
    return unit, spelled


def _devices(spelled: str) -> list[TargetId]:
    """Every device a kept target names, as verify-arch reads a fully spelled target: each feature
    the user left open, and the processor has, set both ways."""
    given_target = kept_target(spelled)
    open_features = [f for f in supported_features(given_target.processor) if given_target.feature(f) is None]
    devices = []
    for values in itertools.product([True, False], repeat=len(open_features)):
        text = spelled + "".join(f":{f}{'+' if v else '-'}" for f, v in zip(open_features, values, strict=True))
        devices.append(resolve_required(text).agent)
    return devices


def _keeps(spelled: str, obj: CodeObject) -> bool:
    kept = [Kept(spelled, kept_target(spelled))]
    return serves_any(obj.target, kept, cov=obj.code_object_version, gv=obj.generic_version)


@RULE
@pytest.mark.fuzz
@given(case())
def test_prune_keeps_every_entry_verify_arch_selects_for_a_kept_target(generated):
    unit, spelled = generated
    for device in _devices(spelled):
        for obj, how in selected_entries(unit, device):
            assert _keeps(spelled, obj), f"verify-arch loads {obj.target} ({how.value}) on {device}; prune drops it"


def _prune_means_to_keep(spelled: str, obj: CodeObject) -> bool:
    """The entries prune keeps on purpose beyond verify-arch's rule (tree/targets.serves_kept)."""
    target = obj.target or ""
    processor = target.split(":")[0]
    code = parse_target_id(target)
    if is_family_name(processor) or code is None:
        return True
    if code.processor not in KNOWN_PROCESSORS | GENERIC_PROCESSORS | {SPIRV_PROCESSOR}:
        return True
    if code.processor == SPIRV_PROCESSOR:
        return True  # SPIR-V is kept wherever it is, a kpack archive too (CLR never looks it up there)
    kept = kept_target(spelled)
    lacking = set(FEATURES) - set(supported_features(kept.processor))
    return any(code.feature(f) is not None and kept.feature(f) is None for f in lacking)


@RULE
@pytest.mark.fuzz
@given(case())
def test_prune_keeps_more_only_where_it_means_to(generated):
    """An entry prune keeps is one verify-arch would select on some device of the kept target if it
    were the unit's only entry (its id naming what its header says: prune reads the header), or one
    of prune's deliberate extras."""
    unit, spelled = generated
    devices = _devices(spelled)
    for obj in unit:
        if obj.kind == "host" or not _keeps(spelled, obj):
            continue
        alone = [dataclasses.replace(obj, bundle_target=obj.target)]
        as_only_entry = any(selected_entries(alone, device) for device in devices)
        assert as_only_entry or _prune_means_to_keep(spelled, obj), (
            f"prune keeps {obj.target} for {spelled}, but verify-arch loads it on none of {devices}"
        )


def test_a_bare_target_keeps_code_for_every_setting_verify_arch_reads_one_of():
    """The superset on a known case: verify-arch judges a bare gfx942 as sramecc+ xnack- and does
    not load xnack+ code there; prune keeps it, since an HSA_XNACK=1 process on that GPU loads it."""
    entry = CodeObject(
        "offload-bundle",
        "entry",
        None,
        1,
        0,
        "hipv4-amdgcn-amd-amdhsa--gfx942:xnack+",
        "hipv4",
        "gfx942:xnack+",
        "bundle-id",
        "gfx942:xnack+",
    )
    assert selected_entries([entry], resolve_required("gfx942").agent) == []
    assert selected_entries([entry], resolve_required("gfx942:xnack+").agent) != []
    assert _keeps("gfx942", entry)
    assert not _keeps("gfx942:xnack-", entry)
