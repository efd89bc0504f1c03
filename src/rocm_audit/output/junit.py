"""JUnit XML: one test case per rule per file; failures for findings at or above the failing severity."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import defaultdict

from rocm_audit.findings import Finding, Severity
from rocm_audit.outcome import CommandOutcome
from rocm_audit.output.escape import display
from rocm_audit.output.prefixes import evaluated, rule_prefixes
from rocm_audit.rulebook.policy import active_policy


def render_junit(outcome: CommandOutcome, fail_on: Severity | None) -> str:
    policy = active_policy()
    by_rule_file: dict[tuple[str, str], list[Finding]] = defaultdict(list)
    for one in outcome.findings:
        by_rule_file[(one.rule, one.path)].append(one)
    prefixes = rule_prefixes(outcome.command)
    rules = sorted({r for r in policy.rules if r.startswith(prefixes)} | {rule for rule, _ in by_rule_file})
    suites = ET.Element("testsuites", name=f"rocm-audit {outcome.command}")
    total_tests = total_failures = total_skipped = 0
    for rule_id in rules:
        rule = policy.rules.get(rule_id)
        suite = ET.SubElement(suites, "testsuite", name=f"{rule_id} {rule.title if rule else ''}".strip())
        cases = sorted((path, found) for (rid, path), found in by_rule_file.items() if rid == rule_id)
        tests = failures = skipped = 0
        if not cases:
            case = ET.SubElement(suite, "testcase", classname=rule_id, name="no findings")
            tests = 1
            judged = rule is not None and evaluated(rule.reported_by, rule_id, outcome.command, outcome.sections)
            if not judged:  # a check left out, or a mode this run was not in: no pass to show
                ET.SubElement(case, "skipped", message="not judged by this run (a check left out or another mode)")
                case.set("name", "not judged")
                skipped = 1
        for path, found in cases:
            case = ET.SubElement(suite, "testcase", classname=rule_id, name=display(path))
            tests += 1
            failing = [f for f in found if fail_on is not None and f.severity >= fail_on]
            text = "\n".join(
                f"{f.severity.value}: {display(f.message)}"
                + "".join(f"\n  related: {display(p)}" for p in f.related_paths)
                for f in found
            )
            if failing:
                failures += 1
                failure = ET.SubElement(
                    case, "failure", message=display(failing[0].message), type=failing[0].severity.value
                )
                failure.text = text
            else:
                ET.SubElement(case, "system-out").text = text
        suite.set("tests", str(tests))
        suite.set("failures", str(failures))
        suite.set("errors", "0")
        suite.set("skipped", str(skipped))
        total_tests += tests
        total_failures += failures
        total_skipped += skipped
    suites.set("tests", str(total_tests))
    suites.set("failures", str(total_failures))
    suites.set("errors", "0")
    suites.set("skipped", str(total_skipped))
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
