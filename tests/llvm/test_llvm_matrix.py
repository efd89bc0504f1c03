"""The issue's matrix: for each real-library case, the static prediction and the probe agree.

Every case asserts the prediction itself (so agreement cannot come from two wrong answers) and
then the outcome of a real load in a sandboxed child, mode by mode.
"""

from __future__ import annotations

import os

import pytest

from rocm_audit.llvm.clashes import Expect, agrees, predict_closure, predict_pair
from rocm_audit.llvm.probes import PAIR_MODES, ProbeOutcome, probe_closure, probe_pair
from rocm_audit.llvm.roles import ClFacts, Role, classify
from rocm_audit.tree.inventory import read_dynamic_info

ABORT, CLEAN = Expect.ABORT, Expect.CLEAN


def facts(path) -> ClFacts:
    real = os.path.realpath(path)
    return classify(real, read_dynamic_info(real))


def same_file(a, b) -> bool:
    sa, sb = os.stat(a), os.stat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def check_pair(first, second, expected: dict[str, Expect], *, same_library: bool, option: str | None = None):
    """Assert the prediction, then probe each mode and assert the probe agrees with it."""
    predicted = predict_pair(facts(first), facts(second), same_file=same_file(first, second), same_library=same_library)
    assert predicted == expected
    for mode in PAIR_MODES:
        result = probe_pair(str(first), str(second), mode, timeout_s=120)
        assert agrees(predicted[mode], result.outcome), (mode, result)
        if predicted[mode] is ABORT:
            assert result.outcome is ProbeOutcome.CONFIRMED
            assert result.returncode == -6
            if option is not None:
                assert result.option == option
        else:
            assert result.outcome is ProbeOutcome.CLEAN, (mode, result)


def test_two_copies_of_libllvm15_abort_when_the_first_is_global(dup_llvm15):
    core, devel = dup_llvm15.paths["core"], dup_llvm15.paths["devel"]
    assert facts(core).role is Role.EXPORTER and facts(core).interposable_registry
    check_pair(
        core,
        devel,
        {"global-global": ABORT, "global-local": ABORT, "local-local": CLEAN},
        same_library=True,
        option="use-dbg-addr",
    )


def test_two_copies_of_a_registrant_abort_even_both_local(dup_clang_cpp):
    a, b = dup_clang_cpp.paths["a"], dup_clang_cpp.paths["b"]
    assert facts(a).role is Role.REGISTRANT and facts(a).version_node == "LLVM_15"
    check_pair(a, b, {mode: ABORT for mode in PAIR_MODES}, same_library=True)
    local = probe_pair(str(a), str(b), "local-local", timeout_s=120)
    assert "registered more than once" in local.stderr_tail and local.option


@pytest.mark.parametrize("order", ["15-then-16", "16-then-15"])
def test_libllvm15_next_to_libllvm16_is_versioned_apart(llvm15_and_16, order):
    v15, v16 = llvm15_and_16.paths["v15"], llvm15_and_16.paths["v16"]
    first, second = (v15, v16) if order == "15-then-16" else (v16, v15)
    check_pair(first, second, {mode: CLEAN for mode in PAIR_MODES}, same_library=False)


def test_private_llvmlite_copies_never_clash(llvmlite_twice):
    a, b = llvmlite_twice.paths["a"], llvmlite_twice.paths["b"]
    one = facts(a)
    assert one.role is Role.PRIVATE_COPY and one.embeds_registry and one.exported_cl_symbols == 0
    check_pair(a, b, {mode: CLEAN for mode in PAIR_MODES}, same_library=True)


@pytest.mark.parametrize("alias", ["hardlink", "symlink"])
def test_one_inode_through_another_path_is_mapped_once(same_inode, alias):
    core, other = same_inode.paths["core"], same_inode.paths[alias]
    check_pair(core, other, {mode: CLEAN for mode in PAIR_MODES}, same_library=True)
    result = probe_pair(str(core), str(other), "global-global", timeout_s=120)
    assert result.instances == 1  # /proc/self/maps of the child: one inode mapped


def test_runpath_closure_with_two_copies_of_one_llvm_aborts_in_any_mode(runpath_closures):
    v15, bis = facts(runpath_closures.paths["v15"]), facts(runpath_closures.paths["bis"])
    predicted = predict_closure(v15, bis)
    assert predicted == {"global": ABORT, "local": ABORT}
    for mode in predicted:
        result = probe_closure(
            str(runpath_closures.paths["copies"]),
            mode,
            timeout_s=120,
            watch=[str(runpath_closures.paths["v15"]), str(runpath_closures.paths["bis"])],
        )
        assert result.outcome is ProbeOutcome.CONFIRMED and result.option == "use-dbg-addr", result


def test_runpath_closure_with_llvm15_and_16_loads_cleanly(runpath_closures):
    predicted = predict_closure(facts(runpath_closures.paths["v15"]), facts(runpath_closures.paths["v16"]))
    assert predicted == {"global": CLEAN, "local": CLEAN}
    watch = [str(runpath_closures.paths["v15"]), str(runpath_closures.paths["v16"])]
    for mode in predicted:
        result = probe_closure(str(runpath_closures.paths["two"]), mode, timeout_s=120, watch=watch)
        assert result.outcome is ProbeOutcome.CLEAN, result
        assert result.instances == 3  # libtwo.so and both LLVMs, mapped through the RUNPATH


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        # Unversioned exporters interpose whichever comes first in the global scope.
        (
            "plain-a",
            "plain-b",
            {"global-global": ABORT, "global-local": ABORT, "local-local": CLEAN},
        ),
        # One version node: still one namespace for the symbols.
        (
            "node1-a",
            "node1-b",
            {"global-global": ABORT, "global-local": ABORT, "local-local": CLEAN},
        ),
        # Distinct nodes never bind to each other.
        ("node1-a", "node2", {mode: CLEAN for mode in PAIR_MODES}),
        # -Bsymbolic binds its own references inside itself...
        ("plain-a", "symbolic", {mode: CLEAN for mode in PAIR_MODES}),
        # ...but a plain library loaded after a global -Bsymbolic one still binds to it.
        (
            "symbolic",
            "plain-a",
            {"global-global": ABORT, "global-local": ABORT, "local-local": CLEAN},
        ),
    ],
)
def test_miniature_llvms_follow_the_symbol_binding_rules(fake_llvms, first, second, expected):
    check_pair(
        fake_llvms.paths[first],
        fake_llvms.paths[second],
        expected,
        same_library=False,
        option="fake-opt",
    )


def test_a_preloaded_copy_is_global_before_either_step(fake_llvms):
    a, b = facts(fake_llvms.paths["plain-a"]), facts(fake_llvms.paths["plain-b"])
    everywhere = {mode: ABORT for mode in PAIR_MODES}
    for preloaded in ((True, False), (False, True), (True, True)):
        assert predict_pair(a, b, same_file=False, same_library=False, preloaded=preloaded) == everywhere
    preload = [str(fake_llvms.paths["plain-b"])]
    result = probe_pair(
        str(fake_llvms.paths["plain-a"]),
        str(fake_llvms.paths["plain-b"]),
        "local-local",
        preload=preload,
    )
    assert result.outcome is ProbeOutcome.CONFIRMED and result.preload == tuple(preload)
