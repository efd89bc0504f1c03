"""The one-line message of an LLVM clash says when it fails: which library first, in which mode.

A clash that aborts only when one library is loaded RTLD_GLOBAL before the other must not read as
"these two can never be installed together". The condition comes from the verdicts per order and
mode (the model's, or the probes' once they decided), the same data the ``-v`` detail words.
"""

from __future__ import annotations

from rocm_audit.llvm.clash_findings import failing_modes, when_text
from rocm_audit.llvm.clashes import LlvmOptions, analyse
from rocm_audit.llvm.pairs import OrderVerdicts, PairVerdicts
from rocm_audit.llvm.probes import ProbeOutcome, ProbeResult, ProbeVerdict
from rocm_audit.llvm.verdicts import CLEAN, Prediction, Verdict
from rocm_audit.tree.discovery import resolve_roots
from rocm_audit.tree.inventory import build_inventory
from support.llvm.realload import load_all

A, B = "/site/a/liba.so", "/site/b/libb.so"
ABORT = Prediction(Verdict.ABORT, "registered twice")
EVERY = ("global-global", "global-local", "local-local")


def _pair(forward: set[str], reverse: set[str]) -> PairVerdicts:
    def order(first: str, second: str, bad: set[str]) -> OrderVerdicts:
        return OrderVerdicts(first, second, {mode: ABORT if mode in bad else CLEAN for mode in EVERY})

    return PairVerdicts((A, B), (order(A, B, forward), order(B, A, reverse)))


def _probe(mode: str, verdict: ProbeVerdict) -> ProbeResult:
    outcome = ProbeOutcome.CLEAN if verdict is ProbeVerdict.CLEAN else ProbeOutcome.INCONCLUSIVE
    return ProbeResult(mode, outcome, None, 0, "", "", None, 0.0, verdict=verdict)


def test_the_words_name_the_order_and_the_mode_that_fail():
    first_global = {"global-global", "global-local"}
    assert when_text(failing_modes(_pair(first_global, set()))) == "when liba.so is loaded RTLD_GLOBAL before libb.so"
    assert when_text(failing_modes(_pair(set(), set(EVERY)))) == "when libb.so is loaded before liba.so"
    assert when_text(failing_modes(_pair(set(EVERY), set(EVERY)))) == "when they are loaded together"
    assert when_text(failing_modes(_pair(first_global, first_global))) == (
        "when either is loaded RTLD_GLOBAL before the other"
    )
    assert when_text(failing_modes(_pair({"global-global"}, {"global-global"}))) == "when both are loaded RTLD_GLOBAL"
    assert when_text(failing_modes(_pair(first_global, set(EVERY)))) == (
        "when liba.so is loaded RTLD_GLOBAL before libb.so, or libb.so is loaded before liba.so"
    )
    assert when_text(failing_modes(_pair({"local-local"}, set()))) == (
        "when liba.so is loaded before libb.so (RTLD_LOCAL, then RTLD_LOCAL)"
    )
    # Two files of one name: whole paths, or the words would not say which comes first.
    same = PairVerdicts(
        (A, "/site/c/liba.so"),
        (OrderVerdicts(A, "/site/c/liba.so", {m: ABORT for m in EVERY}), OrderVerdicts("/site/c/liba.so", A, {})),
    )
    assert when_text(failing_modes(same)) == f"when {A} is loaded before /site/c/liba.so"


def test_decided_probes_give_the_condition_and_an_inconclusive_one_keeps_the_model():
    pair = _pair(set(EVERY), {"global-global"})
    probes = [
        _probe("global-global", ProbeVerdict.CRASH),
        _probe("global-local", ProbeVerdict.INCONCLUSIVE),  # says nothing: the model's abort stays
        _probe("local-local", ProbeVerdict.CLEAN),
        _probe("global-global", ProbeVerdict.CLEAN),
        _probe("global-local", ProbeVerdict.INCONCLUSIVE),  # nor here: the model's clean stays
        _probe("local-local", ProbeVerdict.CLEAN),
    ]
    assert failing_modes(pair, probes) == [(A, B, frozenset({"global-global", "global-local"}))]
    assert failing_modes(pair) == [(A, B, frozenset(EVERY)), (B, A, frozenset({"global-global"}))]


def test_the_message_of_a_real_clash_says_when_and_real_loads_agree(fake_llvms):
    roots, _ = resolve_roots([str(fake_llvms.root)])
    analysis = analyse(build_inventory(roots), LlvmOptions())
    symbolic, plain_a, plain_b = (str(fake_llvms.paths[n]) for n in ("symbolic", "plain-a", "plain-b"))
    by_pair = {(f.path, *f.related_paths): f for f in analysis.findings if f.rule == "LLVM002"}
    one_order = by_pair[(symbolic, plain_a)]
    assert one_order.message.endswith(
        "the process aborts ('Option ... registered more than once') when libfakellvm-symbolic.so is loaded "
        "RTLD_GLOBAL before libfakellvm-plain-a.so"
    )
    assert one_order.detail.startswith(f"abort when {symbolic} is loaded RTLD_GLOBAL before {plain_a} (RTLD_GLOBAL: ")
    assert by_pair[(plain_a, plain_b)].message.endswith("when either is loaded RTLD_GLOBAL before the other")
    # What the words say is what a process does: only the -Bsymbolic one first and global aborts.
    loads = load_all(
        [
            [(symbolic, True), (plain_a, False)],
            [(symbolic, False), (plain_a, False)],
            [(plain_a, True), (symbolic, True)],
            [(plain_a, True), (plain_b, False)],
            [(plain_b, True), (plain_a, False)],
            [(plain_b, False), (plain_a, True)],
        ]
    )
    assert [one.verdict for one in loads] == ["abort", "clean", "clean", "abort", "abort", "clean"]
