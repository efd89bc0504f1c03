"""Two whole LLVMs in one DT_NEEDED list: the later one binds its registries to the earlier one.

A library that links both rocm-bindings-compiler's libLLVM.so (DT_SYMBOLIC, unversioned) and
Debian's libLLVM-15 maps both in one dlopen. glibc looks libLLVM-15's references up in the root's
search list, breadth first; its LLVM_15-versioned references accept an unversioned definition
(dl-lookup.c check_match), so when libLLVM.so comes first, libLLVM-15's own MachineSchedRegistry
(and Registry<T> heads) bind to libLLVM.so's: one registry for two LLVMs, a crash at exit. In the
other order libLLVM-15 finds itself first and DT_SYMBOLIC keeps libLLVM.so to itself: clean. Being
in one closure is no sign of one build here (both carry CommandLine.cpp).

The sweep below builds such a library for every ordered pair of whole LLVM carriers (each with
its own CommandLine.cpp: Debian's libLLVM 14/15/16/19, librocmllvm 6.2 and 7.2.2, rocm-bindings'
libLLVM, torch-mlir's and IREE's CAPIs, triton's pass plugins) and loads it for real in both
RTLD modes. It found what the pair sweep could not: a library that maps triton's pass plugin (an
unversioned, not -Bsymbolic LLVM) before Debian's libLLVM crashes at exit (free(): invalid
pointer) in both modes, with libLLVM's versioned references to its own cl::opt objects
(PrintChanged, ...) bound to the plugin's copies. The same two libraries dlopened one after the
other (the plugin first, in any of the four mode pairs) load and exit cleanly: in one closure every
object is relocated before any initialiser runs, and libLLVM's, as the dependency BFS reaches
later, run before the plugin's.
"""

from __future__ import annotations

import itertools
import json
import subprocess

import pytest

from rocm_audit.llvm.clashes import LlvmOptions, Reason, analyse
from rocm_audit.llvm.probes import CLOSURE_MODES
from rocm_audit.tree.discovery import resolve_roots
from rocm_audit.tree.inventory import build_inventory
from support.llvm.carriers import CARRIERS, SYSDEPS_DIR, build_tree, cache_dir, sysdeps, unpacked
from support.llvm.llvm_builders import LIBLLVM15, cc_shared, place, require_file
from support.llvm.realload import load, load_all

pytestmark = pytest.mark.toolchain  # whole LLVMs loaded for real in child processes


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


BAD = {"abort", "crash", "hang"}
# One pair per mechanism, both orders (carriers.py names): the plugin's unversioned LLVM first
# (libLLVM 19 binds its cl::opt objects to the plugin's: a crash at exit) or second (it registers
# into libLLVM 19's map: an abort); two Debian versions with their own version nodes (clean).
CLOSURE_PAIRS = (("triton36/libPrintLoadStoreMemSpaces.so", "llvm19"), ("llvm15", "llvm16"))


def _soname(path) -> str | None:
    dynamic = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return next((line.split("[", 1)[1].rstrip("]") for line in dynamic.splitlines() if "(SONAME)" in line), None)


def _closure_tree(root, pairs):
    """The carriers, and one library per ordered pair whose DT_NEEDED list names both, in order."""
    tree = build_tree(root, tuple(sorted({n for pair in pairs for n in pair})))
    built = {}
    for a, b in pairs:
        for first, second in ((a, b), (b, a)):
            pa, pb = tree.libraries[first], tree.libraries[second]
            name = f"libboth-{first}-{second}".replace("/", "_")
            built[first, second] = str(
                cc_shared(
                    root / "closures" / f"{name}.so",
                    "int both_marker;\n",
                    "-Wl,--no-as-needed",
                    str(pa),
                    str(pb),
                    f"-Wl,-rpath,{pa.parent}:{pb.parent}",
                )
            )
    return built


def _closure_sweep(root, built):
    """Per library and RTLD mode: the static verdict, the real load, and whether rocm-audit's
    findings name the library as the way an error arrives."""
    found, _ = resolve_roots([str(root)])
    analysis = analyse(build_inventory(found), LlvmOptions())
    judge = analysis.judge
    assert judge is not None
    erring = {
        via
        for clash in analysis.clashes
        if clash.kind == "closure" and clash.finding is not None and clash.finding.severity.name == "ERROR"
        for via in clash.via
    }
    rows, sequences = [], []
    for (first, second), library in sorted(built.items()):
        for mode, rtld_global in CLOSURE_MODES.items():
            rows.append(
                {
                    "first": first,
                    "second": second,
                    "mode": mode,
                    "static": judge.predict([(library, rtld_global)]).verdict.value,
                    "reported": library in erring,
                }
            )
            sequences.append([(host, True) for host in judge.hosts(library)] + [(library, rtld_global)])
    for row, real in zip(rows, load_all(sequences), strict=True):
        row["real"], row["detail"] = real.verdict, real.detail[-200:]
    return rows


def _disagreements(rows):
    return [
        r
        for r in rows
        if r["real"] == "load-error"
        or (r["static"] in BAD) != (r["real"] in BAD)
        or r["reported"] != (r["real"] in BAD)
    ]


def test_two_whole_llvms_in_one_closure_match_real_loads(tmp_path):
    root = tmp_path
    rows = _closure_sweep(root, _closure_tree(root, CLOSURE_PAIRS))
    assert not _disagreements(rows), _disagreements(rows)
    real = {(r["first"], r["second"], r["mode"]): r["real"] for r in rows}
    plugin = CLOSURE_PAIRS[0][0]
    assert real[plugin, "llvm19", "global"] == "crash" and real[plugin, "llvm19", "local"] == "crash"
    assert real["llvm19", plugin, "global"] == "abort"
    assert {real["llvm15", "llvm16", m] for m in CLOSURE_MODES} == {"clean"}


@pytest.mark.slow  # every ordered pair of whole LLVM carriers: 216 loads, about 2 minutes
def test_every_pair_of_whole_llvms_in_one_closure_matches_real_loads(tmp_path_factory):
    root = tmp_path_factory.mktemp("closure-sweep")
    tree = build_tree(root / "probe")
    found, _ = resolve_roots([str(tree.root)])
    judge = analyse(build_inventory(found), LlvmOptions()).judge
    assert judge is not None
    whole = []
    for key, path in sorted(tree.libraries.items()):
        stat = path.stat()
        if not key.endswith("-copy") and judge.linkage_of(str(path), (stat.st_dev, stat.st_ino)).defines_registry:
            whole.append(key)
    assert len(whole) >= 10, whole
    sonames = {key: _soname(tree.libraries[key]) for key in whole}
    pairs = [(a, b) for a, b in itertools.combinations(whole, 2) if sonames[a] is None or sonames[a] != sonames[b]]
    rows = _closure_sweep(root / "sweep", _closure_tree(root / "sweep", pairs))
    figures = {
        "libraries": whole,
        "loads": len(rows),
        "really_bad_libraries": len({(r["first"], r["second"]) for r in rows if r["real"] in BAD}),
        "outcomes": dict(sorted({f"{r['static']}/{r['real']}": 0 for r in rows}.items())),
        "disagreements": _disagreements(rows),
    }
    for r in rows:
        figures["outcomes"][f"{r['static']}/{r['real']}"] += 1
    (cache_dir() / "closure-sweep.json").write_text(json.dumps(figures, indent=1))
    assert not figures["disagreements"], figures["disagreements"]
