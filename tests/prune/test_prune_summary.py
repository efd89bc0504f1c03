"""What an applying `prune` says it did: the counts and bytes (text and JSON), the journal, the
backup and the command that undoes the run, which is run as printed; a dry run's JSON holds the
plan its text prints. On the prune unit tree (tests/prune/conftest.py): whole per-arch units and a
HIP fat-binary library, mylib/libfat.so."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from rocm_audit.tree.inventory import TEMP_PREFIX
from support.prune_units import REMOVED, tree_state, unwrapped


def _undo_command(text: str) -> str:
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("to undo, run:"))
    said = lines[at].removeprefix("to undo, run:").strip() or lines[at + 1].strip()
    return said


def _libraries(section: dict) -> dict[str, tuple]:
    return {
        lib["path"]: (lib["bytes"], lib["file_bytes"], lib["removed_targets"], lib["layout"])
        for lib in section["libraries"]
        if lib["bytes"]
    }


def test_an_applying_run_ends_with_what_it_did_and_the_command_that_undoes_it(run_cli, units, tmp_path):
    before = tree_state(units)
    backup = tmp_path / "backup"
    plan = run_cli("prune", "gfx942", "--fatbins", "--dry-run", "-p", str(units), "--format", "json").report
    planned = plan["prune_fatbins"]
    assert planned["libraries"] and all(lib["status"] == "planned" for lib in planned["libraries"] if lib["bytes"])
    done = run_cli("prune", "gfx942", "--fatbins", "-p", str(units), "--backup", str(backup), expect=0)
    manifest = units / ".rocm-audit" / "prune-manifest.jsonl"
    tail = unwrapped(done.output)[-7:]
    assert tail[0].startswith(f"prune: removed {len(REMOVED)} per-GPU files, folders or wheels and slimmed 1 library: ")
    assert tail[1:3] == [f"revert manifest: {manifest}", f"backup of the originals: {backup}"]
    assert tail[-2:] == ["", "prune: 0 errors, 0 warnings, 5 info"]  # the count closes the report, apart
    command = _undo_command(done.output)
    assert command == f"rocm-audit prune --revert {manifest}"
    # the command as printed undoes the run
    run_cli(*shlex.split(command)[1:], expect=0)
    record = "mylib-1.0.dist-info/RECORD"  # its bytes come back; the revert writes it anew (mtime)
    after = tree_state(units)
    assert after[record][:3] == before[record][:3]
    assert {k: v for k, v in after.items() if k != record} == {k: v for k, v in before.items() if k != record}


def test_the_stderr_summary_of_a_report_to_a_file_keeps_the_undo_command_on_one_line(run_cli, units, tmp_path):
    """Beside a report written to a file, stderr says what the run did in lines of 100 columns:
    the undo command stays whole on its own line (split, it pasted as two commands)."""
    report = tmp_path / "report.json"
    args = ("prune", "gfx942", "--fatbins", "-p", str(units), "--backup", str(tmp_path / "backup"))
    done = run_cli(*args, "--format", "json", "-o", str(report), expect=0)
    command = f"rocm-audit prune --revert {units / '.rocm-audit' / 'prune-manifest.jsonl'}"
    assert len(command) > 40  # the summary before it fills its line: the command must go whole below
    lines = done.stderr.splitlines()
    holding = [line for line in lines if command in line]
    assert len(holding) == 1 and holding[0].strip() == command, lines
    run_cli(*shlex.split(holding[0].strip())[1:], expect=0)


def test_the_json_of_an_applying_run_counts_what_it_removed_and_slimmed(run_cli, units, tmp_path):
    plan = run_cli("prune", "gfx942", "--fatbins", "--dry-run", "-p", str(units), "--format", "json").report
    assert plan["prune"]["manifest"] is None and plan["prune"]["revert_command"] is None
    size_before = os.path.getsize(units / "mylib/libfat.so")
    backup = tmp_path / "backup"
    args = ("prune", "gfx942", "--fatbins", "-p", str(units), "--backup", str(backup), "--format", "json")
    report = run_cli(*args, expect=0).report
    section, fatbins = report["prune"], report["prune_fatbins"]
    assert section["removed"] == len(REMOVED) and section["slimmed"] == fatbins["slimmed"] == 1
    assert section["slimmed_bytes"] == fatbins["bytes"] > 0
    shrunk = size_before - os.path.getsize(units / "mylib/libfat.so")
    removed_bytes = sum(r["bytes"] for r in section["removals"])
    assert shrunk > 0 and section["bytes_freed"] == removed_bytes + shrunk
    manifest = str(units / ".rocm-audit" / "prune-manifest.jsonl")
    assert (section["manifest"], section["backup"]) == (manifest, str(backup))
    assert section["revert_command"] == f"rocm-audit prune --revert {manifest}"
    assert section["nothing_done"] == ""
    # the dry run's JSON held exactly what the applying run did, library by library
    assert _libraries(fatbins) == _libraries(plan["prune_fatbins"])
    assert [d["bytes"] for d in fatbins["by_distribution"]] == [fatbins["bytes"]]


def test_a_run_that_changes_nothing_says_why(run_cli, units):
    run_cli("prune", "gfx942", "--fatbins", "-p", str(units), expect=0)
    again = run_cli("prune", "gfx942", "--fatbins", "-p", str(units), expect=0)
    why = "no whole unit for other GPUs can go and no library can be slimmed (the findings say what stays and why)"
    assert unwrapped(again.output)[-3] == f"prune: nothing removed: {why}"
    report = run_cli("prune", "gfx942", "--fatbins", "-p", str(units), "--format", "json", expect=0).report
    assert report["prune"]["revert_command"] is None and report["prune"]["nothing_done"] == why
    assert (report["prune"]["removed"], report["prune"]["slimmed"], report["prune"]["bytes_freed"]) == (0, 0, 0)


def test_without_fatbins_a_run_left_with_fat_binaries_points_at_fatbins(run_cli, units):
    run_cli("prune", "gfx942", "-p", str(units), "--keep-dist", "mylib", expect=0)
    report = run_cli("prune", "gfx942", "-p", str(units), "--format", "json", expect=0).report
    assert report["prune"]["removals"] and report["prune"]["nothing_done"] == ""
    for path in (units / "_rocm_sdk_libraries/lib/libMIOpenCKNeeded_gfx90a.so", units / "mylib/lib"):
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    report = run_cli("prune", "gfx942", "-p", str(units), "--format", "json", expect=0).report
    assert report["prune"]["nothing_done"] == (
        "the code for other GPUs sits in fat binaries of host libraries, which --fatbins slims"
    )


@contextlib.contextmanager
def _read_only(directory: Path):
    """``directory`` read-only for real: a read-only bind mount as root (root ignores modes),
    mode 0555 on it and its folders otherwise."""
    if os.geteuid() == 0:
        view = directory.parent / "read-only-view"
        view.mkdir()
        done = subprocess.run(["mount", "--bind", "-o", "ro", str(directory), str(view)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"no read-only bind mount here: {done.stderr.decode().strip()}")
        try:
            yield view
        finally:
            subprocess.run(["umount", str(view)], check=True)
        return
    folders = [directory, *(p for p in directory.rglob("*") if p.is_dir() and not p.is_symlink())]
    for folder in folders:
        folder.chmod(0o555)
    try:
        yield directory
    finally:
        for folder in folders:
            folder.chmod(0o755)


def test_a_read_only_tree_says_why_nothing_was_removed_in_plain_words(run_cli, units, tmp_path):
    before = tree_state(units)
    with _read_only(units) as tree:
        elsewhere = ("--manifest", str(tmp_path / "journal.jsonl"))
        done = run_cli("prune", "gfx942", "--fatbins", "-p", str(tree), *elsewhere, "--format", "json", expect=1)
        text = run_cli("prune", "gfx942", "--fatbins", "-p", str(tree), *elsewhere, expect=1).output
    assert tree_state(units) == before
    section = done.report["prune"]
    assert (section["removed"], section["slimmed"], section["revert_command"]) == (0, 0, None)
    assert section["nothing_done"]
    said = " ".join(text.split())
    assert f"prune: nothing removed: {section['nothing_done']}" in said
    assert "every bundle holds only code a kept target can select" not in said  # not the false reason
    assert "[Errno" not in text and TEMP_PREFIX not in text  # the system's words, no temporary names
    libraries = done.report["prune_fatbins"]["libraries"]
    assert [lib["status"] for lib in libraries if lib["path"].endswith("libfat.so")] == ["failed"]


def test_with_fatbins_the_headline_and_table_count_what_slimming_removes(run_cli, units):
    """The first lines of a --fatbins plan never say "removable: 0 B" above libraries it slims:
    the headline names both parts, and the table has a fatbins column per distribution."""
    args = ("prune", "gfx942", "--fatbins", "--dry-run", "-p", str(units))
    report = run_cli(*args, "--format", "json").report
    whole, slim = report["prune"]["totals"]["removable_bytes"], report["prune_fatbins"]["bytes"]
    assert slim > 0
    lines = unwrapped(run_cli(*args).output)
    from rocm_audit.units import size_text

    headline = next(line for line in lines if line.startswith("device code "))
    assert headline.endswith(
        f"removable: {size_text(whole)} as whole files and {size_text(slim)} from fat binaries (--fatbins)"
    )
    header = next(line for line in lines if line.startswith("distribution "))
    assert header.split()[-2:] == ["removable", "fatbins"] and len(header) <= 100
    (row,) = (line for line in lines if line.startswith("mylib "))
    assert row.endswith(size_text(slim).rjust(11)) and len(row) <= 100
    # More slimmed than unused (the padding between entries goes too) is said under the table;
    # how the bytes leave a file (JSON layout) is not the user's concern.
    unused = sum(w["unused_bytes"] for w in report["prune"]["weight"] if w["distribution"] == "mylib")
    note = "(fatbins: the unused entries slimming removes and the padding between them)"
    assert (note in lines) == (slim > unused), (slim, unused)
    from rocm_audit.output.prune_text import prune_lines

    padded = {**report, "prune_fatbins": {**report["prune_fatbins"], "by_distribution": []}}
    padded["prune_fatbins"]["by_distribution"] = [{"distribution": "mylib", "bytes": unused + 4096}]
    assert note in prune_lines(padded) and note not in prune_lines(report)
    planned = next(line for line in lines if line.startswith("would slim"))
    assert planned.endswith(" smaller]") and "(truncated)" not in planned and "(split)" not in planned


def test_the_estimate_names_files_no_distribution_owns_in_words():
    from rocm_audit.output.prune_text import fatbins_estimate_lines

    section = {
        "fatbins_estimate": [
            {"distribution": "pyg_lib-rocm", "bytes": 65 << 20},
            {"distribution": "(no distribution)", "bytes": 65 << 20},
        ],
        "totals": {"fatbins_estimate_bytes": 130 << 20},
    }
    (line,) = fatbins_estimate_lines(section)
    assert "(pyg_lib-rocm 65.0 MiB, files no distribution owns (with --backup) 65.0 MiB)" in line
    assert "((" not in line
