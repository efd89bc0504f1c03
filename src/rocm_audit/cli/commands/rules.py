"""`rocm-audit rules`: the rules and policy settings in force, and where each came from."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rocm_audit.cli.common import FailOn, Report, reporting_command

if TYPE_CHECKING:
    from rocm_audit.outcome import CommandOutcome
    from rocm_audit.report_types import IgnoreRecord, PolicySetting, RuleRecord


@reporting_command(shared=("rules", "fmt", "output", "verbose"), fail_on=FailOn.never)
def command(report: Report) -> CommandOutcome:
    """List the rules in force and the policy settings, with the file each came from.

    Each rule shows its id, severity and title; `rocm-audit explain RULE` tells what one means,
    why it matters and how to fix it. With --rules, the list is the one your rules files make.

    \b
    Examples:
      rocm-audit rules
      rocm-audit rules --rules ci-rules.toml --format json
      rocm-audit explain DUP001
    """
    from rocm_audit.outcome import CommandOutcome
    from rocm_audit.rulebook.policy import active_policy

    policy = active_policy()
    listed: list[RuleRecord] = []
    for rule in sorted(policy.rules.values(), key=lambda r: r.id):
        record: RuleRecord = {
            "id": rule.id,
            "title": rule.title,
            "severity": rule.severity.value,
            "severity_source": policy.severity_sources.get(rule.id, rule.source),
            "defined_in": rule.source,
            "rationale": rule.rationale,
            "fix": rule.fix,
        }
        if rule.graded and rule.id not in policy.severity_sources:  # a rules file's severity holds for all
            record["graded"] = rule.graded
        listed.append(record)
    settings: list[PolicySetting] = [
        {"area": area, "key": key, "value": value, "source": policy.setting_sources.get((area, key), "")}
        for area, table in sorted(policy.settings.items())
        for key, value in sorted(table.items())
    ]
    ignores: list[IgnoreRecord] = []
    for i in policy.ignores:
        ignore: IgnoreRecord = {"rule": i.rule, "path": i.path_glob, "reason": i.reason, "source": i.source}
        if i.distribution != "*":
            ignore["distribution"] = i.distribution
        ignores.append(ignore)
    return CommandOutcome(
        command="rules",
        findings=[],
        inputs=list(policy.files),
        sections={"rules": listed, "policy": settings, "ignores": ignores},
    )
