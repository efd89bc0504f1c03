"""Reports for machines: the JSON summary, file names that are not UTF-8 (JSON, SARIF), and
GitHub annotation paths relative to the workspace.

A name with byte 0xff is created on disk, audited by the installed `rocm-audit`, and read back by
jq and by Python: both must recover the exact bytes, and every report must be valid UTF-8.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote_to_bytes

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocm_audit.findings import Severity, make_finding
from rocm_audit.output.report import build_report, to_json
from support.cli import check_summary
from support.toolchain import gfx942_code_object

RAW_NAME = b"k\xff\xfe name,%0A:x.hsaco"


@pytest.fixture(scope="module")
def odd_tree(tmp_path_factory) -> tuple[Path, bytes]:
    """A real gfx942 code object whose file name holds bytes that are not UTF-8."""
    site = tmp_path_factory.mktemp("raw") / "site-packages"
    built = gfx942_code_object(site / "pkg")
    raw_path = os.fsencode(site / "pkg") + b"/" + RAW_NAME
    os.rename(built, raw_path)
    return site, raw_path


def rocm_audit(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """The installed console script, as CI runs it (bytes out: nothing decodes it for us)."""
    script = Path(sys.executable).with_name("rocm-audit")
    return subprocess.run(
        [str(script), *args], capture_output=True, timeout=300, check=False, env=env or dict(os.environ)
    )


def test_non_utf8_name_round_trips_through_json_for_jq_and_python(odd_tree, report_validator):
    site, raw_path = odd_tree
    for argv, section in (
        (["verify-arch", "gfx950", "-p", str(site)], "carriers"),
        (["scan", "-p", str(site), "--targets"], "code_objects"),
    ):
        run = rocm_audit(*argv, "--format", "json")
        assert run.returncode in (0, 1), run.stderr
        text = run.stdout.decode("utf-8")  # strict: a lone surrogate would not decode
        assert "\\ud" not in text.lower()
        report = json.loads(text)
        report_validator.validate(report)
        check_summary(report)
        records = report[section] + report["findings"]
        assert records
        for record in records:
            assert record["path"] == os.fsdecode(raw_path).encode("utf-8", "surrogateescape").decode(
                "utf-8", "backslashreplace"
            )  # readable: each undecodable byte as \xNN
            assert base64.b64decode(record["path_bytes_b64"]) == raw_path
        jq = shutil.which("jq")
        assert jq, "jq is installed by scripts/test (tests/apt-packages.txt)"
        query = f".{section}[], .findings[] | .path_bytes_b64 // (.path | @base64)"
        lines = subprocess.run([jq, "-r", query], input=run.stdout, capture_output=True, timeout=60, check=True)
        recovered = {base64.b64decode(line) for line in lines.stdout.split()}
        assert recovered == {raw_path}


def test_utf8_names_carry_no_bytes_sibling(odd_tree, run_cli):
    site, _ = odd_tree
    plain = site / "pkg" / "plain ü.hsaco"
    shutil.copy2(os.fsencode(site / "pkg") + b"/" + RAW_NAME, plain)
    try:
        report = run_cli("verify-arch", "gfx950", "-p", str(site), "--format", "json", expect=1).report
    finally:
        plain.unlink()
    (record,) = [f for f in report["findings"] if f["path"] == str(plain)]
    assert "path_bytes_b64" not in record


def test_sarif_percent_encodes_the_bytes_of_the_name(odd_tree, tmp_path):
    from sarif import loader as sarif_loader

    site, raw_path = odd_tree
    run = rocm_audit("verify-arch", "gfx950", "-p", str(site), "--format", "sarif")
    assert run.returncode == 1, run.stderr
    text = run.stdout.decode("utf-8")
    assert "\\ud" not in text.lower()
    document = json.loads(text)
    run0 = document["runs"][0]
    (result,) = run0["results"]
    location = result["locations"][0]["physicalLocation"]["artifactLocation"]
    base = run0["originalUriBaseIds"][location["uriBaseId"]]["uri"]
    assert base.startswith("file://")
    assert unquote_to_bytes(base[len("file://") :] + location["uri"]) == raw_path
    out = tmp_path / "report.sarif"
    out.write_bytes(run.stdout)
    assert sarif_loader.load_sarif_file(str(out)).get_result_count() == 1


def annotation_fields(line: str) -> tuple[str, dict[str, str], str]:
    """A workflow command as the runner reads it: properties split on ',', then %XX undone with
    '%25' last (actions/runner src/Runner.Common/ActionCommand.cs, TryParseV2)."""
    assert line.startswith("::")
    head, data = line[2:].split("::", 1)
    command, _, props = head.partition(" ")

    def undo(text: str, tokens: dict[str, str]) -> str:
        for escaped, raw in tokens.items():
            text = text.replace(escaped, raw)
        return text.replace("%25", "%")

    data_tokens = {"%0D": "\r", "%0A": "\n"}
    prop_tokens = {**data_tokens, "%3A": ":", "%2C": ","}
    properties = dict(p.split("=", 1) for p in props.split(",") if p)
    return command, {k: undo(v, prop_tokens) for k, v in properties.items()}, undo(data, data_tokens)


@pytest.mark.parametrize("inside", [True, False])
def test_github_annotation_paths_are_relative_to_the_workspace(tmp_path, inside):
    workspace = tmp_path / "checkout"
    site = workspace / "venv" / "site-packages"
    gfx942_code_object(site / "pkg", "k,1:%0A.hsaco")
    env = dict(os.environ)
    env.pop("GITHUB_WORKSPACE", None)
    if inside:
        env["GITHUB_WORKSPACE"] = str(workspace)
    run = rocm_audit("verify-arch", "gfx950", "-p", str(site), "--format", "github", env=env)
    assert run.returncode == 1, run.stderr
    (line,) = run.stdout.decode("utf-8").splitlines()
    command, properties, message = annotation_fields(line)
    assert command == "error" and properties["title"] == "ARCH001"
    where = "venv/site-packages/pkg/k,1:%0A.hsaco" if inside else str(site / "pkg" / "k,1:%0A.hsaco")
    assert properties["file"] == where
    assert message.startswith("no code object for gfx950")


def test_github_workspace_given_through_a_symlink(tmp_path):
    from rocm_audit.outcome import CommandOutcome
    from rocm_audit.output.github import render_github

    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    finding = make_finding("DUP001", real / "a.so", "m", related=[real / "lib" / "c.so"])
    outside = make_finding("ARCH001", tmp_path / "realx" / "b.so", "m")
    text = render_github(CommandOutcome(command="x", findings=[finding, outside]), str(tmp_path / "link"))
    fields = [annotation_fields(line) for line in text.splitlines()]
    files = [properties["file"] for _, properties, _ in fields]
    assert files == ["a.so", str(tmp_path / "realx" / "b.so")]  # a sibling with the same prefix stays absolute
    assert fields[0][2] == "m\nrelated: lib/c.so"


def test_summary_counts_severities_families_and_suppressions_by_source():
    findings = [
        make_finding("DUP001", "/a", "m"),
        make_finding("DUP002", "/b", "m"),
        make_finding("ARCH001", "/c", "m", severity=Severity.WARNING),
        make_finding("PRUNE001", "/d", "m", severity=Severity.INFO),
    ]
    suppressed = [
        {"rule": "DUP001", "path": "/e", "reason": "r", "source": "rules.toml:6"},
        {"rule": "DUP001", "path": "/f", "reason": "r", "source": "rules.toml:6"},
        {"rule": "ARCH001", "path": "/g", "reason": "known", "source": "baseline:base.json"},
    ]
    report = build_report("check", findings, suppressed=suppressed, sections={"summary": {"checks": ["dedup"]}})
    check_summary(report)
    summary = report["summary"]
    assert summary["checks"] == ["dedup"]
    assert summary["by_family"]["PRUNE"] == {"total": 1, "error": 0, "warning": 0, "info": 1}
    assert summary["suppressed"]["by_source"] == [
        {"source": "baseline:base.json", "kind": "baseline", "count": 1},
        {"source": "rules.toml:6", "kind": "rules", "count": 2},
    ]
    assert (summary["suppressed"]["rules"], summary["suppressed"]["baseline"]) == (2, 1)


def test_summary_counts_what_a_rules_file_suppressed(sdk, run_cli, tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text('[[ignore]]\nrule = "DUP001"\npath = "*"\nreason = "known"\n')
    report = run_cli("dedup", "--check", "-p", str(sdk.site), "--rules", str(rules), "--format", "json").report
    assert report["summary"]["suppressed"]["total"] >= 1  # run_cli checked every count (check_summary)
    assert report["summary"]["suppressed"]["by_source"][0]["source"].startswith(f"{rules}:")


@settings(max_examples=200, deadline=None)
@given(
    names=st.lists(st.binary(min_size=1, max_size=12).filter(lambda b: b"\0" not in b), min_size=1, max_size=4),
    layout=st.sampled_from([None, 2]),
)
def test_every_name_round_trips_through_to_json(names, layout):
    """Any bytes a file name can hold: the JSON is UTF-8 and each path's exact bytes come back."""
    decoded = [os.fsdecode(n) for n in names]
    document = {"path": decoded[0], "paths": decoded, "records": [{"path": d} for d in decoded]}
    text = to_json(document, indent=layout)
    back = json.loads(text.encode("utf-8"))

    def exact(record: dict, key: str) -> list[bytes]:
        values = record[key] if isinstance(record[key], list) else [record[key]]
        raw = record.get(key + "_bytes_b64")
        raws = raw if isinstance(raw, list) else [raw] * len(values)
        return [base64.b64decode(r) if r is not None else v.encode("utf-8") for v, r in zip(values, raws, strict=True)]

    assert exact(back, "path") == names[:1]
    assert exact(back, "paths") == names
    assert [exact(r, "path")[0] for r in back["records"]] == names


def test_summary_counts_what_a_baseline_suppressed(sdk, run_cli, tmp_path):
    baseline = tmp_path / "baseline.json"
    site = str(sdk.site)
    first = run_cli("dedup", "--check", "-p", site, "--write-baseline", str(baseline), "--format", "json").report
    assert first["findings"]
    again = run_cli("dedup", "--check", "-p", site, "--baseline", str(baseline), "--format", "json").report
    suppressed = again["summary"]["suppressed"]  # run_cli checked every count (check_summary)
    assert again["findings"] == [] and suppressed["baseline"] == len(first["findings"]) == suppressed["total"]
    assert suppressed["by_source"] == [
        {"source": f"baseline:{baseline}", "kind": "baseline", "count": len(first["findings"])}
    ]


def test_a_group_of_missing_libraries_counts_the_libraries_it_does_not_name():
    """Sixteen files that miss twenty libraries between them: the four most missed are named, the
    rest counted as libraries (not "and 16 more" beside "16 files", which reads as files)."""
    from rocm_audit.output.layout import PathView
    from rocm_audit.output.text import finding_lines

    names = [f"libmissing{n:02}.so" for n in range(20)]
    group = [
        make_finding(
            "POST002",
            f"/site/pkg/ext{i:02}.so",
            "needs ROCm libraries that no search path finds",
            data={"missing_sonames": names[: 5 + i % 16] if i else names},
        )
        for i in range(16)
    ]
    said = " ".join(" ".join(finding_lines(group, PathView(["/site"]), False, 0)).split())
    assert "16 files: needs ROCm libraries that no search path finds - libmissing00.so (16 files)" in said
    assert said.count("(16 files)") == 4 and "and 16 other libraries" in said


def test_files_missing_rocm_libraries_are_one_text_entry_and_each_annotation_names_its_own(run_cli, tmp_path):
    """Three gcc libraries, each built against a different ROCm library the tree lacks: the text
    says the cause once and counts the names; a CI annotation is about one file and names its own."""
    from support.sdk_tree import build_library

    stubs, site = tmp_path / "stubs", tmp_path / "site-packages"
    wanted = {"liba.so": "libamdhip64.so.7", "libb.so": "libhipblas.so.3", "libc.so": "libamdhip64.so.7"}
    for soname in sorted(set(wanted.values())):
        build_library(stubs, soname.split(".")[0], soname)
    for library, needed in wanted.items():
        build_library(site / "pkg", library.split(".")[0], library, needed=(needed,), link_dir=stubs)
    text = " ".join(run_cli("check", "gfx942", "-p", str(site), "--skip", "llvm").stdout.split())
    cause = "needs ROCm libraries that no search path finds"
    assert f"POST002 3 files: {cause} - libamdhip64.so.7 (2 files), libhipblas.so.3 (1 file)" in text
    # The count line counts findings; the entries above group them: it says how many there are.
    assert text.endswith("check: 0 errors, 3 warnings, 0 info (in 1 entry above)")
    annotations = run_cli("check", "gfx942", "-p", str(site), "--skip", "llvm", "--format", "github").stdout
    said = {line.split("::")[-1] for line in annotations.splitlines() if "title=POST002" in line}
    assert said == {f"{cause}: libamdhip64.so.7", f"{cause}: libhipblas.so.3"}


def test_findings_of_one_file_and_rule_are_ordered_by_their_place_and_told_apart():
    """Three old code objects in one library's .data: listed by offset in every format (0x660
    before 0x3f80, not as text), each with a fingerprint of its own for a baseline."""
    from rocm_audit.outcome import CommandOutcome
    from rocm_audit.output.text import render_text

    offsets = [0x3F80, 0x660, 0x7BC0]
    findings = [
        make_finding("ARCH006", "/s/libhsa.so", f".data+{o:#x}: EF_AMDGPU_MACH 0x0", data={"offset": o, "mach": 0})
        for o in offsets
    ]
    from rocm_audit.audit.attribution import fingerprints

    report = build_report("check", findings)
    assert [f["data"]["offset"] for f in report["findings"]] == sorted(offsets)
    assert len(set(fingerprints(findings, ["/s"]))) == 3  # the rule's fingerprint names the offset
    text = render_text(CommandOutcome(command="check", findings=findings))
    said = [line.split(": ")[1] for line in text.splitlines() if line.startswith("INFO ARCH006")]
    assert said == [".data+0x660", ".data+0x3f80", ".data+0x7bc0"]
    # With one cause (old code objects), the text says it once for the file and lists the places.
    cause = "old code objects (V2 or older) name their GPU in a note, not in the ELF header; not judged"
    same = [
        make_finding(
            "ARCH006",
            "/s/libhsa.so",
            f".data+{o:#x}: an old code object",
            data={"offset": o, "location": f".data+{o:#x}", "cause": cause},
        )
        for o in offsets
    ]
    lines = render_text(CommandOutcome(command="check", findings=same, roots=["/s"])).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("INFO ARCH006"))
    assert sum(line.startswith("INFO ARCH006") for line in lines) == 1
    assert " ".join(" ".join(lines[start : start + 2]).split()) == f"INFO ARCH006 libhsa.so (3 places): {cause}"
    assert lines[start + 2] == "    .data+0x660, .data+0x3f80, .data+0x7bc0"
    from rocm_audit.output.markdown import render_markdown

    summary = render_markdown(CommandOutcome(command="check", findings=same, roots=["/s"]))
    assert "ARCH006 libhsa.so (3 places: .data+0x660, .data+0x3f80, .data+0x7bc0): old code objects" in summary


def test_github_annotations_come_errors_first_as_in_the_text():
    from rocm_audit.outcome import CommandOutcome
    from rocm_audit.output.github import render_github

    findings = [
        make_finding("ARCH006", "/s/a.so", "old", data={"offset": 1}),
        make_finding("DUP001", "/s/b.so", "copy"),
        make_finding("POST002", "/s/a.so", "needs x"),
    ]
    said = [
        line.split(" ", 1)[0] for line in render_github(CommandOutcome(command="check", findings=findings)).splitlines()
    ]
    assert said == ["::error", "::warning", "::notice"]
