"""Findings: data with a stable rule id, rendered by reporters (docs/style.md 4)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rocm_audit.rulebook.catalogue import default_severity
from rocm_audit.severity import Severity

__all__ = [
    "Finding",
    "Severity",
    "ShippedBy",
    "cause_groups",
    "cause_key",
    "cause_text",
    "make_finding",
    "sorted_findings",
]


@dataclass(frozen=True, slots=True)
class ShippedBy:
    """The installed distribution whose RECORD lists a file (with a hash or not): the file came from its
    wheel, so a problem in it is fixed by that project, not by the user who installed it."""

    name: str  # as its METADATA spells it
    version: str
    report_to: str  # its issue tracker or home page (METADATA Project-URL / Home-page); "" if none


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem (or notable fact) about one file, under one rule.

    ``message`` is one line saying what is wrong; ``detail`` (optional) says how it comes about and
    what to do, shown by ``-v`` and in machine reports."""

    rule: str
    severity: Severity
    path: str
    message: str
    related_paths: tuple[str, ...] = ()
    data: Mapping[str, Any] = field(default_factory=dict)
    detail: str = ""
    shipped_by: ShippedBy | None = None
    fingerprint: str = ""  # the baseline key, filled in when the report is made (audit/attribution.py)

    def sort_key(self) -> tuple[str, str, int, str, tuple[str, ...]]:
        """By file, rule, then place in the file (``data["offset"]``: 0x660 before 0x3f80), message."""
        offset = self.data.get("offset")
        place = offset if isinstance(offset, int) and not isinstance(offset, bool) else -1
        return (self.path, self.rule, place, self.message, self.related_paths)


def make_finding(
    rule: str,
    path: object,
    message: str,
    *,
    related: Iterable[object] = (),
    data: Mapping[str, Any] | None = None,
    severity: Severity | None = None,
    detail: str = "",
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
        detail=detail,
    )


def sorted_findings(findings: Iterable[Finding]) -> list[Finding]:
    return sorted(findings, key=Finding.sort_key)


def cause_text(one: Finding) -> str:
    """What a group of findings says once: ``data["cause"]`` where a rule words its cause apart
    from the message (POST002: "needs ROCm libraries that no search path finds", while each message
    names its own libraries, as a CI annotation of that one file must), else the message."""
    cause = one.data.get("cause")
    return cause if isinstance(cause, str) and cause else one.message


def place_in_file(one: Finding) -> str:
    """Where in its file a finding is, for a group of one file's findings with one cause: its
    location (``.data+0x660``), else its offset, else "?"."""
    where, offset = one.data.get("location"), one.data.get("offset")
    return where if isinstance(where, str) else f"offset {offset:#x}" if isinstance(offset, int) else "?"


def cause_key(one: Finding) -> tuple[str, str, str, tuple[str, ...]]:
    """Findings with one rule and one cause share this key: the same rule, severity and cause
    (a message never names the finding's own file). A finding that names other files (a duplicate
    group, a clash pair) is about its own set of files and is a group of its own."""
    own = (one.path, *one.related_paths) if one.related_paths else ()
    return (one.rule, one.severity.value, cause_text(one), own)


def cause_groups(findings: Iterable[Finding]) -> list[list[Finding]]:
    """The findings grouped by ``cause_key``: errors first, then warnings, then info; within a
    severity by rule, then by the first path; members sorted by path."""
    groups: dict[tuple[str, str, str, tuple[str, ...]], list[Finding]] = {}
    for one in sorted_findings(findings):
        groups.setdefault(cause_key(one), []).append(one)
    return sorted(groups.values(), key=lambda g: (-g[0].severity.rank, g[0].rule, g[0].sort_key()))
