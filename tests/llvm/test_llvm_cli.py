"""`rocm-audit llvm` end to end through the CLI: JSON against the schema, exit codes, text."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.toolchain  # load probes of real LLVMs in child processes


def clash_set(report):
    return {
        (
            c["reason"],
            tuple(
                os.path.basename(os.path.dirname(os.path.dirname(p))) + "/" + os.path.basename(p) for p in c["paths"]
            ),
        )
        for c in report["clashes"]
    }


def rules(report):
    return sorted(f["rule"] for f in report["findings"])


def test_split_hardlink_of_libllvm_is_a_high_clash_with_a_dedup_fix(llvm_cli, dup_llvm15):
    result = llvm_cli("-p", str(dup_llvm15.root), "--format", "json", expect=1)
    report = result.report
    (clash,) = report["clashes"]
    assert clash["reason"] == "duplicate-exporter" and clash["severity"] == "high"
    assert clash["paths"] == sorted(str(p) for p in dup_llvm15.paths.values())
    assert clash["mode"] == "first-global" and clash["confirmed"] is None and clash["option"] is None
    assert clash["identical"] is True and "rocm-audit dedup" in clash["fix"]
    assert str(dup_llvm15.paths["core"]) in clash["fix"].split("keeps ")[1]  # the runtime copy is kept
    assert clash["predictions"] == {
        "global-global": "abort",
        "global-local": "abort",
        "local-local": "clean",
    }
    libraries = {lib["path"]: lib for lib in report["libraries"]}
    for path in dup_llvm15.paths.values():
        lib = libraries[str(path)]
        assert (lib["role"], lib["soname"], lib["version_node"], lib["in_scan"]) == (
            "exporter",
            "libLLVM-15.so.1",
            "LLVM_15",
            True,
        )
    assert rules(report) == ["LLVM001"]
    assert report["findings"][0]["severity"] == "error"


def test_probe_confirms_the_split_hardlink_and_names_the_option(llvm_cli, dup_llvm15):
    report = llvm_cli("-p", str(dup_llvm15.root), "--probe", "--format", "json", expect=1).report
    (clash,) = report["clashes"]
    assert clash["confirmed"] is True and clash["option"] == "use-dbg-addr"
    outcomes = {p["mode"]: (p["outcome"], p["agrees"]) for p in clash["probes"]}
    assert outcomes == {
        "global-global": ("confirmed", True),
        "global-local": ("confirmed", True),
        "local-local": ("clean", True),
    }
    assert rules(report) == ["LLVM001", "LLVM005"]


def test_duplicated_registrant_fires_in_any_mode_and_lists_the_llvm_it_binds(llvm_cli, dup_clang_cpp):
    report = llvm_cli("-p", str(dup_clang_cpp.root), "--probe", "--format", "json", expect=1).report
    (clash,) = report["clashes"]
    assert (clash["reason"], clash["mode"], clash["confirmed"]) == (
        "duplicate-registrant",
        "any",
        True,
    )
    assert all(p["outcome"] == "confirmed" and p["agrees"] for p in clash["probes"])
    # The system libLLVM-15 both copies bind to: reached through their closures, outside the scan.
    outside = [lib for lib in report["libraries"] if not lib["in_scan"]]
    assert [(lib["role"], lib["soname"]) for lib in outside] == [("exporter", "libLLVM-15.so.1")]


@pytest.mark.parametrize("scenario", ["llvm15_and_16", "llvmlite_twice", "same_inode"])
def test_no_clash_cases_exit_zero(llvm_cli, request, scenario):
    tree = request.getfixturevalue(scenario)
    report = llvm_cli("-p", str(tree.root), "--probe", "--format", "json", expect=0).report
    assert report["clashes"] == []
    roles = sorted({lib["role"] for lib in report["libraries"] if lib["in_scan"]})
    if scenario == "llvmlite_twice":
        assert roles == ["private-copy"] and rules(report) == ["LLVM011", "LLVM011"]
    elif scenario == "same_inode":
        (finding,) = report["findings"]
        assert finding["rule"] == "LLVM010" and finding["severity"] == "info"
        assert [finding["path"], *finding["related_paths"]] == [
            str(tree.paths[k]) for k in ("core", "hardlink", "symlink")
        ]
    else:
        assert roles == ["exporter"] and rules(report) == []


def test_runpath_closures_are_found_and_probed(llvm_cli, runpath_closures):
    paths = runpath_closures.paths
    report = llvm_cli("-p", str(runpath_closures.root), "--probe", "--format", "json", expect=1).report
    by_reason = {c["reason"]: c for c in report["clashes"]}
    assert set(by_reason) == {"duplicate-exporter", "closure-interposition", "closure-two-llvms"}
    interposition = by_reason["closure-interposition"]
    assert interposition["paths"] == [str(paths["v15"]), str(paths["bis"])]
    assert interposition["via"] == [str(paths["copies"])] and interposition["severity"] == "high"
    # Issue 16: the model judges the root's own dlopen, and the probe decided.
    assert (interposition["verdict"], interposition["decided_by"]) == ("abort", "probe")
    assert (interposition["mode"], interposition["confirmed"], interposition["option"]) == (
        "any",
        True,
        "use-dbg-addr",
    )
    two = by_reason["closure-two-llvms"]
    assert two["paths"] == [str(paths["v15"]), str(paths["v16"])] and two["via"] == [str(paths["two"])]
    assert (two["severity"], two["mode"], two["confirmed"]) == ("medium", "none", False)
    assert all(p["agrees"] for c in report["clashes"] for p in c["probes"])
    assert "LLVM007" not in rules(report)


def test_closure_on_request(llvm_cli, runpath_closures):
    two = str(runpath_closures.paths["two"])
    report = llvm_cli("-p", two, "--closure", two, "--format", "json", expect=0).report
    (closure,) = report["closures"]
    assert closure["root"] == two and closure["missing"] == []
    head = [(o["path"], o["via"], o["depth"], o["role"]) for o in closure["objects"][:3]]
    assert head == [
        (two, "dlopen", 0, "none"),
        (str(runpath_closures.paths["v15"]), "runpath", 1, "exporter"),
        (str(runpath_closures.paths["v16"]), "runpath", 1, "exporter"),
    ]
    text = " ".join(llvm_cli("-p", two, "--closure", two, expect=0).output.split())
    assert f"Closure of {two}" in text and "(runpath: libLLVM-16.so.1) [exporter]" in text
    # The two LLVMs lie outside the scanned file; its closure still finds them.
    assert "one load closure maps two different LLVMs" in text


def test_exporters_that_bind_each_other_are_an_error_when_some_order_fails(llvm_cli, fake_llvms):
    # Issue 16: severity follows the truth. Each pair that binds aborts in some order (the model
    # says so statically), so LLVM002 is an error before any probe; a probe then decides.
    static = llvm_cli("-p", str(fake_llvms.root), "--format", "json", expect=1).report
    assert {f["severity"] for f in static["findings"] if f["rule"] == "LLVM002"} == {"error"}
    assert all(c["decided_by"] == "static" and c["verdict"] == "abort" for c in static["clashes"])
    report = llvm_cli("-p", str(fake_llvms.root), "--probe", "--format", "json", expect=1).report
    assert all(c["decided_by"] == "probe" for c in report["clashes"])
    pairs = {
        tuple(os.path.basename(os.path.dirname(p)) for p in c["paths"])
        for c in report["clashes"]
        if c["reason"] == "interposable-exporters"
    }
    assert ("plain-a", "plain-b") in pairs and ("node1-a", "node1-b") in pairs
    assert not {("node1-a", "node2"), ("node2", "node1-a"), ("plain-a", "symbolic")} & pairs
    assert ("symbolic", "plain-a") in pairs  # the -Bsymbolic one must come first to be bound to
    clashes = [c for c in report["clashes"] if c["reason"] == "interposable-exporters"]
    assert all(c["severity"] == "high" and c["mode"] == "first-global" and c["confirmed"] for c in clashes)
    assert "LLVM007" not in rules(report) and "LLVM005" in rules(report)


def test_a_contradicted_prediction_is_reported(fake_llvms):
    from rocm_audit.llvm.clashes import Clash, Expect, LlvmOptions, Reason, Risk, probe_clashes

    wrong = Clash(
        reason=Reason.INTERPOSABLE_EXPORTERS,
        risk=Risk.MEDIUM,
        paths=(str(fake_llvms.paths["node1-a"]), str(fake_llvms.paths["node2"])),
        predictions={"global-global": Expect.ABORT},
        fix="",
    )
    findings = probe_clashes([wrong], LlvmOptions())
    assert [(f.rule, f.data["predicted"], f.data["observed"]) for f in findings] == [("LLVM007", "abort", "clean")]


def test_usage_errors_exit_2(llvm_cli, dup_llvm15, tmp_path):
    missing = llvm_cli("-p", str(dup_llvm15.root), "--closure", str(tmp_path / "nope.so"), expect=2)
    assert "not a file" in missing.output
    sysroot = llvm_cli("-p", str(dup_llvm15.root), "--probe", "--sysroot", str(tmp_path), expect=2)
    assert "--sysroot" in sysroot.output


def test_report_file_is_written_and_summary_goes_to_stderr(llvm_cli, dup_llvm15, tmp_path, report_validator):
    import json

    target = tmp_path / "report.json"
    result = llvm_cli("-p", str(dup_llvm15.root), "--format", "json", "-o", str(target), expect=1)
    report_validator.validate(json.loads(target.read_text()))
    assert "llvm: 2 libraries carry LLVM; 1 clash that can abort or crash a process" in result.output
    assert "llvm: 1 error, 0 warnings, 0 info" in result.output  # the count the exit code follows


def test_help_and_import_stay_light():
    code = (
        "import sys, rocm_audit.cli.app, rocm_audit.cli.commands.llvm; "
        "heavy = ('elftools', 'rocm_audit.llvm.roles', 'rocm_audit.llvm.probes'); "
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
    from typer.testing import CliRunner

    from rocm_audit.cli.app import app

    text = CliRunner().invoke(app, ["llvm", "--help"]).output
    for option in (
        "--probe",
        "--probe-timeout",
        "--preload",
        "--closure",
        "--sysroot",
        "--ld-library-path",
    ):
        assert option in text


def test_rocm_sdk_preloads_make_a_split_comgr_clash_in_any_mode(llvm_cli, fake_comgr_split):
    """rocm-sdk test preloads core comgr RTLD_GLOBAL, then loads every library: a devel copy
    with its own inode then clashes even when loaded RTLD_LOCAL (formats.md 1.5)."""
    core, devel = str(fake_comgr_split.paths["core"]), str(fake_comgr_split.paths["devel"])
    plain = llvm_cli("-p", str(fake_comgr_split.root), "--probe", "--format", "json", expect=1)
    (clash,) = plain.report["clashes"]
    assert clash["mode"] == "first-global"
    assert {p["mode"]: p["outcome"] for p in clash["probes"]}["local-local"] == "clean"
    preloaded = llvm_cli(
        "-p",
        str(fake_comgr_split.root),
        "--probe",
        "--preload-rocm-sdk",
        "--format",
        "json",
        expect=1,
    ).report
    (clash,) = preloaded["clashes"]
    assert clash["paths"] == [core, devel] and clash["mode"] == "any"
    assert all(p["outcome"] == "confirmed" and p["agrees"] and p["preload"] == [core] for p in clash["probes"])
    assert clash["option"] == "fake-opt"


def test_preload_rocm_sdk_needs_a_core_tree(llvm_cli, dup_clang_cpp):
    result = llvm_cli("-p", str(dup_clang_cpp.root), "--preload-rocm-sdk", expect=2)
    assert "_rocm_sdk_core" in result.output


def test_an_executable_closure_is_found_but_never_dlopened(llvm_cli, llvm15_copies, tmp_path):
    """An executable's own closure counts; glibc refuses to dlopen a PIE, so the probe says
    load-error (inconclusive, LLVM008) rather than pretending to have loaded it."""
    from support.llvm.llvm_builders import place, stub

    lib = tmp_path / "lib"
    v15 = place(llvm15_copies[0], lib / "libLLVM-15.so.1")
    bis = place(llvm15_copies[1], lib / "libLLVM-15-bis.so.1")
    stubs = [stub(tmp_path / "stubs", name) for name in ("libLLVM-15.so.1", "libLLVM-15-bis.so.1")]
    app = tmp_path / "bin" / "app"
    app.parent.mkdir()
    (tmp_path / "app.c").write_text("int main(void) { return 0; }\n")
    subprocess.run(
        [
            "gcc",
            "-o",
            str(app),
            str(tmp_path / "app.c"),
            "-Wl,--no-as-needed",
            *map(str, stubs),
            "-Wl,--enable-new-dtags,-rpath,$ORIGIN/../lib",
        ],
        check=True,
        timeout=120,
    )
    (tmp_path / "app.c").unlink()
    for one in stubs:
        one.unlink()
    report = llvm_cli("-p", str(tmp_path), "--probe", "--format", "json", expect=1).report
    closure = next(c for c in report["clashes"] if c["reason"] == "closure-interposition")
    assert closure["paths"] == [str(v15), str(bis)] and closure["via"] == [str(app)]
    assert {p["outcome"] for p in closure["probes"]} == {"load-error"}
    assert closure["confirmed"] is None
    assert "LLVM008" in rules(report)


def test_probe_says_when_nothing_needed_a_probe(run_cli, sdk):
    """--probe on a tree without LLVM clashes runs no probe, and the text does not say it ran one."""
    result = run_cli("llvm", "--probe", "-p", str(sdk.site), expect=0)
    said = " ".join(result.stdout.split())
    assert "No probe was needed: nothing to confirm. Probes would run under" in said
    assert "Probes ran under" not in said


def test_check_counts_clashes_alike_in_its_text_and_its_stderr_summary(run_cli, fake_llvms, tmp_path):
    from rocm_audit.llvm.counts import clash_counts
    from rocm_audit.units import plural

    root = str(fake_llvms.root)
    report = run_cli("check", "gfx942", "-p", root, "--format", "json").report
    harmful, harmless = clash_counts(report["clashes"])
    assert harmful == sum(1 for c in report["clashes"] if c["severity"] != "info") > 1
    text = " ".join(run_cli("check", "gfx942", "-p", root).stdout.split())
    assert f"{plural(harmful, 'clash', 'clashes')} that can abort or crash a process" in text
    stderr = " ".join(run_cli("check", "gfx942", "-p", root, "-o", str(tmp_path / "r.txt")).stderr.split())
    assert f"{harmful} LLVM clashes that can abort or crash" + (f", {harmless} harmless" if harmless else ";") in stderr
