"""Layer-aware waste: identical content under different paths, and which layer holds each copy.

A layer is immutable once built: a later `RUN rocm-audit dedup` adds a layer with a symlink but the
duplicate's bytes stay in the layer below (README, "Image layers"; peers.md 5). So the question
for each group of identical copies is where they were written:
- all copies in one layer: running `dedup` in the step that wrote that layer frees the bytes;
- copies in different layers: no single step can free them; the trees must be written in one
  step (the install, or one `COPY --from` of their common parent) with `dedup` in it.
A group can be both (a staging copy in one layer, the core and devel copies in the next): each
layer's extra copies are that layer's step to free (IMG007), one copy per further layer is not.
Copies a later layer deleted or replaced still count: they are still in the image.

Identity is BLAKE2b-256 of the content plus its size. Only copies that share their size with
another copy are hashed (image/digests.py): a file streamed past unwritten while it
streams, a written one read back from the merged view when a second copy of its size appears or
before a later layer deletes or replaces it. This is a report, it changes nothing, so a
cryptographic digest is enough (dedup itself byte-compares).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from rocm_audit.findings import Finding, make_finding
from rocm_audit.image.merge import Copy, MergeState
from rocm_audit.report_types import ImageWaste, WasteCopy
from rocm_audit.units import clip, size_text

# How much of a layer's build step a finding quotes (a RUN can hold a whole script).
STEP_WIDTH = 60
_LEGACY_MEMBER = re.compile(r"^[0-9a-f]{64}/layer\.tar$")

PACKAGE_DIRS = ("site-packages", "dist-packages")
SDK_MARKS = ("/_rocm_sdk_", "/_rocm_profiler")  # the platform trees of TheRock's wheels (tree/discovery.py)
REPORT_MIN_BYTES = 64 << 10  # groups of smaller files count in the total but are not listed


@dataclass(frozen=True, slots=True)
class WasteGroup:
    size: int
    digest: str
    copies: tuple[WasteCopy, ...]
    layers: tuple[int, ...]
    on_base: bool = False  # the image has more layers than one: layer 0 is its base image's

    @property
    def from_base(self) -> bool:
        """The group's first layer is the base image's (layer 0 of an image of several layers)."""
        return self.on_base and self.layers[0] == 0

    @property
    def wasted_bytes(self) -> int:
        return self.size * (len(self.copies) - 1)

    @property
    def same_layer(self) -> bool:
        return len(self.layers) == 1

    def copies_in(self, layer: int) -> list[WasteCopy]:
        return [c for c in self.copies if c["layer"] == layer]

    @property
    def same_layer_wasted(self) -> int:
        """What `dedup` in the steps that wrote the layers frees: every copy but one per layer."""
        return self.wasted_bytes - self.cross_layer_wasted

    @property
    def cross_layer_wasted(self) -> int:
        """One copy for each layer beyond the first: no single step can free these."""
        return self.size * (len(self.layers) - 1)

    @property
    def in_sdk(self) -> bool:
        """A copy lies in a ``_rocm_sdk_*`` tree: what `rocm-audit dedup` links."""
        return any(mark in c["path"] for mark in SDK_MARKS for c in self.copies)

    @property
    def tier(self) -> int:
        """Where the group ranks: SDK trees first, then site-packages, then base-OS files."""
        if self.in_sdk:
            return 0
        return 1 if any(f"/{d}/" in c["path"] for d in PACKAGE_DIRS for c in self.copies) else 2


def analyse(state: MergeState) -> tuple[list[WasteGroup], int]:
    """Groups of identical stored copies (two or more), and the bytes wasted over all of them."""
    aliases: dict[int, list[str]] = defaultdict(list)
    for path, copy_index in state.hardlinked.items():
        aliases[copy_index].append(path)
    visible_copy = {index: path for path, index in state.visible.items()}
    by_content: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    for index, copy in enumerate(state.copies):
        # Unhashed: no other copy has its size (image/digests.py). Replaced within its layer: a
        # path stored twice, not a copy under another path (``stored_again_findings``).
        if copy.digest is not None and not copy.replaced_in_layer:
            by_content[(copy.size, copy.digest)].append(index)
    groups: list[WasteGroup] = []
    total = 0
    for (size, digest), members in by_content.items():
        if len(members) < 2:
            continue
        total += size * (len(members) - 1)
        copies = tuple(_copy_dict(state.copies[i], i in visible_copy, sorted(aliases.get(i, []))) for i in members)
        groups.append(
            WasteGroup(
                size=size,
                digest=digest.hex(),
                copies=tuple(sorted(copies, key=lambda c: (c["layer"], c["path"]))),
                layers=tuple(sorted({state.copies[i].layer for i in members})),
                on_base=len(state.layers) > 1,
            )
        )
    groups.sort(key=lambda g: (g.tier, -g.wasted_bytes, g.copies[0]["path"]))
    return groups, total


def replaced_in_layer(state: MergeState) -> list[Copy]:
    """The copies a later member of the same name in the same layer replaced: bytes of the layer's
    blob that no view shows (a tar appended to keeps the older member)."""
    return [copy for copy in state.copies if copy.replaced_in_layer]


def stored_again_findings(copies: list[Copy], layer_names: list[str]) -> list[Finding]:
    """IMG011, one per layer: the paths it stores more than once. Docker Engine refuses the layer
    (its tar-split layer store takes each path once); it is not a matter for dedup, nor of
    identical copies: the tool that wrote the layer wrote those paths twice."""
    by_layer: dict[int, list[Copy]] = defaultdict(list)
    for copy in copies:
        by_layer[copy.layer].append(copy)
    findings = []
    for layer, here in sorted(by_layer.items()):
        paths = sorted({copy.path for copy in here})
        stored = sum(copy.size for copy in here)
        findings.append(
            make_finding(
                "IMG011",
                paths[0],
                f"layer {layer} ({_short(layer_names, layer)}) stores "
                f"{'a path' if len(paths) == 1 else f'{len(paths)} paths'} more than once: "
                f"{size_text(stored)} in earlier entries that a later one of the same name replaces; "
                "Docker Engine refuses such a layer (docker load and pull: 'duplicates of file paths not "
                "supported'): write each file once",
                related=paths[1:],
                data={"layer": layer, "stored_again_bytes": stored, "paths": paths},
            )
        )
    return findings


def _copy_dict(copy: Copy, visible: bool, hardlinks: list[str]) -> WasteCopy:
    return {"layer": copy.layer, "path": copy.path, "visible": visible, "hardlinks": hardlinks}


def waste_findings(groups: list[WasteGroup], layer_names: list[str]) -> list[Finding]:
    """IMG007 for same-layer groups (dedup in that step frees them), IMG008 across layers, for
    groups with a copy inside a ``_rocm_sdk_*`` tree (what `rocm-audit dedup` handles); IMG010
    (info) for any other group listed: worth knowing, but often the base OS's or a package's own
    choice. Every group counts in the section's totals."""
    findings = []
    for group in groups:
        if group.size < REPORT_MIN_BYTES:
            continue
        if not group.in_sdk:
            findings.append(_elsewhere_finding(group))
            continue
        findings.extend(_same_layer_findings(group, layer_names))
        if not group.same_layer:
            findings.append(_cross_layer_finding(group))
    return findings


def _where(group: WasteGroup) -> str:
    return ", ".join(f"{c['path']} (layer {c['layer']}{'' if c['visible'] else ', hidden'})" for c in group.copies)


def _same_layer_findings(group: WasteGroup, layer_names: list[str]) -> list[Finding]:
    findings = []
    for layer in group.layers:
        here = group.copies_in(layer)
        # Only where dedup can act: copies of this layer inside an SDK tree, written by a step of the
        # user's (the base image's own copies are its choice; the waste section still counts them).
        in_sdk = any(mark in c["path"] for mark in SDK_MARKS for c in here)
        if len(here) < 2 or not in_sdk or (layer == 0 and group.on_base):
            continue
        layer_paths = [c["path"] for c in here]
        freed = group.size * (len(here) - 1)
        where_here = ", ".join(f"{c['path']}{'' if c['visible'] else ' (hidden)'}" for c in here)
        step = (
            f"run `rocm-audit dedup` in the step that writes this layer to free {size_text(freed)} "
            "(a later RUN frees nothing)"
        )
        findings.append(
            make_finding(
                "IMG007",
                layer_paths[0],
                f"{len(here)} identical copies of {size_text(group.size)} in layer {layer} "
                f"({_short(layer_names, layer)}): {where_here}; {step}",
                related=layer_paths[1:],
                data=_group_data(group, freed, [layer]),
            )
        )
    return findings


def _cross_layer_finding(group: WasteGroup) -> Finding:
    paths = [c["path"] for c in group.copies]
    mixed = f" ({size_text(group.same_layer_wasted)} more within layers: IMG007)" if group.same_layer_wasted else ""
    return make_finding(
        "IMG008",
        paths[0],
        f"{len(paths)} identical copies of {size_text(group.size)} spread over layers "
        f"{', '.join(map(str, group.layers))}: {_where(group)}; {size_text(group.cross_layer_wasted)} "
        f"no later step can free{mixed}: {_fix(group)}",
        related=_others(paths),
        data=_group_data(group, group.cross_layer_wasted, group.layers),
    )


def _others(paths: list[str]) -> list[str]:
    """The other paths of a group: a copy a later layer hid at the same path is the finding's own
    path (the message says which layers hold it), never a "with" of its own."""
    return sorted({p for p in paths[1:] if p != paths[0]})


def _group_data(group: WasteGroup, wasted: int, layers: Iterable[int]) -> dict[str, object]:
    """A waste finding's data: its copies' size, the bytes they waste, where; a later RUN frees none."""
    return {"size": group.size, "wasted_bytes": wasted, "layers": list(layers), "later_run_dedup_shrinks_image": False}


def _elsewhere_finding(group: WasteGroup) -> Finding:
    paths = [c["path"] for c in group.copies]
    layers = ", ".join(map(str, group.layers))
    return make_finding(
        "IMG010",
        paths[0],
        f"{len(paths)} identical copies of {size_text(group.size)} outside the SDK trees "
        f"(layer{'s' if len(group.layers) > 1 else ''} {layers}): {_where(group)}; "
        f"{size_text(group.wasted_bytes)} in the extra copies: {_fix(group)}",
        related=_others(paths),
        data=_group_data(group, group.wasted_bytes, group.layers),
    )


def waste_section(groups: list[WasteGroup], total: int, again: list[Copy]) -> ImageWaste:
    listed = [g for g in groups if g.size >= REPORT_MIN_BYTES]
    return {
        "wasted_bytes": total,
        "stored_again_bytes": sum(copy.size for copy in again),
        "listed_min_size_bytes": REPORT_MIN_BYTES,
        "later_run_dedup_shrinks_image": False,
        "same_layer_bytes": sum(g.same_layer_wasted for g in groups),
        "cross_layer_bytes": sum(g.cross_layer_wasted for g in groups),
        "groups": [
            {
                "size": g.size,
                "blake2b": g.digest,
                "wasted_bytes": g.wasted_bytes,
                "scope": "same-layer" if g.same_layer else "cross-layer",
                "layers": list(g.layers),
                "fix": _fix(g),
                "copies": [c.copy() for c in g.copies],
            }
            for g in listed
        ],
    }


def _fix(group: WasteGroup) -> str:
    """What frees the group's extra copies: dedup where they lie in an SDK tree (what it links),
    else writing the file once; nothing for the copies of layer 0, the base image's."""
    if group.from_base and group.layers == (0,):
        return "the copies come from the base image (layer 0)"
    once = "write the file once (or hardlink it)"
    within = [layer for layer in group.layers if len(group.copies_in(layer)) > 1 and (layer or not group.on_base)]
    in_steps = f"the step that writes layer{'s' if len(within) > 1 else ''} {', '.join(map(str, within))}"
    steps = (f"run rocm-audit dedup in {in_steps}" if group.in_sdk else f"{once} in {in_steps}") if within else ""
    later = [layer for layer in group.layers if layer or not group.on_base]
    across = ""
    if group.from_base and later:  # nothing frees the base image's copy: the later ones are the waste
        layers = f"layer{'s' if len(later) > 1 else ''} {', '.join(map(str, later))}"
        across = f"the base image (layer 0) has the file already: do not write it again in {layers}"
    elif not group.same_layer and group.in_sdk:
        across = "write the copies in one step (install RUN or one COPY of the parent) and run rocm-audit dedup there"
    elif not group.same_layer:
        across = f"{once} in one step, not in each of layers {', '.join(map(str, later))}"
        across += " (the base image, layer 0, has it too)" if group.from_base else ""
    if steps and across:
        across = f"for the rest, {across}"
    return "; ".join(part for part in (steps, across) if part)


def _short(names: list[str], index: int) -> str:
    """A layer as a finding names it: its step, else its digest or its legacy ``<id>/layer.tar``
    directory in 12 hex digits, as `docker` prints IDs."""
    name = names[index] if 0 <= index < len(names) else "?"
    if name.startswith("sha256:"):
        return name[:19]
    return name[:12] if _LEGACY_MEMBER.match(name) else clip(name, STEP_WIDTH)
