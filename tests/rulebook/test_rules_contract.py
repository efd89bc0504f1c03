"""The rule catalogue is a contract: every rule id the code can emit is defined, once, in rules/."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import rocm_audit
from rocm_audit.rulebook.catalogue import shipped_catalogue

RULE_ID = re.compile(r"^[A-Z]{3,5}[0-9]{3}$")


def rule_ids_in_source() -> dict[str, str]:
    found = {}
    for path in Path(rocm_audit.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and RULE_ID.match(node.value):
                found.setdefault(node.value, str(path))
    return found


def test_every_rule_id_used_in_the_code_is_in_the_catalogue():
    catalogue = shipped_catalogue()
    missing = {rule: where for rule, where in rule_ids_in_source().items() if rule not in catalogue.rules}
    assert not missing, f"rule ids used but not defined in rules/*.toml: {missing}"


def test_every_rule_has_text_a_user_can_act_on():
    for rule in shipped_catalogue().rules.values():
        assert RULE_ID.match(rule.id)
        assert len(rule.title) > 10 and len(rule.rationale) > 30 and len(rule.fix) > 10, rule.id


def test_the_dedup_policy_puts_runtime_packages_before_devel():
    order = shipped_catalogue().policy["dedup"]["owner_order"]
    assert order.index("_rocm_sdk_core") < order.index("_rocm_sdk_devel")
    assert order.index("_rocm_sdk_libraries*") < order.index("_rocm_sdk_devel")
    assert shipped_catalogue().policy["dedup"]["kinds"] == ["shared-library"]


def test_only_defects_in_shipped_files_send_users_upstream():
    """'report to URL' follows a finding about what a distribution shipped; rocm-audit's own actions
    and notices (prune, dedup, image reading, unreadable paths) and the user's installs never."""
    rules = shipped_catalogue().rules
    upstream = {rule_id for rule_id, rule in rules.items() if rule.report_upstream}
    assert {"ARCH001", "POST001", "POST006", "LLVM003", "KPACK001", "SCAN002"} <= upstream
    never = {r for r in rules if r.startswith(("PRUNE", "DUP", "IMG"))} | {"SCAN001", "SCAN004", "POST003", "KPACK004"}
    assert not never & upstream, sorted(never & upstream)


def test_every_severity_a_verdict_can_change_is_said_in_the_catalogue():
    """A finding of an LLVM rule that is an error becomes a warning when it needs a library nothing
    loads (llvm/optin.py), and LLVM002 becomes an error when an order aborts: `explain` says when."""
    import pytest

    from rocm_audit.errors import ConfigError
    from rocm_audit.rulebook.catalogue import _parse_rule
    from rocm_audit.severity import Severity

    rules = shipped_catalogue().rules
    softened = {r for r, rule in rules.items() if r.startswith("LLVM") and rule.severity is Severity.ERROR}
    assert softened | {"LLVM002"} == {r for r, rule in rules.items() if rule.graded}
    with pytest.raises(ConfigError, match="graded must be a string"):
        _parse_rule("X001", {"title": "t", "severity": "info", "rationale": "r", "fix": "f", "graded": 1}, "x.toml")
