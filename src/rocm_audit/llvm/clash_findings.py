"""Findings (rule id, message, data) for clashes and for failing pairs no clash names."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

from rocm_audit.findings import Finding, Severity, make_finding
from rocm_audit.llvm import fixes
from rocm_audit.llvm.pairs import PairJudge, PairVerdicts
from rocm_audit.llvm.prediction import RULE_OF_REASON, Clash, Expect, Reason, probe_decided, probe_mode_text
from rocm_audit.llvm.probes import (
    PAIR_MODES,
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


def _outcome(verdict: Verdict, how: str, when: str = "when they are loaded together") -> str:
    """``the process aborts (...) when A is loaded RTLD_GLOBAL before B, as load probes confirmed``."""
    return f"the process {_OUTCOME_TEXT[verdict]} {when}{how}"


# The modes of one order (PAIR_MODES keys) that fail, and how a person says them.
_EVERY_MODE = frozenset(PAIR_MODES)
_FIRST_GLOBAL = frozenset({"global-global", "global-local"})
_BOTH_GLOBAL = frozenset({"global-global"})
GLOBAL_SCOPE = "RTLD_GLOBAL: the flag, a preload or a DT_NEEDED of the executable"

Failing = tuple[str, str, frozenset[str]]  # first, second, the modes in which that order fails


def failing_modes(pair: PairVerdicts, probes: Sequence[ProbeResult] = ()) -> list[Failing]:
    """Each order that fails, with the modes it fails in: by the probes once they decided (one per
    order and mode, as probing._probe_orders runs them; an inconclusive one keeps the model's
    verdict), else by the model. The one source of a pair's condition, in message and detail."""
    decided = probe_decided(probes) is not None
    results = iter(probes)
    found = []
    for order in pair.orders:
        failing = set()
        for mode, prediction in order.modes.items():
            probe = next(results, None) if decided else None
            if probe is not None and probe.mode == mode and probe.verdict.conclusive:
                bad = probe.verdict is not ProbeVerdict.CLEAN
            else:
                bad = prediction.verdict.bad
            if bad:
                failing.add(mode)
        if failing:
            found.append((order.first, order.second, frozenset(failing)))
    return found


def _short_names(failing: Sequence[Failing]) -> Callable[[str], str]:
    """File names, unless two of the paths share one (then whole paths)."""
    paths = {path for first, second, _ in failing for path in (first, second)}
    unique = len({os.path.basename(p) for p in paths}) == len(paths)
    return os.path.basename if unique else str


def when_text(failing: Sequence[Failing], name: Callable[[str], str] | None = None) -> str:
    """When a pair fails, in words: ``when A is loaded RTLD_GLOBAL before B``; ``when they are
    loaded together`` when both orders fail in every mode. ``name`` shortens a path (default: file
    names, unless two share one)."""
    name = name or _short_names(failing)
    sets = {modes for _, _, modes in failing}
    if len(failing) == 2 and len(sets) == 1:
        both = {
            _EVERY_MODE: "when they are loaded together",
            _FIRST_GLOBAL: "when either is loaded RTLD_GLOBAL before the other",
            _BOTH_GLOBAL: "when both are loaded RTLD_GLOBAL",
        }.get(next(iter(sets)))
        if both is not None:
            return both
    phrases = []
    for first, second, modes in failing:
        a, b = name(first), name(second)
        if modes == _EVERY_MODE:
            phrases.append(f"{a} is loaded before {b}")
        elif modes == _FIRST_GLOBAL:
            phrases.append(f"{a} is loaded RTLD_GLOBAL before {b}")
        elif modes == _BOTH_GLOBAL:
            phrases.append(f"both are loaded RTLD_GLOBAL, {a} first")
        else:
            flags = " or ".join(probe_mode_text(m).removeprefix("loaded ") for m in sorted(modes))
            phrases.append(f"{a} is loaded before {b} ({flags})")
    return "when " + ", or ".join(phrases)


def _scope_note(when: str) -> str:
    return f" ({GLOBAL_SCOPE})" if "RTLD_GLOBAL" in when else ""


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
            _outcome(decided, ", as load probes confirmed", when_text(failing_modes(pair, probes))),
            detail=f"probe: {decided.value} {when_text(failing_modes(pair, probes), str)}{where}{host_text} "
            f"(static: {worst.reason}); fix: {fix}",
            related=[pair.paths[1], *through],
            data=data,
        )
    when = when_text(failing_modes(pair), str)
    return make_finding(
        rule,
        pair.paths[0],
        _outcome(worst.verdict, "", when_text(failing_modes(pair))),
        detail=f"{worst.verdict.value} {when}{_scope_note(when)}{where}{host_text}: {worst.reason}; fix: {fix}",
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
        f"{' '.join(what.split())}: {_outcome(verdict, '', _closure_when(clash, decided is not None))}",
        detail=f"{verdict.value} when {_WHEN[clash.mode]}; {reason}; fix: {clash.fix}",
        related=clash.paths[1:],
        data=data,
        severity=Severity.ERROR,
    )


def _closure_when(clash: Clash, decided: bool) -> str:
    """When a closure clash fails: its root's dlopen in the modes that fail (probes first, once
    they decided; the model where a probe was inconclusive)."""
    observed = {p.mode: p.verdict is not ProbeVerdict.CLEAN for p in clash.probes if decided and p.verdict.conclusive}
    failing = sorted(m for m, p in clash.closure_judged.items() if observed.get(m, p.verdict.bad))
    if not failing or len(failing) == len(clash.closure_judged):
        return "when they are loaded together"
    root = clash.probe_root or clash.via[0]
    return f"when {os.path.basename(root)} is loaded " + " or ".join(f"RTLD_{m.upper()}" for m in failing)


def clash_finding(clash: Clash) -> Finding:
    # Copies are separate inodes (one inode through several paths is LLVM010, mapped once); the
    # bytes were compared (Clash.identical): the same, or one SONAME over different builds.
    kind = {True: "identical copies (separate files, separate inodes)", False: "different builds", None: "copies"}
    copies = f"{len(clash.paths)} {kind[clash.identical]} of {clash.soname or 'one library'}"
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
        when = when_text(failing_modes(judged, clash.probes))
        return make_finding(
            RULE_OF_REASON[clash.reason],
            clash.paths[0],
            f"{' '.join(what.split())}: {_outcome(decided, ', as load probes confirmed', when)}",
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
    when = when_text(failing_modes(judged), str)
    return make_finding(
        RULE_OF_REASON[clash.reason],
        clash.paths[0],
        f"{' '.join(what.split())}: {_outcome(judged.worst.verdict, '', when_text(failing_modes(judged)))}",
        detail=f"{judged.worst.verdict.value} {when}{_scope_note(when)}; {judged.worst.reason}; fix: {clash.fix}",
        related=clash.paths[1:],
        data=data,
        severity=Severity.ERROR,
    )
