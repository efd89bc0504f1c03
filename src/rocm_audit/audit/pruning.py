"""`rocm-audit prune` and prune's part of `check`: gpu's code-object scan fed into prune's plan.

prune (a capability) cannot import gpu (another one); this module, above both, resolves the
targets the way verify-arch does and hands prune gpu's per-file code-object fact.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import time

from rocm_audit.errors import FormatError, Interrupted
from rocm_audit.findings import Finding, Severity, make_finding
from rocm_audit.outcome import CommandOutcome
from rocm_audit.progress import SILENT, Progress
from rocm_audit.prune import apply as prune_apply
from rocm_audit.prune.fatbins.apply import FatbinApplyResult, FatbinPlan, apply_fatbins, plan_fatbins, revert_fatbins
from rocm_audit.prune.fatbins.comgr import site_comgr
from rocm_audit.prune.plan import (
    DeviceCode,
    DeviceCodeOf,
    Kept,
    PrunePlan,
    Removal,
    distribution_matches,
    keep_distributions,
    make_plan,
)
from rocm_audit.prune.reinstall import Reinstalls, mark_reverted, run_facts
from rocm_audit.prune.summary import apply_summary, record_apply
from rocm_audit.prune.weigh import NO_DISTRIBUTION, Weight, weigh
from rocm_audit.report_types import (
    FatbinDistribution,
    KeptDistribution,
    PruneFatbinsSection,
    PruneRemoval,
    PruneRevertSection,
    PruneSection,
    PruneTotals,
)
from rocm_audit.tree.discovery import resolve_roots
from rocm_audit.tree.inventory import FileKind, FileRecord, Inventory, build_inventory
from rocm_audit.tree.journal import journalled_trees
from rocm_audit.tree.ownership import Distribution, normalize
from rocm_audit.tree.targets import TargetSelection, kept_target
from rocm_audit.units import plural, size_text

MODES = ("apply", "dry-run", "check")


def _units(count: int) -> str:
    """What whole-unit prune removes, counted: per-arch files and folders, and device wheels."""
    return plural(count, "per-GPU file, folder or wheel", "per-GPU files, folders or wheels")


def kept_targets(
    target_args: list[str], roots: list[str], environ: dict[str, str]
) -> tuple[list[Kept], str, TargetSelection]:
    """Targets as verify-arch resolves them (arguments, $GPU_ARCH, policy, dist_info.json), and the
    scan selection verify-arch would use for them: compressed entries no kept target selects are
    listed from their bundle ids, never inflated (their sizes come from the entry table). Raises
    UsageError."""
    from rocm_audit.gpu.verify import requested_targets, selection_for

    required, source = requested_targets(target_args, roots, environ)
    return [Kept(t.spelled, kept_target(t.spelled)) for t in required], source, selection_for(required)


def device_code_of(inventory: Inventory, selection: TargetSelection | None = None) -> DeviceCodeOf:
    """gpu's code-object fact of a file (read once per run), None for files that hold no code.
    ``selection``: check's, so that prune weighs the fact verify-arch already read (entries the
    judgement did not inflate count by the target their bundle id names)."""
    from rocm_audit.gpu.verify import code_objects_of, may_hold_code

    def read(record: FileRecord) -> DeviceCode | None:
        if record.kind is None or not may_hold_code(record):
            return None
        return code_objects_of(inventory, record, selection)

    return read


def kept_distributions(keep_dist_args: list[str]) -> list[tuple[str, str]]:
    """The distributions prune leaves whole, each with where it was named: ``--keep-dist NAME``,
    then a rules file's ``[policy.prune] keep_dist``."""
    from rocm_audit.rulebook.policy import active_policy

    current = active_policy()
    where = current.setting_sources.get(("prune", "keep_dist"), "a rules file")
    named = [(name, f"--keep-dist {name}") for name in keep_dist_args]
    named += [(name, f"keep_dist in {where}") for name in current.area("prune").get("keep_dist", [])]
    return named


def check_kept_names(keep_dist_args: list[str], installed: list[Distribution]) -> None:
    """Each ``--keep-dist NAME`` must name (or, as a glob, match) an installed distribution: a typo
    would keep nothing whole and say nothing. Raises UsageError, with the closest names."""
    import difflib

    from rocm_audit.errors import UsageError

    names = sorted({d.name for d in installed}, key=str.lower)
    by_normal = {normalize(name): name for name in names}
    for pattern in keep_dist_args:
        if distribution_matches_any(pattern, installed):
            continue
        wanted = normalize(pattern)
        # A name's first word ("cupy" for cupy-rocm-7-0) is what people type; then spelling slips.
        close = [name for n, name in by_normal.items() if n.startswith(wanted + "-")][:3]
        close = close or [by_normal[n] for n in difflib.get_close_matches(wanted, list(by_normal), n=3, cutoff=0.6)]
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        where = f"{len(names)} installed" if names else "none installed"
        raise UsageError(f"--keep-dist {pattern}: no installed distribution has that name ({where}){hint}")


def distribution_matches_any(pattern: str, installed: list[Distribution]) -> bool:
    return any(distribution_matches(d.name, [(pattern, "")]) is not None for d in installed)


def kept_whole(installed: list[Distribution], keep: list[tuple[str, str]]) -> list[KeptDistribution]:
    """The installed distributions ``keep`` names, each with where it was named, by name."""
    found: list[KeptDistribution] = []
    for distribution in sorted(installed, key=lambda d: d.normalized):
        source = distribution_matches(distribution.name, keep)
        if source is not None and distribution.name not in [k["distribution"] for k in found]:
            found.append({"distribution": distribution.name, "source": source})
    return found


def weight_finding(
    plan: PrunePlan,
    weight: Weight,
    looked: str,
    fatbins: FatbinPlan | None = None,
    *,
    fatbins_estimate: int = 0,
) -> Finding | None:
    """PRUNE001 with the totals; None when every byte of device code serves a kept target.
    ``fatbins``: the --fatbins plan, whose bytes the message then states exactly; else
    ``fatbins_estimate``, what --fatbins would slim by the entry tables (fatbins_estimate())."""
    totals = weight.totals(fatbins_estimate)
    if not totals["unused_bytes"]:
        return None
    kept = ", ".join(k.spelled for k in plan.kept)
    if totals["removable_bytes"] or not (fatbins_estimate or (fatbins is not None and fatbins.freed)):
        removable = f"{size_text(totals['removable_bytes'])} of it can be removed by `rocm-audit prune`"
        removable += f" ({_units(len(plan.removals))})"
    else:  # nothing whole can go, but the fat binaries can be slimmed: say that, not "0 B"
        removable = "no whole file or distribution of it can go"
    in_libraries = totals["unused_in_host_libraries_bytes"]
    data: dict[str, object] = {**totals, "removals": len(plan.removals), "targets": [k.spelled for k in plan.kept]}
    if fatbins is not None:
        data["fatbins_bytes"] = fatbins.freed
        rest = (
            f"; `prune --fatbins` removes {size_text(fatbins.freed)} of device code from fat binaries of host "
            f"libraries ({size_text(fatbins.saved)} off the files on disk"
            + (
                f"; {size_text(fatbins.freed - fatbins.saved)} stays in them as zeros)"
                if fatbins.saved < fatbins.freed
                else ")"
            )
        )
    elif fatbins_estimate:
        rest = (
            f"; `rocm-audit prune --fatbins` can remove about {size_text(fatbins_estimate)} from fat binaries "
            "of host libraries (an estimate from their entry tables; `prune --fatbins --dry-run` gives the "
            "exact figure)"
        )
    elif in_libraries:
        rest = (
            f"; the rest, {size_text(in_libraries)}, sits in fat binaries of host libraries "
            "`rocm-audit prune --fatbins` leaves as they are (kept whole, or no library it can slim)"
        )
    else:
        rest = ""
    return make_finding(
        "PRUNE001",
        looked,
        f"{size_text(totals['unused_bytes'])} of {size_text(totals['device_bytes'])} device code is for GPUs no kept "
        f"target ({kept}) loads; {removable}{rest}",
        data=data,
    )


def _removal_dict(removal: Removal) -> PruneRemoval:
    distribution = removal.distribution
    return {
        "kind": removal.kind,
        "path": removal.path,
        "arches": list(removal.arches),
        "distribution": distribution.name if distribution is not None else None,
        "version": distribution.version if distribution is not None else None,
        "files": sorted(r.path for r in removal.files),
        "devel_links": sorted(d.path for d in removal.devel_links),
        "bytes": removal.bytes_on_disk,
        "status": removal.status,
        "reason": removal.reason,
    }


def shell_preview(plan: PrunePlan) -> list[str]:
    """What the plan does, as shell (rocm-audit also journals and re-checks each file first)."""
    lines = []
    for removal in plan.removals:
        if removal.distribution is not None:
            lines.append(f"python -m pip uninstall -y {shlex.quote(removal.distribution.name)}")
            paths = [d.path for d in removal.devel_links]
        elif removal.directories:
            lines.append(f"rm -rf -- {shlex.quote(removal.path)}")
            paths = [d.path for d in removal.devel_links]
        else:
            paths = [r.path for r in removal.files] + [d.path for d in removal.devel_links]
        lines.extend(f"rm -f -- {shlex.quote(path)}" for path in paths)
    return lines


def fatbins_estimate(
    inventory: Inventory, plan: PrunePlan, weight: Weight, reader: DeviceCodeOf, keep: list[tuple[str, str]]
) -> dict[str, int]:
    """Path -> bytes of device code no kept target loads inside the fat binaries of a host library
    that ``prune --fatbins`` would slim: the weight's figure for that file (entries no kept target
    can load, CCOB entries by their share of the bundle's bytes on disk), read from the entry
    tables, nothing inflated or recompressed. An estimate: the exact figure, after recompression
    and the runtime's own selection, is ``prune --fatbins --dry-run``'s."""
    removed = {r.path for removal in plan.removals for r in removal.files}
    estimate: dict[str, int] = {}
    for record in inventory.files:
        per = weight.by_path.get(record.path)
        if record.kind is not FileKind.SHARED_LIBRARY or record.path in removed or not per or per[1] <= per[2]:
            continue
        owner = plan.owner_of.get(record.path)
        if owner is not None and distribution_matches(owner.name, keep) is not None:
            continue
        with contextlib.suppress(OSError, FormatError):
            code = reader(record)
            if code is not None and "hip-fatbin" in code.containers:
                estimate[record.path] = per[1] - per[2]
    return estimate


def _by_distribution(plan: PrunePlan, by_path: dict[str, int]) -> list[FatbinDistribution]:
    sums: dict[str, int] = {}
    for path, nbytes in by_path.items():
        owner = plan.owner_of.get(path)
        name = owner.name if owner is not None else NO_DISTRIBUTION
        sums[name] = sums.get(name, 0) + nbytes
    return [{"distribution": d, "bytes": b} for d, b in sorted(sums.items(), key=lambda item: (-item[1], item[0]))]


def prune_section(
    plan: PrunePlan,
    weight: Weight,
    mode: str,
    source: str,
    elapsed_s: float = 0.0,
    fatbins_by_path: dict[str, int] | None = None,
    keep: list[tuple[str, str]] | None = None,
) -> PruneSection:
    fatbins_by_path = fatbins_by_path or {}
    return {
        "mode": mode,
        "targets": [k.spelled for k in plan.kept],
        "targets_source": source,
        "totals": weight.totals(sum(fatbins_by_path.values())),
        "fatbins_estimate": _by_distribution(plan, fatbins_by_path),
        "weight": [row.to_dict() for row in weight.rows],
        "removals": [_removal_dict(r) for r in plan.removals],
        "kept_units": [{"path": k.path, "arches": list(k.arches), "reason": k.reason} for k in plan.kept_units],
        "removed": 0,
        "slimmed": 0,
        "slimmed_bytes": 0,
        "bytes_freed": 0,
        "manifest": None,
        "backup": None,
        "revert_command": None,
        "nothing_done": "",
        "shell_preview": shell_preview(plan) if mode == "dry-run" else [],
        "elapsed_s": round(elapsed_s, 3),
        "kept_whole": kept_whole(plan.distributions, keep or []),
    }


def prune_for_check(
    inventory: Inventory,
    kept: list[Kept],
    source: str,
    looked: str,
    selection: TargetSelection | None = None,
    *,
    by_file: bool = False,
) -> tuple[Finding | None, PruneSection, dict[str, tuple[int, int, int, int]]]:
    """check's part: the weight and the plan (nothing changes), as one info finding and the section.
    With ``by_file``, also path -> (bytes, unused bytes, removable bytes, --fatbins estimate) of device code in that
    file, which ``image`` turns into a per-layer weight (empty without)."""
    reader = device_code_of(inventory, selection)
    plan = make_plan(inventory, kept, reader)
    keep = kept_distributions([])  # a rules file's [policy.prune] keep_dist
    keep_distributions(plan, keep)
    weight = weigh(inventory, plan, reader)
    fatbins = fatbins_estimate(inventory, plan, weight, reader, keep)
    section = prune_section(plan, weight, "check", source, fatbins_by_path=fatbins, keep=keep)
    by_path = (
        {path: (b, u, r, fatbins.get(path, 0)) for path, (b, u, r) in sorted(weight.by_path.items())} if by_file else {}
    )
    return weight_finding(plan, weight, looked, fatbins_estimate=sum(fatbins.values())), section, by_path


def run_prune(
    paths: list[str] | None,
    target_args: list[str],
    *,
    mode: str,
    manifest_path: str | None = None,
    backup_dir: str | None = None,
    python: str | None = None,
    environ: dict[str, str] | None = None,
    progress: Progress = SILENT,
    fatbins: bool = False,
    keep_dists: list[str] | None = None,
) -> CommandOutcome:
    """Weigh, plan and (mode "apply") remove; with ``fatbins`` also slim the fat binaries of host
    libraries (prune/fatbins), leaving whole the distributions named in ``keep_dists``. Raises
    UsageError, and Interrupted on Ctrl-C in mode "apply" (nothing changed when it came before the
    first removal)."""
    applied: list[prune_apply.ApplyResult] = []
    try:
        return _run_prune(
            paths,
            target_args,
            mode,
            manifest_path,
            backup_dir,
            python,
            environ,
            progress,
            applied,
            fatbins,
            list(keep_dists or []),
        )
    except Interrupted:
        raise
    except KeyboardInterrupt:
        if mode != "apply":
            raise
        if not applied:
            raise Interrupted("prune", 0, 0, None) from None
        done = applied[0]  # every removal was carried out; the report was not built
        raise Interrupted("prune", done.removed, done.planned, done.manifest if done.removed else None) from None


def _read_code_objects(inventory: Inventory, reader: DeviceCodeOf, progress: Progress) -> None:
    """The weight asks every file for its code objects: read them here, where the count shows."""
    progress.phase("reading GPU code objects", len(inventory.files), "files")
    seen_bytes = 0
    for done, record in enumerate(inventory.files, 1):
        seen_bytes += record.size
        progress.update(done, seen_bytes)
        with contextlib.suppress(OSError, FormatError):  # the plan meets the same error and reports it
            reader(record)


def _run_prune(
    paths: list[str] | None,
    target_args: list[str],
    mode: str,
    manifest_path: str | None,
    backup_dir: str | None,
    python: str | None,
    environ: dict[str, str] | None,
    progress: Progress,
    applied: list[prune_apply.ApplyResult],
    fatbins: bool = False,
    keep_dists: list[str] | None = None,
) -> CommandOutcome:
    started = time.monotonic()
    roots, looked = resolve_roots(paths)
    environ = dict(os.environ) if environ is None else environ
    kept, source, selection = kept_targets(target_args, [r.path for r in roots], environ)
    inventory = build_inventory(roots, progress)
    reader = device_code_of(inventory, selection)
    _read_code_objects(inventory, reader, progress)
    progress.phase("weighing device code for other GPUs")
    plan = make_plan(inventory, kept, reader)
    check_kept_names(keep_dists or [], plan.distributions)
    keep = kept_distributions(keep_dists or [])
    keep_distributions(plan, keep)
    # The backup the run would keep: a dry run refuses one inside the tree before it reads, as the run would.
    dry_backup = prune_apply.backup_outside(plan, backup_dir) if mode == "dry-run" else None
    weight = weigh(inventory, plan, reader)
    where = looked[0] if len(looked) == 1 else ", ".join(looked)
    findings: list[Finding] = list(inventory.findings) + plan.findings
    fatbin_plan = None
    if fatbins:
        # an applying run slims each library once, as it writes it (prune/fatbins/apply.py)
        progress.phase("choosing the libraries to slim" if mode == "apply" else "slimming fat binaries (in memory)")
        fatbin_plan = _fatbin_plan(inventory, plan, reader, keep, backup=backup_dir is not None, defer=mode == "apply")
        findings.extend(fatbin_plan.findings)
    estimate = fatbins_estimate(inventory, plan, weight, reader, keep)
    weight_note_at = len(findings)
    result = None
    fatbin_result = None
    if mode == "apply":
        result = prune_apply.apply_plan(plan, manifest_path, backup_dir, python, findings, progress)
        applied.append(result)
        if fatbin_plan is not None:
            progress.phase("slimming fat binaries")
            try:
                fatbin_result = _apply_fatbins(plan, fatbin_plan, manifest_path, backup_dir, findings, python)
            except Interrupted as stopped:  # the units removed before count as changes made too
                made, planned = stopped.made + result.removed, stopped.planned + result.planned
                manifest = stopped.manifest or (result.manifest if result.removed else None)
                raise Interrupted("prune", made, planned, manifest) from None
    apply_errors = findings[weight_note_at:]
    # after the apply: an applying run knows what the fat binaries gave only once they are slimmed
    weight_note = weight_finding(plan, weight, where, fatbin_plan, fatbins_estimate=sum(estimate.values()))
    if weight_note is not None:
        findings.insert(weight_note_at, weight_note)
    section = prune_section(plan, weight, mode, source, time.monotonic() - started, estimate, keep)
    if mode == "apply":
        record_apply(section, result, fatbin_result, apply_errors, fatbins_asked=fatbins)
        summary = apply_summary(section)
    else:
        section["backup"] = dry_backup
        summary = _plan_summary(mode, len(plan.removals), section["totals"])
    sections: dict[str, object] = {"sdk_trees": inventory.sdk_trees, "prune": section}
    if fatbin_plan is not None:
        sections["prune_fatbins"] = fatbins_section(fatbin_plan, mode, fatbin_result)
        if fatbin_result is None:
            summary += f"; --fatbins would remove {size_text(fatbin_plan.freed)} from host libraries "
            summary += f"({size_text(fatbin_plan.saved)} off the files on disk)"
    return CommandOutcome(
        command="prune",
        findings=findings,
        inputs=[r.path for r in roots],
        summary_commands=[section["revert_command"]] if section["revert_command"] else [],
        sections=sections,  # type: ignore[arg-type]
        force_failure=mode == "check" and (bool(plan.removals) or bool(fatbin_plan and fatbin_plan.freed)),
        summary=summary,
    )


def _plan_summary(mode: str, units: int, totals: PruneTotals) -> str:
    """The one-line summary of a run that changes nothing (dry run, check)."""
    return (
        f"prune ({mode}): {_units(units)}, {size_text(totals['removable_bytes'])} removable of "
        f"{size_text(totals['unused_bytes'])} unused device code ({size_text(totals['device_bytes'])} in all)"
    )


def _fatbin_plan(
    inventory: Inventory,
    plan: PrunePlan,
    reader: DeviceCodeOf,
    keep_dists: list[tuple[str, str]],
    *,
    backup: bool,
    defer: bool = False,
) -> FatbinPlan:
    """The libraries with fat binaries (gpu's scan saw a .hip_fatbin) that no removal takes,
    slimmed in memory (``defer``: left for the applying step to slim, once)."""
    removed = {r.path for removal in plan.removals for r in removal.files}
    candidates = []
    for record in inventory.files:
        if record.kind is not FileKind.SHARED_LIBRARY or record.path in removed:
            continue
        with contextlib.suppress(OSError, FormatError):
            code = reader(record)
            if code is not None and "hip-fatbin" in code.containers:
                candidates.append((record.path, plan.owner_of.get(record.path)))
    kept = [k.pattern for k in plan.kept]
    # the site's own comgr is the one the image will run (prune/fatbins/comgr.py)
    comgr = site_comgr([record.path for record in inventory.files]) if candidates else None
    return plan_fatbins(
        candidates, kept, [k.spelled for k in plan.kept], keep_dists, backup=backup, comgr_library=comgr, defer=defer
    )


def _apply_fatbins(
    plan: PrunePlan,
    fatbin_plan: FatbinPlan,
    manifest_path: str | None,
    backup_dir: str | None,
    findings: list[Finding],
    python: str | None = None,
) -> FatbinApplyResult:
    backup = prune_apply.backup_outside(plan, backup_dir)
    locked = sorted({*plan.sdk_trees, *(r.path for r in plan.roots if not r.single_file)})
    manifest = manifest_path or prune_apply.default_manifest_path(plan)
    return apply_fatbins(fatbin_plan, locked, manifest, backup, findings, python)


def fatbins_section(plan: FatbinPlan, mode: str, result: FatbinApplyResult | None) -> PruneFatbinsSection:
    return {
        "mode": mode,
        "bytes": result.bytes_zeroed if result is not None else plan.freed,
        "slimmed": result.slimmed if result is not None else 0,
        "by_distribution": [
            {"distribution": d, "bytes": b} for d, b in plan.freed_by_distribution(applied=result is not None).items()
        ],
        "libraries": [
            {
                "path": library.path,
                "distribution": library.owner.name if library.owner is not None else None,
                "bytes": library.freed,
                "removed_targets": library.result.removed_targets if library.result is not None else [],
                "status": library.status,
                "reason": library.refused,
                "layout": library.result.layout if library.result is not None else "",
                "file_bytes": library.saved,
                "comgr": library.comgr,
            }
            for library in plan.libraries
        ],
    }


def revert_prune(manifests: list[str], progress: Progress = SILENT, python: str | None = None) -> CommandOutcome:
    """Restore what the manifests journalled. ``python``: the audited site's interpreter, for the
    reinstall lines (else the one each manifest recorded, else the one owning the site). Raises
    UsageError, and Interrupted on Ctrl-C."""
    reinstalls = Reinstalls(python=os.path.abspath(python) if python else None)
    result = prune_apply.revert(manifests, progress, reinstalls)
    try:
        slimmed = revert_fatbins(manifests, reinstalls)
    except Interrupted as stopped:  # the paths the units' revert restored count too
        made, planned = stopped.made + len(result.restored), stopped.planned + result.planned
        raise Interrupted("prune --revert", made, planned, None) from None
    result.findings.extend(slimmed.findings)
    result.restored.extend(slimmed.restored)
    result.original.extend(slimmed.original)
    result.findings.extend(reinstalls.findings())
    reinstall = [*reinstalls.commands(), *result.reinstall]
    facts = run_facts(manifests)
    reverted, backups = facts.reverted, facts.backups
    failed = any(f.severity is Severity.ERROR for f in result.findings)
    whole = not failed and not reinstall  # every journalled path is as it was before the prune
    if whole:
        mark_reverted(facts)
    nothing = ""
    if not result.restored and whole:
        journalled = "this manifest" if len(manifests) == 1 else "these manifests"
        gone = ", ".join(name for name, _version in reinstalls.gone)
        if backups and all(run in reverted for run in backups):
            nothing = f"an earlier --revert restored everything {journalled} journalled" + (
                f", but for distributions uninstalled since ({gone})" if gone else ""
            )
        elif gone:
            nothing = f"what the prune changed belongs to distributions uninstalled since ({gone})"
        else:
            nothing = (
                "every journalled path is as it was before the prune (the run changed nothing, or it was put back)"
            )
    section: PruneRevertSection = {
        "restored": result.restored,
        "original": result.original,
        "reinstall": reinstall,
        "uninstalled": [{"distribution": n, "version": v} for n, v in reinstalls.gone],
        "nothing_done": nothing,
        "backups_done": sorted({b for b in backups.values() if b}) if whole and result.restored else [],
    }
    summary = (
        f"prune --revert: {plural(len(result.restored), 'path')} restored, {len(result.original)} already original"
    )
    if reinstall:
        summary += f", {plural(len(reinstall), 'reinstall command')} to run"
    return CommandOutcome(
        command="prune",
        findings=result.findings,
        inputs=list(manifests),
        roots=journalled_trees(manifests, [*result.restored, *result.original]),
        sections={"prune_revert": section},
        force_failure=bool(reinstall),
        summary=summary if not nothing else f"prune --revert: nothing to restore: {nothing}",
    )
