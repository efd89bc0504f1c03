"""No line of any command's text output can begin with text a file name chose.

Hostile names (newline, carriage return, ANSI escape, non-UTF-8 bytes) are put where every command
prints names: a byte-identical devel library (dedup, check), a device code object (verify-arch,
scan --targets), an LLVM library (llvm), an image layer (image), a rules file (rules). Each command's
text, GitHub and JUnit output is then split into lines as a terminal or a CI log would split it.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from support.image.layer_writers import docker_save, layer
from support.sdk_tree import build_library
from support.toolchain import gfx942_code_object

FORGED = "ok      forged-line  [raw-elf]  gfx950 native"
HOSTILE_TAILS = [
    f"\n{FORGED}",  # a new line in a CI log
    f"\r{FORGED}",  # a terminal returns to the start of the line
    f"\x1b[2K\r{FORGED}",  # erase the line, then write over it
    f"\u2028{FORGED}",  # a line separator some log viewers break on
]
UNDECODABLE = os.fsdecode(b"bad-\xff\xfe-name")


def _hostile(stem: str, suffix: str) -> list[str]:
    return [f"{stem}{n}{tail}{suffix}" for n, tail in enumerate(HOSTILE_TAILS)] + [f"{stem}-{UNDECODABLE}{suffix}"]


def _forged_lines(raw: bytes) -> list[str]:
    """Lines (as a terminal, a log, or a viewer would split them) that start with the forged text."""
    text = raw.decode("utf-8", "replace")
    pieces = []
    for line in text.replace("\r", "\n").replace("\u2028", "\n").split("\n"):
        pieces.append(line)
        pieces.extend(line.split("\x1b[2K"))
    return [p for p in pieces if p.lstrip().startswith(FORGED) or p.lstrip("-: ").startswith("ok ")]


@pytest.fixture(scope="module")
def hostile_site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("hostile") / "site-packages"
    core_lib = site / "_rocm_sdk_core" / "lib"
    library = build_library(core_lib, "comgr", "libamd_comgr.so.3", payload=os.urandom(20_000))
    devel_lib = site / "_rocm_sdk_devel" / "lib"
    devel_lib.mkdir(parents=True)
    for name in _hostile("libamd_comgr", ".so.3"):
        shutil.copy2(library, os.fsencode(devel_lib) + b"/" + os.fsencode(name))
    code = gfx942_code_object(site / "_rocm_sdk_libraries" / "lib")
    for name in _hostile("kernels", ".hsaco"):
        shutil.copy2(code, os.fsencode(code.parent) + b"/" + os.fsencode(name))
    return site


@pytest.fixture(scope="module")
def hostile_llvm(tmp_path_factory) -> Path:
    """A real LLVM exporter (Debian libLLVM-15) under hostile names, hardlinked (no copy of 100 MB)."""
    real = Path("/usr/lib/llvm-15/lib/libLLVM-15.so")
    assert real.exists(), "libllvm15 is installed by scripts/test (tests/apt-packages.txt)"
    directory = tmp_path_factory.mktemp("hostile-llvm")
    for name in _hostile("libLLVM", ".so.15"):
        target = os.fsencode(directory) + b"/" + os.fsencode(name)
        try:
            os.link(real.resolve(), target)
        except OSError:  # another filesystem
            shutil.copy2(real.resolve(), target)
    return directory


def _assert_contract(result, expect_escaped: bool = True) -> None:
    raw = result.stdout_bytes
    assert not _forged_lines(raw), raw.decode("utf-8", "replace")
    assert b"\x1b" not in raw and b"\r" not in raw, "raw control characters reached the output"
    if expect_escaped:  # the names were printed at all, escaped
        assert b"\\nok      forged-line" in raw and b"\\x1b[2K\\rok" in raw and b"\\xff\\xfe" in raw


@pytest.mark.parametrize("fmt", ["text", "github", "junit", "markdown"])
@pytest.mark.parametrize(
    "argv",
    [
        ["dedup", "--dry-run"],
        ["dedup", "--check"],
        ["verify-arch", "gfx950"],
        ["scan", "--targets"],
        ["check", "gfx950"],
    ],
    ids=lambda a: " ".join(a),
)
def test_no_command_prints_a_line_a_file_name_chose(run_cli, hostile_site, argv, fmt):
    # Text groups the findings of one cause and lists every file of a group with -v.
    verbose = ["-v"] if fmt == "text" else []
    result = run_cli(*argv, "-p", str(hostile_site), "--format", fmt, *verbose)
    assert result.exit_code in (0, 1), result.output
    if verbose:  # the default text holds no forged line either
        assert not _forged_lines(run_cli(*argv, "-p", str(hostile_site), "--format", fmt).stdout_bytes)
    # GitHub and JUnit output carry findings only; a dry run and a listing have none to carry.
    # Markdown escapes display()'s backslashes once more (tests/output/test_readable_reports.py).
    expect_escaped = fmt == "text" or (fmt != "markdown" and argv[-1] not in ("--dry-run", "--targets"))
    _assert_contract(result, expect_escaped=expect_escaped)
    if fmt == "markdown" and argv[-1] not in ("--dry-run", "--targets"):
        assert b"\\\\nok      forged" in result.stdout_bytes


@pytest.mark.parametrize("fmt", ["text", "github", "markdown"])
def test_llvm_output_escapes_library_names(run_cli, hostile_llvm, fmt):
    result = run_cli("llvm", "-p", str(hostile_llvm), "--format", fmt)
    assert result.exit_code in (0, 1), result.output
    _assert_contract(result, expect_escaped=fmt != "markdown")


def test_image_output_escapes_layer_paths(run_cli, tmp_path, hostile_site):
    site = "usr/lib/python3/dist-packages"
    comgr = (hostile_site / "_rocm_sdk_core" / "lib" / "libamd_comgr.so.3").read_bytes()
    directories = ["", "_rocm_sdk_core/", "_rocm_sdk_core/lib/", "_rocm_sdk_devel/", "_rocm_sdk_devel/lib/"]
    entries: list[tuple[str, bytes | None]] = [(f"{site}/{d}", None) for d in directories]
    entries.append((f"{site}/_rocm_sdk_core/lib/libamd_comgr.so.3", comgr))
    entries += [(f"{site}/_rocm_sdk_devel/lib/{name}", comgr) for name in _hostile("libamd_comgr", ".so.3")[:4]]
    archive = docker_save(tmp_path / "image.tar", [layer(*entries)])
    result = run_cli("image", "--archive", str(archive), "--target", "gfx942")
    assert result.exit_code in (0, 1), result.output
    raw = result.stdout_bytes
    assert not _forged_lines(raw), raw.decode("utf-8", "replace")
    assert b"\x1b" not in raw and b"\r" not in raw
    assert b"\\nok      forged-line" in raw


def test_rules_output_escapes_policy_text(run_cli, tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text(
        '[[ignore]]\nrule = "DUP002"\npath = "*/x\\nok      forged-line  [raw-elf]  gfx950 native*"\n'
        'reason = "because\\rok      forged-line  [raw-elf]  gfx950 native"\n'
    )
    result = run_cli("rules", "--rules", str(rules))
    assert result.exit_code == 0, result.output
    raw = result.stdout_bytes
    assert not _forged_lines(raw), raw.decode("utf-8", "replace")
    assert b"\\nok      forged-line" in raw and b"\\rok      forged-line" in raw


def test_stderr_summaries_and_errors_escape_names(hostile_site, tmp_path):
    """The one-line summary (JSON to stdout, summary to stderr) and error messages name paths too."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    summary = subprocess.run(
        [sys.executable, "-m", "rocm_audit", "dedup", "--check", "--format", "json", "-p", str(hostile_site)],
        capture_output=True,
        timeout=120,
        env=env,
    )
    assert summary.returncode == 1 and b"dedup (check)" in summary.stderr
    missing = os.fsencode(tmp_path) + b"/" + os.fsencode(_hostile("image", ".tar")[0])
    error = subprocess.run(
        [sys.executable, "-m", "rocm_audit", "image", "--archive", missing], capture_output=True, timeout=120, env=env
    )
    assert error.returncode == 2 and b"\\nok      forged-line" in error.stderr
    for raw in (summary.stderr, error.stderr):
        assert not _forged_lines(raw), raw


def test_a_number_and_its_unit_stay_on_one_line():
    from rocm_audit.output.layout import wrap

    said = "dedup (dry-run): 2 groups, 2 files to be replaced by links, 16.0 KiB to free, 4 files scanned in 0.01 s"
    for width in range(40, 101):
        lines = wrap(said, width=width)
        assert " ".join(" ".join(lines).split()) == said
        for line, below in zip(lines, lines[1:], strict=False):
            assert not (line.split()[-1][0].isdigit() and below.split()[0] in ("s", "KiB")), (width, lines)


def test_a_command_in_a_message_keeps_its_absolute_paths_while_the_rest_is_relative():
    """Paths under the audited root are shown relative to it, but not inside a backticked command:
    it is pasted from wherever the reader stands (a revert line read `.rocm-audit/...`)."""
    from rocm_audit.output.layout import PathView

    root = "/tmp/env/lib/python3.11/site-packages"
    view = PathView([root])
    said = f"{root}/a.so kept gfx942: `rocm-audit prune --revert {root}/.rocm-audit/m.jsonl` puts it back; {root}/b"
    assert view.relative_text(said) == (
        f"a.so kept gfx942: `rocm-audit prune --revert {root}/.rocm-audit/m.jsonl` puts it back; b"
    )
    assert view.relative_text(f"no command: {root}/c") == "no command: c"
