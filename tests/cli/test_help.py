"""First contact: what `--help`, `rocm-audit explain RULE` and `-v` give a person meeting the tool.

Every command's help has a summary the command list shows whole, examples that parse, its options in
panels and no exit-code footer (the table is in `rocm-audit --help` once); `explain` covers every
rule of the shipped catalogue; `-v` after any reporting command turns on logging.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shlex
import subprocess
import sys
from unittest import mock

import pytest
import typer
from typer.testing import CliRunner

from rocm_audit.cli import app as cli
from rocm_audit.cli.common import ACTION_PANEL, AUDIT_PANEL, REPORT_PANEL
from rocm_audit.rulebook.catalogue import shipped_catalogue

WIDTH = 100
REPORTING = ["dedup", "prune", "verify-arch", "llvm", "check", "image", "scan", "rules"]


def group() -> typer.core.TyperGroup:
    return typer.main.get_command(cli.app)  # type: ignore[return-value]


def help_of(*argv: str) -> str:
    """The help as a terminal wider than 100 columns shows it. Click reads COLUMNS; typer's
    CliRunner would force 80 columns, so this runs main() as the console script does."""
    out = io.StringIO()
    with mock.patch.dict(os.environ, {"COLUMNS": "200"}), contextlib.redirect_stdout(out):
        assert cli.main([*argv, "--help"]) == 0
    return out.getvalue()


def test_every_command_is_covered_here():
    assert set(group().commands) == {*REPORTING, "explain"}


def test_the_command_list_shows_each_summary_whole_on_one_line():
    text = help_of()
    commands = group().commands
    pad = max(len(name) for name in commands)
    for name, command in commands.items():
        summary = command.short_help
        assert summary and summary.endswith(".") and "..." not in summary, name
        line = f"  {name:<{pad}}  {summary}"
        assert line in text.splitlines(), (name, text)
        assert len(line) <= WIDTH, line


@pytest.mark.parametrize("name", [*REPORTING, "explain"])
def test_command_help_has_summary_examples_panels_and_no_exit_code_footer(name):
    text = help_of(name)
    command = group().commands[name]
    lines = text.splitlines()
    assert all(len(line) <= WIDTH for line in lines), [line for line in lines if len(line) > WIDTH]
    assert lines[2] == f"  {command.short_help}"  # Usage, blank, the summary
    assert "Exit codes" not in text

    examples = [line.strip() for line in lines if line.startswith("    rocm-audit ")]
    assert len(examples) >= 2, text
    assert any(e.split()[1] == name for e in examples)
    for example in examples:
        # Each example is a command line click accepts: the options exist and take their values.
        words = shlex.split(example)[1:]
        target = group().commands[words[0]]
        with target.make_context(words[0], words[1:], parent=None) as ctx:
            assert ctx.command is target

    headings = [line[:-1] for line in lines if line.endswith(":") and not line.startswith(" ")]
    if name == "explain":
        assert headings == ["Arguments", REPORT_PANEL]
        assert lines[0] == "Usage: rocm-audit explain [OPTIONS] RULE"  # not typer's {RULE}
        return
    panels = [getattr(p, "rich_help_panel", None) for p in command.params]
    assert set(panels) <= {AUDIT_PANEL, ACTION_PANEL, REPORT_PANEL}, panels
    expected = [p for p in (AUDIT_PANEL, ACTION_PANEL, REPORT_PANEL) if p in panels]
    assert headings == expected
    assert REPORT_PANEL in expected and (name == "rules" or AUDIT_PANEL in expected)
    report_part = text.split(f"\n{REPORT_PANEL}:\n")[1]
    assert "-v, --verbose" in report_part and "--format" in report_part and "--help" in report_part


@pytest.mark.parametrize("name", ["dedup", "prune"])
def test_changing_commands_group_their_modes_under_what_to_do(name):
    part = help_of(name).split(f"\n{ACTION_PANEL}:\n")[1].split("\n\n")[0]
    for option in ("--dry-run", "--check", "--revert", "--manifest"):
        assert option in part, (option, part)


@pytest.mark.parametrize("name", ["check", "image"])
def test_skip_help_names_every_check_it_accepts(name):
    from rocm_audit.audit.check import CHECKS

    said = " ".join(help_of(name).split("\n  --skip CHECK")[1].split("\n\n")[0].split())
    assert all(check in said for check in CHECKS), said


def test_the_exit_code_table_is_in_the_root_help_once():
    text = help_of()
    assert text.count("Exit codes") == 1
    table = text.split("Exit codes")[1]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^ +(\d+) +(.+)$", table, re.MULTILINE)}
    assert rows == {
        "0": "clean",
        "1": "findings at or above --fail-on (dedup/prune --check: work to do)",
        "2": "usage or configuration error",
        "3": "internal error",
        "130": "interrupted",
    }


def test_help_imports_neither_rich_nor_logging_nor_the_explain_code():
    """--help stays fast: nothing it does not print is imported (rich alone costs ~0.1 s; the
    outcome, the rule catalogue, the report TypedDicts and traceback 40 ms). tomllib itself is not
    asked about: coverage, which the full run starts in every subprocess, imports it to read its
    configuration."""
    probe = (
        "import sys\nfrom rocm_audit.cli.app import main\n"
        "for argv in (['--help'], ['check', '--help'], ['explain', '--help']):\n    main(argv)\n"
        "names = ('rich', 'logging', 'rocm_audit.rulebook.explain', 'rocm_audit.output.explain',\n"
        "         'rocm_audit.outcome', 'rocm_audit.rulebook.catalogue', 'rocm_audit.report_types')\n"
        "print(','.join(m for m in names if m in sys.modules), file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr


def _squashed(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("rule", sorted(shipped_catalogue().rules.values(), key=lambda r: r.id), ids=lambda r: r.id)
def test_explain_prints_what_why_how_severity_and_commands_for_every_rule(rule, run_cli):
    text = run_cli("explain", rule.id.lower(), expect=0).stdout
    assert all(len(line) <= WIDTH for line in text.splitlines()), text
    assert text.startswith(f"{rule.id}: ")
    flat = _squashed(text)
    assert _squashed(rule.title) in flat and _squashed(rule.rationale) in flat and _squashed(rule.fix) in flat
    assert f"Default severity: {rule.severity.value}" in text
    assert "Why it matters:" in text and "How to fix it:" in text
    assert rule.reported_by
    for reported in rule.reported_by:
        assert f"rocm-audit {reported}" in flat


def test_every_command_a_rule_names_exists_with_the_option_it_names():
    commands = group().commands
    for rule in shipped_catalogue().rules.values():
        for reported in rule.reported_by:
            name, *flags = reported.split()
            assert name in commands and name != "explain", (rule.id, reported)
            known = {opt for param in commands[name].params for opt in getattr(param, "opts", [])}
            assert set(flags) <= known, (rule.id, reported)


def test_explain_json_is_the_catalogue_entry():
    rule = shipped_catalogue().rules["LLVM002"]
    result = CliRunner().invoke(cli.app, ["explain", "LlVm002", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "id": "LLVM002",
        "title": rule.title,
        "severity": rule.severity.value,
        "graded": rule.graded,
        "reported_by": list(rule.reported_by),
        "rationale": rule.rationale,
        "fix": rule.fix,
        "defined_in": "rocm_audit/rules/llvm.toml",
    }
    assert rule.graded.startswith("error when a load order is shown to abort or crash")


def test_a_graded_rule_says_when_a_finding_takes_another_severity(run_cli, tmp_path):
    """LLVM002 is a warning by default and an error when an order aborts: explain and rules say so;
    a rules file's severity holds for every finding, so then neither does."""
    explained = " ".join(CliRunner().invoke(cli.app, ["explain", "LLVM002"]).stdout.split())
    assert "Default severity: warning Severity per finding: error when a load order is shown" in explained
    listed = run_cli("rules", expect=0).stdout.splitlines()
    assert any(line.startswith("LLVM002  warning* ") for line in listed)
    assert any(line.startswith("DUP001   error    ") for line in listed)  # never graded: no mark
    assert "*: the default; a finding's verdict may set another (rocm-audit explain RULE says when)" in listed
    rules_file = tmp_path / "rules.toml"
    rules_file.write_text('[rules.LLVM002]\nseverity = "error"\n')
    overridden = run_cli("rules", "--rules", str(rules_file), "--format", "json", expect=0).report["rules"]
    assert "graded" not in next(r for r in overridden if r["id"] == "LLVM002")
    assert "graded" in next(r for r in overridden if r["id"] == "LLVM001")


@pytest.mark.parametrize(
    ("given", "suggested"),
    [("LLVM02", "LLVM002"), ("dup1", "DUP001"), ("ARCH0001", "ARCH001"), ("LVM002", "LLVM002"), ("xyz", None)],
)
def test_explain_an_unknown_rule_exits_2_with_a_suggestion(given, suggested, capsys):
    code = cli.main(["explain", given])
    seen = capsys.readouterr()
    assert code == 2 and seen.out == ""
    assert seen.err.startswith(f"rocm-audit: error: no rule '{given}'") and "Traceback" not in seen.err
    assert seen.err.splitlines()[-1] == "hint: `rocm-audit rules` lists them all, with their titles"
    if suggested:
        assert "did you mean" in seen.err and suggested in seen.err
    else:
        assert "did you mean" not in seen.err
    assert max(map(len, seen.err.splitlines())) <= WIDTH


def test_explain_a_rule_family_names_its_rules_in_order(capsys):
    assert cli.main(["explain", "arch"]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    last = max(r for r in shipped_catalogue().rules if r.startswith("ARCH"))
    assert first == f"rocm-audit: error: no rule 'arch'; the ARCH rules are ARCH001 to {last}"


def test_rules_points_to_explain(run_cli):
    listed = run_cli("rules", expect=0).stdout
    assert "rocm-audit explain RULE" in listed
    assert "rules: 0 errors" not in listed and not listed.endswith("\n\n")  # a listing has nothing to count
    assert "rocm-audit explain" in help_of("rules")


def test_the_rules_table_continues_a_long_title_under_its_column(run_cli):
    lines = run_cli("rules", expect=0).stdout.splitlines()
    title_column = lines[0].index("title")
    table = lines[1 : next(i for i, line in enumerate(lines) if line.startswith(("what a rule means", "*: ")))]
    continued = [line for line in table if line.startswith(" ")]
    assert continued and all(len(line) <= 100 for line in table)
    assert all(len(line) - len(line.lstrip()) == title_column for line in continued)
    assert len([line for line in table if not line.startswith(" ")]) == len(shipped_catalogue().rules)


@pytest.fixture()
def fresh_logging():
    """The root logger as it was, after the test: -v installs a handler on it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


# Arguments that let each reporting command run over an empty directory.
RUNS = {
    "dedup": ["--check", "-p", "{empty}"],
    "prune": ["--check", "-p", "{empty}", "gfx942"],
    "verify-arch": ["-p", "{empty}", "gfx942"],
    "llvm": ["-p", "{empty}"],
    "check": ["-p", "{empty}", "gfx942"],
    "image": ["--archive", "{empty}/missing.tar"],
    "scan": ["-p", "{empty}"],
    "rules": [],
}


@pytest.mark.parametrize("name", REPORTING)
def test_v_after_the_command_turns_on_logging(name, tmp_path, capsys, fresh_logging):
    assert set(RUNS) == set(REPORTING)
    quiet = [] if name == "rules" else ["-q"]  # rules has no progress line to silence
    argv = [name, *(a.format(empty=tmp_path) for a in RUNS[name]), *quiet, "-v"]
    code = cli.main(argv)
    seen = capsys.readouterr()
    assert "No such option" not in seen.err
    assert code == (2 if name == "image" else 0), seen.err  # image: the archive does not exist
    assert fresh_logging.level == logging.INFO
    logging.getLogger("rocm_audit.some.module").info("a step of the audit")
    logging.getLogger("rocm_audit.some.module").debug("a detail")
    assert capsys.readouterr().err == "rocm-audit: some.module: a step of the audit\n"


@pytest.mark.parametrize(
    ("argv", "level", "count"),
    [
        (["scan", "-vv"], logging.DEBUG, 2),
        (["-v", "scan"], logging.INFO, 1),
        (["-v", "scan", "--verbose"], logging.DEBUG, 2),
        (["scan"], None, 0),
    ],
)
def test_v_counts_before_and_after_the_command_and_reaches_the_text_renderer(
    argv, level, count, tmp_path, monkeypatch, capsys, fresh_logging
):
    from rocm_audit.output import text

    given: list[int] = []
    real = text.render_text

    def recording(outcome, verbose=0, colour=False):
        given.append(verbose)
        return real(outcome, verbose=verbose, colour=colour)

    monkeypatch.setattr(text, "render_text", recording)
    before = fresh_logging.level
    assert cli.main([*argv, "-p", str(tmp_path)]) == 0
    assert given == [count]
    assert fresh_logging.level == (before if level is None else level)
    capsys.readouterr()


def test_the_image_commands_byte_limit_default_is_the_librarys():
    """The CLI spells --max-bytes' default as text (its module stays light for --help); the
    library's DEFAULT_MAX_BYTES is what ImageOptions and the rule's text use: they must agree."""
    import inspect
    from pathlib import Path

    from rocm_audit.cli.commands import image
    from rocm_audit.image.budget import DEFAULT_MAX_BYTES

    default = inspect.signature(image.command).parameters["max_bytes"].default
    assert image.parse_size(default) == DEFAULT_MAX_BYTES
    assert f"default {default} of tar" in (Path(image.__file__).parents[2] / "rules" / "image.toml").read_text()


def test_dedup_help_says_a_dry_run_never_fails(sdk, run_cli):
    """A dry run exits 0 whatever it finds, even with --fail-on info: its help says so."""
    said = " ".join(help_of("dedup").split("\n  --dry-run")[1].split("\n  --check")[0].split())
    assert "exit 0 whatever it finds" in said
    result = run_cli("dedup", "--dry-run", "--fail-on", "info", "-p", str(sdk.site), "--format", "json", expect=0)
    assert any(f["severity"] == "error" for f in result.report["findings"])


def test_v_logs_each_phase_with_its_count_and_time(sdk, capsys, fresh_logging):
    """-v in a CI log (no terminal, so no progress line): each phase of the work, as it ends."""
    assert cli.main(["check", "gfx942", "-p", str(sdk.site), "-v"]) == 1
    prefix = "rocm-audit: check: "
    phases = [line for line in capsys.readouterr().err.splitlines() if line.startswith(prefix)]
    said = [line.removeprefix(prefix) for line in phases]
    assert said[0].startswith("listing files: ") and re.search(r" in [0-9]+\.[0-9]{2} s$", said[0]), said
    assert any(line.startswith("reading GPU code and ELF facts: ") for line in said), said
    assert all(re.search(r" in [0-9]+\.[0-9]{2} s$", line) and len(line) <= WIDTH for line in phases), phases
