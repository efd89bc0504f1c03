"""The rule catalogue and default policy shipped in ``rocm_audit/rules/*.toml``.

Each TOML file holds ``[rules.<ID>]`` tables (title, severity, rationale, fix, optional params and
reported_by) and optionally ``[policy.<area>]`` tables; a top-level ``reported_by`` (the commands
that report the file's rules) applies to every rule that does not set its own. Files are merged in
name order; an id defined twice is an error.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from typing import Any

from rocm_audit.errors import ConfigError
from rocm_audit.severity import Severity

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

_RULE_KEYS = {
    "title",
    "severity",
    "graded",
    "rationale",
    "fix",
    "params",
    "fingerprint",
    "reported_by",
    "report_upstream",
}


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    title: str
    severity: Severity
    rationale: str
    fix: str
    params: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    # Finding data fields that, with the rule and the file, say which problem a finding is: a
    # baseline entry matches a later finding with the same values (audit/baseline.py).
    fingerprint: tuple[str, ...] = ()
    reported_by: tuple[str, ...] = ()  # the commands that report it: "dedup", "llvm --probe"
    # Whether a finding describes a defect in what a distribution ships, so that the text report
    # names where its users report problems ("report to URL"): not for rocm-audit's own actions
    # (a prune's notices), the state of this machine (an unreadable path) or the user's choices.
    report_upstream: bool = True
    # When a finding of the rule takes another severity than ``severity`` (the verdict decides it:
    # an LLVM clash shown to abort is an error), in words for `explain`; "" when it never does.
    graded: str = ""


@dataclass(frozen=True, slots=True)
class Catalogue:
    rules: dict[str, Rule]
    policy: dict[str, dict[str, Any]]


def _command_list(value: object, source: str, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
        raise ConfigError(source, "reported_by must be a non-empty array of command names", key=key)
    return tuple(value)


def _flag(table: dict[str, Any], key: str, default: bool, source: str, where: str) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(source, f"{key} must be true or false", key=f"{where}{key}")
    return value


def _parse_rule(
    rule_id: str, table: object, source: str, reported_by: tuple[str, ...] = (), report_upstream: bool = True
) -> Rule:
    if not isinstance(table, dict):
        raise ConfigError(source, "a rule must be a table", key=f"rules.{rule_id}")
    unknown = set(table) - _RULE_KEYS
    if unknown:
        raise ConfigError(source, f"unknown keys {sorted(unknown)}", key=f"rules.{rule_id}")
    for key in ("title", "severity", "rationale", "fix"):
        if not isinstance(table.get(key), str) or not table[key]:
            raise ConfigError(source, "missing or empty string", key=f"rules.{rule_id}.{key}")
    try:
        severity = Severity(table["severity"])
    except ValueError:
        raise ConfigError(
            source,
            f"severity must be one of {[s.value for s in Severity]}",
            key=f"rules.{rule_id}.severity",
        ) from None
    params = table.get("params", {})
    if not isinstance(params, dict):
        raise ConfigError(source, "params must be a table", key=f"rules.{rule_id}.params")
    graded = table.get("graded", "")
    if not isinstance(graded, str):
        raise ConfigError(source, "graded must be a string", key=f"rules.{rule_id}.graded")
    fingerprint = table.get("fingerprint", [])
    if not isinstance(fingerprint, list) or not all(isinstance(f, str) for f in fingerprint):
        raise ConfigError(source, "fingerprint must be a list of data field names", key=f"rules.{rule_id}.fingerprint")
    return Rule(
        fingerprint=tuple(fingerprint),
        id=rule_id,
        title=table["title"],
        severity=severity,
        rationale=table["rationale"],
        fix=table["fix"],
        params=dict(params),
        source=source,
        reported_by=(
            _command_list(table["reported_by"], source, f"rules.{rule_id}.reported_by")
            if "reported_by" in table
            else reported_by
        ),
        report_upstream=_flag(table, "report_upstream", report_upstream, source, f"rules.{rule_id}."),
        graded=graded,
    )


def _rules_folder() -> Any:
    """The package's rules directory. A pip install unpacks the package, so the directory is read
    as it is; importlib.resources (whose import pulls in zipfile and tempfile: 3-5 ms of every run)
    only serves a package imported from a zip archive."""
    from pathlib import Path

    folder = Path(__file__).parent.parent / "rules"  # rocm_audit/rules, beside this folder
    if folder.is_dir():
        return folder
    from importlib import resources

    return resources.files("rocm_audit") / "rules"


@functools.lru_cache(maxsize=1)
def shipped_catalogue() -> Catalogue:
    """Load every ``rules/*.toml`` shipped in the package. Raises ConfigError on a bad file."""
    rules: dict[str, Rule] = {}
    policy: dict[str, dict[str, Any]] = {}
    folder = _rules_folder()
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".toml"):
            continue
        source = f"rocm_audit/rules/{entry.name}"
        try:
            document = tomllib.loads(entry.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(source, str(exc)) from None
        file_reported_by = (
            _command_list(document["reported_by"], source, "reported_by") if "reported_by" in document else ()
        )
        file_upstream = _flag(document, "report_upstream", True, source, "")
        for rule_id, table in document.get("rules", {}).items():
            if rule_id in rules:
                raise ConfigError(source, "rule defined twice", key=f"rules.{rule_id}")
            rules[rule_id] = _parse_rule(rule_id, table, source, file_reported_by, file_upstream)
        for area, table in document.get("policy", {}).items():
            policy.setdefault(area, {}).update(table)
    return Catalogue(rules=rules, policy=policy)


def rule(rule_id: str) -> Rule:
    try:
        return shipped_catalogue().rules[rule_id]
    except KeyError:
        raise KeyError(f"rule {rule_id} is not in the shipped catalogue") from None


def default_severity(rule_id: str) -> Severity:
    return rule(rule_id).severity


def reports_upstream(rule_id: str) -> bool:
    """Whether the text report names where the shipper of a finding's file takes reports."""
    return rule(rule_id).report_upstream
