"""`rocm-audit check`: the whole audit in one pass over one inventory.

dedup in check mode, verify-arch, llvm (static; probes on request) and the post-build checks all
read the same inventory, so every file is walked and classified once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rocm_audit.errors import FormatError, UsageError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.outcome import CommandOutcome
from rocm_audit.progress import SILENT, Progress
from rocm_audit.report_types import Sections
from rocm_audit.tree.discovery import AuditRoot, resolve_roots
from rocm_audit.tree.inventory import FileKind, FileRecord, Inventory, build_inventory
from rocm_audit.tree.loader import HostView, LoaderModel
from rocm_audit.units import plural

if TYPE_CHECKING:
    from rocm_audit.gpu.verify import TargetCandidate, TargetChoice
    from rocm_audit.postbuild.symbols import PythonHost
    from rocm_audit.tree.targets import TargetSelection


@dataclass(slots=True)
class CheckOptions:
    targets: list[str] = field(default_factory=list)  # as on the verify-arch command line
    environ: dict[str, str] | None = None  # for $GPU_ARCH; None = os.environ
    environ_label: str = "$GPU_ARCH"  # how the report names that variable's origin
    targets_example: str = "rocm-audit check gfx942 gfx950"  # how to name targets, for CHK001
    # Target lists the audited system records (an image's Env and build history), most trusted first.
    recorded_targets: tuple[TargetCandidate, ...] = ()
    prune_by_file: bool = False  # image: device-code bytes per file, for its per-layer weight
    sysroot: str = "/"  # the system the audited files run on (an unpacked image root)
    # Files of that system the sysroot does not hold (paths inside it): an image's libraries
    # outside the directories its default mode extracts. The loader model finds them, unread.
    unextracted: frozenset[str] = frozenset()
    probe: bool = False
    probe_timeout_s: float | None = None
    python: str | None = None  # --python: the interpreter probes run under (else the audited one)
    skip: frozenset[str] = frozenset()  # any of CHECKS
    # Facts already read from the audited files' bytes, by inode and fact name (tree/facts.py):
    # an image's LLVM facts, read while its layers streamed (image/trim.py).
    known_facts: Mapping[tuple[int, int], Mapping[str, object]] = field(default_factory=dict)


CHECKS = ("dedup", "verify-arch", "llvm", "post-build", "prune")


def checks_to_skip(names: list[str]) -> frozenset[str]:
    """The --skip names, checked. Raises UsageError for a name that is no check."""
    unknown = set(names) - set(CHECKS)
    if unknown:
        raise UsageError(f"--skip takes {', '.join(sorted(CHECKS))}; not {', '.join(sorted(unknown))}")
    return frozenset(names)


def read_facts(
    inventory: Inventory, skip: frozenset[str], selection: TargetSelection | None = None, progress: Progress = SILENT
) -> None:
    """The fact pass: each file is opened once for every fact the checks not skipped will ask for
    (tree/facts.py). A fact that cannot be read is remembered; the check that asks reports it.
    ``selection``: the targets verify-arch will judge, so that code objects are read only as far
    as that judgement needs (gpu/codeobjects.scan_file). The linkage of LLVM's libraries, the
    longest reads, comes after the pass, several at a time (llvm/libfacts.py ``read_linkages``),
    through a second descriptor of the file the pass held."""
    from rocm_audit.gpu.verify import code_objects_of, may_hold_code
    from rocm_audit.llvm.clashes import role_facts_of
    from rocm_audit.llvm.libfacts import linkage_is_due, read_linkages

    linkage_due: list[tuple[FileRecord, int]] = []
    linkage_inodes: set[tuple[int, int]] = set()  # one read per inode, whatever the paths

    def code_objects(inventory: Inventory, record: FileRecord) -> object:
        return code_objects_of(inventory, record, selection)

    def linkage_later(inventory: Inventory, record: FileRecord) -> object:
        if record.identity not in linkage_inodes and linkage_is_due(inventory, record):
            fd = inventory.facts.duplicate(record)
            if fd is not None:
                linkage_inodes.add(record.identity)
                linkage_due.append((record, fd))
        return None

    host_kinds = (FileKind.SHARED_LIBRARY, FileKind.EXECUTABLE)
    code, elf = "verify-arch" not in skip, not {"llvm", "post-build"} <= skip
    label = "GPU code and ELF facts" if code and elf else "GPU code objects" if code else "ELF facts"
    if code or elf:
        progress.phase(f"reading {label}", len(inventory.files), "files")
    seen_bytes = 0
    try:
        for done, record in enumerate(inventory.files, 1):
            seen_bytes += record.size
            progress.update(done, seen_bytes)
            readers: list[Callable[[Inventory, FileRecord], object]] = []
            if "verify-arch" not in skip and may_hold_code(record):
                readers.append(code_objects)
            if "llvm" not in skip and record.kind is FileKind.SHARED_LIBRARY:
                readers += [role_facts_of, linkage_later]
            if "post-build" not in skip and record.kind in host_kinds:
                readers.append(_versions_if_needed)
            if "post-build" not in skip and record.kind is FileKind.SHARED_LIBRARY:
                readers.append(_references)
            if not readers:
                continue
            with inventory.facts.holding(record):
                for reader in readers:
                    try:
                        reader(inventory, record)
                    except (OSError, FormatError):
                        pass
    except BaseException:
        for _record, fd in linkage_due:
            os.close(fd)
        raise
    read_linkages(inventory, linkage_due)


def _versions_if_needed(inventory: Inventory, record: FileRecord) -> object:
    from rocm_audit.postbuild.checks import versions_of

    return versions_of(inventory, record) if inventory.dynamic(record).needed else None


def _references(inventory: Inventory, record: FileRecord) -> object:
    from rocm_audit.postbuild.symbols import read_references

    return inventory.facts.get(record, "references", read_references)


@dataclass(slots=True)
class _Audit:
    """What the steps of one ``check`` add to, in the order they run (the inventory is passed to
    each step beside it, never kept in it)."""

    findings: list[Finding]
    sections: Sections
    ran: list[str] = field(default_factory=list)
    summaries: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)


def audit_inventory(
    inventory: Inventory, looked: list[str], options: CheckOptions, progress: Progress = SILENT
) -> CommandOutcome:
    """Run every check over an inventory already built. Raises UsageError for bad targets."""
    audit = _Audit(findings=list(inventory.findings), sections={"sdk_trees": inventory.sdk_trees})
    where = looked[0] if looked else ""
    if "dedup" not in options.skip:
        _dedup_step(inventory, audit, progress)
    choice = _target_choice(inventory, options) if "verify-arch" not in options.skip else None
    selection = _selection(choice) if "verify-arch" not in options.skip else None
    read_facts(inventory, options.skip, selection, progress)
    if "verify-arch" not in options.skip:
        _verify_arch_step(inventory, audit, choice, selection, where, options, progress)
    if "llvm" not in options.skip:
        _llvm_step(inventory, audit, options, progress)
    if "post-build" not in options.skip:
        _post_build_step(inventory, audit, options, progress)
    device_bytes_by_path: dict[str, tuple[int, int, int, int]] = {}
    if choice is not None and choice.targets and "prune" not in options.skip:
        device_bytes_by_path = _prune_step(inventory, audit, choice, selection, where, options, progress)
    elapsed = time.monotonic() - audit.started
    audit.sections["summary"] = {
        "checks": audit.ran,
        "files_scanned": len(inventory.files),
        "elapsed_s": round(elapsed, 3),
    }
    return CommandOutcome(
        command="check",
        findings=audit.findings,
        inputs=looked,
        sections=audit.sections,
        summary="check: " + "; ".join([plural(len(inventory.files), "file"), *audit.summaries, f"{elapsed:.2f} s"]),
        device_bytes_by_path=device_bytes_by_path,
    )


def _dedup_step(inventory: Inventory, audit: _Audit, progress: Progress) -> None:
    """dedup in check mode: the groups a plain run would link, as findings and the section."""
    from rocm_audit.dedup.apply import ApplyResult
    from rocm_audit.dedup.plan import make_plan
    from rocm_audit.dedup.report import check_mode_findings, dedup_section

    plan = make_plan(inventory, progress=progress)
    audit.findings.extend(plan.findings)
    audit.findings.extend(check_mode_findings(plan))
    audit.sections["dedup"] = dedup_section(plan, "check", ApplyResult(), time.monotonic() - audit.started)
    audit.ran.append("dedup")
    audit.summaries.append(plural(len(plan.groups), "SDK duplicate group"))


def _target_choice(inventory: Inventory, options: CheckOptions) -> TargetChoice | None:
    """The targets verify-arch judges (and prune keeps); None when none was found. Raises
    UsageError for targets the user named that are not valid."""
    from rocm_audit.gpu.verify import choose_targets

    environ = dict(os.environ) if options.environ is None else options.environ
    try:
        return choose_targets(
            options.targets,
            [r.path for r in inventory.roots],
            environ,
            options.recorded_targets,
            options.environ_label,
        )
    except UsageError:
        if options.targets:
            raise  # targets the user named must be valid
        return None


def _selection(choice: TargetChoice | None) -> TargetSelection:
    """What the code-object scan reads for these targets. No targets: nothing is judged, and the
    carriers are listed from their entry tables alone."""
    from rocm_audit.gpu.verify import selection_for

    return selection_for(choice.targets if choice else [])


def _verify_arch_step(
    inventory: Inventory,
    audit: _Audit,
    choice: TargetChoice | None,
    selection: TargetSelection | None,
    where: str,
    options: CheckOptions,
    progress: Progress,
) -> None:
    """verify-arch: every carrier judged against the targets, or CHK001 when there are none."""
    from rocm_audit.audit.pruned import mark_pruned
    from rocm_audit.gpu import verify as archcheck
    from rocm_audit.gpu.kpack_runtime import inventory_findings

    progress.phase("judging GPU code objects")
    scans = archcheck.scan_inventory(inventory, selection)
    carriers = archcheck.build_carriers(scans)
    audit.findings.extend(archcheck.scan_findings(scans))
    judged: list[Finding] = []
    if choice is not None and choice.targets:
        judged = archcheck.judge_all(carriers, choice.targets)
        # a target this tree's own prune removed says so, not "report to the shipper"
        judged = mark_pruned(judged, [root.path for root in inventory.roots])
        audit.findings.extend(judged)
        audit.sections["targets"] = [{"target": t.spelled, "agent": str(t.agent)} for t in choice.targets]
        audit.sections["targets_source"] = choice.source
        audit.sections["targets_origin"] = choice.origin
        missing = sum(1 for c in carriers if c.missing)
        audit.summaries.append(f"{plural(len(carriers), 'GPU code carrier')}, {missing} missing a target")
    else:
        audit.findings.append(
            make_finding(
                "CHK001",
                where,
                f"no GPU targets to verify: name them ({options.targets_example}), set GPU_ARCH, "
                "or install _rocm_sdk_core with share/therock/dist_info.json",
            )
        )
        audit.summaries.append(f"{plural(len(carriers), 'GPU code carrier')}, targets unknown")
    targets = choice.targets if choice is not None and choice.targets else []
    audit.findings.extend(inventory_findings(inventory, scans, targets, judged))
    audit.sections["carriers"] = [archcheck.carrier_to_dict(c) for c in carriers]
    audit.ran.append("verify-arch")


def _llvm_step(inventory: Inventory, audit: _Audit, options: CheckOptions, progress: Progress) -> None:
    """llvm: the static analysis, and the load probes when asked for."""
    from rocm_audit.llvm import clashes as llvm_clashes
    from rocm_audit.llvm.counts import clash_counts

    llvm_options = llvm_clashes.LlvmOptions(
        probe=options.probe, sysroot=options.sysroot, unextracted=options.unextracted, python=options.python
    )
    if options.probe_timeout_s is not None:
        llvm_options.probe_timeout_s = options.probe_timeout_s
    analysis = llvm_clashes.analyse(inventory, llvm_options, progress)
    if options.probe:
        llvm_clashes.probe_analysis(analysis, llvm_options, progress)
    audit.findings.extend(analysis.reported_findings())
    audit.sections["libraries"] = [
        llvm_clashes.library_to_dict(
            one,
            analysis.library_in_scan.get(one.path, True),
            analysis.library_identity.get(one.path),
            analysis.linkage_of(one.path),
        )
        for one in analysis.libraries
    ]
    audit.sections["clashes"] = [llvm_clashes.clash_to_dict(c) for c in analysis.clashes]
    audit.sections["pairs"] = [llvm_clashes.pair_to_dict(p, analysis.pair_probes.get(p.paths)) for p in analysis.pairs]
    audit.sections["judged_pairs"] = analysis.judged_pairs
    if analysis.probe_interpreter is not None:
        audit.sections["probe_interpreter"] = llvm_clashes.interpreter_to_dict(analysis.probe_interpreter)
    audit.ran.append("llvm")
    harmful, harmless = clash_counts(audit.sections["clashes"])
    said = plural(harmful, "LLVM clash", "LLVM clashes") + " that can abort or crash"
    audit.summaries.append(said + (f", {harmless} harmless" if harmless else ""))


def _post_build_step(inventory: Inventory, audit: _Audit, options: CheckOptions, progress: Progress) -> None:
    """post-build: symbol versions and DT_NEEDED, resolved the way the loader of the sysroot would,
    and two builds of one library that one process maps."""
    from rocm_audit.postbuild.checks import post_build_findings
    from rocm_audit.postbuild.sonames import two_builds_findings
    from rocm_audit.postbuild.symbols import Resolver, symbol_findings

    progress.phase("post-build checks: symbol versions and DT_NEEDED")
    host = HostView(options.sysroot, known_elf_keys=inventory.elf_keys(), unextracted=options.unextracted)
    loader = LoaderModel(sysroot=options.sysroot, host=host)
    # One set of load scopes for both steps: a library is judged where the others load it.
    resolver = Resolver(loader, _load_host(inventory, options), inventory)
    post_build = post_build_findings(inventory, loader, resolver)
    audit.findings.extend(post_build)
    progress.phase("post-build checks: symbols in the load scope")
    not_importable = frozenset(f.path for f in post_build if f.rule == "POST003")
    audit.findings.extend(symbol_findings(inventory, loader, resolver.host, not_importable, resolver))
    progress.phase("post-build checks: two builds of one library")
    audit.findings.extend(two_builds_findings(inventory, loader))
    audit.ran.append("post-build")


def _load_host(inventory: Inventory, options: CheckOptions) -> PythonHost | None:
    """The interpreter every audited library is loaded into: an image's own, read from its files
    (never run); else --python or the owner of the audited directories, asked once."""
    from rocm_audit.postbuild.symbols import host_of_image, host_of_interpreter
    from rocm_audit.tree.discovery import ChosenBy, interpreter_for

    directories = [r.path for r in inventory.roots]
    if options.sysroot not in ("", "/"):
        return host_of_image(options.sysroot, directories)
    interpreter = interpreter_for(options.python, directories)
    if not interpreter.running:
        return None
    judged = interpreter.chosen_by is not ChosenBy.OWN
    described = f"Python {'.'.join(interpreter.version.split('.')[:2])} ({interpreter.executable})"
    return host_of_interpreter(interpreter.running, interpreter.version, interpreter.libpython, judged, described)


def _prune_step(
    inventory: Inventory,
    audit: _Audit,
    choice: TargetChoice,
    selection: TargetSelection | None,
    where: str,
    options: CheckOptions,
    progress: Progress,
) -> dict[str, tuple[int, int, int, int]]:
    """The weight of device code no kept target loads (one info finding), over the facts read
    above; returns the device bytes per file when ``options.prune_by_file`` (image), else {}."""
    from rocm_audit.audit.pruning import prune_for_check
    from rocm_audit.prune.plan import Kept
    from rocm_audit.tree.targets import kept_target

    progress.phase("weighing device code for other GPUs")
    kept = [Kept(t.spelled, kept_target(t.spelled)) for t in choice.targets]
    finding, section, by_path = prune_for_check(
        inventory, kept, choice.source, where, selection, by_file=options.prune_by_file
    )
    if finding is not None:
        audit.findings.append(finding)
    audit.sections["prune"] = section
    audit.ran.append("prune")
    return by_path


def run_check(
    paths: list[str] | None,
    options: CheckOptions,
    progress: Progress = SILENT,
    roots: list[AuditRoot] | None = None,
) -> CommandOutcome:
    """Resolve the paths (or take prepared roots), build one inventory, audit it."""
    if options.probe and options.sysroot not in ("", "/"):
        raise UsageError("--probe loads libraries with this host's loader; it cannot audit another system root")
    looked: list[str]
    if roots is None:
        roots, looked = resolve_roots(paths)
    else:
        looked = [r.given for r in roots]
    inventory = build_inventory(roots, progress)
    for identity, facts in options.known_facts.items():
        for name, value in facts.items():
            inventory.facts.preload(identity, name, value)
    return audit_inventory(inventory, looked, options, progress)
