"""`rocm-audit dedup`: discover, plan and (mode "apply") apply; the outcome for the CLI."""

from __future__ import annotations

import os
import time

from rocm_audit.dedup.apply import ApplyResult, apply_plan
from rocm_audit.dedup.plan import hardlinked, make_plan
from rocm_audit.dedup.report import check_mode_findings, dedup_section
from rocm_audit.errors import Interrupted
from rocm_audit.findings import make_finding
from rocm_audit.outcome import CommandOutcome
from rocm_audit.progress import SILENT, Progress
from rocm_audit.report_types import Sections
from rocm_audit.tree.discovery import resolve_roots
from rocm_audit.tree.inventory import build_inventory
from rocm_audit.units import plural, size_text


def run_dedup(
    paths: list[str] | None, *, mode: str, manifest_path: str | None = None, progress: Progress = SILENT
) -> CommandOutcome:
    """Discover, plan, and (mode == "apply") apply. Returns the outcome for the CLI.

        Raises Interrupted on Ctrl-C in mode "apply": before the first change (nothing changed), during
    the changes (apply_plan's count), or after them (all made, the report not built)."""
    applied: list[ApplyResult] = []
    try:
        return _run_dedup(paths, mode=mode, manifest_path=manifest_path, progress=progress, applied=applied)
    except Interrupted:
        raise
    except KeyboardInterrupt:
        if mode != "apply":
            raise
        if not applied:
            raise Interrupted("dedup", 0, 0, None) from None
        done = applied[0]
        raise Interrupted("dedup", done.replaced, done.planned, done.manifest if done.replaced else None) from None


def _run_dedup(
    paths: list[str] | None,
    *,
    mode: str,
    manifest_path: str | None,
    progress: Progress,
    applied: list[ApplyResult],
) -> CommandOutcome:
    started = time.monotonic()
    roots, looked = resolve_roots(paths, for_dedup=True)
    inventory = build_inventory(roots, progress, worth_reading=hardlinked)
    findings = list(inventory.findings)
    if not inventory.sdk_trees:
        findings.append(
            make_finding(
                "SCAN003",
                looked[0] if len(looked) == 1 else ", ".join(looked),
                f"no ROCm SDK tree (_rocm_sdk_*) found; looked in: {', '.join(looked)}",
                data={"looked_in": looked},
            )
        )
    plan = make_plan(inventory, exact=mode != "apply", progress=progress)
    findings.extend(plan.findings)
    result = ApplyResult()
    if mode == "apply":
        result = apply_plan(plan, manifest_path, findings, progress)
        applied.append(result)
        findings = [f for f in findings if not (f.rule == "SCAN004" and not os.path.lexists(f.path))]
    else:  # what a plain run would change; a dry run says it too, never "0 error(s)" on a split tree
        findings.extend(check_mode_findings(plan))
    planned_freed = sum(g.bytes_freed_if_done() for g in plan.groups)
    elapsed = time.monotonic() - started
    replaced_or_planned = result.replaced if mode == "apply" else sum(len(g.duplicates) for g in plan.groups)
    sections: Sections = {"sdk_trees": inventory.sdk_trees, "dedup": dedup_section(plan, mode, result, elapsed)}
    verb = {"apply": "replaced", "dry-run": "to be replaced", "check": "to be replaced"}[mode]
    freed = result.bytes_freed if mode == "apply" else planned_freed
    summary = (
        f"dedup ({mode}): {plural(len(plan.groups), 'group')}, {plural(replaced_or_planned, 'file')} {verb} by links, "
        f"{size_text(freed)} {'freed' if mode == 'apply' else 'to free'}, "
        f"{len(inventory.files)} files scanned in {elapsed:.2f} s"
    )
    if plan.intact:
        settled = sum(len(paths) for _, paths in plan.intact)
        summary += f"; {plural(settled, 'path')} already on their runtime file's inode, left as rocm-sdk made them"
    if not inventory.sdk_trees:
        summary = "dedup: nothing to link: no SDK tree in the audited paths"  # SCAN003 says where it looked
    return CommandOutcome(
        command="dedup",
        findings=findings,
        inputs=[r.path for r in roots],
        sections=sections,
        # A fresh TheRock install passes: its intact hardlinks are one library for the loader (DUP013, info).
        force_failure=(mode == "check" and any(not d.intact for g in plan.groups for d in g.duplicates)),
        findings_decide_exit=mode != "dry-run",
        summary=summary,
    )
