"""After an applying run: every path resolves to its planned inode and DT_NEEDED resolutions are unchanged."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from rocm_audit.dedup.plan import DedupPlan
from rocm_audit.elf import read as elfread
from rocm_audit.findings import Finding, make_finding
from rocm_audit.tree.loader import LoaderModel


@dataclass(frozen=True, slots=True)
class NeededBefore:
    dynamic: elfread.DynamicInfo  # read from the duplicate's own bytes, which its keeper's equal
    resolved: dict[str, str | None]  # DT_NEEDED name -> the path glibc would load


def needed_before(paths: Sequence[str]) -> dict[str, NeededBefore]:
    """DT_NEEDED resolution of each library, as the loader sees it now (read-only: any process)."""
    loader = LoaderModel()
    snapshot: dict[str, NeededBefore] = {}
    for path in paths:
        dynamic = loader.dynamic_of(path)
        if dynamic is not None:
            resolutions = loader.resolve_all(path, dynamic)
            snapshot[path] = NeededBefore(dynamic, {n: r.path for n, r in resolutions.items()})
    return snapshot


def verify_applied(plan: DedupPlan, before: dict[str, NeededBefore], findings: list[Finding]) -> bool:
    """Every path still resolves to the same bytes; DT_NEEDED of replaced libraries resolve alike."""
    ok = True
    for group in plan.groups:
        keeper = group.keeper
        try:
            keeper_now = os.stat(keeper.path)
        except OSError as exc:
            findings.append(make_finding("DUP006", keeper.path, f"keeper no longer resolves: {exc.strerror}"))
            ok = False
            continue
        if (keeper_now.st_dev, keeper_now.st_ino) != keeper.identity or keeper_now.st_size != keeper.size:
            findings.append(make_finding("DUP006", keeper.path, "keeper changed during the run"))
            ok = False
        for planned in group.duplicates:
            path = planned.record.path
            expected = keeper.identity if group.status[path] == "replaced" else planned.record.identity
            try:
                now = os.stat(path)
            except OSError as exc:
                findings.append(make_finding("DUP006", path, f"path no longer resolves: {exc.strerror}"))
                ok = False
                continue
            if (now.st_dev, now.st_ino) != expected or now.st_size != planned.record.size:
                findings.append(
                    make_finding(
                        "DUP006", path, "path resolves to a different file than planned", related=[keeper.path]
                    )
                )
                ok = False
    # Every path was just shown to resolve to its planned inode, whose bytes were compared with the
    # duplicate's: the dynamic section read before the change is the one the loader reads now.
    after_loader = LoaderModel()
    for path, needed in sorted(before.items()):
        resolved_before = needed.resolved
        resolved_after = {n: r.path for n, r in after_loader.resolve_all(path, needed.dynamic).items()}
        if resolved_after != resolved_before:
            changed = sorted(
                n for n in set(resolved_before) | set(resolved_after) if resolved_before.get(n) != resolved_after.get(n)
            )
            findings.append(
                make_finding(
                    "DUP006",
                    path,
                    f"DT_NEEDED resolution changed for {', '.join(changed)}",
                    data={"before": resolved_before, "after": resolved_after},
                )
            )
            ok = False
    return ok
