"""Renderers of a command outcome for machines: SARIF 2.1.0, JUnit XML, GitHub Actions annotations.

Text lives in ``rocm_audit.output.text`` and JSON in ``rocm_audit.output.report``. Every renderer is a pure
function of the outcome (findings already filtered through the policy) and returns a string.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rocm_audit.audit.check import CHECKS  # the checks --skip can leave out

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


# Which check a rule belongs to, by its id's prefix (rules/*.toml): check and image name the checks
# that ran (summary.checks), and `--skip` names them too.
CHECK_OF_PREFIX = {
    "DUP": "dedup",
    "ARCH": "verify-arch",
    "LLVM": "llvm",
    "POST": "post-build",
    "PRUNE": "prune",
    "IMG": "image",
    "SCAN": "scan",
    "CHK": "check",
}


def check_of(rule: str) -> str:
    """The check a rule belongs to: ``llvm`` for ``LLVM002``."""
    prefix = rule_family(rule)
    return CHECK_OF_PREFIX.get(prefix, prefix.lower())


def evaluated(rule_commands: tuple[str, ...], rule: str, command: str, sections: Mapping[str, Any]) -> bool:
    """Whether this run judged ``rule``: a command it is reported by ran in the mode that reports
    it (``llvm --probe`` only with probes), and under check or image its check was not left out."""
    ran = (sections.get("summary") or {}).get("checks")
    if command in ("check", "image") and ran is not None and check_of(rule) in CHECKS and check_of(rule) not in ran:
        return False
    return any(
        name == command and all(any(key in sections for key in _MODE_SECTIONS.get(flag, ())) for flag in flags)
        for name, *flags in (entry.split() for entry in rule_commands)
    )


# The report section a run has only in the mode a rule's ``reported_by`` flag names.
_MODE_SECTIONS = {
    "--probe": ("probe_interpreter",),
    "--revert": ("revert", "prune_revert"),
    "--targets": ("code_objects",),
}
