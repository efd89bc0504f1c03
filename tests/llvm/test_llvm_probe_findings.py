"""One crash, one finding: LLVM015 names the load that failed, not the pair a probe was run for.

Every pair that needs a plugin's host loads that host first; when the host's load is what crashes,
the probes of every such pair saw the same failure, before any plugin was loaded.
"""

from __future__ import annotations

from rocm_audit.llvm.probes import ProbeOutcome, ProbeResult, ProbeVerdict
from rocm_audit.llvm.probing import loading_failure, one_per_failing_load

LLVM, HOST = "/site/rocm/llvm/librocmllvm.so", "/site/triton/_C/libtriton.so"
PLUGIN, COPY = "/site/triton/plugins/libplugin.so", "/site/triton/plugins/libplugin.so.23"


def _crash(mode: str, steps: tuple[str, ...], step: str, verdict: ProbeVerdict = ProbeVerdict.CRASH) -> ProbeResult:
    signal = "SIGSEGV" if verdict is ProbeVerdict.CRASH else None
    return ProbeResult(mode, ProbeOutcome.INCONCLUSIVE, None, -11, "", "", None, 0.0, (), steps, verdict, signal, step)


def test_a_crash_before_the_partner_is_loaded_is_one_finding_about_what_was_loaded():
    probes = [
        _crash("global-global", (f"global:{LLVM}", f"global:{HOST}"), f"global:{HOST}"),
        _crash("global-global", (f"global:{LLVM}", f"global:{HOST}", f"global:{PLUGIN}"), f"global:{HOST}"),
        _crash("global-local", (f"global:{LLVM}", f"global:{HOST}", f"local:{COPY}"), f"global:{HOST}"),
        _crash("global-local", (f"global:{LLVM}", f"local:{HOST}"), f"local:{HOST}"),  # another load
        _crash("global-local", (f"global:{LLVM}", f"local:{HOST}"), f"local:{HOST}", ProbeVerdict.HANG),
    ]
    found = one_per_failing_load([loading_failure(p) for p in probes])
    assert [(f.rule, f.path, f.related_paths, f.message) for f in found] == [
        (
            "LLVM015",
            LLVM,
            (HOST,),
            "a probe loading librocmllvm.so (RTLD_GLOBAL), then libtriton.so (RTLD_GLOBAL) was killed by "
            "SIGSEGV while loading libtriton.so",
        ),
        (
            "LLVM015",
            LLVM,
            (HOST,),
            "a probe loading librocmllvm.so (RTLD_GLOBAL), then libtriton.so (RTLD_LOCAL) was killed by "
            "SIGSEGV while loading libtriton.so",
        ),
        (
            "LLVM015",
            LLVM,
            (HOST,),
            "a probe loading librocmllvm.so (RTLD_GLOBAL), then libtriton.so (RTLD_LOCAL) hung while loading "
            "libtriton.so",
        ),
    ]
    assert found[0].data["loads"] == [f"global:{LLVM}", f"global:{HOST}"]


def test_a_crash_in_the_partner_names_it():
    (found,) = one_per_failing_load(
        [loading_failure(_crash("local-local", (f"global:{HOST}", f"local:{PLUGIN}"), f"local:{PLUGIN}"))]
    )
    assert (found.path, found.related_paths) == (HOST, (PLUGIN,))
    assert found.message.endswith("while loading libplugin.so")
