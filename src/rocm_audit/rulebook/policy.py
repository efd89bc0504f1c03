"""The policy in force: the shipped catalogue plus a user's ``--rules FILE`` overrides.

A rules file may change a rule's severity, ignore findings (a reason is mandatory), and change
policy settings (extra required GPU targets, the dedup owner order, which kinds may be deduplicated).
Every setting remembers where it came from, for ``rocm-audit rules``. A bad file is a ConfigError
naming the file, line and key (exit code 2).
"""

from __future__ import annotations

import contextvars
import fnmatch
import re
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from rocm_audit.errors import ConfigError
from rocm_audit.findings import Finding, Severity
from rocm_audit.rulebook.catalogue import Catalogue, Rule, shipped_catalogue

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Policy keys a rules file may set, with a validator each: (description, check).
_STRING_LIST = ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) and x for x in v))
_KNOWN_POLICY: dict[str, dict[str, tuple[str, Any]]] = {
    "dedup": {
        "owner_order": _STRING_LIST,
        "tie_break": (
            "a list of soname-name/shortest-path/path-order",
            lambda v: isinstance(v, list) and set(v) <= {"soname-name", "shortest-path", "path-order"},
        ),
        "kinds": (
            "a list of shared-library/amdgpu-code-object/not-elf (executables are never linked)",
            lambda v: isinstance(v, list) and v and set(v) <= {"shared-library", "amdgpu-code-object", "not-elf"},
        ),
    },
    "verify-arch": {
        "targets": _STRING_LIST,
        "extra_targets": _STRING_LIST,
    },
    "prune": {
        # distributions prune leaves whole (as --keep-dist NAME): PEP 503 names or globs of them
        "keep_dist": _STRING_LIST,
    },
}


@dataclass(frozen=True, slots=True)
class Ignore:
    rule: str  # a rule id or a glob of them (LLVM0*)
    path_glob: str
    reason: str
    source: str
    distribution: str = "*"  # a glob of the shipping distribution's normalised name (PEP 503)

    def matches(self, one: Finding) -> bool:
        if not fnmatch.fnmatchcase(one.rule, self.rule) or not _path_matches(one.path, self.path_glob):
            return False
        if self.distribution == "*":
            return True
        shipper = one.shipped_by
        return shipper is not None and fnmatch.fnmatchcase(_normalized(shipper.name), self.distribution)


def _path_matches(path: str, glob: str) -> bool:
    """An absolute glob matches the whole path; a relative one (``triton/instrumentation/*``) matches
    from any directory down, as the paths of a report are shown relative to the audited root."""
    if glob.startswith(("/", "*")):
        return fnmatch.fnmatchcase(path, glob)
    return fnmatch.fnmatchcase(path, glob) or fnmatch.fnmatchcase(path, "*/" + glob)


def _normalized(name: str) -> str:
    """PEP 503 name normalisation (``Foo_Bar`` and ``foo-bar`` are one distribution)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(slots=True)
class Policy:
    catalogue: Catalogue
    rules: dict[str, Rule]
    settings: dict[str, dict[str, Any]]
    setting_sources: dict[tuple[str, str], str]
    severity_sources: dict[str, str]
    ignores: list[Ignore] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    def area(self, name: str) -> dict[str, Any]:
        return dict(self.settings.get(name, {}))

    def apply(self, findings: Iterable[Finding]) -> tuple[list[Finding], list[dict[str, str]]]:
        """Findings with overridden severities, minus ignored ones (returned with their reasons)."""
        kept: list[Finding] = []
        suppressed: list[dict[str, str]] = []
        for one in findings:
            ignore = next((i for i in self.ignores if i.matches(one)), None)
            if ignore is not None:
                suppressed.append(
                    {"rule": one.rule, "path": one.path, "reason": ignore.reason, "source": ignore.source}
                )
                continue
            rule = self.rules.get(one.rule)
            if rule is not None and one.rule in self.severity_sources and rule.severity is not one.severity:
                one = replace(one, severity=rule.severity)
            kept.append(one)
        suppressed.sort(key=lambda s: (s["path"], s["rule"]))
        return kept, suppressed


def shipped_policy() -> Policy:
    catalogue = shipped_catalogue()
    sources = {}
    for area, table in catalogue.policy.items():
        for key in table:
            sources[(area, key)] = _shipped_source(catalogue, area)
    return Policy(
        catalogue=catalogue,
        rules=dict(catalogue.rules),
        settings={k: dict(v) for k, v in catalogue.policy.items()},
        setting_sources=sources,
        severity_sources={},
    )


def _shipped_source(catalogue: Catalogue, area: str) -> str:
    for rule in catalogue.rules.values():
        if area.replace("-", "_") in rule.source or area in rule.source:
            return rule.source
    return "rocm_audit/rules"


def _line_of(text: str, *needles: str) -> int | None:
    """1-based line of the first line containing all needles (for error messages)."""
    for number, line in enumerate(text.splitlines(), 1):
        if all(n in line for n in needles):
            return number
    return None


def load_policy(rules_files: Iterable[str]) -> Policy:
    """The shipped policy with each rules file applied in order. Raises ConfigError."""
    active = shipped_policy()
    for path in rules_files:
        _apply_file(active, path)
    return active


def _apply_file(active: Policy, path: str) -> None:
    """Apply one rules file to ``active``: its rule overrides, ignores and policy settings, in that
    order. Raises ConfigError naming the file, line and key of the first thing wrong."""
    text, document = _read_rules_file(path)
    active.files.append(path)
    unknown_top = set(document) - {"rules", "ignore", "policy"}
    if unknown_top:
        key = sorted(unknown_top)[0]
        raise ConfigError(
            path, "unknown top-level key (expected rules, ignore, policy)", line=_line_of(text, key), key=key
        )
    _apply_severities(active, path, text, document.get("rules", {}))
    _apply_ignores(active, path, text, document.get("ignore", []))
    _apply_settings(active, path, text, document.get("policy", {}))


def _read_rules_file(path: str) -> tuple[str, dict[str, Any]]:
    """The text of a rules file and its TOML document. Raises ConfigError."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise ConfigError(path, f"cannot read rules file: {exc.strerror}") from None
    text = raw.decode("utf-8", errors="replace")
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        raise ConfigError(path, f"not valid TOML: {exc}", line=int(match.group(1)) if match else None) from None
    except RecursionError:  # "a = [[[[...": Python's parser recurses per level
        raise ConfigError(path, "not valid TOML: nested too deeply") from None
    return text, document


def _apply_severities(active: Policy, path: str, text: str, rules: dict[str, Any]) -> None:
    """``[rules.ID] severity = ...``: the rule's severity, and where it was set."""
    for rule_id, table in rules.items():
        where = f"rules.{rule_id}"
        line = _line_of(text, rule_id)
        if rule_id not in active.rules:
            raise ConfigError(path, "no such rule (see `rocm-audit rules`)", line=line, key=where)
        if not isinstance(table, dict) or set(table) - {"severity"} or "severity" not in table:
            raise ConfigError(path, "a rule override may set only `severity`", line=line, key=where)
        try:
            severity = Severity(table["severity"])
        except ValueError:
            raise ConfigError(
                path,
                f"severity must be one of {[s.value for s in Severity]}",
                line=_line_of(text, "severity", str(table["severity"])),
                key=f"{where}.severity",
            ) from None
        active.rules[rule_id] = replace(active.rules[rule_id], severity=severity)
        active.severity_sources[rule_id] = f"{path}:{line}" if line else path


def _apply_ignores(active: Policy, path: str, text: str, ignores: Any) -> None:
    """``[[ignore]]`` tables: each names a rule, a path or a distribution (globs), and a reason."""
    if not isinstance(ignores, list):
        raise ConfigError(
            path, "`ignore` must be an array of tables ([[ignore]])", line=_line_of(text, "ignore"), key="ignore"
        )
    for index, entry in enumerate(ignores):
        where = f"ignore[{index}]"
        if not isinstance(entry, dict):
            raise ConfigError(path, "each ignore must be a table", key=where)
        line = _line_of(text, str(entry.get("rule", entry.get("distribution", "[[ignore]]"))))
        unknown = set(entry) - {"rule", "path", "reason", "distribution"}
        if unknown:
            raise ConfigError(path, f"unknown keys {sorted(unknown)}", line=line, key=where)
        rule_glob = entry.get("rule", "*")
        if not isinstance(rule_glob, str) or not rule_glob:
            raise ConfigError(path, "rule must be a rule id or a glob of them", line=line, key=f"{where}.rule")
        rule_glob = rule_glob.upper()
        if not any(fnmatch.fnmatchcase(known, rule_glob) for known in active.rules):
            raise ConfigError(
                path,
                f"ignore names an unknown rule {entry.get('rule')!r} (no rule matches; see `rocm-audit rules`)",
                line=line,
                key=f"{where}.rule",
            )
        reason = entry.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError(path, "every ignore needs a non-empty reason", line=line, key=f"{where}.reason")
        glob = entry.get("path", "*")
        if not isinstance(glob, str) or not glob:
            raise ConfigError(path, "path must be a non-empty glob", line=line, key=f"{where}.path")
        distribution = entry.get("distribution", "*")
        if not isinstance(distribution, str) or not distribution:
            raise ConfigError(
                path, "distribution must be a non-empty name or glob", line=line, key=f"{where}.distribution"
            )
        if rule_glob == "*" and glob == "*" and distribution == "*":
            raise ConfigError(path, "an ignore must name a rule, a path or a distribution", line=line, key=where)
        active.ignores.append(
            Ignore(rule_glob, glob, reason.strip(), f"{path}:{line}" if line else path, _normalized(distribution))
        )


def _apply_settings(active: Policy, path: str, text: str, areas: dict[str, Any]) -> None:
    """``[policy.AREA]`` tables: known settings only, each checked, and where each was set."""
    for area, table in areas.items():
        known = _KNOWN_POLICY.get(area)
        if known is None:
            raise ConfigError(
                path,
                f"unknown policy area (known: {sorted(_KNOWN_POLICY)})",
                line=_line_of(text, f"policy.{area}"),
                key=f"policy.{area}",
            )
        if not isinstance(table, dict):
            raise ConfigError(path, "a policy area must be a table", key=f"policy.{area}")
        for key, value in table.items():
            line = _line_of(text, key)
            if key not in known:
                raise ConfigError(
                    path, f"unknown setting (known: {sorted(known)})", line=line, key=f"policy.{area}.{key}"
                )
            description, check = known[key]
            if not check(value):
                raise ConfigError(path, f"must be {description}", line=line, key=f"policy.{area}.{key}")
            active.settings.setdefault(area, {})[key] = value
            active.setting_sources[(area, key)] = f"{path}:{line}" if line else path


_ACTIVE: contextvars.ContextVar[Policy | None] = contextvars.ContextVar("rocm_audit_policy", default=None)


def active_policy() -> Policy:
    current = _ACTIVE.get()
    if current is None:
        current = shipped_policy()
        _ACTIVE.set(current)
    return current


@contextmanager
def using_policy(current: Policy) -> Iterator[Policy]:
    token = _ACTIVE.set(current)
    try:
        yield current
    finally:
        _ACTIVE.reset(token)


def policy(area: str) -> dict[str, Any]:
    """Settings of one policy area in force: shipped defaults plus any --rules overrides."""
    return active_policy().area(area)
