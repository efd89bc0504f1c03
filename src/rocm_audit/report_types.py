"""The JSON report's shapes as TypedDicts: one per ``$defs`` entry of schemas/report-v1.json, one
per inline object of a section, and ``Sections``, what a command hands to the renderers.

The builders (dedup/report.py, gpu/verify.py, llvm/clashes.py, audit/pruning.py, image/,
output/report.py) return them and the renderers (output/text_sections.py, output/markdown.py)
read them, so mypy checks every key on both sides. tests/test_report_types.py holds each one
against the schema: a field renamed on one side only fails there. Enumerated strings stay
``str`` here (the schema checks the values); fields of any JSON type are ``object``.
A field whose text is not UTF-8 gains a ``<field>_bytes_b64`` sibling in the encoder
(output/report.py ``to_json``), after these types.
"""

from __future__ import annotations

import sys
from typing import TypedDict

if sys.version_info >= (3, 11):  # 3.10: the annotations stay text (PEP 563) and nothing reads them at run time
    from typing import NotRequired

# ---------------------------------------------------------------------------------------------
# The header and the summary


class Tool(TypedDict):
    name: str
    version: str


class SeverityCounts(TypedDict):
    total: int
    error: int
    warning: int
    info: int


class SuppressedSource(TypedDict):
    source: str
    kind: str  # rules | baseline
    count: int


class SuppressedCounts(TypedDict):
    total: int
    rules: int
    baseline: int
    by_source: list[SuppressedSource]


class Summary(TypedDict):
    findings: SeverityCounts
    by_family: dict[str, SeverityCounts]
    suppressed: SuppressedCounts
    checks: NotRequired[list[str]]
    files_scanned: NotRequired[int]
    elapsed_s: NotRequired[float]


class CheckSummary(TypedDict):
    """What ``check`` adds to the summary (output/report.py build_report merges it)."""

    checks: list[str]
    files_scanned: int
    elapsed_s: float


class ShippedBy(TypedDict):
    name: str
    version: str
    report_to: str


class FindingRecord(TypedDict):
    rule: str
    severity: str
    path: str
    related_paths: list[str]
    message: str
    detail: NotRequired[str]
    data: dict[str, object]
    group: NotRequired[int]
    fingerprint: NotRequired[str]
    shipped_by: NotRequired[ShippedBy]


class Suppressed(TypedDict):
    rule: str
    path: str
    reason: str
    source: str


# ---------------------------------------------------------------------------------------------
# dedup


class DedupLink(TypedDict):
    path: str
    link_text: str
    hardlink: bool
    made: NotRequired[str]  # symlink | hardlink
    intact: NotRequired[bool]
    status: str  # planned | replaced | skipped | failed


class DedupGroupRecord(TypedDict):
    keeper: str
    duplicates: list[DedupLink]
    size: int
    reason: str  # identical-content | hardlink | mirrored


class IntactLinks(TypedDict):
    keeper: str
    paths: list[str]


class DedupSection(TypedDict):
    mode: str  # apply | dry-run | check
    groups: list[DedupGroupRecord]
    bytes_freed: int
    replaced: int
    skipped: int
    manifest: str | None
    verified: NotRequired[bool | None]
    shell_preview: NotRequired[list[str]]
    intact_links: NotRequired[list[IntactLinks]]
    files_scanned: NotRequired[int]
    bytes_compared: NotRequired[int]
    elapsed_s: NotRequired[float]


class RevertSection(TypedDict):
    manifests: list[str]
    restored: list[str]
    already_original: int
    relinked_by_rocm_sdk: NotRequired[list[str]]
    failed: int


# ---------------------------------------------------------------------------------------------
# verify-arch and scan --targets


class ArchTarget(TypedDict):
    target: str
    agent: str


class TargetsOrigin(TypedDict, total=False):
    kind: str
    variable: str
    history_index: int
    path: str
    value: str
    extra_targets: list[str]
    device_wheels: list[str]
    library_families: list[str]


class FoundVia(TypedDict):
    target: str
    source: str  # e_flags | bundle-id | kpack-toc | offload-binary | file-name
    container: str


class CarrierMatch(TypedDict):
    target: str
    agent: str
    how: str | None  # native | generic | spirv | jit, None when missing
    tus_without: list[int]


class EmbeddedImage(TypedDict):
    tu: int
    place: str


class CarrierRecord(TypedDict):
    path: str
    package: str | None
    kind: str
    containers: list[str]
    tu_count: int | None
    members: list[str]
    targets: list[str]
    found_via: list[FoundVia]
    matches: list[CarrierMatch]
    missing: list[str]
    embedded_images: NotRequired[list[EmbeddedImage]]
    shipped_by: NotRequired[ShippedBy]  # the distribution whose RECORD lists it


class CodeObjectFileRecord(TypedDict):
    path: str
    package: str | None
    containers: list[str]
    tu_count: int
    wrappers: int | None
    kpack: bool
    code_objects: int


class CodeObjectRecord(TypedDict):
    path: str
    container: str
    location: str
    file_offset: int | None
    size: int
    tu: int | None
    entry_id: str | None
    kind: str
    target: str | None
    target_source: str
    bundle_target: str | None
    code_object_version: int | None
    generic_version: int | None
    metadata_target: str | None
    kernels: int | None


# ---------------------------------------------------------------------------------------------
# llvm


class LlvmLibrary(TypedDict):
    path: str
    role: str  # exporter | registrant | private-copy | none | unknown
    soname: str | None
    version_node: str | None
    exported_cl_symbols: int
    imports_add_argument: bool
    has_initialisers: bool
    embeds_registry: bool | None
    symbolic: bool
    interposable_registry: bool | None
    nodelete: bool
    in_scan: bool
    device: int | None
    inode: int | None
    registers_at_load: NotRequired[bool | None]
    registration_path: NotRequired[str]
    registry_entry_points: NotRequired[dict[str, str]]


class LlvmProbe(TypedDict):
    mode: str
    outcome: str
    option: str | None
    returncode: int | None
    detail: str
    preload: list[str]
    steps: list[str]
    stderr_tail: str
    instances: int | None
    agrees: bool | None
    verdict: NotRequired[str]
    signal: NotRequired[str | None]
    step: NotRequired[str | None]
    isolation: NotRequired[str]


class LlvmPrediction(TypedDict):
    verdict: str  # abort | crash | hang | clean
    reason: str
    culprit: str | None
    other: str | None
    step: int | None
    symbols: list[str]


class LlvmOrder(TypedDict):
    first: str
    second: str
    modes: dict[str, LlvmPrediction]


class PairProbe(TypedDict):
    mode: str
    steps: list[str]
    verdict: str
    signal: str | None
    step: str | None
    detail: str
    option: str | None


class LlvmPair(TypedDict):
    paths: list[str]
    verdict: str
    hosts: dict[str, list[str]]
    arrives_through: list[str]
    orders: list[LlvmOrder]
    decided_by: str  # static | probe
    probes: list[PairProbe]


class PairJudged(TypedDict):
    """The static part of an llvm_pair (llvm/pairs.py), before the probes and who decided."""

    paths: list[str]
    verdict: str
    hosts: dict[str, list[str]]
    arrives_through: list[str]
    orders: list[LlvmOrder]


class ClashJudgement(TypedDict, total=False):
    """The optional llvm_clash fields of a judged clash (both orders, three modes)."""

    verdict: str
    decided_by: str  # static | probe
    arrives_through: list[str]
    orders: list[LlvmOrder]


class LinkageFields(TypedDict, total=False):
    """The optional llvm_library fields, present when the linkage facts were read."""

    registers_at_load: bool | None
    registration_path: str
    registry_entry_points: dict[str, str]


class LlvmClash(TypedDict):
    paths: list[str]
    reason: str
    severity: str  # high | medium | low
    mode: str
    confirmed: bool | None
    option: str | None
    fix: str
    soname: str | None
    version_node: str | None
    identical: bool | None
    via: list[str]
    via_count: int
    predictions: dict[str, str]
    probes: list[LlvmProbe]
    verdict: NotRequired[str]
    decided_by: NotRequired[str]
    arrives_through: NotRequired[list[str]]
    orders: NotRequired[list[LlvmOrder]]


class ClosureObject(TypedDict):
    path: str
    request: str
    via: str
    needed_by: str | None
    depth: int
    soname: str | None
    device: int
    inode: int
    role: str


class ClosureMissing(TypedDict):
    needed_by: str
    name: str
    detail: str


class LoadClosure(TypedDict):
    root: str
    objects: list[ClosureObject]
    missing: list[ClosureMissing]
    truncated: bool


class ProbeInterpreter(TypedDict):
    executable: str
    version: str
    chosen_by: str  # --python | owner | rocm-audit
    reason: str


# ---------------------------------------------------------------------------------------------
# prune


class PruneTotals(TypedDict):
    device_bytes: int
    compressed_bytes: int
    inflated_bytes: int
    unused_bytes: int
    removable_bytes: int
    unused_in_host_libraries_bytes: int
    # of those, in fat binaries `prune --fatbins` would slim: an estimate from the entry tables
    fatbins_estimate_bytes: int


class PruneWeightRow(TypedDict):
    distribution: str
    target: str
    bytes: int
    compressed_bytes: int
    inflated_bytes: int
    needed: bool
    unused_bytes: int
    removable_bytes: int


class PruneRemoval(TypedDict):
    kind: str
    path: str
    arches: list[str]
    distribution: str | None
    version: str | None
    files: list[str]
    devel_links: list[str]
    bytes: int
    status: str  # planned | removed | skipped | failed
    reason: str


class KeptUnit(TypedDict):
    path: str
    arches: list[str]
    reason: str


class KeptDistribution(TypedDict):
    distribution: str
    source: str  # "--keep-dist NAME" or "keep_dist in FILE:LINE"


class PruneSection(TypedDict):
    mode: str  # apply | dry-run | check
    targets: list[str]
    targets_source: str
    totals: PruneTotals
    weight: list[PruneWeightRow]
    removals: list[PruneRemoval]
    kept_units: list[KeptUnit]
    removed: int  # whole units removed (an applying run)
    slimmed: int  # libraries --fatbins slimmed (an applying run)
    slimmed_bytes: int  # device code those libraries lost (zeroed bytes included)
    bytes_freed: int  # on disk: the removed units and what the slimmed libraries shrank by
    manifest: str | None  # the revert journal written, None when none was
    backup: str | None
    revert_command: str | None  # the command that undoes the run, None when it changed nothing
    nothing_done: str  # an applying run that changed nothing: why; else empty
    shell_preview: list[str]
    elapsed_s: float
    # per distribution: device code for no kept target in fat binaries of host libraries, which
    # `prune --fatbins` would remove (from the entry tables, no recompression), largest first
    fatbins_estimate: list[FatbinDistribution]
    # the installed distributions left whole (--keep-dist, [policy.prune] keep_dist) and where each was named
    kept_whole: list[KeptDistribution]


class RevertedDistribution(TypedDict):
    distribution: str
    version: str


class PruneRevertSection(TypedDict):
    restored: list[str]
    original: list[str]
    reinstall: list[str]  # the commands that write back what no backup holds
    uninstalled: list[RevertedDistribution]  # pruned, then uninstalled: nothing restored for them
    nothing_done: str  # why nothing was restored; empty when something was, or something is left to do
    backups_done: list[str]  # backup directories no longer needed: everything is back


class FatbinLibraryRecord(TypedDict):
    """One host library ``prune --fatbins`` looked at."""

    path: str
    distribution: str | None
    bytes: int  # device code the slimmed bundles no longer hold
    removed_targets: list[str]
    status: str  # planned | slimmed | unchanged | skipped | failed
    reason: str
    layout: str  # truncated | split | zeroed (prune/fatbins/layout.py); "" when not slimmed
    file_bytes: int  # bytes the file itself shrinks by (0 when zeroed)
    comgr: str  # comgr's lookup: agreed | not available | knows none of the kept targets | not run: ... | ""


class FatbinDistribution(TypedDict):
    distribution: str
    bytes: int


class PruneFatbinsSection(TypedDict):
    """``prune --fatbins``: fat binaries slimmed; the files shrink (or keep their size, zeroed)."""

    mode: str
    bytes: int
    slimmed: int
    by_distribution: list[FatbinDistribution]
    libraries: list[FatbinLibraryRecord]


# ---------------------------------------------------------------------------------------------
# image


class ImageSource(TypedDict):
    kind: str  # archive | daemon | registry
    format: str
    platform: NotRequired[str]  # registry: the platform picked from an index (os/arch[/variant])
    path: NotRequired[str | None]
    ref: NotRequired[str]
    image_id: NotRequired[str]
    tags: NotRequired[list[str]]
    manifest_digest: NotRequired[str | None]


class ImageLayer(TypedDict):
    index: int
    name: str
    entries: int
    files: int
    file_bytes: int
    whiteouts: int
    opaque_dirs: int
    refused: int
    step: NotRequired[str]  # the build step that wrote it (``RUN pip install ...``), from the history


class PruneLayer(TypedDict):
    layer: int
    name: str
    device_bytes: int
    hidden_device_bytes: int  # of device_bytes, in files a later layer hid (still in this layer)
    unused_bytes: int
    removable_bytes: int
    fatbins_estimate_bytes: int  # device code for other GPUs in fat binaries prune --fatbins would slim


class WasteCopy(TypedDict):
    layer: int
    path: str
    visible: bool
    hardlinks: list[str]


class ImageWasteGroup(TypedDict):
    size: int
    blake2b: str
    wasted_bytes: int
    scope: str  # same-layer | cross-layer
    layers: list[int]
    fix: str
    copies: list[WasteCopy]


class ImageWaste(TypedDict):
    wasted_bytes: int
    listed_min_size_bytes: int
    later_run_dedup_shrinks_image: bool
    same_layer_bytes: int
    cross_layer_bytes: int
    stored_again_bytes: int  # members a later member of the same name in the same layer replaced
    groups: list[ImageWasteGroup]


class ImageSection(TypedDict):
    source: ImageSource
    layers: list[ImageLayer]
    audited_paths: list[str]
    extracted: str
    bytes_read: int
    checks_elapsed_s: NotRequired[float]  # the checks' own time; summary.elapsed_s is the whole run's
    prune_layers: NotRequired[list[PruneLayer]]
    waste: NotRequired[ImageWaste]


# ---------------------------------------------------------------------------------------------
# rules


class RuleRecord(TypedDict):
    id: str
    title: str
    severity: str
    severity_source: str
    defined_in: str
    rationale: str
    fix: str
    graded: NotRequired[str]  # when a finding takes another severity than the rule's (LLVM clashes)


class PolicySetting(TypedDict):
    area: str
    key: str
    value: object
    source: str


class IgnoreRecord(TypedDict):
    rule: str
    path: str
    reason: str
    source: str
    distribution: NotRequired[str]


# ---------------------------------------------------------------------------------------------
# Everything a command reports besides the header, and the whole document


class Sections(TypedDict, total=False):
    """``CommandOutcome.sections``: what a command reports besides the findings (every key optional;
    which ones a command fills is its contract, checked by the schema)."""

    sdk_trees: list[str]
    image: ImageSection
    libraries: list[LlvmLibrary]
    clashes: list[LlvmClash]
    pairs: list[LlvmPair]
    judged_pairs: int
    probe_interpreter: ProbeInterpreter
    closures: list[LoadClosure]
    summary: CheckSummary
    dedup: DedupSection
    prune: PruneSection
    prune_revert: PruneRevertSection
    prune_fatbins: PruneFatbinsSection
    rules: list[RuleRecord]
    policy: list[PolicySetting]
    ignores: list[IgnoreRecord]
    revert: RevertSection
    targets: list[ArchTarget]
    targets_source: str
    targets_origin: TargetsOrigin
    carriers: list[CarrierRecord]
    code_object_files: list[CodeObjectFileRecord]
    code_objects: list[CodeObjectRecord]
    file_kinds: dict[str, int]


class Report(TypedDict):
    """The whole JSON document (output/report.py build_report)."""

    schema_version: int
    tool: Tool
    command: str
    inputs: list[str]
    sdk_trees: NotRequired[list[str]]
    findings: list[FindingRecord]
    image: NotRequired[ImageSection]
    suppressed: NotRequired[list[Suppressed]]
    libraries: NotRequired[list[LlvmLibrary]]
    clashes: NotRequired[list[LlvmClash]]
    pairs: NotRequired[list[LlvmPair]]
    judged_pairs: NotRequired[int]
    probe_interpreter: NotRequired[ProbeInterpreter]
    closures: NotRequired[list[LoadClosure]]
    summary: Summary
    dedup: NotRequired[DedupSection]
    prune: NotRequired[PruneSection]
    prune_revert: NotRequired[PruneRevertSection]
    prune_fatbins: NotRequired[PruneFatbinsSection]
    rules: NotRequired[list[RuleRecord]]
    policy: NotRequired[list[PolicySetting]]
    ignores: NotRequired[list[IgnoreRecord]]
    revert: NotRequired[RevertSection]
    targets: NotRequired[list[ArchTarget]]
    targets_source: NotRequired[str]
    targets_origin: NotRequired[TargetsOrigin]
    carriers: NotRequired[list[CarrierRecord]]
    code_object_files: NotRequired[list[CodeObjectFileRecord]]
    code_objects: NotRequired[list[CodeObjectRecord]]
    file_kinds: NotRequired[dict[str, int]]
