"""Two whole LLVMs in one DT_NEEDED list: the later one binds its registries to the earlier one.

A library that links both rocm-bindings-compiler's libLLVM.so (DT_SYMBOLIC, unversioned) and
Debian's libLLVM-15 maps both in one dlopen. glibc looks libLLVM-15's references up in the root's
search list, breadth first; its LLVM_15-versioned references accept an unversioned definition
(dl-lookup.c check_match), so when libLLVM.so comes first, libLLVM-15's own MachineSchedRegistry
(and Registry<T> heads) bind to libLLVM.so's: one registry for two LLVMs, a crash at exit. In the
other order libLLVM-15 finds itself first and DT_SYMBOLIC keeps libLLVM.so to itself: clean. Being
in one closure is no sign of one build here (both carry CommandLine.cpp).
"""

from __future__ import annotations

import pytest
from carriers import CARRIERS, SYSDEPS_DIR, sysdeps, unpacked
from llvm_builders import LIBLLVM15, cc_shared, place, require_file
from realload import load

from rocm_audit.llvm.clashes import LlvmOptions, Reason, analyse
from rocm_audit.llvm.probes import CLOSURE_MODES
from rocm_audit.tree.discovery import resolve_roots
from rocm_audit.tree.inventory import build_inventory


@pytest.fixture(scope="module")
def two_llvm_roots(tmp_path_factory):
    root = tmp_path_factory.mktemp("two-llvms")
    (carrier,) = [c for c in CARRIERS if c.name == "rbllvm"]
    libllvm = place(unpacked(carrier) / carrier.members[0], root / "rocm" / "bindings" / "llvm" / "libLLVM.so")
    for soname in carrier.standins:
        place(sysdeps(soname), root / SYSDEPS_DIR / soname)
    llvm15 = require_file(LIBLLVM15, "libllvm15")
    roots = {}
    for name, needed in (("rb-first", ("libLLVM.so", llvm15.name)), ("15-first", (llvm15.name, "libLLVM.so"))):
        roots[name] = str(
            cc_shared(
                root / "lib" / f"libboth-{name}.so",
                "int both_marker;\n",
                "-Wl,--no-as-needed",
                f"-L{libllvm.parent}",
                f"-L{llvm15.parent}",
                f"-Wl,-rpath-link,{root / SYSDEPS_DIR}",
                *(f"-l:{n}" for n in needed),
                f"-Wl,-rpath,{libllvm.parent}",
            )
        )
    return root, roots


def test_the_closure_verdict_is_the_real_load_in_both_orders(two_llvm_roots):
    root, roots = two_llvm_roots
    found, _ = resolve_roots([str(root)])
    analysis = analyse(build_inventory(found), LlvmOptions())
    judge = analysis.judge
    assert judge is not None
    verdicts = {}
    for name, library in roots.items():
        for mode, rtld_global in CLOSURE_MODES.items():
            static = judge.predict([(library, rtld_global)]).verdict.value  # what the clash is judged by
            sequence = [(host, True) for host in judge.hosts(library)] + [(library, rtld_global)]
            real = load(sequence)
            assert real.verdict != "load-error", real
            assert (static == "clean") is (real.verdict == "clean"), (name, mode, static, real)
            verdicts[name, mode] = static
    assert {v for (name, _), v in verdicts.items() if name == "rb-first"} == {"crash"}
    assert {v for (name, _), v in verdicts.items() if name == "15-first"} == {"clean"}
    (clash,) = [c for c in analysis.clashes if c.reason is Reason.CLOSURE_INTERPOSITION]
    assert list(clash.via) == [roots["rb-first"]] and clash.finding is not None
    assert clash.finding.severity.name == "ERROR"  # was LLVM014 (info): "clean" by the model
