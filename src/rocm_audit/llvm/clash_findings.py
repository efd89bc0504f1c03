"""Findings (rule id, message, data) for clashes and for failing pairs no clash names."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from rocm_audit.findings import Finding, Severity, make_finding
from rocm_audit.llvm import fixes
from rocm_audit.llvm.pairs import PairJudge, PairVerdicts
from rocm_audit.llvm.prediction import RULE_OF_REASON, Clash, Expect, Reason, probe_decided
from rocm_audit.llvm.probes import (
    ProbeResult,
    ProbeVerdict,
)
from rocm_audit.llvm.roles import ClFacts
from rocm_audit.llvm.verdicts import Verdict

MAX_VIA_ROOTS = 20  # closure roots listed per clash; the count says how many there were


# When a clash fires (Clash.mode), in words: the RTLD flags of the two dlopen calls.
_WHEN = {
    "any": "they are loaded together in any way",
    "first-global": "the first one loaded is in the global scope (RTLD_GLOBAL, a preload or a DT_NEEDED "
    "of the executable)",
    "both-global": "both are loaded RTLD_GLOBAL",
    "none": "(in no load mode)",
}

# What a verdict means for a person, in the one-line message of a finding.
_OUTCOME_TEXT = {
    Verdict.ABORT: "aborts ('Option ... registered more than once')",
    Verdict.CRASH: "can crash (two LLVMs share one option registry)",
    Verdict.HANG: "hangs",
    Verdict.CLEAN: "is clean",
}


def _outcome(verdict: Verdict, how: str) -> str:
    """``the process aborts (...) when they are loaded together, as a load probe confirmed``."""
    return f"the process {_OUTCOME_TEXT[verdict]} when they are loaded together{how}"


def expect_of(verdict: Verdict) -> Expect:
    if verdict is Verdict.ABORT:
        return Expect.ABORT
    return Expect.CLEAN if verdict is Verdict.CLEAN else Expect.UNSAFE


def pair_finding(pair: PairVerdicts, judge: PairJudge, probes: Sequence[ProbeResult] = ()) -> Finding:
    """LLVM012 (the failure arrives through a dependency or a host) or LLVM013; with conclusive
    probes, their verdict decides (clean: LLVM014)."""
    worst = pair.worst
    decided = probe_decided(probes)
    through = pair.arrives_through()
    hosts = [h for hs in pair.hosts.values() for h in hs]
    failing = ", ".join(f"{o.first} then {o.second}" for o in pair.failing_orders())
    caution = judge.global_caution(*pair.paths)
    fix = fixes.pair_fix(*pair.paths, caution, through)
    rule = "LLVM012" if through or hosts else "LLVM013"
    where = f"; arrives through {', '.join(through)}" if through else ""
    host_text = f"; loaded after its host {', '.join(hosts)}" if hosts else ""
    data = {"verdict": worst.verdict.value, "arrives_through": through, "decided_by": "static"}
    if decided is not None:
        data.update(verdict=decided.value, decided_by="probe")
        if not decided.bad:
            return make_finding(
                "LLVM014",
                pair.paths[0],
                f"loading them together is harmless ({len(probes)} probe loads were clean)",
                detail=f"predicted {worst.verdict.value} ({failing}), but every probe load was clean",
                related=[pair.paths[1], *through],
                data=data,
            )
        return make_finding(
            rule,
            pair.paths[0],
            _outcome(decided, ", as load probes confirmed"),
            detail=f"probe: {decided.value} when loaded together{where}{host_text} (static: {worst.reason}); "
            f"fix: {fix}",
            related=[pair.paths[1], *through],
            data=data,
        )
    return make_finding(
        rule,
        pair.paths[0],
        _outcome(worst.verdict, ""),
        detail=f"{worst.verdict.value} in {failing}{where}{host_text}: {worst.reason}; fix: {fix}",
        related=[pair.paths[1], *through],
        data=data,
    )


def at_path(facts: ClFacts, path: str) -> ClFacts:
    return facts if facts.path == path else dataclasses.replace(facts, path=path)


def _closure_finding(clash: Clash, what: str, data: dict[str, Any]) -> Finding:
    """A closure clash judged by the model (and perhaps a probe): clean is never an error."""
    static = max((p.verdict for p in clash.closure_judged.values()), key=lambda v: v.rank)
    decided = probe_decided(clash.probes)
    verdict = decided or static
    data.update(verdict=verdict.value, decided_by="probe" if decided is not None else "static")
    if not verdict.bad:
        return make_finding(
            "LLVM014",
            clash.paths[0],
            f"{' '.join(what.split())}, but loading it is harmless (RTLD_GLOBAL or RTLD_LOCAL)"
            + (", as probes confirmed" if decided is not None else ""),
            related=clash.paths[1:],
            data=data,
        )
    reason = next(p.reason for p in clash.closure_judged.values() if p.verdict is static)
    return make_finding(
        RULE_OF_REASON[clash.reason],
        clash.paths[0],
        f"{' '.join(what.split())}: {_outcome(verdict, '')}",
        detail=f"{verdict.value} when {_WHEN[clash.mode]}; {reason}; fix: {clash.fix}",
        related=clash.paths[1:],
        data=data,
        severity=Severity.ERROR,
    )


def clash_finding(clash: Clash) -> Finding:
    copies = f"{len(clash.paths)} copies (different files) of {clash.soname or 'one library'}"
    example = f" (e.g. {clash.via[0]})" if clash.via else ""
    what = {
        Reason.DUPLICATE_EXPORTER: f"{copies}, which exports LLVM's option registry",
        Reason.DUPLICATE_REGISTRANT: f"{copies}, which registers LLVM options",
        Reason.INTERPOSABLE_EXPORTERS: "two libraries export LLVM's option registry and bind each other's",
        Reason.CLOSURE_INTERPOSITION: f"one load closure maps two LLVMs that bind each other's state{example}",
        Reason.CLOSURE_TWO_LLVMS: f"one load closure maps two different LLVMs{example}",
    }[clash.reason]
    data: dict[str, Any] = {"reason": clash.reason.value, "mode": clash.mode}
    judged = clash.judged
    if judged is None and clash.closure_judged:
        return _closure_finding(clash, what, data)
    if judged is None:
        return make_finding(
            RULE_OF_REASON[clash.reason],
            clash.paths[0],
            " ".join(what.split()),
            detail=f"fails when {_WHEN[clash.mode]}; fix: {clash.fix}",
            related=clash.paths[1:],
            data=data,
        )
    data.update(verdict=judged.worst.verdict.value, decided_by="static", arrives_through=judged.arrives_through())
    decided = probe_decided(clash.probes)
    if decided is not None:
        data.update(verdict=decided.value, decided_by="probe")
        loads = sum(1 for p in clash.probes if p.verdict.conclusive)
        if not decided.bad:
            return make_finding(
                "LLVM014",
                clash.paths[0],
                f"{' '.join(what.split())}, but loading them together is harmless ({loads} probe loads were clean)",
                detail=f"static verdict: {judged.worst.verdict.value}; every probe (both orders, every mode) was clean",
                related=clash.paths[1:],
                data=data,
            )
        seen = next(p for p in clash.probes if p.verdict.conclusive and p.verdict is not ProbeVerdict.CLEAN)
        return make_finding(
            RULE_OF_REASON[clash.reason],
            clash.paths[0],
            f"{' '.join(what.split())}: {_outcome(decided, ', as load probes confirmed')}",
            detail=f"probe: {decided.value} ({seen.mode}: {seen.detail}); fix: {clash.fix}",
            related=clash.paths[1:],
            data=data,
            severity=Severity.ERROR,
        )
    if not judged.bad:
        # Severity follows the truth: clean in every order and mode is never an error.
        return make_finding(
            "LLVM014",
            clash.paths[0],
            f"{' '.join(what.split())}, but loading them together is harmless",
            detail=f"clean in both orders and every RTLD mode: {judged.worst.reason}",
            related=clash.paths[1:],
            data=data,
        )
    failing = ", ".join(f"{o.first} then {o.second}" for o in judged.failing_orders())
    return make_finding(
        RULE_OF_REASON[clash.reason],
        clash.paths[0],
        f"{' '.join(what.split())}: {_outcome(judged.worst.verdict, '')}",
        detail=f"{judged.worst.verdict.value} in {failing}, when {_WHEN[clash.mode]}; {judged.worst.reason}; "
        f"fix: {clash.fix}",
        related=clash.paths[1:],
        data=data,
        severity=Severity.ERROR,
    )
