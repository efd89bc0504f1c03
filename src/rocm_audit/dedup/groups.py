"""What a dedup plan is made of: a planned link, a group with its keeper, the plan itself."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from rocm_audit.findings import Finding
from rocm_audit.tree.identical import (
    CompareStats,
)
from rocm_audit.tree.inventory import FileRecord, Inventory
from rocm_audit.tree.ownership import Ownership


@dataclass(frozen=True, slots=True)
class PlannedLink:
    record: FileRecord  # the duplicate as the plan saw it
    link_text: str  # relative symlink text, as `ln -sr` would write it
    hardlink: bool  # shares the keeper's inode
    # What replaces the duplicate: "symlink" (link_text), or "hardlink" of the keeper for what TheRock
    # links itself (its device reconcile re-hardlinks a symlink; mirrored data files and executables,
    # which find their siblings through /proc/self/exe, must stay regular files).
    make: str = "symlink"
    # An expansion already on its owned keeper's inode, as rocm-sdk init made it: one library for the
    # loader now; the symlink is hardening (it survives a per-tree copy), so --check does not fail on it.
    intact: bool = False


@dataclass(slots=True)
class DedupGroup:
    keeper: FileRecord
    duplicates: list[PlannedLink]
    reason: str  # "identical-content", "hardlink", or "mirrored" (a devel file split from its runtime twin)
    status: dict[str, str] = field(default_factory=dict)  # duplicate path -> planned/replaced/...
    # The keeper's st_ctime_ns after this run hardlinked it (a link moves it): the last look expects it.
    keeper_ctime_ns_ours: int | None = None

    @property
    def size(self) -> int:
        return self.keeper.size

    def bytes_freed_if_done(self) -> int:
        # Hardlinks already share blocks: turning them into symlinks frees nothing.
        return sum(self.size for d in self.duplicates if not d.hardlink)


@dataclass(slots=True)
class DedupPlan:
    inventory: Inventory
    groups: list[DedupGroup]
    findings: list[Finding]
    stats: CompareStats
    exact: bool = True  # False: members agree on size, head and tail; apply_plan compares the rest
    ownership: Ownership = field(default_factory=lambda: Ownership({}, {}))
    # Expansions that already share their runtime file's inode, as rocm-sdk made them: (keeper, paths).
    intact: list[tuple[str, list[str]]] = field(default_factory=list)


def relative_link_text(
    keeper_real: str,
    link_path: str,
    realdir: Callable[[str], str] = os.path.realpath,
    reldir: Callable[[str, str], str] = os.path.relpath,
) -> str:
    """The text `ln -sr keeper link` writes: the keeper's real path relative to the link's real
    directory. ``realdir`` and ``reldir`` may be cached: a plan asks about few directories, and
    their real paths and relative paths cost a system call or a string walk per component."""
    keeper_dir, name = os.path.split(keeper_real)
    up = reldir(keeper_dir, realdir(os.path.dirname(link_path)))
    return name if up == "." else f"{up}/{name}"


def inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
