"""The JSON report sections of `rocm-audit llvm`: libraries, clashes, pairs, closures, the probe
interpreter (pure builders over the analysis)."""

from __future__ import annotations

from rocm_audit.llvm.closure import Closure
from rocm_audit.llvm.linkage import EMPTY as EMPTY_LINKAGE
from rocm_audit.llvm.linkage import Linkage
from rocm_audit.llvm.pairs import PairVerdicts
from rocm_audit.llvm.prediction import Clash, agrees, probe_decided
from rocm_audit.llvm.probes import (
    ProbeResult,
    ProbeVerdict,
)
from rocm_audit.llvm.roles import ClFacts, Role
from rocm_audit.llvm.verdicts import Verdict
from rocm_audit.report_types import (
    ClashJudgement,
    LinkageFields,
    LlvmClash,
    LlvmLibrary,
    LlvmPair,
    LoadClosure,
    ProbeInterpreter,
)
from rocm_audit.tree.discovery import Interpreter

# ---------------------------------------------------------------------------------------------
# Report sections and text


def library_to_dict(
    one: ClFacts, in_scan: bool, identity: tuple[int, int] | None, linkage: Linkage | None = None
) -> LlvmLibrary:
    extra: LinkageFields = {}
    if linkage is not None and linkage is not EMPTY_LINKAGE:
        extra = {
            "registers_at_load": linkage.registers_at_load,
            "registration_path": linkage.registration_path,
            "registry_entry_points": linkage.entry_points(),
        }
    return {
        **extra,
        "path": one.path,
        "role": one.role.value,
        "soname": one.soname,
        "version_node": one.version_node,
        "exported_cl_symbols": one.exported_cl_symbols,
        "imports_add_argument": one.imports_add_argument,
        "has_initialisers": one.has_initialisers,
        "embeds_registry": one.embeds_registry,
        "symbolic": one.symbolic,
        "interposable_registry": one.interposable_registry,
        "nodelete": one.nodelete,
        "in_scan": in_scan,
        "device": identity[0] if identity else None,
        "inode": identity[1] if identity else None,
    }


def interpreter_to_dict(interpreter: Interpreter) -> ProbeInterpreter:
    """The report's ``probe_interpreter``: which interpreter ran the probes, and why."""
    return {
        "executable": interpreter.executable,
        "version": interpreter.version,
        "chosen_by": interpreter.chosen_by.value,
        "reason": interpreter.reason,
    }


def clash_to_dict(clash: Clash) -> LlvmClash:
    return {
        "paths": list(clash.paths),
        "reason": clash.reason.value,
        "severity": clash.risk.value,
        "mode": clash.mode,
        "confirmed": clash.confirmed,
        "option": clash.option,
        "fix": clash.fix,
        "soname": clash.soname,
        "version_node": clash.version_node,
        "identical": clash.identical,
        "via": list(clash.via),
        "via_count": clash.via_count,
        "predictions": {mode: expect.value for mode, expect in clash.predictions.items()},
        **_judged_fields(clash),
        "probes": [
            {
                "mode": p.mode,
                "outcome": p.outcome.value,
                "option": p.option,
                "returncode": p.returncode,
                "detail": p.detail,
                "preload": list(p.preload),
                "steps": list(p.steps),
                "stderr_tail": p.stderr_tail,
                "instances": p.instances,
                "agrees": _agreement(clash, index, p),
                "verdict": p.verdict.value,
                "signal": p.signal,
                "step": p.step,
                "isolation": p.isolation,
            }
            for index, p in enumerate(clash.probes)
        ],
    }


def _agreement(clash: Clash, index: int, probe: ProbeResult) -> bool | None:
    if index < len(clash.probe_expect):
        if not probe.verdict.conclusive:
            return None
        return (probe.verdict is not ProbeVerdict.CLEAN) == clash.probe_expect[index].bad
    return agrees(clash.predictions[probe.mode], probe.outcome)


def _judged_fields(clash: Clash) -> ClashJudgement:
    """Fields added to schema v1 by issue 16: the verdict, who decided it, both orders."""
    if clash.judged is None and clash.closure_judged:
        decided = probe_decided(clash.probes)
        static = max((p.verdict for p in clash.closure_judged.values()), key=lambda v: v.rank)
        return {"verdict": (decided or static).value, "decided_by": "probe" if decided is not None else "static"}
    if clash.judged is None:
        return {}
    decided = probe_decided(clash.probes)
    return {
        "verdict": (decided or clash.judged.worst.verdict).value,
        "decided_by": "probe" if decided is not None else "static",
        "arrives_through": clash.judged.arrives_through(),
        "orders": clash.judged.to_dict()["orders"],
    }


def pair_to_dict(pair: PairVerdicts, probes: tuple[list[ProbeResult], list[Verdict]] | None = None) -> LlvmPair:
    found = pair.to_dict()
    results = probes[0] if probes else []
    decided = probe_decided(results)
    return {
        **found,
        "verdict": decided.value if decided is not None else found["verdict"],
        "decided_by": "probe" if decided is not None else "static",
        "probes": [
            {
                "mode": p.mode,
                "steps": list(p.steps),
                "verdict": p.verdict.value,
                "signal": p.signal,
                "step": p.step,
                "detail": p.detail,
                "option": p.option,
            }
            for p in results
        ],
    }


def closure_to_dict(closure: Closure, roles: dict[str, Role]) -> LoadClosure:
    return {
        "root": closure.root,
        "objects": [
            {
                "path": o.path,
                "request": o.request,
                "via": o.via,
                "needed_by": o.needed_by,
                "depth": o.depth,
                "soname": o.soname,
                "device": o.identity[0],
                "inode": o.identity[1],
                "role": roles.get(o.path, Role.NONE).value,
            }
            for o in closure.objects
        ],
        "missing": [{"needed_by": m.needed_by, "name": m.name, "detail": m.detail} for m in closure.missing],
        "truncated": closure.truncated,
    }
