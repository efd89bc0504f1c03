"""The progress line, as a person at a terminal sees it: every phase of a long command says what it
does and how far it is; the line fits the terminal, is redrawn at most 10 times a second and is
cleared before the report; none of it in a pipe, in CI, on a dumb terminal or with --quiet.

Real processes on a real pseudo-terminal. Over the small trees built here each phase lasts
milliseconds, so the tests that look for every phase label set ROCM_AUDIT_TEST_REDRAW_S=0 (every
call draws); the rate test keeps the real interval.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys

import pytest

from support.terminal import run_on_terminal

EVERY_CALL = {"ROCM_AUDIT_TEST_REDRAW_S": "0"}


def _labels(drawn: list[str], command: str) -> list[str]:
    """The phase of each drawn line (what comes before its counts), consecutive repeats once."""
    phases: list[str] = []
    for line in drawn:
        if not line:
            continue
        assert line.startswith(f"{command}: "), line
        label = line[len(command) + 2 :]
        label = label.rsplit(": ", 1)[0] if label.rsplit(": ", 1)[-1][:1].isdigit() else label
        if not phases or phases[-1] != label:
            phases.append(label)
    return phases


def _in_order(expected: list[str], phases: list[str]) -> None:
    at = 0
    for label in expected:
        found = [i for i in range(at, len(phases)) if phases[i].startswith(label)]
        assert found, f"phase {label!r} missing or out of order in {phases}"
        at = found[0]


def test_check_names_every_phase_with_its_counts_and_clears_the_line_before_the_report(sdk):
    done = run_on_terminal("check", "gfx942", "-p", str(sdk.site), env=EVERY_CALL)
    assert done.returncode in (0, 1), done.output
    drawn = done.drawn()
    phases = _labels(drawn, "check")
    _in_order(
        [
            "listing files",
            "scanning",
            "comparing 6 candidate groups",
            "reading GPU code and ELF facts",
            "judging GPU code objects",
            "LLVM: reading roles",
            "LLVM: following the load closures of",
            "post-build checks",
            "weighing device code for other GPUs",
        ],
        phases,
    )
    files = sum(
        1
        for folder, _, names in os.walk(sdk.site)
        for name in names
        if stat.S_ISREG(os.lstat(f"{folder}/{name}").st_mode)
    )
    # how far: the walk counts files and bytes (binary units), the comparison groups
    assert any(re.fullmatch(rf"check: scanning: {files}/{files} files, \d+\.\d (KiB|MiB)", line) for line in drawn)
    assert "check: comparing 6 candidate groups: 6/6" in "\n".join(drawn)
    assert any(line.startswith(f"check: reading GPU code and ELF facts: {files}/{files} files") for line in drawn)
    # cleared before the report is written: the report follows the clearing, whole
    assert drawn[-1] == ""
    report = done.report()
    assert report.startswith("paths relative to ") and re.search(r"\ncheck: 5 errors?, ", report)
    assert "\r" not in report.replace("\r\n", "\n")  # no progress drawn over the report


def test_dedup_names_every_phase_including_linking(sdk):
    done = run_on_terminal("dedup", "-p", str(sdk.site), env=EVERY_CALL)
    assert done.returncode == 0, done.output
    drawn = done.drawn()
    _in_order(
        ["listing files", "scanning", "comparing", "comparing and linking", "checking what each changed library"],
        _labels(drawn, "dedup"),
    )
    assert any(re.fullmatch(r"dedup: comparing and linking: 6/6 files, \d+\.\d (KiB|MiB)", line) for line in drawn)
    assert "6 files replaced by links" in done.report()


def test_llvm_says_which_pairs_it_judges(tmp_path):
    """Two copies of a real libLLVM (Debian's, as the llvm tests use) make a pair to judge."""
    library = _a_real_libllvm()
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        shutil.copy2(library, tmp_path / name / os.path.basename(library))
    done = run_on_terminal("llvm", "-p", str(tmp_path), env=EVERY_CALL)
    assert done.returncode in (0, 1), done.output
    phases = _labels(done.drawn(), "llvm")
    _in_order(["scanning", "LLVM: reading roles", "LLVM: reading linkage", "LLVM: judging 2 libraries"], phases)
    assert "llvm: LLVM: judging 2 libraries: 1/1 pairs" in done.drawn()


def _a_real_libllvm() -> str:
    import glob

    found = sorted(glob.glob("/usr/lib/llvm-*/lib/libLLVM*.so.1")) + sorted(
        glob.glob("/usr/lib/llvm-*/lib/libLLVM.so*")
    )
    found = [p for p in found if os.path.isfile(p)]
    if not found:
        pytest.skip("no Debian libLLVM shared library on this machine (package libllvm19)")
    return found[0]


def test_a_line_never_exceeds_the_terminal_width(sdk):
    done = run_on_terminal("check", "gfx942", "-p", str(sdk.site), env=EVERY_CALL, columns=30)
    drawn = [line for line in done.drawn() if line]
    assert drawn
    assert max(len(line) for line in drawn) <= 29  # one column short: no wrap at the last column
    assert any(line.startswith("check: reading GPU code and E") for line in drawn)  # cut, not dropped


def test_redrawn_at_most_ten_times_a_second(sdk):
    """The real interval: a run of some seconds over a few thousand files draws at most one line
    per 0.1 s (plus the clearing)."""
    tree = sdk.site / "_rocm_sdk_core" / "share" / "many"
    tree.mkdir(parents=True)
    for index in range(3000):
        (tree / f"f{index}.bin").write_bytes(index.to_bytes(4, "little") * 64)
    done = run_on_terminal("check", "gfx942", "-p", str(sdk.site))
    drawn = [line for line in done.drawn() if line]
    assert drawn, done.output
    assert len(drawn) <= done.elapsed_s / 0.1 + 1, (len(drawn), done.elapsed_s)


@pytest.mark.parametrize(
    ("why", "args", "env"),
    [
        ("--quiet", ["-q"], {}),
        ("CI=1", [], {"CI": "1"}),
        ("TERM=dumb", [], {"TERM": "dumb"}),
    ],
)
def test_no_progress_with_quiet_in_ci_or_on_a_dumb_terminal(sdk, why, args, env):
    done = run_on_terminal("check", "gfx942", "-p", str(sdk.site), *args, env={**EVERY_CALL, **env})
    assert done.returncode in (0, 1), done.output
    assert not done.drawn(), why
    assert "scanning" not in done.output


def test_no_progress_when_only_stderr_is_a_terminal(sdk):
    """`rocm-audit check > report.txt`: the report goes to a file; the terminal gets no progress."""
    done = run_on_terminal("check", "gfx942", "-p", str(sdk.site), env=EVERY_CALL, stdout_elsewhere=True)
    assert done.returncode in (0, 1), done.output
    assert not done.drawn() and "scanning" not in done.output


@pytest.mark.parametrize("command", [["check", "gfx942"], ["dedup", "--check"]])
def test_no_progress_when_stdout_or_stderr_is_not_a_terminal(sdk, command):
    env = {k: v for k, v in os.environ.items() if k != "CI"} | EVERY_CALL | {"TERM": "xterm"}
    piped = subprocess.run(
        [sys.executable, "-m", "rocm_audit", *command, "-p", str(sdk.site)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert piped.returncode in (0, 1), piped.stderr
    assert "\r" not in piped.stdout + piped.stderr and "scanning" not in piped.stderr


@pytest.mark.parametrize(
    ("args", "command", "expected"),
    [
        (
            ["verify-arch", "gfx942"],
            "verify-arch",
            ["scanning", "reading GPU code objects", "judging GPU code against 1"],
        ),
        (["scan", "--targets"], "scan", ["listing files", "scanning", "reading GPU code objects"]),
        (["prune", "gfx942", "--dry-run"], "prune", ["scanning", "reading GPU code objects", "weighing device code"]),
    ],
)
def test_verify_arch_scan_and_prune_name_their_phases(sdk, args, command, expected):
    done = run_on_terminal(*args, "-p", str(sdk.site), env=EVERY_CALL)
    assert done.returncode in (0, 1), done.output
    _in_order(expected, _labels(done.drawn(), command))
    files = sum(
        1
        for folder, _, names in os.walk(sdk.site)
        for name in names
        if stat.S_ISREG(os.lstat(f"{folder}/{name}").st_mode)
    )
    assert any(line.startswith(f"{command}: reading GPU code objects: {files}/{files} files") for line in done.drawn())
