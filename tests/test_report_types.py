"""The TypedDicts of rocm_audit/report_types.py against the shipped JSON Schema: each one's keys
are the properties of its schema object and its required keys the schema's ``required``, so a
field renamed, added or dropped on one side only fails here."""

from __future__ import annotations

import sys
import typing

import pytest

if sys.version_info < (3, 11):
    pytest.skip("typing.NotRequired and Required came with Python 3.11", allow_module_level=True)

from typing import NotRequired, Required, get_origin, get_type_hints, is_typeddict

from rocm_audit import report_types as rt
from rocm_audit.output.report import load_schema

# Each TypedDict and the schema object it describes (a JSON pointer into report-v1.json).
PLACES: dict[type, str] = {
    rt.Report: "",
    rt.Tool: "/properties/tool",
    rt.SeverityCounts: "/$defs/severity_counts",
    rt.Summary: "/$defs/summary",
    rt.SuppressedCounts: "/$defs/summary/properties/suppressed",
    rt.SuppressedSource: "/$defs/summary/properties/suppressed/properties/by_source/items",
    rt.FindingRecord: "/$defs/finding",
    rt.ShippedBy: "/$defs/shipped_by",
    rt.Suppressed: "/properties/suppressed/items",
    rt.DedupSection: "/$defs/dedup",
    rt.DedupGroupRecord: "/$defs/dedup_group",
    rt.DedupLink: "/$defs/dedup_group/properties/duplicates/items",
    rt.IntactLinks: "/$defs/dedup/properties/intact_links/items",
    rt.RevertSection: "/$defs/revert",
    rt.ArchTarget: "/$defs/arch_target",
    rt.TargetsOrigin: "/properties/targets_origin",
    rt.CarrierRecord: "/$defs/carrier",
    rt.FoundVia: "/$defs/carrier/properties/found_via/items",
    rt.CarrierMatch: "/$defs/carrier/properties/matches/items",
    rt.EmbeddedImage: "/$defs/carrier/properties/embedded_images/items",
    rt.CodeObjectFileRecord: "/$defs/code_object_file",
    rt.CodeObjectRecord: "/$defs/code_object",
    rt.LlvmLibrary: "/$defs/llvm_library",
    rt.LlvmProbe: "/$defs/llvm_probe",
    rt.LlvmPrediction: "/$defs/llvm_prediction",
    rt.LlvmOrder: "/$defs/llvm_order",
    rt.LlvmPair: "/$defs/llvm_pair",
    rt.PairProbe: "/$defs/llvm_pair/properties/probes/items",
    rt.LlvmClash: "/$defs/llvm_clash",
    rt.LoadClosure: "/$defs/load_closure",
    rt.ClosureObject: "/$defs/load_closure/properties/objects/items",
    rt.ClosureMissing: "/$defs/load_closure/properties/missing/items",
    rt.ProbeInterpreter: "/properties/probe_interpreter",
    rt.PruneSection: "/$defs/prune",
    rt.PruneTotals: "/$defs/prune/properties/totals",
    rt.PruneWeightRow: "/$defs/prune_weight_row",
    rt.PruneRemoval: "/$defs/prune_removal",
    rt.KeptUnit: "/$defs/prune/properties/kept_units/items",
    rt.KeptDistribution: "/$defs/prune/properties/kept_whole/items",
    rt.PruneRevertSection: "/$defs/prune_revert",
    rt.RevertedDistribution: "/$defs/prune_revert/properties/uninstalled/items",
    rt.PruneFatbinsSection: "/$defs/prune_fatbins",
    rt.FatbinDistribution: "/$defs/prune_fatbins/properties/by_distribution/items",
    rt.FatbinLibraryRecord: "/$defs/prune_fatbins/properties/libraries/items",
    rt.ImageSection: "/$defs/image",
    rt.ImageSource: "/$defs/image/properties/source",
    rt.ImageLayer: "/$defs/image_layer",
    rt.PruneLayer: "/$defs/image/properties/prune_layers/items",
    rt.ImageWaste: "/$defs/image/properties/waste",
    rt.ImageWasteGroup: "/$defs/image_waste_group",
    rt.WasteCopy: "/$defs/image_waste_group/properties/copies/items",
    rt.RuleRecord: "/properties/rules/items",
    rt.PolicySetting: "/properties/policy/items",
    rt.IgnoreRecord: "/properties/ignores/items",
}

# Shapes that are no schema object of their own: what a command hands over for the top level
# (Sections, every key optional) and check's part of the summary (merged by build_report).
DERIVED = {rt.Sections: "", rt.CheckSummary: "/$defs/summary"}

# Parts of a schema object that a builder makes apart and merges: each part's keys, and whether
# they are all required (True) or all optional (False) there.
PARTS: dict[type, tuple[str, set[str], bool]] = {
    rt.PairJudged: (
        "/$defs/llvm_pair",
        {"paths", "verdict", "hosts", "arrives_through", "orders"},
        True,
    ),
    rt.ClashJudgement: ("/$defs/llvm_clash", {"verdict", "decided_by", "arrives_through", "orders"}, False),
    rt.LinkageFields: (
        "/$defs/llvm_library",
        {"registers_at_load", "registration_path", "registry_entry_points"},
        False,
    ),
}


def _typeddicts() -> list[type]:
    return [v for v in vars(rt).values() if isinstance(v, type) and is_typeddict(v) and v.__module__ == rt.__name__]


def _at(pointer: str) -> dict[str, typing.Any]:
    node: typing.Any = load_schema()
    for part in filter(None, pointer.split("/")):
        node = node[part]
    return node  # type: ignore[no-any-return]


def _keys(shape: type) -> tuple[set[str], set[str]]:
    """(all keys, required keys), read from the annotations: ``__required_keys__`` misses
    NotRequired written as text (PEP 563) before Python 3.13."""
    hints = get_type_hints(shape, include_extras=True)
    total = getattr(shape, "__total__", True)
    required = set()
    for name, hint in hints.items():
        origin = get_origin(hint)
        if origin is Required or (total and origin is not NotRequired):
            required.add(name)
    return set(hints), required


def test_every_typeddict_is_held_against_the_schema() -> None:
    assert set(_typeddicts()) == set(PLACES) | set(DERIVED) | set(PARTS)


@pytest.mark.parametrize("shape", list(PARTS), ids=lambda t: t.__name__)
def test_parts_are_fields_of_their_schema_object(shape: type) -> None:
    pointer, expected, all_required = PARTS[shape]
    place = _at(pointer)
    keys, required = _keys(shape)
    assert keys == expected
    assert keys <= set(place["properties"])
    in_schema = keys & set(place["required"])
    assert (in_schema, required) == ((keys, keys) if all_required else (set(), set()))


@pytest.mark.parametrize("shape", list(PLACES), ids=lambda t: t.__name__)
def test_keys_and_required_keys_equal_the_schema(shape: type) -> None:
    place = _at(PLACES[shape])
    keys, required = _keys(shape)
    assert keys == set(place["properties"])
    assert required == set(place.get("required", []))


def test_every_object_of_the_schema_has_its_typeddict() -> None:
    """Each $defs object and each object-valued top-level field is described by one TypedDict."""
    schema = load_schema()
    places = set(PLACES.values())
    objects = {f"/$defs/{name}" for name, node in schema["$defs"].items() if "properties" in node}
    for name, node in schema["properties"].items():
        items = node.get("items", {})
        if "properties" in node:
            objects.add(f"/properties/{name}")
        elif "properties" in items:
            objects.add(f"/properties/{name}/items")
    assert objects <= places, sorted(objects - places)


def test_sections_are_the_top_level_fields_a_command_fills() -> None:
    keys, required = _keys(rt.Sections)
    header = {"schema_version", "tool", "command", "inputs", "findings", "suppressed"}
    assert keys == set(load_schema()["properties"]) - header
    assert required == set()
    # check's summary part: the optional fields of the summary, each given
    summary = _at("/$defs/summary")
    keys, required = _keys(rt.CheckSummary)
    assert keys == required == set(summary["properties"]) - set(summary["required"])


def test_a_renamed_field_is_caught() -> None:
    """The comparison sees a renamed key (the check itself can fail)."""

    class Renamed(typing.TypedDict):
        target: str
        agents: str

    keys, _ = _keys(Renamed)
    assert keys != set(_at(PLACES[rt.ArchTarget])["properties"])
