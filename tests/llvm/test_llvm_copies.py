"""Pairs that differ by an identical copy fold into one finding only when they are judged alike
(llvm/copies.py). The real verdicts of real copies are in test_llvm_differential.py; these build
the verdicts directly, to hold the rule where copies of equal bytes are judged apart (a copy next
to a host its twin cannot find)."""

from __future__ import annotations

from rocm_audit.findings import make_finding
from rocm_audit.llvm import copies
from rocm_audit.llvm.pairs import OrderVerdicts, PairVerdicts
from rocm_audit.llvm.probes import PAIR_MODES
from rocm_audit.llvm.verdicts import CLEAN, Prediction, Verdict

ABORT = Prediction(Verdict.ABORT, "registered more than once")
HOST, PLUGIN, PLUGIN_COPY = "/s/host/libhost.so", "/s/a/libplugin.so", "/s/a/libplugin.so.23"
CLASS_OF = copies.class_map([{PLUGIN, PLUGIN_COPY}])


def _pair(a: str, b: str, forward: Prediction, reverse: Prediction = CLEAN) -> PairVerdicts:
    return PairVerdicts(
        (a, b),
        (
            OrderVerdicts(a, b, {mode: forward for mode in PAIR_MODES}),
            OrderVerdicts(b, a, {mode: reverse for mode in PAIR_MODES}),
        ),
    )


def test_copies_judged_alike_fold_and_the_finding_names_the_copy():
    pairs = [_pair(HOST, PLUGIN, ABORT), _pair(HOST, PLUGIN_COPY, ABORT)]
    folded = copies.fold(pairs, CLASS_OF, lambda _pair: ())
    assert list(folded) == [(HOST, PLUGIN)] and folded[(HOST, PLUGIN)] == pairs
    finding = make_finding("LLVM013", HOST, "the process aborts", related=[PLUGIN])
    named = copies.with_copies(finding, folded[(HOST, PLUGIN)], CLASS_OF)
    assert named.message == "the process aborts; the same with libplugin.so.23, an identical copy of libplugin.so"
    assert named.related_paths == (PLUGIN, PLUGIN_COPY)
    assert named.data["identical_copies"] == {PLUGIN_COPY: PLUGIN}


def test_copies_judged_apart_keep_findings_of_their_own():
    # The same bytes, another verdict: only the order, or only the probes, differ.
    for other in (_pair(HOST, PLUGIN_COPY, CLEAN, ABORT), _pair(PLUGIN_COPY, HOST, CLEAN)):
        folded = copies.fold([_pair(HOST, PLUGIN, ABORT), other], CLASS_OF, lambda _pair: ())
        assert len(folded) == 2
    # Libraries that are no copies of one another never fold, whatever their verdicts.
    folded = copies.fold([_pair(HOST, PLUGIN, ABORT), _pair(HOST, "/s/b/libother.so", ABORT)], CLASS_OF, lambda _: ())
    assert len(folded) == 2


def test_a_finding_standing_for_nothing_else_is_unchanged():
    pair = _pair(HOST, PLUGIN, ABORT)
    finding = make_finding("LLVM013", HOST, "the process aborts", related=[PLUGIN])
    assert copies.with_copies(finding, [pair], CLASS_OF) is finding
