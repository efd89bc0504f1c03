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


GROUPED_LIST_LIMIT = 20


def group_per_file(findings: Iterable[Finding]) -> list[Finding]:
    """One finding per (file, rule): people read one line per library. Findings that name other
    files (``related_paths``: a duplicate group, a clash pair) stay as they are, since each is
    about its own set of files. The merged finding keeps the first one's data (the schema-v1
    fields) and lists every original message and data under ``data["grouped"]``."""
    ordered = sorted_findings(findings)
    buckets: dict[tuple[str, str], list[Finding]] = {}
    kept: list[Finding | tuple[str, str]] = []
    for one in ordered:
        if one.related_paths:
            kept.append(one)
            continue
        key = (one.path, one.rule)
        if key not in buckets:
            buckets[key] = []
            kept.append(key)
        buckets[key].append(one)
    result: list[Finding] = []
    for entry in kept:
        if isinstance(entry, Finding):
            result.append(entry)
            continue
        same = buckets[entry]
        if len(same) == 1:
            result.append(same[0])
            continue
        shown = "; ".join(f.message for f in same[:GROUPED_LIST_LIMIT])
        more = f"; ... and {len(same) - GROUPED_LIST_LIMIT} more" if len(same) > GROUPED_LIST_LIMIT else ""
        result.append(
            Finding(
                rule=same[0].rule,
                severity=max((f.severity for f in same), key=lambda s: s.rank),
                path=same[0].path,
                message=f"{len(same)} problems: {shown}{more}",
                data={**same[0].data, "grouped": [{"message": f.message, "data": dict(f.data)} for f in same]},
            )
        )
    return result
