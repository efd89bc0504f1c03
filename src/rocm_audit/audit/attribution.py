"""Who ships each finding's file, and the key that says which problem a finding is.

Both are read from what pip installed: the RECORD of the distribution that lists the file with a
hash (tree/ownership.py), and the file's path relative to that site directory, so that the key is
the same in a reinstall, another venv or another image.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence

from rocm_audit.findings import Finding
from rocm_audit.report_types import Sections
from rocm_audit.rulebook.policy import active_policy
from rocm_audit.tree.ownership import shippers_of, site_dir_of


def with_shippers(findings: Sequence[Finding]) -> list[Finding]:
    """The findings, each naming the distribution that shipped its file (when a RECORD says so)."""
    if not findings:
        return list(findings)
    shipped = shippers_of(f.path for f in findings)
    return [dataclasses.replace(f, shipped_by=shipped[f.path]) if f.path in shipped else f for f in findings]


def attribute_carriers(sections: Sections) -> None:
    """Name the distribution that shipped each device-code carrier (``shipped_by``), so that a
    report can group carriers outside SDK trees by the wheel that brought them."""
    carriers = sections.get("carriers") or []
    # A carrier that is a set of files (per-arch kernels, a kernel database directory) is shipped
    # by whoever ships its members.
    shipped = shippers_of(p for c in carriers for p in (c["path"], *c["members"])) if carriers else {}
    for carrier in carriers:
        who = next((shipped[p] for p in (carrier["path"], *carrier["members"]) if p in shipped), None)
        if who is not None:
            carrier["shipped_by"] = {"name": who.name, "version": who.version, "report_to": who.report_to}


def fingerprints(findings: Sequence[Finding], roots: Sequence[str]) -> list[str]:
    """The baseline key of each finding: a hash of its rule, its path and related paths relative to
    their site directory (else to the audited root holding them), and the data fields its rule's
    catalogue entry declares as its fingerprint. Never an absolute path or a line number."""
    rules = active_policy().rules
    site_cache: dict[str, str | None] = {}
    ordered_roots = sorted((r.rstrip("/") for r in roots if r and r != "/"), key=len, reverse=True)

    def relative(path: str) -> str:
        # A finding about a whole audited directory (CHK001) is "." of it.
        if path in ordered_roots:
            return "."
        site = site_dir_of(os.path.dirname(path), site_cache)
        base = site or next((r for r in ordered_roots if path.startswith(r + "/")), None)
        return os.path.relpath(path, base) if base else path

    keys = []
    for one in findings:
        rule = rules.get(one.rule)
        fields = {name: one.data.get(name) for name in (rule.fingerprint if rule else ())}
        identity = [one.rule, relative(one.path), sorted(relative(p) for p in one.related_paths), fields]
        text = json.dumps(identity, sort_keys=True, default=str, ensure_ascii=False)
        keys.append(hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:16])
    return keys
