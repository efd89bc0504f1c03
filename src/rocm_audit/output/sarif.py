"""SARIF 2.1.0: each rule in force a reportingDescriptor, each finding a result with a physical location."""

from __future__ import annotations

import os
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import quote

from rocm_audit import __version__
from rocm_audit.findings import Finding, Severity
from rocm_audit.outcome import CommandOutcome
from rocm_audit.output.escape import display
from rocm_audit.output.prefixes import rule_prefixes
from rocm_audit.output.report import group_numbers, to_json
from rocm_audit.rulebook.policy import active_policy

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def _base_ids(inputs: list[str], audited: list[str] | None = None) -> dict[str, str]:
    """INPUT1.. -> root directory, for relative artifact URIs (what code-scanning UIs show).

    The audited roots as the findings spell them when the outcome has them (an image's
    site-packages, not the archive's directory), else the inputs' directories. Only absolute
    ones: `--archive image.tar` has no directory a file URI could name."""
    candidates = audited or [p if os.path.isdir(p) else os.path.dirname(p) for p in inputs]
    roots = sorted({r for r in candidates if os.path.isabs(r) and r != "/"})
    return {f"INPUT{index}": root for index, root in enumerate(roots, 1)}


def _location(path: str, bases: dict[str, str], offset: int | None = None) -> dict[str, Any]:
    artifact: dict[str, Any]
    for base_id, root in bases.items():
        if path.startswith(root.rstrip("/") + "/"):
            relative = PurePosixPath(os.path.relpath(path, root))
            artifact = {"uri": "/".join(_quote(p) for p in relative.parts), "uriBaseId": base_id}
            break
    else:
        artifact = {"uri": "file://" + _quote(path) if os.path.isabs(path) else _quote(path)}
    physical: dict[str, Any] = {"artifactLocation": artifact}
    if offset is not None and offset >= 0:
        physical["region"] = {"byteOffset": offset}
    return {"physicalLocation": physical}


def _quote(part: str) -> str:
    """Percent-encode the file name's bytes (undecodable ones included) for a URI."""
    return quote(os.fsencode(part), safe="/._-~+@")


def render_sarif(outcome: CommandOutcome) -> str:
    policy = active_policy()
    prefixes = rule_prefixes(outcome.command)
    rule_ids = sorted(r for r in policy.rules if r.startswith(prefixes))
    rule_ids = sorted(set(rule_ids) | {f.rule for f in outcome.findings})
    index_of = {rule_id: i for i, rule_id in enumerate(rule_ids)}
    descriptors = []
    for rule_id in rule_ids:
        rule = policy.rules.get(rule_id)
        descriptors.append(
            {
                "id": rule_id,
                "name": rule_id if rule is None else "".join(w.capitalize() for w in rule.title.split()[:8]),
                "shortDescription": {"text": rule.title if rule else rule_id},
                "fullDescription": {"text": rule.rationale if rule else rule_id},
                "help": {"text": rule.fix if rule else ""},
                "defaultConfiguration": {"level": _LEVEL[rule.severity] if rule else "warning"},
            }
        )
    bases = _base_ids(outcome.inputs, outcome.roots)
    groups = group_numbers(outcome.findings)
    results = [_result(one, index_of, bases, groups.get(id(one))) for one in outcome.findings]
    # With --baseline, what it held is "unchanged" and the rest "new" (SARIF 2.1.0 baselineState).
    compared = any(s.get("source", "").startswith("baseline:") for s in outcome.suppressed)
    if compared:
        for result in results:
            result["baselineState"] = "new"
    for suppressed in outcome.suppressed:
        results.append(
            {
                "ruleId": suppressed["rule"],
                "ruleIndex": index_of.get(suppressed["rule"], -1),
                "level": "none",
                "message": {"text": f"suppressed: {suppressed['reason']}"},
                "locations": [_location(suppressed["path"], bases)],
                "suppressions": [{"kind": "external", "justification": suppressed["reason"]}],
            }
            | ({"baselineState": "unchanged"} if suppressed.get("source", "").startswith("baseline:") else {})
        )
    document = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "rocm-audit",
                        "version": __version__,
                        "semanticVersion": __version__,
                        "rules": descriptors,
                    }
                },
                "originalUriBaseIds": {k: {"uri": PurePosixPath(v).as_uri() + "/"} for k, v in bases.items()},
                "invocations": [{"executionSuccessful": True, "commandLine": f"rocm-audit {outcome.command}"}],
                "results": results,
            }
        ],
    }
    return to_json(document, records_at=4)  # one result per line


def _result(one: Finding, index_of: dict[str, int], bases: dict[str, str], group: int | None) -> dict[str, Any]:
    offset = one.data.get("offset") if isinstance(one.data.get("offset"), int) else None
    result: dict[str, Any] = {
        "ruleId": one.rule,
        "ruleIndex": index_of[one.rule],
        "level": _LEVEL[one.severity],
        "message": {"text": display(one.message)},
        "locations": [_location(one.path, bases, offset)],
    }
    if one.related_paths:
        result["relatedLocations"] = [dict(_location(p, bases), id=i) for i, p in enumerate(one.related_paths, 1)]
    properties: dict[str, Any] = dict(one.data)
    if group is not None:
        properties["group"] = group  # the cause group text and Markdown show as one entry
    if properties:
        result["properties"] = properties
    if one.fingerprint:
        # The baseline key (rule, site-relative path, declared fields): stable across roots and reinstalls.
        result["partialFingerprints"] = {"rocmAuditFingerprint/v1": one.fingerprint}
    return result
