"""Targets a prune of this tree removed: after `prune --fatbins gfx942 gfx950`, verify-arch for
another GPU finds it missing from the libraries that run slimmed. That is the user's own change,
not a defect of the wheel that shipped the library: such an ARCH001 says which run removed the
target and how to undo it, and names no upstream tracker (output/text.py)."""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Sequence
from typing import Any

from rocm_audit.errors import UsageError
from rocm_audit.findings import Finding
from rocm_audit.prune.apply import MANIFEST_NAME, sha256_of
from rocm_audit.prune.fatbins.apply import DONE_TYPE
from rocm_audit.tree.journal import JOURNAL_DIR, read_records

_PACKAGE_DIRS = ("site-packages", "dist-packages")
_MAX_UP = 8  # directories above an audited root looked at for the journal (-p site/jax_plugins)


@dataclasses.dataclass(frozen=True, slots=True)
class Slimmed:
    sha256: str  # what the run wrote: the file is still that run's only while its bytes are these
    kept: tuple[str, ...]
    manifest: str


def mark_pruned(findings: list[Finding], roots: Sequence[str]) -> list[Finding]:
    """``findings`` with each ARCH001 of a library a `prune --fatbins` run slimmed (and whose bytes
    are still the ones it wrote) saying so. Only those files are hashed."""
    slimmed = _slimmed_files(roots)
    marked = []
    for finding in findings:
        done = slimmed.get(os.path.realpath(finding.path)) if finding.rule == "ARCH001" and slimmed else None
        if done is not None and _still_written(finding.path, done):
            undo = f"rocm-audit prune --revert {shlex.quote(done.manifest)}"
            finding = dataclasses.replace(
                finding,
                message=f"{finding.message} (rocm-audit prune --fatbins kept only {', '.join(done.kept)} "
                f"in it: `{undo}` puts the rest back)",
                data={**finding.data, "pruned_by": done.manifest},
            )
        marked.append(finding)
    return marked


def _still_written(path: str, done: Slimmed) -> bool:
    try:
        return sha256_of(path) == done.sha256
    except OSError:
        return False


def _slimmed_files(roots: Sequence[str]) -> dict[str, Slimmed]:
    """Every library a prune journal beside the roots records as slimmed: path -> what that run wrote."""
    found: dict[str, Slimmed] = {}
    for manifest in _journals(roots):
        try:
            records = read_records(manifest)
        except UsageError:  # a journal it cannot read: prune --revert says what is wrong with it
            continue
        kept: dict[Any, tuple[str, ...]] = {}
        for record in records:
            if "rocm_audit_prune_manifest" in record and isinstance(record.get("kept"), list):
                kept[record.get("run")] = tuple(str(k) for k in record["kept"])
            elif record.get("type") == DONE_TYPE and isinstance(record.get("path"), str):
                after, run = record.get("sha256_after"), record.get("run")
                if isinstance(after, str) and run in kept:
                    found[os.path.realpath(record["path"])] = Slimmed(after, kept[run], manifest)  # the latest
    return found


def _journals(roots: Sequence[str]) -> list[str]:
    """The prune journals at each root or above it, up to its site-packages."""
    journals: list[str] = []
    for root in roots:
        directory = root if os.path.isdir(root) else os.path.dirname(root)
        for _ in range(_MAX_UP):
            journal = os.path.join(directory, JOURNAL_DIR, MANIFEST_NAME)
            if journal not in journals and os.path.isfile(journal):
                journals.append(journal)
            parent = os.path.dirname(directory)
            if os.path.basename(directory) in _PACKAGE_DIRS or parent == directory:
                break
            directory = parent
    return journals
