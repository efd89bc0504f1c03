"""Reports read back by their real consumers (sarif-tools, junitparser), GitHub annotations,
and the --rules policy file: overrides, ignores with reasons, and exact errors for bad files."""

from __future__ import annotations

import json
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from junitparser import Failure, JUnitXml, Skipped
from sarif import loader as sarif_loader


def dedup_check(run_cli, sdk, *extra: str, expect: int | None = None):
    return run_cli("dedup", "--check", "-p", str(sdk.site), *extra, expect=expect)


def test_sarif_is_read_back_by_sarif_tools(sdk, run_cli, tmp_path):
    out = tmp_path / "report.sarif"
    dedup_check(run_cli, sdk, "--format", "sarif", "-o", str(out), expect=1)
    reference = dedup_check(run_cli, sdk, "--format", "json", expect=1).report
    document = json.loads(out.read_text())
    assert document["version"] == "2.1.0"
    run = document["runs"][0]
    descriptor_ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert {"DUP001", "DUP002", "SCAN001"} <= set(descriptor_ids)
    for result in run["results"]:
        assert descriptor_ids[result["ruleIndex"]] == result["ruleId"]

    sarif_file = sarif_loader.load_sarif_file(str(out))
    issues = sarif_file.get_report()
    expected_errors = sum(1 for f in reference["findings"] if f["severity"] == "error")
    expected_warnings = sum(1 for f in reference["findings"] if f["severity"] == "warning")
    assert issues.get_issue_count_for_severity("error") == expected_errors == 5
    assert issues.get_issue_count_for_severity("warning") == expected_warnings == 1
    assert {r["Code"] for r in sarif_file.get_records()} == {"DUP001", "DUP002"}
    locations = sorted(r["Location"] for r in sarif_file.get_records())
    assert locations == sorted(f["path"].replace(str(sdk.site) + "/", "") for f in reference["findings"])
    assert run["originalUriBaseIds"]["INPUT1"]["uri"] == sdk.site.as_uri() + "/"


def test_junit_has_one_case_per_rule_and_file_and_fails_at_the_threshold(sdk, run_cli, tmp_path):
    out = tmp_path / "report.xml"
    dedup_check(run_cli, sdk, "--format", "junit", "-o", str(out), expect=1)
    xml = JUnitXml.fromfile(str(out))
    cases = {(case.classname, case.name): case for suite in xml for case in suite}
    failing = {key for key, case in cases.items() if any(isinstance(r, Failure) for r in case.result)}
    assert {key[0] for key in failing} == {"DUP001"}
    assert len(failing) == 5
    hard = cases[("DUP002", str(sdk.core / "lib" / "libhard.so.1"))]
    assert not hard.result and "hardlinks" in hard.system_out  # a warning: below --fail-on error
    assert ("DUP006", "no findings") in cases
    dedup_check(run_cli, sdk, "--format", "junit", "-o", str(out), "--fail-on", "warning", expect=1)
    xml = JUnitXml.fromfile(str(out))
    failing = {case.classname for suite in xml for case in suite if any(isinstance(r, Failure) for r in case.result)}
    assert failing == {"DUP001", "DUP002"}
    # A rule this run could not judge (a revert's) is skipped, never a green "no findings".
    skipped = {case.classname for suite in xml for case in suite if any(isinstance(r, Skipped) for r in case.result)}
    assert "DUP007" in skipped and not skipped & {"DUP001", "DUP002", "DUP006"}
    assert xml.skipped == len(skipped) > 0


def test_github_annotations_escape_properties_and_messages(sdk, run_cli):
    # Two copies of a truncated ELF: dedup classifies the pair and reports one SCAN002 warning.
    odd = [sdk.devel / "lib" / "weird,name:1.so", sdk.devel / "lib" / "weird,name:2.so"]
    for path in odd:
        path.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 9)
    result = dedup_check(run_cli, sdk, "--format", "github", expect=1)
    lines = result.stdout.splitlines()
    assert len(lines) == 7
    assert sum(line.startswith("::error file=") for line in lines) == 5
    weird = [line for line in lines if "weird" in line]
    assert len(weird) == 1 and weird[0] in {
        f"::warning file={str(p).replace(',', '%2C').replace(':', '%3A')},title=SCAN002::"
        "file ends inside the ELF identification"
        for p in odd
    }


def write_rules(tmp_path, text: str):
    path = tmp_path / "rules.toml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_rules_file_changes_severities_and_ignores_with_reasons(sdk, run_cli, tmp_path):
    rules = write_rules(
        tmp_path,
        """
        [rules.DUP002]
        severity = "error"

        [[ignore]]
        rule = "DUP001"
        path = "*/_rocm_sdk_libraries_gfx94X_dcgpu/*"
        reason = "rocblas is replaced at deploy time"
    """,
    )
    result = dedup_check(run_cli, sdk, "--rules", rules, "--format", "json", expect=1)
    severities = {f["rule"]: f["severity"] for f in result.report["findings"]}
    assert severities["DUP002"] == "error"
    assert [s["path"] for s in result.report["suppressed"]] == [str(sdk.libraries / "lib" / "librocblas.so.5")]
    assert result.report["suppressed"][0]["reason"] == "rocblas is replaced at deploy time"
    assert result.report["suppressed"][0]["source"] == f"{rules}:6"
    listing = run_cli("rules", "--rules", rules, "--format", "json", expect=0).report
    dup002 = next(r for r in listing["rules"] if r["id"] == "DUP002")
    assert dup002["severity"] == "error" and dup002["severity_source"] == f"{rules}:2"
    assert listing["ignores"][0]["rule"] == "DUP001"


def test_policy_setting_changes_the_keeper_and_is_listed_with_its_source(sdk, run_cli, tmp_path):
    rules = write_rules(
        tmp_path,
        """
        [policy.dedup]
        owner_order = ["_rocm_sdk_devel", "_rocm_sdk_core", "_rocm_sdk_libraries*"]
    """,
    )
    result = run_cli("dedup", "--dry-run", "-p", str(sdk.site), "--rules", rules, "--format", "json", expect=0)
    assert all("/_rocm_sdk_devel/" in g["keeper"] for g in result.report["dedup"]["groups"])
    listing = run_cli("rules", "--rules", rules, "--format", "json", expect=0).report
    owner = next(s for s in listing["policy"] if s["key"] == "owner_order")
    assert owner["source"] == f"{rules}:3" and owner["value"][0] == "_rocm_sdk_devel"


@pytest.mark.parametrize(
    "text,where,reason",
    [
        ('[rules.NOPE001]\nseverity = "error"\n', ":1 [rules.NOPE001]", "no such rule"),
        ('[rules.DUP001]\nseverity = "fatal"\n', ":2 [rules.DUP001.severity]", "severity must be one of"),
        ('[[ignore]]\nrule = "DUP001"\n', ":2 [ignore[0].reason]", "every ignore needs a non-empty reason"),
        ('[policy.dedup]\nowner_order = "core"\n', ":2 [policy.dedup.owner_order]", "must be a list of strings"),
        ('[policy.dedup]\nkinds = ["executable"]\n', ":2 [policy.dedup.kinds]", "executables are never linked"),
        ("[policy.nope]\nx = 1\n", ":1 [policy.nope]", "unknown policy area"),
        ('[rules.DUP001\nseverity = "error"\n', ":1", "not valid TOML"),
        ("a = " + "[" * 100_000, "", "nested too deeply"),
    ],
)
def test_bad_rules_files_are_usage_errors_naming_file_line_and_key(sdk, run_cli, tmp_path, text, where, reason):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    result = run_cli("dedup", "--check", "-p", str(sdk.site), "--rules", str(path), expect=2)
    assert f"rocm-audit: error: {path}{where}: " in result.output
    assert reason in result.output
    assert "Traceback" not in result.output


def test_policy_targets_and_extra_targets_reach_verify_arch(tmp_path, run_cli, monkeypatch):
    from support.toolchain import gfx942_code_object

    monkeypatch.delenv("GPU_ARCH", raising=False)
    gfx942_code_object(tmp_path / "pkg")
    rules = write_rules(
        tmp_path,
        """
        [policy.verify-arch]
        targets = ["gfx942"]
    """,
    )
    result = run_cli("verify-arch", "-p", str(tmp_path / "pkg"), "--rules", rules, "--format", "json", expect=0)
    assert [t["target"] for t in result.report["targets"]] == ["gfx942"]
    extra = write_rules(
        tmp_path,
        """
        [policy.verify-arch]
        extra_targets = ["gfx950"]
    """,
    )
    result = run_cli(
        "verify-arch", "gfx942", "-p", str(tmp_path / "pkg"), "--rules", extra, "--format", "json", expect=1
    )
    assert [t["target"] for t in result.report["targets"]] == ["gfx942", "gfx950"]
    assert "extra_targets" in result.report["targets_source"]


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(document=_json_values, records_at=st.integers(0, 4))
def test_laid_out_json_is_the_same_document_as_the_compact_one(document, records_at):
    """to_json lays out the top levels itself and leaves the rest to the C encoder: whatever the
    layout, a reader must get exactly the compact document (lone surrogates included)."""
    from rocm_audit.output.report import to_json

    laid_out = to_json(document, records_at=records_at)
    assert json.loads(laid_out) == json.loads(to_json(document, indent=None))
    laid_out.encode("utf-8")  # always valid UTF-8


def test_laid_out_json_has_one_finding_per_line(sdk, run_cli):
    report = run_cli("dedup", "--check", "-p", str(sdk.site), "--format", "json", expect=1)
    lines = report.stdout.splitlines()
    assert lines[0] == "{" and lines[-1] == "}"
    findings = report.report["findings"]
    assert findings
    for finding in findings:  # each finding is one record: one line, two levels in
        assert "    " + json.dumps(finding, separators=(", ", ": "), ensure_ascii=False) in [
            line.rstrip(",") for line in lines
        ]


def test_checks_left_out_are_skipped_in_junit_and_said_in_markdown(sdk, run_cli, tmp_path):
    """`--skip llvm`: JUnit shows no green "no findings" for rules nobody judged, and the Markdown
    summary tells a clean check (a 0 row) from one left out ("skipped")."""
    out = tmp_path / "report.xml"
    run_cli("check", "gfx942", "-p", str(sdk.site), "--skip", "llvm", "--format", "junit", "-o", str(out))
    cases = {case.classname: case for suite in JUnitXml.fromfile(str(out)) for case in suite}
    assert any(isinstance(r, Skipped) for r in cases["LLVM001"].result)
    assert not any(isinstance(r, Skipped) for r in cases["ARCH002"].result)  # verify-arch ran: a real pass
    summary = run_cli("check", "gfx942", "-p", str(sdk.site), "--skip", "llvm", "--format", "markdown").stdout
    assert "| llvm | skipped |  |  |" in summary and "| verify-arch | 0 | 0 | 0 |" in summary
