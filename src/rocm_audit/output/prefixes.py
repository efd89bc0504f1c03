"""Renderers of a command outcome for machines: SARIF 2.1.0, JUnit XML, GitHub Actions annotations.

Text lives in ``rocm_audit.output.text`` and JSON in ``rocm_audit.output.report``. Every renderer is a pure
function of the outcome (findings already filtered through the policy) and returns a string.
"""

from __future__ import annotations

# Which rule families each command can emit, so JUnit lists a passing case for a quiet rule.
RULE_PREFIXES_BY_COMMAND = {
    "dedup": ("SCAN", "DUP"),
    "verify-arch": ("SCAN", "ARCH"),
    "scan": ("SCAN", "ARCH"),
    "llvm": ("SCAN", "LLVM"),
    "check": ("SCAN", "DUP", "ARCH", "LLVM", "POST"),
    "image": ("SCAN", "DUP", "ARCH", "LLVM", "POST", "IMG"),
}


def rule_prefixes(command: str) -> tuple[str, ...]:
    return RULE_PREFIXES_BY_COMMAND.get(command, ("",))


def rule_family(rule: str) -> str:
    """The family of a rule id: its letters (``DUP`` of ``DUP001``), one per rules/*.toml area."""
    return rule.rstrip("0123456789")
