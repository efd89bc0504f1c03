"""STB_GNU_UNIQUE objects are shared on purpose, a GLOBAL copy is not (glibc dl-lookup.c).

g++ gives a default-visibility inline variable, template static member or local static of an
inline function the binding STB_GNU_UNIQUE, and its guard variable too: the loader keeps one
definition per name for the whole process (do_lookup_unique), whatever the RTLD flags, and the
guard makes the first library's initialiser the only one that runs and registers the destructor.
Two libraries that share such an object are what the C++ ABI intends: seen with flydsl 0.4.2,
whose two dialect modules share mlir::python's PyStringAttribute::name (clean in every real load),
and with rocm-llvm-python's and rocm-bindings-compiler's libLLVM (300 UNIQUE llvm:: objects each,
clean together). A plain GLOBAL object defined in both is constructed twice into one place and
destroyed twice at exit: a double free, as LLVM's registries are.
"""

from __future__ import annotations

import pytest
from llvm_builders import cxx_shared
from realload import load

from rocm_audit.llvm.clashes import LlvmOptions, analyse
from rocm_audit.llvm.linkage import read_linkage
from rocm_audit.llvm.probes import PAIR_MODES
from rocm_audit.tree.discovery import resolve_roots
from rocm_audit.tree.inventory import build_inventory, read_dynamic_info

# LLVM's CommandLine.cpp text (a private copy's mark, roles.py) and one mlir:: object of 4 KiB
# that is built when the library loads and freed at exit.
SOURCE = r"""
#include <string>
extern "C" __attribute__((used)) const char rocm_audit_registry_text[] =
    "CommandLine Error: Option 'x' registered more than once! inconsistency in registered CommandLine options";
namespace mlir { namespace python { struct PyStringAttribute { %s }; } }
%s
extern "C" const char *attribute_name() { return mlir::python::PyStringAttribute::name.c_str(); }
"""
UNIQUE = ("static inline std::string name = std::string(4096, 'n');", "")
GLOBAL = (
    "static std::string name;",
    "std::string mlir::python::PyStringAttribute::name = std::string(4096, 'n');",
)
NAME = "_ZN4mlir6python17PyStringAttribute4nameB5cxx11E"  # std::string carries the cxx11 ABI tag


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    root = tmp_path_factory.mktemp("unique")
    built = {}
    for shape, (member, definition) in (("unique", UNIQUE), ("global", GLOBAL)):
        for module in ("dialect_a", "dialect_b"):
            path = root / shape / f"_{module}.so"
            built[shape, module] = cxx_shared(path, SOURCE % (member, definition), f"-Wl,-soname,_{module}.so")
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
    for shape in ("unique", "global"):
        linkage = read_linkage(built[shape, "dialect_b"], read_dynamic_info(built[shape, "dialect_b"]))
        assert NAME in linkage.exports and NAME in linkage.own_copies  # defined, and looked up
        assert (NAME in linkage.strong_data) is (shape == "global")


@pytest.mark.parametrize("shape", ["unique", "global"])
def test_a_shared_unique_object_is_clean_and_a_shared_global_one_crashes(modules, shape):
    root, built = modules
    a, b = built[shape, "dialect_a"], built[shape, "dialect_b"]
    verdicts = _verdicts(str(root / shape), a, b)
    for (first, second, mode), (static, sequence) in verdicts.items():
        real = load(sequence).verdict
        assert (static == "clean") is (real == "clean"), (shape, first, second, mode, static, real)
        if shape == "unique":
            assert real == "clean", (first, second, mode)
    if shape == "global":  # the first one loaded GLOBAL lends its copy to the second
        assert verdicts[a, b, "global-local"][0] == "crash" and verdicts[a, b, "local-local"][0] == "clean"
