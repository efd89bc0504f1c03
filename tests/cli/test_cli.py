"""The CLI contract shared by every command: entry points, exit codes, lazy imports, default paths."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from rocm_audit.cli import app as cli

HEAVY_MODULES = ("elftools", "lief", "msgpack", "zstandard", "docker", "jsonschema")


def run(*argv: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kwargs)


def test_python_dash_m_and_the_console_script_both_answer_help():
    by_module = run(sys.executable, "-m", "rocm_audit", "--help")
    assert by_module.returncode == 0 and "dedup" in by_module.stdout and "Exit codes" in by_module.stdout
    script = shutil.which("rocm-audit", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    assert script, "the rocm-audit console script is not installed"
    by_script = run(script, "dedup", "--help")
    assert by_script.returncode == 0 and "--dry-run" in by_script.stdout and "--revert" in by_script.stdout


def test_importing_the_cli_loads_no_heavy_module():
    probe = f"import sys, rocm_audit.cli.app\nprint(','.join(m for m in {HEAVY_MODULES!r} if m in sys.modules))"
    done = run(sys.executable, "-c", probe)
    assert done.returncode == 0 and done.stdout.strip() == ""


def test_usage_errors_exit_2_with_one_line_and_no_traceback(tmp_path):
    done = run(sys.executable, "-m", "rocm_audit", "dedup", "--check", "-p", str(tmp_path / "missing"))
    assert done.returncode == 2
    assert done.stderr.strip() == f"rocm-audit: error: path does not exist: {tmp_path / 'missing'}"
    unknown = run(sys.executable, "-m", "rocm_audit", "dedup", "--no-such-option")
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
    bad_choice = run(sys.executable, "-m", "rocm_audit", "dedup", "--format", "yaml")
    assert bad_choice.returncode == 2 and "Traceback" not in bad_choice.stderr


def test_internal_errors_exit_3_and_show_a_traceback_only_with_debug(monkeypatch, capsys, tmp_path):
    from rocm_audit.dedup import run as dedup

    def broken(*args, **kwargs):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(dedup, "run_dedup", broken)
    assert cli.main(["dedup", "-p", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: simulated bug" in err and "Traceback" not in err
    assert cli.main(["--debug", "dedup", "-p", str(tmp_path)]) == 3
    assert "Traceback" in capsys.readouterr().err


def test_version():
    done = run(sys.executable, "-m", "rocm_audit", "--version")
    from rocm_audit import __version__

    assert done.returncode == 0 and done.stdout.strip() == f"rocm-audit {__version__}"


def test_default_path_is_this_interpreters_site_packages_and_an_empty_result_says_where_it_looked():
    from rocm_audit.tree.discovery import default_site_packages

    looked = default_site_packages()
    assert looked and all(os.path.isdir(p) for p in looked)
    if any(name.startswith("_rocm_sdk_") for p in looked for name in os.listdir(p)):
        pytest.fail("this test needs an interpreter without the ROCm wheel SDK installed")
    done = run(sys.executable, "-m", "rocm_audit", "dedup", "--check")
    assert done.returncode == 0
    assert "no ROCm SDK tree (_rocm_sdk_*) found; looked in:" in " ".join(done.stdout.split())
    for path in looked:
        assert path in done.stdout


@pytest.mark.parametrize("fail_on,expected", [("error", 0), ("warning", 1), ("never", 0)])
def test_fail_on_sets_the_threshold(tmp_path, run_cli, fail_on, expected):
    # Two copies of an unreadable-as-ELF file give a SCAN002 warning (dedup must classify them
    # before it could link one to the other); nothing else is wrong.
    tree = tmp_path / "_rocm_sdk_core" / "lib"
    tree.mkdir(parents=True)
    for name in ("libtruncated.so.1", "libtruncated-copy.so.1"):
        (tree / name).write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 9)
    result = run_cli("dedup", "--check", "-p", str(tmp_path), "--fail-on", fail_on)
    assert result.exit_code == expected, result.output
    assert "SCAN002" in result.output


@pytest.mark.parametrize(
    "argv",
    [["dedup", "--help"], ["--debug", "verify-arch", "--help"], ["image"], ["dedup", "--bogus"], ["dedpu"], ["--help"]],
)
def test_main_answers_as_the_whole_command_group_does(argv, capsys, monkeypatch):
    """main() builds a group holding only the command being run; what the user sees and the exit
    code must be those of the group holding every command (the tests' CliRunner uses that one)."""
    from typer.testing import CliRunner

    # One help width for both: click wraps to min(COLUMNS, 80) - 2 columns; the runner takes it given.
    monkeypatch.setenv("COLUMNS", "80")
    whole = CliRunner().invoke(cli.app, argv, prog_name="rocm-audit", terminal_width=78)
    code = cli.main(argv)
    seen = capsys.readouterr()
    assert code == whole.exit_code
    assert seen.out + seen.err == whole.output


def test_the_console_script_flushes_the_whole_report_and_keeps_the_exit_code(sdk):
    """entry() leaves with os._exit (no interpreter teardown): the report must still arrive whole
    and the exit code must be main()'s."""
    script = shutil.which("rocm-audit", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    done = run(script, "dedup", "--check", "-p", str(sdk.site), "--format", "json")
    assert done.returncode == 1  # duplicates found
    assert len(json.loads(done.stdout)["dedup"]["groups"]) == 6
    assert run(script, "dedup", "--check", "-p", str(sdk.site / "missing")).returncode == 2


def test_main_leaves_the_garbage_collector_as_it_found_it():
    import gc

    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    assert cli.main(["--version"]) == 0
    assert gc.get_threshold() == thresholds and gc.get_freeze_count() == frozen


@pytest.mark.parametrize("command", ["verify-arch", "dedup", "llvm", "check", "scan"])
def test_a_wheel_given_as_a_path_is_a_usage_error_not_a_silent_pass(tmp_path, command):
    """A wheel is a zip: read as one file it has no ELF header, and every check would pass it with
    nothing read. rocm-audit says how to install or unpack it instead (exit 2)."""
    import zipfile

    wheel = tmp_path / "demo-1.0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("demo/libdemo.so", b"\x7fELF" + bytes(60))
    argv = [sys.executable, "-m", "rocm_audit", command]
    argv += (["gfx942"] if command in ("verify-arch", "check") else []) + ["-p", str(wheel)]
    done = run(*argv)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "is a zip archive" in done.stderr and "pip install --no-deps --target" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_summary_of_a_report_written_elsewhere_reads_at_100_columns(sdk, tmp_path):
    """With --format json -o FILE, one summary goes to stderr for the person watching the build: its
    counts in words (no "group(s)"), broken at spaces within 100 columns."""
    report = tmp_path / "report.json"
    command = ["check", "gfx942", "-p", str(sdk.site), "--format", "json", "-o", str(report)]
    done = run(sys.executable, "-m", "rocm_audit", *command)
    assert done.returncode == 1 and report.is_file()
    summary = done.stderr.splitlines()
    said = " ".join(line.strip() for line in summary)
    assert said.startswith("check: ") and "SDK duplicate groups" in said and "GPU code carrier" in said
    assert "(s)" not in said and "(es)" not in said
    assert len(summary) > 1 and all(len(line) <= 100 for line in summary), summary
    from rocm_audit.units import plural

    counted = json.loads(report.read_text())["summary"]["findings"]  # the last line: what the exit code follows
    errors, warnings = plural(counted["error"], "error"), plural(counted["warning"], "warning")
    assert summary[-1] == f"check: {errors}, {warnings}, {counted['info']} info"


def test_the_stderr_summary_of_a_run_with_every_check_left_out_has_no_empty_part(run_cli, sdk, tmp_path):
    skips = [a for check in ("dedup", "verify-arch", "llvm", "post-build", "prune") for a in ("--skip", check)]
    result = run_cli("check", "-p", str(sdk.site), *skips, "-o", str(tmp_path / "r.txt"), expect=0)
    first = result.stderr.splitlines()[0]
    assert first.startswith("check: ") and "; ;" not in first and first.endswith(" s"), first
