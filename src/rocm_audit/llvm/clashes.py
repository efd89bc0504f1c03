"""`rocm-audit llvm`: every LLVM command-line option double registration an image can hit.

From ELF facts (``roles``, ``linkage``) and load closures (``closure``), three kinds of clash (formats.md 3.2,
3.4), each with the load modes in which it fires and a fix; ``--probe`` then confirms each one in a
sandboxed child (``probes``) and keeps prediction and outcome side by side.

1. Duplicates: two or more inodes of one exporter or registrant (same SONAME or same bytes): HIGH.
2. Interposable exporters: different exporters whose llvm::cl data bind to each other (unversioned
   or one version node) once the first is in the global scope: MEDIUM.
3. Closures: two LLVM exporters in the load closure of one library or executable: HIGH when they
   bind to each other (they share one lookup scope whatever the RTLD flags), else MEDIUM.
"""

from __future__ import annotations

import dataclasses
import os

from rocm_audit.errors import UsageError
from rocm_audit.llvm.analysis import ROCM_SDK_PRELOADS, LlvmAnalysis, LlvmOptions, analyse, rocm_sdk_preloads
from rocm_audit.llvm.counts import clash_counts
from rocm_audit.llvm.libfacts import linkage_facts_of, role_facts_of
from rocm_audit.llvm.prediction import Clash, Expect, Reason, Risk, agrees, predict_closure, predict_pair
from rocm_audit.llvm.probing import probe_analysis, probe_clashes
from rocm_audit.llvm.report import clash_to_dict, closure_to_dict, interpreter_to_dict, library_to_dict, pair_to_dict
from rocm_audit.llvm.roles import Role
from rocm_audit.outcome import CommandOutcome
from rocm_audit.progress import SILENT, Progress
from rocm_audit.report_types import Sections
from rocm_audit.tree.discovery import resolve_roots
from rocm_audit.tree.inventory import build_inventory
from rocm_audit.units import plural

# The public names of `rocm-audit llvm`, importable from here as before the split (audit/check.py,
# the CLI and the tests import them from this module).
__all__ = [
    "ROCM_SDK_PRELOADS",
    "Clash",
    "Expect",
    "LlvmAnalysis",
    "LlvmOptions",
    "Reason",
    "Risk",
    "agrees",
    "analyse",
    "clash_to_dict",
    "closure_to_dict",
    "interpreter_to_dict",
    "library_to_dict",
    "linkage_facts_of",
    "pair_to_dict",
    "predict_closure",
    "predict_pair",
    "probe_analysis",
    "probe_clashes",
    "role_facts_of",
    "rocm_sdk_preloads",
    "run_llvm",
]


def run_llvm(
    paths: list[str] | None,
    options: LlvmOptions,
    progress: Progress = SILENT,
) -> CommandOutcome:
    """Scan, analyse, optionally probe; the outcome the CLI renders. Raises UsageError."""
    options = dataclasses.replace(options)  # filled in below; the caller's stays as it was
    if options.probe and options.sysroot not in ("", "/"):
        raise UsageError("--probe loads libraries with this host's loader; it cannot model --sysroot")
    for option, given in (("--closure", options.closure_paths), ("--preload", options.preload)):
        for path in given:
            if not os.path.isfile(path):
                raise UsageError(f"{option}: not a file: {path}")
    roots, looked = resolve_roots(paths)
    inventory = build_inventory(roots, progress)
    if options.preload_rocm_sdk:
        found = rocm_sdk_preloads(inventory.sdk_trees)
        if not found:
            raise UsageError(
                "--preload-rocm-sdk: no _rocm_sdk_core/lib/lib{"
                + ",".join(ROCM_SDK_PRELOADS)
                + "}.so* in the scanned trees"
            )
        options.preload = (*options.preload, *found)
    options.closure_paths = tuple(os.path.abspath(p) for p in options.closure_paths)
    analysis = analyse(inventory, options, progress)
    if options.probe:
        probe_analysis(analysis, options, progress)
    findings = list(inventory.findings) + analysis.reported_findings()
    sections: Sections = {
        "libraries": [
            library_to_dict(
                one,
                analysis.library_in_scan.get(one.path, True),
                analysis.library_identity.get(one.path),
                analysis.linkage_of(one.path),
            )
            for one in analysis.libraries
        ],
        "clashes": [clash_to_dict(c) for c in analysis.clashes],
        "pairs": [pair_to_dict(p, analysis.pair_probes.get(p.paths)) for p in analysis.pairs],
        "judged_pairs": analysis.judged_pairs,
    }
    if analysis.closures:
        sections["closures"] = [closure_to_dict(c, analysis.closure_roles) for c in analysis.closures]
    if analysis.probe_interpreter is not None:
        sections["probe_interpreter"] = interpreter_to_dict(analysis.probe_interpreter)
    confirmed = sum(1 for c in analysis.clashes if c.confirmed)
    carrying = sum(1 for one in analysis.libraries if one.role not in (Role.NONE, Role.UNKNOWN))
    # The words of the text report's LLVM line, counted as every summary counts them (llvm/counts.py)
    harmful, harmless = clash_counts(sections["clashes"])
    clashes = (
        f"{plural(harmful, 'clash', 'clashes')} that can abort or crash a process"
        + (f", {harmless} harmless" if harmless else "")
        if analysis.clashes
        else "no clash"
    )
    summary = f"llvm: {plural(carrying, 'library', 'libraries')} carry LLVM; {clashes}" + (
        f", {confirmed} confirmed by probe" if options.probe and analysis.clashes else ""
    )
    return CommandOutcome(
        command="llvm",
        findings=findings,
        inputs=looked,
        sections=sections,
        summary=summary,
    )
