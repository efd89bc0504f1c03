"""`verify-arch` and `scan --targets`: which GPU targets every device-code carrier serves.

A carrier is something the runtime loads device code from as one unit: a host library or executable
with a fat binary (judged per translation unit, formats.md 2.9), a standalone code-object file, a
set of per-arch files that differ only by the arch in their name (``libMIOpenCK*_gfx942.so``), the
folders of code objects named for their arch (aiter's ``hsa/gfx942/``), a per-arch kernel database
(Tensile ``library/``, AOTriton ``aotriton.images``), or Triton's compiled kernels (a kernel cache or
an AOT folder: each kernel is launched only on the GPU its metadata names, and compiled at first
use on another). Library code: returns a ``CommandOutcome`` and never prints.

The commands live here; the steps beside them: requested.py (which targets), scanning.py (reading
every file), carriers.py (grouping files into carriers), judge.py (the judgement), report.py (the
report sections).
"""

from __future__ import annotations

import os

from rocm_audit.gpu.carriers import Carrier, build_carriers, package_of, tree_family
from rocm_audit.gpu.judge import judge, judge_all, tu_match, unselectable
from rocm_audit.gpu.kpack_runtime import inventory_findings
from rocm_audit.gpu.report import carrier_to_dict, code_object_to_dict, scan_findings
from rocm_audit.gpu.requested import (
    TargetCandidate,
    TargetChoice,
    choose_targets,
    dist_info_candidates,
    installed_device_wheel_targets,
    installed_library_families,
    requested_targets,
)
from rocm_audit.gpu.scanning import code_objects_of, may_hold_code, scan_inventory, selection_for
from rocm_audit.outcome import CommandOutcome
from rocm_audit.progress import SILENT, Progress
from rocm_audit.report_types import CodeObjectFileRecord
from rocm_audit.tree.discovery import resolve_roots
from rocm_audit.tree.inventory import FileKind, build_inventory
from rocm_audit.tree.targets import resolve_required
from rocm_audit.units import plural

# What other packages and the tests reach through this module (the steps' own modules also work).
__all__ = [
    "Carrier",
    "TargetCandidate",
    "TargetChoice",
    "build_carriers",
    "carrier_to_dict",
    "choose_targets",
    "code_object_to_dict",
    "code_objects_of",
    "dist_info_candidates",
    "installed_device_wheel_targets",
    "installed_library_families",
    "inventory_summary",
    "judge",
    "judge_all",
    "list_targets",
    "may_hold_code",
    "requested_targets",
    "resolve_required",
    "scan_findings",
    "scan_inventory",
    "selection_for",
    "tree_family",
    "tu_match",
    "unselectable",
    "verify_arch",
]


def verify_arch(
    paths: list[str] | None,
    target_args: list[str],
    *,
    environ: dict[str, str] | None = None,
    progress: Progress = SILENT,
) -> CommandOutcome:
    """Judge every carrier under ``paths`` against the requested targets. Raises UsageError."""
    roots, looked = resolve_roots(paths)
    choice = choose_targets(target_args, [r.path for r in roots], dict(os.environ) if environ is None else environ)
    required = choice.targets
    inventory = build_inventory(roots, progress)
    scans = scan_inventory(inventory, selection_for(required), progress)
    progress.phase(f"judging GPU code against {len(required)} target(s)")
    carriers = build_carriers(scans)
    findings = list(inventory.findings) + scan_findings(scans)
    judged = judge_all(carriers, required)
    findings.extend(judged)
    findings.extend(inventory_findings(inventory, scans, required, judged))
    failing = sum(1 for c in carriers if c.missing)
    outcome = CommandOutcome(
        command="verify-arch",
        findings=findings,
        inputs=looked,
        sections={
            "targets": [{"target": t.spelled, "agent": str(t.agent)} for t in required],
            "targets_source": choice.source,
            "targets_origin": choice.origin,
            "carriers": [carrier_to_dict(c) for c in carriers],
        },
        summary=f"verify-arch: {plural(len(carriers), 'carrier')}, {failing} missing a target of "
        f"{', '.join(t.spelled for t in required)}",
    )
    return outcome


def list_targets(paths: list[str] | None, *, progress: Progress = SILENT) -> CommandOutcome:
    """Every code object in every file under ``paths`` (``scan --targets``)."""
    roots, looked = resolve_roots(paths)
    inventory = build_inventory(roots, progress)
    scans = scan_inventory(inventory, progress=progress)
    objects = [code_object_to_dict(s.path, obj) for s in scans for obj in s.code_objects]
    files: list[CodeObjectFileRecord] = [
        {
            "path": s.path,
            "package": package_of(s.sdk_tree),
            "containers": sorted(s.containers),
            "tu_count": s.tu_count,
            "wrappers": s.wrappers,
            "kpack": s.kpack_ref,
            "code_objects": len(s.code_objects),
        }
        for s in scans
    ]
    return CommandOutcome(
        command="scan",
        findings=list(inventory.findings) + scan_findings(scans),
        inputs=looked,
        sections={"code_object_files": files, "code_objects": objects},
        summary=f"scan: {plural(sum(o['kind'] != 'host' for o in objects), 'GPU code object')} "
        f"in {plural(len(files), 'file')}",
    )


def inventory_summary(paths: list[str] | None, *, progress: Progress = SILENT) -> CommandOutcome:
    """Plain ``scan``: how many files of each kind, and the SDK trees, under ``paths``."""
    roots, looked = resolve_roots(paths)
    inventory = build_inventory(roots, progress)
    counts = {kind.value: 0 for kind in FileKind}
    for record in inventory.files:
        counts[record.opened_kind.value] += 1

    return CommandOutcome(
        command="scan",
        findings=list(inventory.findings),
        inputs=looked,
        sections={"sdk_trees": inventory.sdk_trees, "file_kinds": counts},
        summary=f"scan: {plural(len(inventory.files), 'file')}",
    )
