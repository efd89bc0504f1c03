"""What an applying ``prune`` did, in its report section: the counts, the journal, the command that
undoes it, or why nothing changed; and the one summary line for stderr (JSON reports).

The texts are plain strings of the section's fields (audit/pruning.py's stderr line, and
output/prune_text.py, which escapes them, for a person).
"""

from __future__ import annotations

import os
import shlex

from rocm_audit.findings import Finding, Severity
from rocm_audit.prune.apply import ApplyResult
from rocm_audit.prune.fatbins.apply import FatbinApplyResult
from rocm_audit.report_types import PruneSection
from rocm_audit.units import plural, size_text


def revert_command(manifest: str) -> str:
    """The command that undoes an applying run journalled in ``manifest``."""
    return f"rocm-audit prune --revert {shlex.quote(manifest)}"


def record_apply(
    section: PruneSection,
    result: ApplyResult | None,
    fatbins: FatbinApplyResult | None,
    errors: list[Finding],
    *,
    fatbins_asked: bool,
) -> None:
    """Fill the apply fields of ``section``: whole units removed, libraries slimmed, bytes freed on
    disk (both), the manifest and backup written, the undo command; or, when nothing changed, why
    (``nothing_done``). ``errors``: the findings the apply step added."""
    removed = result.removed if result is not None else 0
    slimmed = fatbins.slimmed if fatbins is not None else 0
    section["removed"] = removed
    section["slimmed"] = slimmed
    section["slimmed_bytes"] = fatbins.bytes_zeroed if fatbins is not None else 0
    section["bytes_freed"] = (result.bytes_freed if result is not None else 0) + (
        fatbins.bytes_saved if fatbins is not None else 0
    )
    manifest = (result.manifest if result is not None else None) or (fatbins.manifest if fatbins is not None else None)
    backup = (result.backup if result is not None else None) or (fatbins.backup if fatbins is not None else None)
    section["manifest"] = manifest
    section["backup"] = os.path.abspath(backup) if manifest and backup else None
    section["revert_command"] = revert_command(manifest) if manifest and (removed or slimmed) else None
    section["nothing_done"] = "" if removed or slimmed else _why_nothing(section, errors, fatbins_asked)


def _why_nothing(section: PruneSection, errors: list[Finding], fatbins_asked: bool) -> str:
    failed = [f for f in errors if f.severity is Severity.ERROR]
    if failed:
        more = f" (and {plural(len(failed) - 1, 'other error')})" if len(failed) > 1 else ""
        return f"{failed[0].message}{more}"
    totals = section["totals"]
    if not totals["unused_bytes"]:
        return "every byte of device code here serves a kept target"
    if not fatbins_asked and totals["unused_in_host_libraries_bytes"] and not section["removals"]:
        return "the code for other GPUs sits in fat binaries of host libraries, which --fatbins slims"
    return "no whole unit for other GPUs can go and no library can be slimmed (the findings say what stays and why)"


def apply_summary(section: PruneSection) -> str:
    """One line: what an applying run did, where its journal is and how to undo it."""
    if section["nothing_done"]:
        return f"prune: nothing removed: {section['nothing_done']}"
    return "; ".join([f"prune: {done_text(section)}", *undo_texts(section)])


def done_text(section: PruneSection) -> str:
    """``removed 2 per-GPU files, folders or wheels and slimmed 12 libraries: 693.1 MiB freed on disk
    (693.1 MiB of device code out of fat binaries)``."""
    parts = []
    if section["removed"]:
        units = plural(section["removed"], "per-GPU file, folder or wheel", "per-GPU files, folders or wheels")
        parts.append(f"removed {units}")
    if section["slimmed"]:
        parts.append(f"slimmed {plural(section['slimmed'], 'library', 'libraries')}")
    text = " and ".join(parts) + f": {size_text(section['bytes_freed'])} freed on disk"
    if section["slimmed_bytes"]:
        text += f" ({size_text(section['slimmed_bytes'])} of device code out of fat binaries)"
    return text


def undo_texts(section: PruneSection) -> list[str]:
    """Where the journal is (and the backup), and the command that undoes the run."""
    texts = []
    if section["manifest"]:
        kept = f" (the originals are in {section['backup']})" if section["backup"] else ""
        texts.append(f"revert manifest: {section['manifest']}{kept}")
    if section["revert_command"]:
        texts.append(f"to undo: {section['revert_command']}")
    return texts
