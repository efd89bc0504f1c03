"""Reports people read: `--format markdown` on every command, one finding per (file, rule), and
text paths relative to the audited root.

The Markdown must be safe in a GitHub job summary: a file name that looks like a link, an HTML tag,
a table cell or a mention stays literal text (every name goes through escape.markdown).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rocm_audit.findings import cause_groups, make_finding
from rocm_audit.output.escape import markdown
from support.image.layer_writers import docker_save, layer
from support.markdown_oracles import cmark_gfm_texts, markdown_it_texts
from support.toolchain import gfx942_code_object

HOSTILE = "x](https:\\\\evil.example)<img src=y>|@someone $m$ *b* www.evil.example"


@pytest.fixture(scope="module")
def carriers(tmp_path_factory) -> Path:
    """30 gfx942-only code objects (one with a hostile name) and one clean site-packages root."""
    site = tmp_path_factory.mktemp("md") / "site-packages"
    code = gfx942_code_object(site / "pkg")
    for index in range(29):
        shutil.copy2(code, site / "pkg" / f"k{index:02}.hsaco")
    shutil.copy2(code, site / "pkg" / f"{HOSTILE}.hsaco")
    return site


def test_markdown_coverage_table_lists_only_gaps_capped(run_cli, carriers):
    result = run_cli("verify-arch", "gfx942", "-p", str(carriers), "--format", "markdown", expect=0)
    assert "| library |" not in result.stdout  # no gap, no table
    assert "No GPU code carrier misses a target (31 judged)." in result.stdout
    result = run_cli("verify-arch", "gfx942", "gfx950", "-p", str(carriers), "--format", "markdown", expect=1)
    text = result.stdout
    assert "| check | errors | warnings | info |" in text
    assert "| verify-arch | 31 | 0 | 0 |" in text
    assert "| library | gfx942 | gfx950 |" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "**missing**" in line]
    assert len(rows) == 25
    assert "... and 6 more" in text
    assert "Paths relative to " in text


def test_markdown_keeps_hostile_names_literal(run_cli, carriers):
    """Parsed by CommonMark and by GitHub's parser, the hostile name is text (no link, HTML, code,
    emphasis, cell split or mention: the oracles fail on any element but the renderer's **)."""
    text = run_cli("verify-arch", "gfx950", "-p", str(carriers), "--format", "markdown", "-v", expect=1).stdout
    assert markdown(f"pkg/{HOSTILE}.hsaco") in text
    for parse in (markdown_it_texts, cmark_gfm_texts):
        blocks = ["".join(pieces) for _, pieces in parse(text, allow=frozenset({"strong"}))]
        assert any(f"pkg/{HOSTILE}.hsaco" in block for block in blocks), parse.__name__
    # Every table row still has the header's column count (no cell was split by a name's '|').
    for line in text.splitlines():
        if line.startswith("| ") and "**missing**" in line:
            assert line.replace("\\|", "").count("|") == 3, line


def test_markdown_on_every_command_with_the_same_exit_code(run_cli, sdk, tmp_path):
    site = str(sdk.site)
    for argv, code in (
        (("dedup", "--check", "-p", site), 1),
        (("check", "gfx942", "-p", site), None),
        (("llvm", "-p", site), None),
        (("scan", "-p", site), 0),
        (("scan", "--targets", "-p", site), 0),
        (("rules",), 0),
    ):
        text_run = run_cli(*argv)
        md_run = run_cli(*argv, "--format", "markdown")
        assert md_run.exit_code == text_run.exit_code, argv
        if code is not None:
            assert md_run.exit_code == code, argv
        assert md_run.stdout.startswith(f"### rocm-audit {argv[0]}"), argv
    dedup = run_cli("dedup", "--check", "-p", site, "--format", "markdown").stdout
    assert "Largest duplicate groups" in dedup and "| size | copies | keep | link |" in dedup
    rules = run_cli("rules", "--format", "markdown").stdout
    assert "| POST002 | warning |" in rules
    scan = run_cli("scan", "-p", site, "--format", "markdown").stdout
    assert "| file kind | files |" in scan
    assert "| shared libraries | " in scan and "| stand-alone GPU code objects (.hsaco, .co) | " in scan
    said = run_cli("scan", "-p", site).stdout  # GPU code inside libraries is no kind: the text says where it is
    assert "shared libraries: " in said and "scan --targets lists every code object" in said


def test_markdown_for_an_image_lists_the_largest_identical_copies(run_cli, tmp_path):
    sp = "usr/lib/python3/dist-packages"
    blob = os.urandom(300_000)
    one = layer((f"{sp}/_rocm_sdk_core/lib/libx.so", blob))
    two = layer((f"{sp}/_rocm_sdk_devel/lib/libx.so", blob))
    archive = docker_save(tmp_path / "s.tar", [one, two])
    text = run_cli("image", "--archive", str(archive), "--target", "gfx942", "--format", "markdown").stdout
    assert "| wasted | copies | scope | paths (layer) |" in text and "| 293.0 KiB | 2 | cross-layer |" in text
    assert "cross-layer" in text and "_rocm_sdk_devel/lib/libx.so (1)" in text
    assert "(docker-save, 2 layers); audited /usr/lib/python3/dist-packages" in text


def test_findings_of_one_rule_and_cause_are_one_group():
    """Text and Markdown show a group as one entry; JSON keeps every finding with its group."""
    same = [
        make_finding("POST002", f"/a/lib{n}.so", "needs ROCm libraries that no search path finds") for n in range(3)
    ]
    other_cause = [make_finding("POST002", "/a/x.so", "needs libfoo.so, which no search path finds")]
    pair = [make_finding("DUP001", "/a/lib0.so", "copies", related=["/b/lib0.so"])]
    also_pair = [make_finding("DUP001", "/a/lib1.so", "copies", related=["/b/lib1.so"])]
    error = [make_finding("POST003", "/a/z.so", "extension for another Python")]
    groups = cause_groups(same + other_cause + pair + also_pair + error)
    assert [len(g) for g in groups] == [1, 1, 1, 3, 1]  # errors first, then warnings; by rule, then path
    assert [g[0].rule for g in groups] == ["DUP001", "DUP001", "POST003", "POST002", "POST002"]
    assert [f.path for f in groups[3]] == ["/a/lib0.so", "/a/lib1.so", "/a/lib2.so"]


def test_text_shows_paths_relative_to_the_audited_root(run_cli, carriers):
    text = run_cli("verify-arch", "gfx950", "-p", str(carriers), "-v", expect=1).stdout
    assert text.splitlines()[0] == f"paths relative to {os.path.realpath(carriers)}"
    entry = text[text.index("ERROR ARCH001") :]
    listed = entry.split(":", 2)[2].split("\n", 2)[1]  # the files of the group, on the next line
    assert listed.strip().startswith("pkg/")
    assert str(carriers) not in "\n".join(text.splitlines()[1:])


def test_sarif_of_an_archive_named_by_a_relative_path(run_cli, tmp_path, monkeypatch):
    """The README's CI step `rocm-audit image --archive image.tar --format sarif` (it once exited 3:
    the archive's empty directory name cannot be a file URI); locations are relative to the
    image's audited site-packages."""
    import json

    sp = "opt/venv/lib/python3.11/site-packages"
    docker_save(tmp_path / "image.tar", [layer((f"{sp}/pkg/lib.so", b"\x7fELF" + b"\0" * 60))])
    monkeypatch.chdir(tmp_path)
    result = run_cli("image", "--archive", "image.tar", "--target", "gfx942", "--format", "sarif")
    assert result.exit_code in (0, 1), result.output
    run = json.loads(result.stdout)["runs"][0]
    assert run["originalUriBaseIds"] == {"INPUT1": {"uri": f"file:///{sp}/"}}
    locations = [r["locations"][0]["physicalLocation"]["artifactLocation"] for r in run["results"]]
    assert {"uri": "pkg/lib.so", "uriBaseId": "INPUT1"} in locations


def test_markdown_numbers_several_roots_as_its_paths_show_them(run_cli, sdk):
    text = run_cli("check", "gfx942", "-p", str(sdk.devel), "-p", str(sdk.core), "--format", "markdown").stdout
    core, devel = sorted([str(sdk.core), str(sdk.devel)])
    assert f"Paths relative to the audited directory holding them: [1] {core}, [2] {devel}" in text
    assert "\\[2\\] lib/" in text  # a devel path of a finding, escaped as Markdown text


def test_a_tree_without_anything_of_rocm_says_so_in_words(run_cli, tmp_path, sdk):
    """All zeros can mean the wrong environment was audited (the README's first command on a
    machine without the wheels): the text says no ROCm content was found; a ROCm tree never does."""
    plain = tmp_path / "plain" / "site-packages"
    (plain / "pkg").mkdir(parents=True)
    (plain / "pkg" / "__init__.py").write_text("")
    said = "no ROCm content here: no _rocm_sdk_* tree, no GPU code, no library that carries LLVM"
    assert said in run_cli("check", "-p", str(plain), expect=0).stdout.splitlines()
    assert said not in run_cli("check", "-p", str(sdk.site)).stdout
    assert said not in run_cli("check", "-p", str(plain), "--skip", "llvm", expect=0).stdout  # not every check ran
