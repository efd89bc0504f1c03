"""Text of ``prune``'s own report sections: the weight, the plan, what an applying run did and
how to undo it, and what ``--revert`` did. Pure functions from the JSON sections to lines; every
name goes through ``display`` (output/escape.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from rocm_audit.output.escape import display
from rocm_audit.output.layout import WIDTH, PathView, hold, plural
from rocm_audit.prune.summary import done_text
from rocm_audit.prune.weigh import NO_DISTRIBUTION
from rocm_audit.report_types import FatbinLibraryRecord, PruneSection, PruneWeightRow, Sections
from rocm_audit.tree.targets import processor_sort_key
from rocm_audit.units import size_text

_NO_ROOTS = PathView(())


class DistributionWeight(TypedDict):
    """Prune's weight rows of one distribution, summed (what text and Markdown show)."""

    distribution: str
    bytes: int
    compressed_bytes: int
    unused_bytes: int
    removable_bytes: int
    targets: int  # how many rows: targets the distribution carries code for


def weight_by_distribution(rows: Sequence[PruneWeightRow]) -> list[DistributionWeight]:
    """The prune weight rows summed per distribution, largest first (pure; text and markdown)."""
    sums: dict[str, DistributionWeight] = {}
    for row in rows:
        one = sums.setdefault(
            row["distribution"],
            {
                "distribution": row["distribution"],
                "bytes": 0,
                "compressed_bytes": 0,
                "unused_bytes": 0,
                "removable_bytes": 0,
                "targets": 0,
            },
        )
        one["bytes"] += row["bytes"]
        one["compressed_bytes"] += row["compressed_bytes"]
        one["unused_bytes"] += row["unused_bytes"]
        one["removable_bytes"] += row["removable_bytes"]
        one["targets"] += 1
    return sorted(sums.values(), key=lambda d: (-d["bytes"], d["distribution"]))


_REMOVAL_MARK = {"planned": "would remove", "removed": "removed", "skipped": "SKIPPED", "failed": "FAILED"}


_NOTHING_TO_PRUNE = "nothing to prune: no GPU device code here (device wheels, code objects, fat binaries)"


def fatbins_estimate_lines(section: PruneSection) -> list[str]:
    """What ``prune --fatbins`` would remove from fat binaries of host libraries, per distribution
    (an estimate from the entry tables; no line when there is nothing)."""
    rows = section["fatbins_estimate"]
    if not rows:
        return []
    total = section["totals"]["fatbins_estimate_bytes"]
    parts = ", ".join(f"{_owner_words(r['distribution'])} {size_text(r['bytes'])}" for r in rows[:8])
    more = f", {len(rows) - 8} more" if len(rows) > 8 else ""
    return [
        f"prune --fatbins: about {size_text(total)} removable from fat binaries of host libraries ({parts}{more}); "
        "an estimate from their entry tables, `prune --fatbins --dry-run` gives the exact figure"
    ]


def _owner_words(distribution: str) -> str:
    """A distribution as a list names it; files no distribution owns are slimmed only with a backup."""
    return "files no distribution owns (with --backup)" if distribution == NO_DISTRIBUTION else display(distribution)


def kept_whole_lines(section: PruneSection) -> list[str]:
    """``kept whole (--keep-dist): cupy-rocm-7-0, onnxruntime-rocm``, one line per place named."""
    by_source: dict[str, list[str]] = {}
    for kept in section["kept_whole"]:
        source = kept["source"]
        where = "--keep-dist" if source.startswith("--keep-dist ") else source
        by_source.setdefault(where, []).append(display(kept["distribution"]))
    return [f"kept whole ({display(where)}): {', '.join(names)}" for where, names in by_source.items()]


def _distribution_table(section: PruneSection, slim: dict[str, int] | None) -> list[str]:
    """A row per distribution: its device code, what no kept target loads, what prune removes
    (and, with --fatbins, what slimming removes: ``slim`` by distribution)."""
    lines = [
        f"{'distribution':32} {'targets':>7} {'on disk':>11} {'compressed':>11} {'unused':>11} {'removable':>11}"
        + (f" {'fatbins':>11}" if slim is not None else "")
    ]
    rows = weight_by_distribution(section["weight"])
    for one in rows:
        lines.append(
            f"{display(one['distribution']):32} {one['targets']:>7} {size_text(one['bytes']):>11} "
            f"{size_text(one['compressed_bytes']):>11} {size_text(one['unused_bytes']):>11} "
            f"{size_text(one['removable_bytes']):>11}"
            + (f" {size_text(slim.get(one['distribution'], 0)):>11}" if slim is not None else "")
        )
    if slim is not None and any(slim.get(one["distribution"], 0) > one["unused_bytes"] for one in rows):
        # more than "unused" would read as a mistake: the padding goes too
        lines.append("(fatbins: the unused entries slimming removes and the padding between them)")
    return lines


def prune_lines(sections: Sections, view: PathView = _NO_ROOTS, *, verbose: int = 0, limit: int = 40) -> list[str]:
    """Totals, a table per distribution, the removals; with ``verbose`` a row per distribution
    and target too."""
    section = sections["prune"]
    totals = section["totals"]
    fatbins = sections.get("prune_fatbins")
    # With --fatbins, what slimming takes out of fat binaries is removable too: a headline and a
    # column of its own beside the whole files, so that neither reads "removable: 0 B" above a plan.
    slim = {d["distribution"]: d["bytes"] for d in fatbins["by_distribution"]} if fatbins is not None else None
    removable = f"removable: {size_text(totals['removable_bytes'])}"
    if fatbins is not None:
        verb = "removed" if fatbins["mode"] == "apply" else "removable"
        removable = (
            f"{verb}: {size_text(totals['removable_bytes'])} as whole files and "
            f"{size_text(fatbins['bytes'])} from fat binaries (--fatbins)"
        )
    keep = f"Keep: {', '.join(display(t) for t in section['targets'])}  [from {display(section['targets_source'])}]"
    if not section["weight"] and not section["fatbins_estimate"] and not (fatbins and fatbins["by_distribution"]):
        # An empty table under its header reads as a failed reading: say what was found instead.
        return [keep, *kept_whole_lines(section), _NOTHING_TO_PRUNE]
    lines = [
        keep,
        f"device code {size_text(totals['device_bytes'])} on disk ({size_text(totals['compressed_bytes'])} in "
        f"compressed bundles, {size_text(totals['inflated_bytes'])} inflated); for no kept target: "
        f"{size_text(totals['unused_bytes'])}, {removable}",
        "",
        *_distribution_table(section, slim),
    ]
    if fatbins is None:  # with --fatbins its own exact figures follow
        lines[2:2] = fatbins_estimate_lines(section)
    lines[1:1] = kept_whole_lines(section)
    if verbose:
        lines += [
            "",
            f"{'distribution':32} {'target':24} {'on disk':>11} {'compressed':>11} {'kept':>4} {'removable':>11}",
        ]
        rows = section["weight"]
        for row in rows if verbose > 1 else rows[:limit]:
            lines.append(
                f"{display(row['distribution']):32} {display(row['target']):24} {size_text(row['bytes']):>11} "
                f"{size_text(row['compressed_bytes']):>11} {'yes' if row['needed'] else 'no':>4} "
                f"{size_text(row['removable_bytes']):>11}"
            )
        if len(rows) > limit and verbose < 2:
            lines.append(f"... {len(rows) - limit} more rows (-vv shows them all; so does --format json)")
    if section["removals"]:
        lines.append("")
    for removal in section["removals"]:
        what = (
            display(removal["distribution"]) + " (pip uninstall)"
            if removal["distribution"]
            else view.path(removal["path"])
        )
        devel = f", {plural(len(removal['devel_links']), 'devel link')}" if removal["devel_links"] else ""
        why = f": {display(removal['reason'])}" if removal["reason"] else ""
        lines.append(
            f"{_REMOVAL_MARK[removal['status']]:12} {what}  [{display(removal['kind'])}, "
            f"{', '.join(display(a) for a in removal['arches'])}, {size_text(removal['bytes'])}{devel}]{why}"
        )
    for kept in section["kept_units"]:
        lines.append(f"{'kept':12} {view.path(kept['path'])}: {display(kept['reason'])}")
    if section["mode"] == "dry-run" and section["shell_preview"]:
        if verbose:
            lines.append(
                "# equivalent shell (rocm-audit also journals and re-checks each file just before removing it):"
            )
            lines.extend(hold(display(line)) for line in section["shell_preview"])  # whole, to paste
        else:
            lines.append("(-v shows the equivalent shell commands)")
    lines += _fatbin_lines(sections, view)
    if section["mode"] == "dry-run":
        lines += no_backup_lines(sections, done=False)
    return lines


def prune_closing_lines(sections: Sections) -> list[str]:
    """What an applying run did (or why nothing), where its journal is and the command that
    undoes it: the last lines above the count, where a person looks when the run ends."""
    if "prune_revert" in sections:
        return prune_revert_closing_lines(sections)
    section = sections["prune"]
    if section["mode"] != "apply":
        return []
    if section["nothing_done"]:
        return [f"prune: nothing removed: {display(section['nothing_done'])}"]
    lines = [display(f"prune: {done_text(section)}")]
    if section["manifest"]:
        lines.append(f"revert manifest: {hold(display(section['manifest']))}")
    if section["backup"]:
        lines.append(f"backup of the originals: {hold(display(section['backup']))}")
    if section["revert_command"]:
        command = hold(display(section["revert_command"]))  # one line, whole, to copy
        said = f"to undo, run: {command}"
        lines += [said] if len(said) <= WIDTH else ["to undo, run:", f"  {command}"]
    return lines + no_backup_lines(sections, done=True)


def no_backup_lines(sections: Sections, *, done: bool) -> list[str]:
    """Without --backup, undoing is a reinstall from the package index (prune --revert prints the
    pip line): a build without network access cannot undo it. Said where a run that changed
    something ends (``done``), and in its dry run, of what it plans, first."""
    section = sections["prune"]
    fatbins = sections.get("prune_fatbins")
    removed, slimmed = ("removed", "slimmed") if done else ("planned", "planned")
    changes = any(r["status"] == removed for r in section["removals"]) or any(
        library["status"] == slimmed for library in (fatbins["libraries"] if fatbins is not None else [])
    )
    if section["backup"] or not changes:
        return []
    return [
        "no --backup: undoing this reinstalls what it changes from the package index (pip);",
        "  --backup DIR keeps the originals, so that prune --revert needs no network",
    ]


_FATBIN_MARK = {"planned": "would slim", "slimmed": "slimmed", "skipped": "SKIPPED", "failed": "FAILED"}


def _fatbin_lines(sections: Sections, view: PathView) -> list[str]:
    """--fatbins: bytes zeroed per distribution, then each library slimmed or refused."""
    fatbins = sections.get("prune_fatbins")
    if fatbins is None:
        return []
    shown = {row["distribution"] for row in sections["prune"]["weight"]}  # in the table's fatbins column
    verb = "removed" if fatbins["mode"] == "apply" else "to remove"
    lines = ["", f"device code in fat binaries of host libraries, {verb}:"]
    lines += [
        f"{display(d['distribution']):32} {size_text(d['bytes']):>11}"
        for d in fatbins["by_distribution"]
        if d["distribution"] not in shown
    ]
    if not fatbins["by_distribution"]:
        lines.append(_why_no_fatbins(fatbins["libraries"]))
    for library in fatbins["libraries"]:
        if library["status"] in ("skipped", "failed"):
            lines.append(
                f"{_FATBIN_MARK[library['status']]:12} {view.path(library['path'])}: {display(library['reason'])}"
            )
        elif library["bytes"] and library["status"] in _FATBIN_MARK:
            removed = ", ".join(display(t) for t in sorted(library["removed_targets"], key=processor_sort_key))
            # How the bytes leave the file (JSON `layout`: cut at its end or moved) is no user's concern.
            on_disk = (
                f"file {size_text(library['file_bytes'])} smaller"
                if library["file_bytes"]
                else "zeroed, same file size"
            )
            lines.append(
                f"{_FATBIN_MARK[library['status']]:12} {view.path(library['path'])}  "
                f"[{size_text(library['bytes'])}; {removed}; {on_disk}]"
            )
        elif library["reason"]:
            lines.append(f"{'kept whole':12} {view.path(library['path'])}: {display(library['reason'])}")
    return lines


_RESTORED_SHOWN = 10


def _why_no_fatbins(libraries: Sequence[FatbinLibraryRecord]) -> str:
    """Why no device code left (or would leave) the fat binaries: failures, refusals, or none to remove."""
    if any(lib["status"] in ("skipped", "failed") for lib in libraries):
        return "nothing: not slimmed (the lines below and the errors say why)"
    if any(lib["reason"] for lib in libraries):
        return "nothing: each library is left as it is, for the reason given below"
    return "nothing: every bundle holds only code a kept target can select"


def prune_revert_lines(sections: Sections, view: PathView = _NO_ROOTS, verbose: int = 0) -> list[str]:
    """The paths put back (the first ten; -v all). The commands for the rest are in the PRUNE007
    findings, said once there."""
    restored = sections["prune_revert"]["restored"]
    shown = restored if verbose else restored[:_RESTORED_SHOWN]
    lines = [f"restored {view.path(path)}" for path in shown]
    if len(restored) > len(shown):
        lines.append(f"... and {len(restored) - len(shown):,} more (-v lists them)")
    return lines


def prune_revert_closing_lines(sections: Sections) -> list[str]:
    """What the revert did, always: how many paths came back or why none did; what is left for
    pip; the backups no longer needed."""
    section = sections["prune_revert"]
    if section["nothing_done"]:
        lines = [f"prune --revert: nothing to restore: {display(section['nothing_done'])}"]
    else:
        restored = len(section["restored"])
        lines = [
            f"prune --revert: restored {plural(restored, 'path')}"
            if restored
            else "prune --revert: no backup to restore from (the prune kept none)"
        ]
        if section["original"]:
            lines[0] += f"; {len(section['original']):,} already as they were"
    if section["reinstall"]:
        count = len(section["reinstall"])
        where = "the PRUNE007 warning above gives it" if count == 1 else "the PRUNE007 warnings above give them"
        lines.append(f"{plural(count, 'reinstall')} left to run: {where}")
    back = "everything still installed is back" if section["uninstalled"] else "everything is back"
    for backup in section["backups_done"]:
        lines.append(f"{back}: the backup {hold(display(backup))} is no longer needed and can be removed")
    return lines
