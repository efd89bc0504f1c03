"""What a dedup run reports: the JSON section, the --dry-run shell preview, the findings of --check."""

from __future__ import annotations

import os
import shlex

from rocm_audit.dedup.apply import ApplyResult
from rocm_audit.dedup.plan import DedupGroup, DedupPlan
from rocm_audit.findings import Finding, make_finding
from rocm_audit.report_types import DedupGroupRecord, DedupSection
from rocm_audit.units import plural, size_text


def _group_json(group: DedupGroup) -> DedupGroupRecord:
    return {
        "keeper": group.keeper.path,
        "duplicates": [
            {
                "path": d.record.path,
                "link_text": d.link_text,
                "hardlink": d.hardlink,
                "made": d.make,
                "intact": d.intact,
                "status": group.status[d.record.path],
            }
            for d in group.duplicates
        ],
        "size": group.size,
        "reason": group.reason,
    }


def shell_preview(groups: list[DedupGroup]) -> list[str]:
    """An equivalent shell script for --dry-run (without rocm-audit's re-checks)."""
    lines = []
    for group in groups:
        for d in group.duplicates:
            keeper, path = shlex.quote(group.keeper.path), shlex.quote(d.record.path)
            link = (
                f"ln -fn -- {keeper} {path}"
                if d.make == "hardlink"
                else f"ln -sfn -- {shlex.quote(d.link_text)} {path}"
            )
            lines.append(f"cmp -s -- {keeper} {path} && {link}")
    return lines


def dedup_section(plan: DedupPlan, mode: str, result: ApplyResult, elapsed_s: float) -> DedupSection:
    """The `dedup` section of the JSON report."""
    planned_freed = sum(g.bytes_freed_if_done() for g in plan.groups)
    return {
        "mode": mode,
        "groups": [_group_json(g) for g in plan.groups],
        "bytes_freed": result.bytes_freed if mode == "apply" else planned_freed,
        "replaced": result.replaced,
        "skipped": result.skipped,
        "manifest": result.manifest,
        "verified": result.verified,
        "shell_preview": shell_preview(plan.groups) if mode == "dry-run" else [],
        "intact_links": [{"keeper": keeper, "paths": paths} for keeper, paths in plan.intact],
        "files_scanned": len(plan.inventory.files),
        "bytes_compared": plan.stats.bytes_read,
        "elapsed_s": round(elapsed_s, 3),
    }


def check_mode_findings(plan: DedupPlan) -> list[Finding]:
    """DUP001/DUP002/DUP011 for every group a plain run would change (what --check, --dry-run and
    `check` report). Expansions on their runtime file's inode (plan.intact) are TheRock's own links
    and no finding: a fresh install passes."""
    findings = []
    # Mirrored files come by the thousand (Tensile, kernel DBs): one finding per pair of trees.
    mirrored: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for group in plan.groups:
        if group.reason == "mirrored":
            for d in group.duplicates:
                key = (group.keeper.sdk_tree or group.keeper.root, d.record.sdk_tree or d.record.root)
                mirrored.setdefault(key, []).append((d.record.path, group.size))
            continue
        intact = [d for d in group.duplicates if d.intact]
        judged = [d for d in group.duplicates if not d.intact]
        if judged:
            hardlinks_only = all(d.hardlink for d in judged)
            findings.append(
                make_finding(
                    "DUP002" if hardlinks_only else "DUP001",
                    group.keeper.path,
                    f"{plural(len(judged), 'other path')} hold{'s' if len(judged) == 1 else ''} the same library "
                    f"({size_text(group.size)})" + (" through hardlinks" if hardlinks_only else " under another inode"),
                    related=[d.record.path for d in judged],
                    data={"size": group.size},
                )
            )
        if intact:
            findings.append(
                make_finding(
                    "DUP013",
                    group.keeper.path,
                    f"{plural(len(intact), 'devel path')} share{'s' * (len(intact) == 1)} this library's inode, "
                    "as rocm-sdk init made them: one library for the loader; dedup makes them relative symlinks, "
                    "which survive a per-tree copy",
                    related=[d.record.path for d in intact],
                    data={"size": group.size},
                )
            )
    for (runtime_tree, expansion_tree), copies in sorted(mirrored.items()):
        findings.append(
            make_finding(
                "DUP011",
                runtime_tree,
                f"{plural(len(copies), 'file')} of {os.path.basename(expansion_tree)} that TheRock links to this "
                f"tree's files hold separate copies ({size_text(sum(size for _, size in copies))})",
                related=sorted(path for path, _ in copies),
                data={"files": len(copies), "bytes": sum(size for _, size in copies)},
            )
        )
    return findings
