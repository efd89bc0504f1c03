"""Baselines: today's findings written down once, so that a run fails only on new ones.

A baseline lists each finding's key (audit/attribution.py ``fingerprints``: rule, path relative to
its site directory, the fields the rule declares), with the rule, path and message for the person
who reads it. Keys survive a reinstall, another venv or image, and a reordering of the report.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rocm_audit.errors import ConfigError
from rocm_audit.findings import Finding

BASELINE_FORMAT = "rocm-audit-baseline/1"


def baseline_document(findings: Sequence[Finding], keys: Sequence[str]) -> dict[str, Any]:
    """The baseline of ``findings`` (one entry per key, sorted)."""
    entries = {
        key: {"fingerprint": key, "rule": one.rule, "path": one.path, "message": one.message}
        for one, key in zip(findings, keys, strict=True)
    }
    return {"format": BASELINE_FORMAT, "findings": [entries[k] for k in sorted(entries)]}


def parse_baseline(text: str, source: str) -> set[str]:
    """The keys a baseline file holds. Raises ConfigError naming the file on anything else."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(source, f"not a baseline (JSON: {exc.msg}, line {exc.lineno})") from None
    except RecursionError:  # "[[[[...": Python's parser recurses per level
        raise ConfigError(source, "not a baseline (JSON nested too deeply)") from None
    if not isinstance(document, dict) or document.get("format") != BASELINE_FORMAT:
        raise ConfigError(source, f"not a baseline: its format is not {BASELINE_FORMAT!r} (--write-baseline makes one)")
    entries = document.get("findings")
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("fingerprint"), str) for e in entries
    ):
        raise ConfigError(source, "a baseline's findings must be objects with a fingerprint")
    return {e["fingerprint"] for e in entries}


def split_by_baseline(
    findings: Sequence[Finding], keys: Sequence[str], known: set[str], source: str
) -> tuple[list[Finding], list[dict[str, str]]]:
    """The findings the baseline does not hold, and the suppressed entries of those it does."""
    kept: list[Finding] = []
    suppressed: list[dict[str, str]] = []
    for one, key in zip(findings, keys, strict=True):
        if key in known:
            suppressed.append(
                {"rule": one.rule, "path": one.path, "reason": "in the baseline", "source": f"baseline:{source}"}
            )
        else:
            kept.append(one)
    return kept, suppressed
