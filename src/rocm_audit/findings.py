"""Findings: data with a stable rule id, rendered by reporters (docs/style.md 4)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rocm_audit.rulebook.catalogue import default_severity
from rocm_audit.severity import Severity

__all__ = ["Finding", "Severity", "make_finding", "sorted_findings"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem (or notable fact) about one file, under one rule."""

    rule: str
    severity: Severity
    path: str
    message: str
    related_paths: tuple[str, ...] = ()
    data: Mapping[str, Any] = field(default_factory=dict)

    def sort_key(self) -> tuple[str, str, str, tuple[str, ...]]:
        return (self.path, self.rule, self.message, self.related_paths)


def make_finding(
    rule: str,
    path: object,
    message: str,
    *,
    related: Iterable[object] = (),
    data: Mapping[str, Any] | None = None,
    severity: Severity | None = None,
) -> Finding:
    """Build a finding whose severity defaults to the rule's default in the shipped catalogue."""
    if severity is None:
        severity = default_severity(rule)
    return Finding(
        rule=rule,
        severity=severity,
        path=str(path),
        message=message,
        related_paths=tuple(sorted(str(p) for p in related)),
        data=dict(data or {}),
    )


def sorted_findings(findings: Iterable[Finding]) -> list[Finding]:
    return sorted(findings, key=Finding.sort_key)
