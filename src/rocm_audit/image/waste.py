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

from collections import defaultdict
from dataclasses import dataclass

from rocm_audit.findings import Finding, make_finding
from rocm_audit.image.merge import Copy, MergeState
from rocm_audit.report_types import ImageWaste, WasteCopy
from rocm_audit.units import size_text

SDK_MARKS = ("/_rocm_sdk_", "/_rocm_profiler")  # the platform trees of TheRock's wheels (tree/discovery.py)
REPORT_MIN_BYTES = 64 << 10  # groups of smaller files count in the total but are not listed


@dataclass(frozen=True, slots=True)
class WasteGroup:
    size: int
    digest: str
    copies: tuple[WasteCopy, ...]
    layers: tuple[int, ...]

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


def analyse(state: MergeState) -> tuple[list[WasteGroup], int]:
    """Groups of identical stored copies (two or more), and the bytes wasted over all of them."""
    aliases: dict[int, list[str]] = defaultdict(list)
    for path, copy_index in state.hardlinked.items():
        aliases[copy_index].append(path)
    visible_copy = {index: path for path, index in state.visible.items()}
    by_content: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    for index, copy in enumerate(state.copies):
        if copy.digest is not None:  # unhashed: no other copy has its size (image/digests.py)
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
            )
        )
    groups.sort(key=lambda g: (-g.wasted_bytes, g.copies[0]["path"]))
    return groups, total


def _copy_dict(copy: Copy, visible: bool, hardlinks: list[str]) -> WasteCopy:
    return {"layer": copy.layer, "path": copy.path, "visible": visible, "hardlinks": hardlinks}


def waste_findings(groups: list[WasteGroup], layer_names: list[str]) -> list[Finding]:
    """IMG007 for same-layer groups (dedup in that step frees them), IMG008 across layers.

    Only groups with a copy inside a ``_rocm_sdk_*`` tree become findings: those are what
    `rocm-audit dedup` handles. Every group counts in the section's totals.
    """
    findings = []
    for group in groups:
        if group.size < REPORT_MIN_BYTES or not any(mark in c["path"] for mark in SDK_MARKS for c in group.copies):
            continue
        paths = [c["path"] for c in group.copies]
        where = ", ".join(f"{c['path']} (layer {c['layer']}{'' if c['visible'] else ', hidden'})" for c in group.copies)
        for layer in group.layers:
            here = group.copies_in(layer)
            if len(here) < 2:
                continue
            layer_paths = [c["path"] for c in here]
            freed = group.size * (len(here) - 1)
            where_here = ", ".join(f"{c['path']}{'' if c['visible'] else ' (hidden)'}" for c in here)
            findings.append(
                make_finding(
                    "IMG007",
                    layer_paths[0],
                    f"{len(here)} identical copies of {size_text(group.size)} in layer {layer} "
                    f"({_short(layer_names, layer)}): {where_here}; run `rocm-audit dedup` in the step "
                    f"that writes this layer to free {size_text(freed)} "
                    f"(a later RUN frees nothing)",
                    related=layer_paths[1:],
                    data={
                        "size": group.size,
                        "wasted_bytes": freed,
                        "layers": [layer],
                        "later_run_dedup_shrinks_image": False,
                    },
                )
            )
        if not group.same_layer:
            mixed = f" ({group.same_layer_wasted:,} more within layers: IMG007)" if group.same_layer_wasted else ""
            findings.append(
                make_finding(
                    "IMG008",
                    paths[0],
                    f"{len(paths)} identical copies of {size_text(group.size)} spread over layers "
                    f"{', '.join(map(str, group.layers))}: {where}; {size_text(group.cross_layer_wasted)} "
                    f"no later step can free{mixed}: write the trees in one step (one install RUN, "
                    f"or one COPY of their "
                    f"common parent) and run `rocm-audit dedup` there",
                    related=paths[1:],
                    data={
                        "size": group.size,
                        "wasted_bytes": group.cross_layer_wasted,
                        "layers": list(group.layers),
                        "later_run_dedup_shrinks_image": False,
                    },
                )
            )
    return findings


def waste_section(groups: list[WasteGroup], total: int) -> ImageWaste:
    listed = [g for g in groups if g.size >= REPORT_MIN_BYTES]
    return {
        "wasted_bytes": total,
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
    within = [layer for layer in group.layers if len(group.copies_in(layer)) > 1]
    steps = f"run rocm-audit dedup in the step that writes layer {', '.join(map(str, within))}" if within else ""
    if group.same_layer:
        return steps
    across = "write the copies in one step (install RUN or one COPY of the parent) and run rocm-audit dedup there"
    return f"{steps}; for the rest, {across}" if steps else across


def _short(names: list[str], index: int) -> str:
    name = names[index] if 0 <= index < len(names) else "?"
    return name[:19] if name.startswith("sha256:") else name
