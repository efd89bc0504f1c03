"""A clash that needs a test or instrumentation library nothing loads is a warning that says which."""

from __future__ import annotations

from rocm_audit.findings import Severity, make_finding
from rocm_audit.llvm.optin import soften_opt_in

SP = "/venv/lib/python3.12/site-packages/triton"
TEST_LIB, PLUGIN_TEST_LIB = (
    f"{SP}/instrumentation/libGPUInstrumentationTestLib.so",
    f"{SP}/plugins/libTritonPluginsTestLib.so",
)
MAIN = f"{SP}/_C/libtriton.so"


def _clash(*paths: str):
    return make_finding("LLVM012", paths[0], "the process aborts", related=paths[1:], severity=Severity.ERROR)


def test_one_opt_in_library_in_the_clash():
    (softened,) = soften_opt_in([_clash(TEST_LIB, MAIN)], {TEST_LIB})
    assert softened.severity is Severity.WARNING
    assert softened.message == (
        "the process aborts (only if libGPUInstrumentationTestLib.so is loaded: a test or instrumentation"
        " library that nothing here loads)"
    )
    assert softened.data["opt_in_library"] == [TEST_LIB]


def test_two_opt_in_libraries_are_both_needed_and_named_so():
    (softened,) = soften_opt_in([_clash(TEST_LIB, MAIN, PLUGIN_TEST_LIB)], {TEST_LIB, PLUGIN_TEST_LIB})
    assert softened.severity is Severity.WARNING
    assert softened.message.endswith(
        "(only if libGPUInstrumentationTestLib.so and libTritonPluginsTestLib.so are loaded: test or"
        " instrumentation libraries that nothing here loads)"
    )


def test_a_clash_of_libraries_something_loads_stays_an_error():
    finding = _clash(MAIN, f"{SP}/plugins/libMLIRDialectPlugin.so")
    assert soften_opt_in([finding], {TEST_LIB}) == [finding]
