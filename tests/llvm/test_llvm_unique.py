"""Which shared objects of clang/MLIR break two copies: only those their initialisers build.

g++ gives a default-visibility inline variable, template static member or local static of an
inline function the binding STB_GNU_UNIQUE, and its guard variable too: the loader keeps one
definition per name for the whole process (glibc dl-lookup.c, do_lookup_unique), whatever the RTLD
flags, and the guard makes the first library's initialiser the only one that runs and registers
the destructor. Seen with flydsl 0.4.2, whose two dialect modules share mlir::python's
PyStringAttribute::name (clean in every real load), and with rocm-llvm-python's and
rocm-bindings-compiler's libLLVM (about 250 UNIQUE llvm:: objects each, clean together).

A plain GLOBAL object is bound to the first library's copy too (global scope first), and then each
library's own initialiser builds it into that one place and registers its destructor: a double
free at exit, as with LLVM's registries. A GLOBAL object no initialiser touches (MLIR's TypeIDs,
constant-initialised, their address is all that matters: flydsl 0.4.2 and 0.5.0 share 5376 of
them) is shared harmlessly. linkage.py tells them apart by the GOT slots .init_array code loads.
"""

from __future__ import annotations

import pytest

from rocm_audit.llvm.clashes import LlvmOptions, analyse
from rocm_audit.llvm.linkage import read_linkage
from rocm_audit.llvm.probes import PAIR_MODES
from rocm_audit.tree.discovery import resolve_roots
from rocm_audit.tree.inventory import build_inventory, read_dynamic_info
from support.llvm.llvm_builders import cxx_shared
from support.llvm.realload import load

# LLVM's CommandLine.cpp text (a private copy's mark, roles.py) and one mlir:: object, looked up
# through the GOT (default visibility, -fPIC) by code that hands out its address.
SOURCE = r"""
#include <string>
extern "C" __attribute__((used)) const char rocm_audit_registry_text[] =
    "CommandLine Error: Option 'x' registered more than once! inconsistency in registered CommandLine options";
namespace mlir { namespace python { %s } }
extern "C" const void *the_object() { return &%s; }
"""
# shape -> (declarations, the object, its symbol)
SHAPES = {
    # A 4 KiB string built when the library loads and freed at exit, STB_GNU_UNIQUE with its guard.
    "unique": (
        "struct PyStringAttribute { static inline std::string name = std::string(4096, 'n'); };",
        "mlir::python::PyStringAttribute::name",
        "_ZN4mlir6python17PyStringAttribute4nameB5cxx11E",  # std::string carries the cxx11 ABI tag
    ),
    # The same string as a plain GLOBAL object: each copy's initialiser builds it, each frees it.
    "global": (
        "struct PyStringAttribute { static std::string name; };"
        " std::string PyStringAttribute::name = std::string(4096, 'n');",
        "mlir::python::PyStringAttribute::name",
        "_ZN4mlir6python17PyStringAttribute4nameB5cxx11E",
    ),
    # A TypeID as MLIR defines them: GLOBAL, constant-initialised, no destructor; only its
    # address matters. flydsl 0.4.2's and 0.5.0's libFlyPythonCAPI (one SONAME) share 5376.
    "constant": (
        "struct TypeIDResolver { static void *id; }; void *TypeIDResolver::id = nullptr;",
        "mlir::python::TypeIDResolver::id",
        "_ZN4mlir6python14TypeIDResolver2idE",
    ),
}


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    root = tmp_path_factory.mktemp("unique")
    built = {}
    for shape, (declarations, obj, _symbol) in SHAPES.items():
        for module in ("dialect_a", "dialect_b"):
            path = root / shape / f"_{module}.so"
            built[shape, module] = cxx_shared(path, SOURCE % (declarations, obj), f"-Wl,-soname,_{module}.so")
    return root, {k: str(v) for k, v in built.items()}


def _verdicts(directory: str, a: str, b: str) -> dict[tuple[str, str, str], tuple[str, list]]:
    roots, _ = resolve_roots([directory])
    judge = analyse(build_inventory(roots), LlvmOptions()).judge
    assert judge is not None
    found = {}
    for first, second in ((a, b), (b, a)):
        order = judge.order(first, second)
        for mode in PAIR_MODES:
            found[first, second, mode] = (order.modes[mode].verdict.value, judge.load_sequence(first, second, mode))
    return found


def test_the_builds_have_the_binding_the_test_is_about(modules):
    _root, built = modules
    for shape, (_declarations, _obj, symbol) in SHAPES.items():
        linkage = read_linkage(built[shape, "dialect_b"], read_dynamic_info(built[shape, "dialect_b"]))
        assert symbol in linkage.exports and symbol in linkage.own_copies  # defined, and looked up
        assert (symbol in linkage.strong_data) is (shape != "unique")
        # Only the string is built by the library's initialiser (the walk sees its GOT slot).
        assert linkage.initialised_copies is not None
        assert (symbol in linkage.initialised_copies) is (shape != "constant")


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_only_a_shared_global_object_its_initialiser_builds_crashes(modules, shape):
    root, built = modules
    a, b = built[shape, "dialect_a"], built[shape, "dialect_b"]
    verdicts = _verdicts(str(root / shape), a, b)
    for (first, second, mode), (static, sequence) in verdicts.items():
        real = load(sequence).verdict
        assert (static == "clean") is (real == "clean"), (shape, first, second, mode, static, real)
        if shape != "global":
            assert real == "clean", (first, second, mode)
    if shape == "global":  # the first one loaded GLOBAL lends its copy to the second
        assert verdicts[a, b, "global-local"][0] == "crash" and verdicts[a, b, "local-local"][0] == "clean"
