"""--report FORMAT=FILE: one run writes every report a CI job hands on (an image is read once, not
once per format), each the same document a run of that format alone writes; and every file a run
will write is checked before the run starts, so a mistyped path neither costs a whole audit nor
leaves a changing command's work done with no report of it."""

from __future__ import annotations

import json
import os
import re
import stat

import pytest
from junitparser import Failure, JUnitXml
from sarif import loader as sarif_loader

from rocm_audit.errors import UsageError
from rocm_audit.output.report import write_atomic

FORMATS = ("text", "json", "sarif", "junit", "github", "markdown")
_VOLATILE = re.compile(r'"(start|end)TimeUtc": "[^"]*"|"elapsed_s": [0-9.e-]+|\b\d+\.\d+ s\b')  # times, durations


def _same(text: str) -> str:
    return _VOLATILE.sub("", text)


def test_one_run_writes_each_format_as_a_run_of_that_format_alone(sdk, run_cli, tmp_path):
    files = {fmt: tmp_path / f"report.{fmt}" for fmt in FORMATS}
    given = [word for fmt, path in files.items() for word in ("--report", f"{fmt}={path}")]
    together = run_cli("check", "-p", str(sdk.site), "--format", "json", *given, expect=1)
    assert together.report["findings"], "the tree has duplicate libraries"
    for fmt, path in files.items():
        alone = run_cli("check", "-p", str(sdk.site), "--format", fmt, expect=1)
        assert _same(path.read_text()) == _same(alone.stdout), fmt
    # and their consumers read them as what the JSON on stdout says
    errors = sum(f["severity"] == "error" for f in together.report["findings"])
    sarif = sarif_loader.load_sarif_file(str(files["sarif"])).get_report()
    assert sarif.get_issue_count_for_severity("error") == errors
    cases = [case for suite in JUnitXml.fromfile(str(files["junit"])) for case in suite]
    assert sum(any(isinstance(r, Failure) for r in case.result) for case in cases) == errors
    assert json.loads(files["json"].read_text())["findings"] == together.report["findings"]


def test_the_reports_follow_fail_on_and_the_exit_code_is_unchanged(sdk, run_cli, tmp_path):
    xml = tmp_path / "report.xml"
    plain = run_cli("dedup", "--check", "-p", str(sdk.site), "--fail-on", "warning")
    with_file = run_cli("dedup", "--check", "-p", str(sdk.site), "--fail-on", "warning", "--report", f"junit={xml}")
    assert plain.exit_code == with_file.exit_code == 1
    suites = JUnitXml.fromfile(str(xml))
    failing = {case.classname for suite in suites for case in suite if any(isinstance(r, Failure) for r in case.result)}
    assert failing == {"DUP001", "DUP002"}  # the warning fails too, as --fail-on warning asks


def _tree_state(root):
    return sorted((str(path.relative_to(root)), path.is_symlink(), path.lstat().st_ino) for path in root.rglob("*"))


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["-o", "{missing}/report.json"], "-o {missing}/report.json: no directory {missing}"),
        (["--report", "sarif={missing}/a.sarif"], "--report sarif={missing}/a.sarif: no directory {missing}"),
        (["--write-baseline", "{tmp}"], "--write-baseline {tmp}: is a directory"),
        (["-o", "{tmp}/r", "--report", "json={tmp}/./r"], "--report json={tmp}/./r: -o {tmp}/r writes this file"),
        (["--report", "sarif"], "--report sarif: expected FORMAT=FILE"),
        (["--report", "xml={tmp}/r.xml"], "--report xml={tmp}/r.xml: no report format 'xml'; the formats: text,"),
        (
            ["--report", "markdown="],
            "--report markdown=: no file after 'markdown='\nhint: is the variable naming it set?",
        ),
    ],
)
def test_a_file_the_run_cannot_write_stops_it_before_it_changes_anything(sdk, run_cli, tmp_path, options, says):
    names = {"missing": str(tmp_path / "no-such-dir"), "tmp": str(tmp_path)}
    good = tmp_path / "good.sarif"
    before = _tree_state(sdk.site)
    result = run_cli(
        "dedup", "-p", str(sdk.site), "--report", f"sarif={good}", *[o.format(**names) for o in options], expect=2
    )
    assert f"rocm-audit: error: {says.format(**names)}" in result.stderr
    assert "internal error" not in result.stderr
    assert _tree_state(sdk.site) == before, "dedup ran although its report could not be written"
    assert not good.exists(), "a report was written by a run that stopped"
    run_cli("dedup", "-p", str(sdk.site), "--report", f"sarif={good}", expect=0)  # and without the typo, it works
    assert _tree_state(sdk.site) != before and good.is_file()


def test_a_report_file_gets_the_mode_a_plain_write_gives_it(tmp_path):
    fresh, kept = tmp_path / "fresh.json", tmp_path / "kept.json"
    kept.write_text("old")
    os.chmod(kept, 0o640)
    old = os.umask(0o027)
    try:
        write_atomic(str(fresh), "new")
        write_atomic(str(kept), "new")
    finally:
        os.umask(old)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o640  # 0666 less the umask, not mkstemp's 0600
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640 and kept.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".rocm-audit-tmp")] == []


def test_a_write_that_fails_names_the_file(tmp_path):
    gone = tmp_path / "gone" / "report.json"
    with pytest.raises(UsageError, match=re.escape(f"cannot write {gone}: No such file or directory")):
        write_atomic(str(gone), "text")


def test_colour_goes_to_a_terminal_only_never_into_a_file(sdk, tmp_path):
    """From a terminal (a real pty), the text on stdout is coloured; the same text written to -o or
    --report is not (it used to follow stdout's terminal into the file)."""
    import pty
    import subprocess
    import sys

    def run(*extra: str) -> str:
        primary, secondary = pty.openpty()
        try:
            argv = [sys.executable, "-m", "rocm_audit", "check", "-p", str(sdk.site), "gfx942", *extra]
            env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "CI")} | {"TERM": "xterm"}
            done = subprocess.run(argv, stdout=secondary, stderr=subprocess.DEVNULL, env=env, timeout=120, check=False)
            assert done.returncode == 1
            os.close(secondary)
            secondary = -1
            chunks = []
            while True:
                try:
                    chunk = os.read(primary, 65536)
                except OSError:  # EIO: the terminal's other end is closed
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            return b"".join(chunks).decode()
        finally:
            os.close(primary)
            if secondary >= 0:
                os.close(secondary)

    on_terminal = run("--report", f"text={tmp_path / 'also.txt'}")
    assert "\x1b[" in on_terminal and "ERROR" in on_terminal
    run("-o", str(tmp_path / "out.txt"))
    for name in ("also.txt", "out.txt"):
        text = (tmp_path / name).read_text()
        assert "ERROR DUP001" in text and "\x1b" not in text, name


def test_a_report_to_a_pipe_or_device_writes_into_it_and_a_link_stays_a_link(sdk, run_cli, tmp_path):
    """`-o /dev/null` or a FIFO a job reads: written in place, never renamed over (that would leave
    a regular file where the device was). A symlink is written through, as a shell's `>` would."""
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    run_cli("dedup", "--check", "-p", str(sdk.site), "--format", "json", "-o", str(fifo), expect=1)
    reader.join(timeout=30)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and b'"command": "dedup"' in received[0]
    if os.geteuid() == 0:  # a private /dev/null: only root may make a device node
        null = tmp_path / "null"
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        run_cli("dedup", "--check", "-p", str(sdk.site), "-o", str(null), expect=1)
        assert stat.S_ISCHR(os.lstat(null).st_mode)
    target, link = tmp_path / "report.txt", tmp_path / "latest.txt"
    target.write_text("old")
    link.symlink_to(target.name)
    run_cli("dedup", "--check", "-p", str(sdk.site), "-o", str(link), expect=1)
    assert link.is_symlink() and "dedup" in target.read_text()
