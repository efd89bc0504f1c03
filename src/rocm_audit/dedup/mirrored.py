"""The mirrored pass: devel files split from their runtime twins (TheRock's devel tree mirrors the
runtime tree), linked to the twin or left with a reason (DUP010)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

from rocm_audit.dedup.groups import DedupGroup, PlannedLink, relative_link_text
from rocm_audit.findings import Finding, make_finding
from rocm_audit.tree.identical import (
    HEAD_BYTES,
    TAIL_BYTES,
    CompareStats,
    ReadFailure,
    same_bytes,
)
from rocm_audit.tree.inventory import FileRecord, Inventory
from rocm_audit.tree.ownership import Ownership, is_family_distribution, sibling_trees, tree_relpath

_NOT_MIRRORED = ("__init__.py", ".devel_reconcile.lock")


def mirrored_groups(
    inventory: Inventory,
    ownership: Ownership,
    classed: set[str],
    stats: CompareStats,
    findings: list[Finding],
    intact: list[tuple[str, list[str]]],
    *,
    exact: bool,
) -> list[DedupGroup]:
    """Files TheRock links from an expansion (devel) to the runtime file of the same path inside a
    sibling tree (kernel DBs, ``.kpack``/``.kpm``, Tensile files, executables, headers): when a copy
    split them and the bytes are still equal, the plan restores TheRock's hardlink. Shared libraries
    that the content groups already judged are left to them. Inexact (an applying run): head and
    tail only, since the apply compares every pair in full before it links."""
    by_path = {r.path: r for r in inventory.files}
    realdir = functools.lru_cache(maxsize=None)(os.path.realpath)
    groups: dict[str, DedupGroup] = {}
    left = {f.path for f in findings if f.rule == "DUP010"}  # the content groups said why already
    for record in inventory.files:
        if record.sdk_tree is None or record.path in classed or not ownership.is_expansion(record.path):
            continue
        if record.path in left:
            continue
        relpath = tree_relpath(record.path, record.sdk_tree)
        if relpath in _NOT_MIRRORED or "__pycache__" in relpath.split(os.sep):
            continue
        twins = []  # the same path in each sibling tree, where a wheel installed it
        for sibling in sibling_trees(record.sdk_tree, inventory.sdk_trees):
            twin = by_path.get(os.path.join(sibling, relpath))
            if twin is not None and ownership.owner(twin.path):
                twins.append(twin)
        on_twin = [twin for twin in twins if twin.identity == record.identity]
        twins, reason = _twins_to_link(record, twins, on_twin, ownership)
        if reason is not None:
            findings.append(
                make_finding(
                    "DUP010",
                    record.path,
                    f"{reason}, so it is left as it is",
                    related=[twin.path for twin in twins],
                    data={"owner": None, "others": sorted({ownership.owner(twin.path) or "" for twin in twins})},
                )
            )
            continue
        _link_to_twin(record, on_twin or twins, stats, findings, intact, groups, realdir, exact=exact)
    return list(groups.values())


def _twins_to_link(
    record: FileRecord, twins: list[FileRecord], on_twin: list[FileRecord], ownership: Ownership
) -> tuple[list[FileRecord], str | None]:
    """The runtime files an expansion may be linked to, or why it is left as it is.

    Legacy per-family wheels: each family's devel links into its own tree, which a copy on its own
    inode still names when its distribution records the family. A copy beside several owners'
    runtime files that names none of them cannot tell which one it mirrors."""
    owners = sorted({ownership.owner(twin.path) or "" for twin in twins})
    made_for = None if on_twin else ownership.made_for(record.path)
    if made_for is not None and any(is_family_distribution(ownership.owner(t.path) or "") for t in twins):
        chosen = [twin for twin in twins if ownership.owner(twin.path) == made_for]
        if chosen:
            return chosen, None
        return twins, (
            f"its distribution was built against {made_for}, which installs no copy here; "
            f"the same path in {', '.join(owners)} is another family's"
        )
    if not on_twin and len(owners) > 1:
        source = (
            f"its distribution was built against {made_for}, which installs no copy here"
            if made_for
            else "which one it was made from is not recorded"
        )
        mirrored = f"the runtime file it mirrors is installed by {len(owners)} distributions"
        return twins, f"{mirrored} ({', '.join(owners)}); {source}"
    return twins, None


def _link_to_twin(
    record: FileRecord,
    twins: list[FileRecord],
    stats: CompareStats,
    findings: list[Finding],
    intact: list[tuple[str, list[str]]],
    groups: dict[str, DedupGroup],
    realdir: Callable[[str], str],
    *,
    exact: bool,
) -> None:
    """Plan a hardlink of ``record`` to the first of ``twins`` (already on its inode: intact; equal
    bytes on one filesystem: a link; on another: DUP012)."""
    for twin in twins:
        if twin.identity == record.identity:
            intact.append((twin.path, [record.path]))
        elif twin.size == record.size and twin.dev == record.dev:
            try:
                equal = all(
                    same_bytes(twin.path, record.path, twin.size, stats, byte_range)
                    for byte_range in _ends(twin.size, exact)
                )
            except ReadFailure as failure:
                findings.append(make_finding("SCAN001", failure.path, f"cannot read: {failure.error.strerror}"))
                break
            if equal:
                keeper_real = os.path.join(realdir(os.path.dirname(twin.path)), os.path.basename(twin.path))
                planned = PlannedLink(
                    record, relative_link_text(keeper_real, record.path, realdir), hardlink=False, make="hardlink"
                )
                group = groups.setdefault(twin.path, DedupGroup(twin, [], "mirrored"))
                group.duplicates.append(planned)
                group.status[record.path] = "planned"
        elif twin.size == record.size:
            findings.append(
                make_finding(
                    "DUP012",
                    record.path,
                    "split from the runtime file TheRock links it to, on another filesystem: cannot be hardlinked",
                    related=[twin.path],
                )
            )
        break


def _ends(size: int, exact: bool) -> list[tuple[int, int]]:
    """What a mirrored pair's plan compares: all of it, or (inexact) head and tail, the last range
    ending at ``size`` so that growth still shows."""
    if exact or size <= HEAD_BYTES + TAIL_BYTES:
        return [(0, size)]
    return [(0, HEAD_BYTES), (size - TAIL_BYTES, size)]
