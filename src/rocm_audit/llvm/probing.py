"""``--probe``: each predicted clash and judged pair confirmed by loads in sandboxed children
(probes.py), with prediction and outcome kept side by side."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from rocm_audit.findings import Finding, make_finding
from rocm_audit.llvm import copies
from rocm_audit.llvm.analysis import LlvmAnalysis, LlvmOptions
from rocm_audit.llvm.clash_findings import clash_finding, pair_finding
from rocm_audit.llvm.pairs import PairJudge, PairVerdicts
from rocm_audit.llvm.prediction import Clash, agrees, probe_decided, probe_mode_text
from rocm_audit.llvm.probes import (
    LoadStep,
    ProbeOutcome,
    ProbeResult,
    ProbeVerdict,
    probe_closure,
    probe_pair,
    run_probe,
)
from rocm_audit.llvm.verdicts import Verdict
from rocm_audit.progress import SILENT, Progress
from rocm_audit.tree.discovery import interpreter_for

# ---------------------------------------------------------------------------------------------
# Probing

log = logging.getLogger(__name__)


def probe_clashes(
    clashes: Sequence[Clash],
    options: LlvmOptions,
    judge: PairJudge | None = None,
    python: str | None = None,
    progress: Progress = SILENT,
) -> list[Finding]:
    """Run every clash's probes under ``python`` (None: this interpreter; one child per mode; a
    judged pair in both orders, each library after its hosts); return the findings they lead to."""
    findings: list[Finding] = []
    for done, clash in enumerate(clashes, 1):
        progress.update(done)
        if clash.judged is not None and judge is not None:
            clash.probes, clash.probe_expect = _probe_orders(clash.judged, judge, options, python)
            findings.extend(_judged_probe_findings(clash.paths, clash.probes, clash.probe_expect))
            continue
        for mode in clash.predictions:
            common: dict[str, Any] = {
                "timeout_s": options.probe_timeout_s,
                "preload": options.preload,
                "ld_library_path": options.ld_library_path,
                "python": python,
            }
            if clash.kind == "closure":
                root = clash.probe_root or clash.via[0]
                result = probe_closure(root, mode, watch=clash.paths, **common)
            else:
                result = probe_pair(clash.paths[0], clash.paths[1], mode, **common)
            log.info("probe %s %s: %s", mode, " + ".join(clash.paths), result.outcome.value)
            clash.probes.append(result)
        findings.extend(_probe_findings(clash))
    return one_per_failing_load(findings)


def _probe_orders(
    pair: PairVerdicts, judge: PairJudge, options: LlvmOptions, python: str | None = None
) -> tuple[list[ProbeResult], list[Verdict]]:
    """Both orders, three modes: what a real process loads (hosts first), and what was expected."""
    results: list[ProbeResult] = []
    expected: list[Verdict] = []
    for order in pair.orders:
        for mode, prediction in order.modes.items():
            sequence = judge.load_sequence(order.first, order.second, mode)
            result = run_probe(
                mode,
                [LoadStep(path, rtld_global) for path, rtld_global in sequence],
                timeout_s=options.probe_timeout_s,
                preload=options.preload,
                ld_library_path=options.ld_library_path,
                python=python,
            )
            log.info("probe %s %s then %s: %s", mode, order.first, order.second, result.verdict.value)
            results.append(result)
            expected.append(prediction.verdict)
    return results, expected


def _judged_probe_findings(
    paths: Sequence[str], probes: Sequence[ProbeResult], expected: Sequence[Verdict]
) -> list[Finding]:
    """The findings the probes of one judged pair or clash give, one block per rule (LLVM005 abort,
    LLVM006 crash at exit, and the disagreements with the prediction). Long because the blocks are
    independent and read best side by side, as the rules a probe can raise."""
    findings = []
    subject, related = paths[0], list(paths[1:])

    def where(result: ProbeResult) -> str:
        loads = [step.split(":", 1)[1] for step in result.steps]
        return f"{probe_mode_text(result.mode)} ({' then '.join(loads)})"

    aborted = [p for p in probes if p.verdict is ProbeVerdict.ABORT]
    if aborted:
        option = next((p.option for p in aborted if p.option), None)
        named = f" of option '{option}'" if option else ""
        findings.append(
            make_finding(
                "LLVM005",
                subject,
                f"a load probe confirmed the double registration{named}: the process aborts",
                detail="; ".join(where(p) for p in aborted[:3]),
                related=related,
                data={"option": option, "modes": sorted({p.mode for p in aborted})},
            )
        )
    at_exit = [p for p in probes if p.outcome is ProbeOutcome.CRASH_AT_EXIT]
    if at_exit:
        findings.append(
            make_finding(
                "LLVM006",
                subject,
                f"probe loaded the libraries, then crashed at exit ({'; '.join(where(p) for p in at_exit[:3])})",
                related=related,
                data={"modes": sorted({p.mode for p in at_exit})},
            )
        )
    loading = [
        p for p in probes if p.verdict is ProbeVerdict.HANG or (p.verdict is ProbeVerdict.CRASH and p.step != "exit")
    ]
    findings.extend(one_per_failing_load([loading_failure(result) for result in loading]))
    for result, expect in zip(probes, expected, strict=True):
        if not result.verdict.conclusive:
            findings.append(
                make_finding(
                    "LLVM008",
                    subject,
                    f"probe {where(result)} inconclusive: {result.detail}",
                    related=related,
                    data={"mode": result.mode},
                )
            )
        elif (result.verdict is not ProbeVerdict.CLEAN) != expect.bad:
            findings.append(
                make_finding(
                    "LLVM007",
                    subject,
                    f"probe {where(result)}: predicted {expect.value}, observed {result.verdict.value}",
                    related=related,
                    data={"mode": result.mode, "predicted": expect.value, "observed": result.verdict.value},
                )
            )
    if any(p.isolation == "host network" for p in probes):
        findings.append(
            make_finding(
                "LLVM016",
                subject,
                "probes ran with the host's network (not root: no network namespace)",
                related=related,
            )
        )
    return findings


def _failing_load(result: ProbeResult) -> tuple[str, ...]:
    """The loads of a probe up to the one it crashed or hung in (hosts included): what failed,
    whatever pair of libraries the probe was run for."""
    steps = result.steps
    return steps[: steps.index(result.step) + 1] if result.step in steps else steps


def loading_failure(result: ProbeResult) -> Finding:
    """LLVM015 for a probe killed or hung while loading, about the libraries that load involved:
    ``a probe loading liba.so (RTLD_GLOBAL), then libb.so (RTLD_GLOBAL) was killed by SIGSEGV while
    loading libb.so``. Equal for every probe that failed in one load (one_per_failing_load)."""
    loads = _failing_load(result)
    paths = [step.split(":", 1)[1] for step in loads]
    unique = len({os.path.basename(p) for p in paths}) == len(paths)
    names = [os.path.basename(p) if unique else p for p in paths]
    flags = [f"RTLD_{step.split(':', 1)[0].upper()}" for step in loads]
    order = ", then ".join(f"{name} ({flag})" for name, flag in zip(names, flags, strict=True))
    what = "hung" if result.verdict is ProbeVerdict.HANG else f"was killed by {result.signal}"
    return make_finding(
        "LLVM015",
        paths[0],
        f"a probe loading {order} {what} while loading {names[-1]}",
        related=paths[1:],
        data={"verdict": result.verdict.value, "signal": result.signal, "step": result.step, "loads": list(loads)},
    )


def one_per_failing_load(findings: Sequence[Finding]) -> list[Finding]:
    """One LLVM015 per distinct failing load: the pairs whose probes ran the same loads up to the
    failing one (a plugin's host crashing before the plugin was loaded) saw one failure."""
    seen: set[tuple[str, ...]] = set()
    kept = []
    for one in findings:
        if one.rule == "LLVM015" and "loads" in one.data:
            key = tuple(one.data["loads"]) + (str(one.data["verdict"]),)
            if key in seen:
                continue
            seen.add(key)
        kept.append(one)
    return kept


def probe_analysis(analysis: LlvmAnalysis, options: LlvmOptions, progress: Progress = SILENT) -> None:
    """Probe every clash and every failing pair; the probe verdict overrides the static one (the
    clash's finding is rewritten: a clean probe downgrades it to LLVM014 with the evidence, a bad
    one makes it an error) and the report says which decided.

    The probes run under the audited interpreter (interpreter_for: --python, else the owner of the
    audited directories, else this one), recorded in ``analysis.probe_interpreter``: an extension
    module built for 3.12 does not load into 3.11. Raises UsageError for a --python that does not run."""
    audited = [root.path for root in analysis.facts.inventory.roots] if analysis.facts is not None else []
    interpreter = interpreter_for(options.python, audited)
    analysis.probe_interpreter = interpreter
    python = interpreter.executable
    progress.phase("LLVM: probing clashes in child processes", len(analysis.clashes) + len(analysis.pairs))
    analysis.findings.extend(probe_clashes(analysis.clashes, options, analysis.judge, python, progress))
    judge = analysis.judge
    for done, pair in enumerate(analysis.pairs, len(analysis.clashes) + 1):
        if judge is None:
            break
        progress.update(done)
        analysis.pair_probes[pair.paths] = _probe_orders(pair, judge, options, python)
    rewritten: dict[int, Finding] = {}
    for clash in analysis.clashes:
        judged = clash.judged is not None or bool(clash.closure_judged)
        if clash.finding is not None and judged and probe_decided(clash.probes) is not None:
            rewritten[id(clash.finding)] = clash_finding(clash)
            clash.finding = rewritten[id(clash.finding)]
    if judge is not None:
        analysis.findings.extend(_probed_pair_findings(analysis, judge, rewritten))
    analysis.findings = one_per_failing_load([rewritten.get(id(f), f) for f in analysis.findings])


def _probed_pair_findings(analysis: LlvmAnalysis, judge: PairJudge, rewritten: dict[int, Finding]) -> list[Finding]:
    """The probes' findings of the failing pairs, and each pair finding the probes decided
    rewritten (in ``rewritten``). A pair folded into another's finding as an identical copy
    (llvm/copies.py) stays folded only while its probes agree with that pair's: otherwise it gets
    findings of its own."""
    added: list[Finding] = []

    def probes_of(pair: PairVerdicts) -> list[ProbeResult]:
        return analysis.pair_probes.get(pair.paths, ([], []))[0]

    for paths, members in analysis.pair_members.items():
        old = analysis.pair_findings.get(paths)
        for group in copies.fold(members, analysis.class_of, probes_of).values():
            first = group[0]
            probes, expected = analysis.pair_probes.get(first.paths, ([], []))
            probed = _judged_probe_findings(first.paths, probes, expected)
            added.extend(copies.with_copies(f, group, analysis.class_of) for f in probed)
            decided = probe_decided(probes) is not None
            finding = copies.with_copies(pair_finding(first, judge, probes), group, analysis.class_of)
            if first.paths == paths and old is not None:
                if decided or len(group) < len(members):
                    rewritten[id(old)] = finding
            else:
                added.append(finding)  # a copy the probes told apart
    return added


def _probe_findings(clash: Clash) -> list[Finding]:
    findings = []
    subject, related = clash.paths[0], clash.paths[1:]
    confirmed = [p.mode for p in clash.probes if p.outcome is ProbeOutcome.CONFIRMED]
    if confirmed:
        option = f" of option '{clash.option}'" if clash.option else ""
        findings.append(
            make_finding(
                "LLVM005",
                subject,
                f"a load probe confirmed the double registration{option}: the process aborts",
                detail="probes: " + "; ".join(probe_mode_text(m) for m in confirmed),
                related=related,
                data={"option": clash.option, "modes": confirmed},
            )
        )
    crashed = [p.mode for p in clash.probes if p.outcome is ProbeOutcome.CRASH_AT_EXIT]
    if crashed:
        findings.append(
            make_finding(
                "LLVM006",
                subject,
                f"probe loaded the libraries, then crashed at exit (modes: {', '.join(crashed)})",
                related=related,
                data={"modes": crashed},
            )
        )
    for result in clash.probes:
        verdict = agrees(clash.predictions[result.mode], result.outcome)
        if verdict is None and result.verdict in (ProbeVerdict.CRASH, ProbeVerdict.HANG):
            findings.append(
                make_finding(
                    "LLVM015",
                    subject,
                    f"probe ({probe_mode_text(result.mode)}): {result.detail}",
                    related=related,
                    data={"mode": result.mode, "verdict": result.verdict.value, "signal": result.signal},
                )
            )
        elif verdict is None:
            findings.append(
                make_finding(
                    "LLVM008",
                    subject,
                    f"probe ({probe_mode_text(result.mode)}) inconclusive: {result.detail}",
                    related=related,
                    data={"mode": result.mode},
                )
            )
        elif not verdict:
            findings.append(
                make_finding(
                    "LLVM007",
                    subject,
                    f"probe ({probe_mode_text(result.mode)}): predicted {clash.predictions[result.mode].value}, "
                    f"observed {result.outcome.value}",
                    related=related,
                    data={
                        "mode": result.mode,
                        "predicted": clash.predictions[result.mode].value,
                        "observed": result.outcome.value,
                    },
                )
            )
    return findings
