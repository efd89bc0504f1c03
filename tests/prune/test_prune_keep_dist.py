"""A rules file's ``[policy.prune] keep_dist``: the same as ``--keep-dist NAME`` on the command
line, for whole-unit prune and for ``--fatbins``, through the CLI on the prune unit tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.prune_units import REMOVED, tree_state


def _rules(tmp_path: Path, names: list[str]) -> Path:
    path = tmp_path / "rules.toml"
    quoted = ", ".join(f'"{n}"' for n in names)
    path.write_text(f"# keep these whole\n[policy.prune]\nkeep_dist = [{quoted}]\n")
    return path


def _mylib_units() -> set[str]:
    return {rel for rel in REMOVED if rel.startswith("mylib/")}


def test_rules_file_keeps_a_distribution_whole_in_whole_unit_prune(run_cli, units, tmp_path):
    rules = _rules(tmp_path, ["MyLib"])  # PEP 503: any spelling
    report = run_cli("prune", "gfx942", "--dry-run", "-p", str(units), "--rules", str(rules), "--format", "json").report
    removed = {os.path.relpath(r["path"], units) for r in report["prune"]["removals"]}
    assert removed == set(REMOVED) - _mylib_units() and _mylib_units()
    reasons = {os.path.relpath(k["path"], units): k["reason"] for k in report["prune"]["kept_units"]}
    for rel in _mylib_units():
        assert reasons[rel] == f"mylib is kept whole (keep_dist in {rules}:3)"
    # the command line says the same, naming itself
    by_flag = run_cli("prune", "gfx942", "--dry-run", "-p", str(units), "--keep-dist", "mylib", "--format", "json")
    kept = {os.path.relpath(k["path"], units): k["reason"] for k in by_flag.report["prune"]["kept_units"]}
    assert all(kept[rel] == "mylib is kept whole (--keep-dist mylib)" for rel in _mylib_units())
    # applied: nothing of mylib goes, the rest does
    before = tree_state(units)
    run_cli("prune", "gfx942", "-p", str(units), "--rules", str(rules), expect=0)
    after = tree_state(units)
    assert all(after.get(rel) == before[rel] for rel in before if rel.startswith("mylib"))
    assert not any(os.path.lexists(units / rel) for rel in set(REMOVED) - _mylib_units())


def test_rules_file_keeps_fat_binaries_whole_with_fatbins(run_cli, units, tmp_path):
    before = tree_state(units)
    rules = _rules(tmp_path, ["my*"])  # globs, as an ignore's distribution takes
    args = ("prune", "gfx942", "--fatbins", "-p", str(units), "--rules", str(rules), "--format", "json")
    report = run_cli(*args[:2], "--dry-run", *args[2:]).report
    rows = report["prune_fatbins"]["libraries"]
    assert rows and all(r["bytes"] == 0 and r["status"] == "unchanged" for r in rows)
    assert {r["reason"] for r in rows} == {f"mylib is kept whole (keep_dist in {rules}:3)"}
    run_cli(*args)
    assert tree_state(units)["mylib/libfat.so"] == before["mylib/libfat.so"]
    # without the rules file the same library is slimmed: the rule made the difference
    slimmed = run_cli("prune", "gfx942", "--fatbins", "--dry-run", "-p", str(units), "--format", "json").report
    assert any(r["bytes"] > 0 for r in slimmed["prune_fatbins"]["libraries"])


def test_a_bad_keep_dist_value_is_a_usage_error(run_cli, units, tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text('[policy.prune]\nkeep_dist = "mylib"\n')
    done = run_cli("prune", "gfx942", "--dry-run", "-p", str(units), "--rules", str(rules), expect=2)
    assert "keep_dist" in done.stdout + done.stderr


def test_a_keep_dist_naming_no_installed_distribution_is_a_usage_error(run_cli, units):
    before = tree_state(units)
    done = run_cli("prune", "gfx942", "-p", str(units), "--keep-dist", "mylbi", expect=2)
    assert "--keep-dist mylbi: no installed distribution has that name" in done.output
    assert "did you mean mylib?" in done.output
    assert tree_state(units) == before  # refused before anything was removed
    # a glob that matches an installed distribution is accepted; one that matches none is not
    run_cli("prune", "gfx942", "--dry-run", "-p", str(units), "--keep-dist", "my*", expect=0)
    run_cli("prune", "gfx942", "--dry-run", "-p", str(units), "--keep-dist", "nosuch*", expect=2)


def test_the_report_says_what_was_kept_whole_and_why(run_cli, units, tmp_path):
    args = ("prune", "gfx942", "--dry-run", "-p", str(units), "--keep-dist", "MyLib")
    report = run_cli(*args, "--format", "json").report
    assert report["prune"]["kept_whole"] == [{"distribution": "mylib", "source": "--keep-dist MyLib"}]
    text = run_cli(*args).output.splitlines()
    assert text[2] == "kept whole (--keep-dist): mylib"  # under the kept targets, before the figures
    rules = _rules(tmp_path, ["mylib"])
    text = run_cli("prune", "gfx942", "--dry-run", "-p", str(units), "--rules", str(rules)).output
    assert f"kept whole (keep_dist in {rules}:3): mylib" in " ".join(text.split())  # wrapped at 100 columns
    assert "kept whole" not in run_cli("prune", "gfx942", "--dry-run", "-p", str(units)).output


def test_a_keep_dist_typed_as_the_first_word_of_a_name_is_offered_that_name():
    """`--keep-dist cupy` where cupy-rocm-7-0 is installed: the error names it (the spelling
    distance alone found nothing that short a word resembles)."""
    from rocm_audit.audit.pruning import check_kept_names
    from rocm_audit.errors import UsageError
    from rocm_audit.tree.ownership import Distribution

    names = ("cupy-rocm-7-0", "onnxruntime-rocm", "numpy")
    installed = [Distribution(n, "1", f"/s/{n}.dist-info", "/s") for n in names]
    with pytest.raises(UsageError) as raised:
        check_kept_names(["cupy"], installed)
    assert raised.value.message.endswith("did you mean cupy-rocm-7-0?")
    with pytest.raises(UsageError) as raised:
        check_kept_names(["onnxruntime_rocn"], installed)
    assert raised.value.message.endswith("did you mean onnxruntime-rocm?")
    check_kept_names(["CuPy_ROCm_7_0", "numpy"], installed)  # PEP 503 spellings of installed names pass
