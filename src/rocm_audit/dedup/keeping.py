"""One group from a set of identical files: which copy is kept, which expansions of it are linked and
why the others are not (TheRock's devel expansions, mirrored trees, modes)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

from rocm_audit.dedup.groups import DedupGroup, PlannedLink, inside, relative_link_text
from rocm_audit.errors import FormatError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.tree.inventory import FileRecord, Inventory
from rocm_audit.tree.keeper import KeeperRule
from rocm_audit.tree.ownership import Ownership, is_family_distribution


def group_from(
    records: list[FileRecord],
    inventory: Inventory,
    keeper_rule: KeeperRule,
    findings: list[Finding],
    ownership: Ownership,
    intact: list[tuple[str, list[str]]],
    realdir: Callable[[str], str] = os.path.realpath,
    reldir: Callable[[str, str], str] = os.path.relpath,
) -> list[DedupGroup]:
    """The groups of byte-identical ``records`` (none when nothing may change). Ownership first
    (tree/ownership.py): the keeper is a copy a wheel installed when there is one; a copy another
    distribution installed stays its own (DUP010), and an expansion already on the keeper's inode
    is left as rocm-sdk made it. An expansion whose distribution names the other owner it was
    built against (``Ownership.made_for``) goes with that owner's copy, in a group of its own."""
    owner = {r.path: ownership.owner(r.path) for r in records}
    ordered = _keeper_first(records, owner, inventory, keeper_rule, findings)
    keeper = ordered[0]
    keeper_owner = owner[keeper.path]
    foreign = [r for r in ordered[1:] if owner[r.path] not in (None, keeper_owner)]
    expansions = _Expansions.sort_out(ordered, owner, foreign, ownership)
    for record in expansions.with_other_owner:
        intact.append((expansions.foreign_inodes[record.identity].path, [record.path]))
    for record in expansions.mismatched:
        findings.append(
            make_finding(
                "DUP010",
                record.path,
                f"its distribution was built against {expansions.made_for[record.path]}, which installs no copy "
                f"with these bytes here ({keeper_owner}'s is the same bytes), so it is left as it is",
                related=[keeper.path],
                data={"owner": None, "others": [keeper_owner]},
            )
        )
    groups: list[DedupGroup] = []
    for other in sorted({expansions.made_for[r.path] for r in expansions.elsewhere}, key=str):
        groups += group_from(
            [r for r in records if owner[r.path] == other]
            + [r for r in expansions.elsewhere if expansions.made_for[r.path] == other],
            inventory,
            keeper_rule,
            findings,
            ownership,
            intact,
            realdir,
            reldir,
        )
    split = [r for r in foreign if r.identity != keeper.identity]
    if split:
        findings.append(
            make_finding(
                "DUP010",
                keeper.path,
                f"{len(split)} copy(ies) of these bytes installed by another distribution "
                f"({', '.join(sorted({owner[r.path] or '' for r in split}))}); each owns its copy, none is linked",
                related=[r.path for r in split],
                data={"owner": keeper_owner, "others": sorted({owner[r.path] or "" for r in split})},
            )
        )
    left_alone = foreign + expansions.left_alone()
    group = _group_of_changeable(
        ordered, left_alone, keeper_owner is not None, findings, ownership, intact, realdir, reldir
    )
    return groups if group is None else [*groups, group]


def _keeper_first(
    records: list[FileRecord],
    owner: dict[str, str | None],
    inventory: Inventory,
    keeper_rule: KeeperRule,
    findings: list[Finding],
) -> list[FileRecord]:
    """``records`` in the keeper rule's order, the keeper first (the SONAME read only when the
    rule needs it to break a tie)."""
    soname = None
    if keeper_rule.needs_soname([r.sdk_tree for r in records], [owner[r.path] is not None for r in records]):
        try:
            soname = inventory.dynamic(records[0]).soname
        except (OSError, FormatError) as exc:  # a malformed dynamic section only loses the SONAME tie-break
            findings.append(make_finding("SCAN002", records[0].path, f"cannot read the dynamic section: {exc}"))
    return sorted(
        records, key=lambda r: keeper_rule.sort_key(r.path, r.sdk_tree, soname, owned=owner[r.path] is not None)
    )


@dataclass(slots=True)
class _Expansions:
    """The expansions among a group's members that are not linked to its keeper, by why.

    An expansion belongs to the runtime copy it was made from. rocm-sdk init hardlinks it to that
    copy, and a legacy per-family devel wheel links into its own family's tree only
    (build_python_packages.py _run_legacy; py_packaging.py _find_populated): one on another
    distribution's copy stays with that copy (``with_other_owner``), and one split from it goes
    back to it when its distribution names that family (``elsewhere``). One built against a
    family whose copy is not among these bytes is never linked to another family's
    (``mismatched``). One on its own inode beside two owners' copies that names none cannot tell
    which it came from (``undecided``; the mirrored pass reports it): linking it to either could
    make the very split it should mend."""

    foreign_inodes: dict[tuple[int, int], FileRecord]
    made_for: dict[str, str | None]
    with_other_owner: list[FileRecord]
    elsewhere: list[FileRecord]
    mismatched: list[FileRecord]
    undecided: list[FileRecord]

    @classmethod
    def sort_out(
        cls,
        ordered: list[FileRecord],
        owner: dict[str, str | None],
        foreign: list[FileRecord],
        ownership: Ownership,
    ) -> _Expansions:
        keeper = ordered[0]
        keeper_owner = owner[keeper.path]
        foreign_inodes = {r.identity: r for r in foreign}
        foreign_owners = {owner[r.path] for r in foreign}
        expansions = [r for r in ordered[1:] if owner[r.path] is None and ownership.is_expansion(r.path)]
        with_other_owner = [r for r in expansions if r.identity != keeper.identity and r.identity in foreign_inodes]
        made_for = {r.path: ownership.made_for(r.path) for r in expansions}
        elsewhere = [
            r
            for r in expansions
            if r.identity != keeper.identity and r not in with_other_owner and made_for[r.path] in foreign_owners
        ]
        mismatched = [
            r
            for r in expansions
            if r.identity != keeper.identity
            and r not in with_other_owner
            and r not in elsewhere
            and made_for[r.path] is not None
            and keeper_owner is not None
            and is_family_distribution(keeper_owner)
            and made_for[r.path] != keeper_owner
        ]
        undecided = [
            r
            for r in expansions
            if foreign
            and r.identity != keeper.identity
            and r not in with_other_owner
            and r not in elsewhere
            and r not in mismatched
            and (keeper_owner is None or made_for[r.path] != keeper_owner)
        ]
        return cls(foreign_inodes, made_for, with_other_owner, elsewhere, mismatched, undecided)

    def left_alone(self) -> list[FileRecord]:
        return self.with_other_owner + self.elsewhere + self.mismatched + self.undecided


def _group_of_changeable(
    ordered: list[FileRecord],
    left_alone: list[FileRecord],
    keeper_owned: bool,
    findings: list[Finding],
    ownership: Ownership,
    intact: list[tuple[str, list[str]]],
    realdir: Callable[[str], str],
    reldir: Callable[[str, str], str],
) -> DedupGroup | None:
    """The group of what may become a link to the keeper ``ordered[0]``: every other member but
    those ``left_alone`` and the device links TheRock keeps on the keeper's inode itself (those go
    to ``intact``). None when nothing may change, or when the keeper resolves outside its root."""
    keeper = ordered[0]
    on_keeper = {
        r.path for r in ordered[1:] if keeper_owned and r.identity == keeper.identity and ownership.is_expansion(r.path)
    }
    # TheRock's device reconcile re-hardlinks these on every init/path/test: left as it made them.
    settled = [r for r in ordered[1:] if r.path in on_keeper and ownership.is_device_link(r.path)]
    if settled:
        intact.append((keeper.path, [r.path for r in settled]))
    changeable = [r for r in ordered[1:] if r not in left_alone and r not in settled]
    if not changeable:
        return None
    # records are regular files (lstat), so realpath(file) == realpath(its directory) + its name
    keeper_real = os.path.join(realdir(os.path.dirname(keeper.path)), os.path.basename(keeper.path))
    if not inside(keeper_real, keeper.root):
        findings.append(
            make_finding(
                "DUP005",
                keeper.path,
                "keeper resolves outside the audited root; group left alone",
                related=[r.path for r in ordered[1:]],
            )
        )
        return None
    duplicates = []
    for record in changeable:
        link_text = relative_link_text(keeper_real, record.path, realdir, reldir)
        make = "hardlink" if ownership.is_device_link(record.path) else "symlink"
        duplicates.append(
            PlannedLink(
                record,
                link_text,
                hardlink=record.identity == keeper.identity,
                make=make,
                intact=record.path in on_keeper,
            )
        )
        _report_mode_difference(record, keeper, findings)
    reason = "hardlink" if all(d.hardlink for d in duplicates) else "identical-content"
    group = DedupGroup(keeper, duplicates, reason)
    for planned in duplicates:
        group.status[planned.record.path] = "planned"
    return group


def _report_mode_difference(record: FileRecord, keeper: FileRecord, findings: list[Finding]) -> None:
    if stat.S_IMODE(record.mode) != stat.S_IMODE(keeper.mode) or (record.uid, record.gid) != (
        keeper.uid,
        keeper.gid,
    ):
        findings.append(
            make_finding(
                "DUP004",
                record.path,
                f"mode {stat.S_IMODE(record.mode):o} owner {record.uid}:{record.gid} differs from the keeper's "
                f"mode {stat.S_IMODE(keeper.mode):o} owner {keeper.uid}:{keeper.gid}",
                related=[keeper.path],
            )
        )
