"""The probe sandbox: timeouts kill the whole group, output stays bounded, outcomes classified."""

from __future__ import annotations

import time

import pytest

from rocm_audit.llvm.probes import (
    OUTPUT_LIMIT_BYTES,
    LoadStep,
    ProbeOutcome,
    classify,
    extract_option,
    probe_pair,
    run_probe,
)
from support.llvm.llvm_builders import cc_shared


def load_one(path, **options):
    return run_probe("local", [LoadStep(str(path), False)], **options)


def _gone(pid: int) -> bool:
    """True once pid has exited (a zombie waiting for a reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_timeout_is_inconclusive_and_kills_the_whole_process_group(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    hang = cc_shared(
        tmp_path / "libhang.so",
        f"""
        #include <stdio.h>
        #include <unistd.h>
        __attribute__((constructor)) static void hang(void) {{
            if (fork() == 0) {{
                FILE *out = fopen("{pid_file}", "w");
                fprintf(out, "%d", getpid());
                fclose(out);
            }}
            sleep(120);
        }}
    """,
    )
    started = time.monotonic()
    result = load_one(hang, timeout_s=1.5)
    assert time.monotonic() - started < 20
    assert result.outcome is ProbeOutcome.INCONCLUSIVE and result.returncode is None
    assert "timed out" in result.detail
    # Issue 16: a timeout is a hang, as conclusive as an abort, with the step it hung in.
    assert result.verdict.value == "hang" and result.step == f"local:{hang}"
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while not _gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(grandchild), "the forked grandchild survived the probe's timeout"


def test_output_is_bounded_and_cannot_hide_the_result(tmp_path):
    noisy = cc_shared(
        tmp_path / "libnoisy.so",
        """
        #include <stdio.h>
        #include <string.h>
        __attribute__((constructor)) static void noise(void) {
            char line[1024];
            memset(line, 'x', sizeof line - 2);
            line[sizeof line - 2] = '\\n';
            line[sizeof line - 1] = 0;
            for (int i = 0; i < 4096; i++) { fputs(line, stdout); fputs(line, stderr); }
            fputs("all loaded\\n", stdout);
        }
    """,
    )
    result = load_one(noisy)
    assert result.outcome is ProbeOutcome.CLEAN and result.returncode == 0
    assert f"output cut at {OUTPUT_LIMIT_BYTES} bytes" in result.detail
    assert len(result.stderr_tail) <= 2000


def test_crash_at_exit_is_told_apart_from_a_clean_load(tmp_path):
    crash = cc_shared(
        tmp_path / "libcrash.so",
        """
        #include <signal.h>
        #include <stdlib.h>
        static void die(void) { raise(SIGSEGV); }
        __attribute__((constructor)) static void arm(void) { atexit(die); }
    """,
    )
    result = load_one(crash)
    assert result.outcome is ProbeOutcome.CRASH_AT_EXIT and result.returncode == -11
    assert "SIGSEGV" in result.detail and result.instances == 1


def test_a_missing_dependency_is_a_load_error_not_a_pass(tmp_path):
    result = probe_pair(str(tmp_path / "absent-a.so"), str(tmp_path / "absent-b.so"), "global-global")
    assert result.outcome is ProbeOutcome.LOAD_ERROR and "absent-a.so" in result.detail


def test_the_child_inherits_nothing_from_our_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCM_AUDIT_PROBE_CANARY", "leaked")
    monkeypatch.setenv("LD_PRELOAD", str(tmp_path / "nothing.so"))
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    spy = cc_shared(
        tmp_path / "libspy.so",
        """
        #include <stdio.h>
        #include <stdlib.h>
        static const char *show(const char *v) { return v ? v : "unset"; }
        __attribute__((constructor)) static void spy(void) {
            fprintf(stderr, "canary=%s preload=%s ld=%s\\n",
                    show(getenv("ROCM_AUDIT_PROBE_CANARY")),
                    show(getenv("LD_PRELOAD")), show(getenv("LD_LIBRARY_PATH")));
        }
    """,
    )
    assert "canary=unset preload=unset ld=unset" in load_one(spy).stderr_tail
    modelled = load_one(spy, ld_library_path=["/opt/x"])
    assert "ld=/opt/x" in modelled.stderr_tail


def test_preloads_are_loaded_globally_first(tmp_path):
    provider = cc_shared(tmp_path / "libprovider.so", "int provided(void) { return 42; }\n")
    # Linked without the provider: only a global preload lets its constructor resolve provided().
    user = cc_shared(
        tmp_path / "libuser.so",
        """
        #include <stdio.h>
        int provided(void);
        __attribute__((constructor)) static void use(void) {
            fprintf(stderr, "value=%d\\n", provided());
        }
    """,
    )
    assert load_one(user).outcome is ProbeOutcome.LOAD_ERROR
    preloaded = load_one(user, preload=[str(provider)])
    assert preloaded.outcome is ProbeOutcome.CLEAN and "value=42" in preloaded.stderr_tail


@pytest.mark.parametrize(
    ("returncode", "status", "stderr", "outcome", "option"),
    [
        (
            -6,
            "",
            ": CommandLine Error: Option 'use-dbg-addr' registered more than once!\n"
            "LLVM ERROR: inconsistency in registered CommandLine options\n",
            ProbeOutcome.CONFIRMED,
            "use-dbg-addr",
        ),
        (
            -6,
            "",
            "mesa: CommandLine Error: Option 'help-list' registered more than once!\n",
            ProbeOutcome.CONFIRMED,
            "help-list",
        ),
        (-6, "", "opt: Option 'O3' already exists!\n", ProbeOutcome.CONFIRMED, "O3"),
        (
            1,
            "",
            "LLVM ERROR: inconsistency in registered CommandLine options\n",
            ProbeOutcome.CONFIRMED,
            None,
        ),
        (0, "mapped 08:01 12\nall loaded\n", "", ProbeOutcome.CLEAN, None),
        (0, "", "", ProbeOutcome.INCONCLUSIVE, None),  # exited before reporting: never a pass
        (-11, "all loaded\n", "", ProbeOutcome.CRASH_AT_EXIT, None),
        (-11, "", "", ProbeOutcome.INCONCLUSIVE, None),
        (
            97,
            "load error: libx.so: cannot open shared object file\n",
            "",
            ProbeOutcome.LOAD_ERROR,
            None,
        ),
        (None, "", "", ProbeOutcome.INCONCLUSIVE, None),
    ],
)
def test_classification(returncode, status, stderr, outcome, option):
    got, got_option, detail = classify(returncode, status, stderr, 5.0)
    assert (got, got_option) == (outcome, option) and detail


def test_option_extraction_ignores_unrelated_text():
    assert extract_option("warning: Option 'x' is deprecated\n") is None
    assert extract_option(": CommandLine Error: Option 'a-b.c' registered more than once!") == "a-b.c"


def test_probes_never_load_in_our_process(dup_llvm15):
    probe_pair(str(dup_llvm15.paths["core"]), str(dup_llvm15.paths["devel"]), "local-local")
    with open("/proc/self/maps") as maps:
        assert "libLLVM-15" not in maps.read()
