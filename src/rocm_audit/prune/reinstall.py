"""What a ``prune --revert`` cannot put back from a backup, and what it says about it.

- A path whose distribution pip still has installed: the reinstall command, run by the audited
  site's own interpreter (``--python``, else the one the manifest recorded, else the one that owns
  the site-packages; when none is known the message names the site-packages whose interpreter it
  must be); one PRUNE007 finding per distribution, on its ``.dist-info``, the command said once.
- A path whose distribution is no longer installed (the user uninstalled it after the prune):
  nothing to restore for it, one PRUNE010 info finding per distribution.
- Runs a revert has restored are marked in the manifest (an appended ``reverted`` record; the
  journal stays append-only), so a second revert can say that nothing is left to restore.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from rocm_audit.findings import Finding, make_finding
from rocm_audit.tree.journal import append_records, read_records

REVERTED_TYPE = "reverted"


@dataclass(slots=True)
class _Needed:
    name: str
    version: str
    where: str  # the .dist-info, else the first path
    site_dir: str | None
    python: str | None  # None: unknown, the message names the site-packages
    files: int = 0


def _interpreter_of(site_dir: str | None) -> str | None:
    """The interpreter that owns ``site_dir``, asked by running it (discovery.owning_interpreter)."""
    if not site_dir:
        return None
    from rocm_audit.tree.discovery import default_site_packages, owning_interpreter  # noqa: PLC0415

    real = os.path.realpath(site_dir)
    if real in default_site_packages():
        return sys.executable
    owner = owning_interpreter(real)
    return owner.executable if owner is not None else None


@dataclass(slots=True)
class Reinstalls:
    """The distributions a revert must leave to pip, and those no longer installed.
    ``python``: the interpreter ``--python`` named (absolute), which wins over the manifest's."""

    python: str | None = None
    needed: dict[tuple[str, str], _Needed] = field(default_factory=dict)
    gone: dict[tuple[str, str], list[Any]] = field(default_factory=dict)  # (name, version) -> [dist-info, files]
    _owners: dict[str, str | None] = field(default_factory=dict)

    def uninstalled(self, entry: dict[str, Any], *, removed_by_prune: bool = False) -> bool:
        """True (and counted) when the entry's distribution is no longer installed: its
        ``.dist-info`` is gone though the prune did not uninstall it (``removed_by_prune``)."""
        dist_info = entry.get("dist_info")
        if removed_by_prune or not entry.get("owner") or not isinstance(dist_info, str) or os.path.isdir(dist_info):
            return False
        key = (entry["owner"], str(entry.get("owner_version", "")))
        self.gone.setdefault(key, [dist_info, 0])[1] += 1
        return True

    def add(self, entry: dict[str, Any], run_python: str | None) -> None:
        """A path its owning distribution must write again (no backup holds it)."""
        key = (entry["owner"], str(entry.get("owner_version", "")))
        needed = self.needed.get(key)
        if needed is None:
            site_dir = entry.get("site_dir")
            if site_dir is None and isinstance(entry.get("dist_info"), str):
                site_dir = os.path.dirname(entry["dist_info"])
            python = self.python or run_python
            if python is None and site_dir is not None:
                if site_dir not in self._owners:
                    self._owners[site_dir] = _interpreter_of(site_dir)
                python = self._owners[site_dir]
            where = entry.get("dist_info") or entry["path"]
            needed = self.needed[key] = _Needed(key[0], key[1], where, site_dir, python)
        needed.files += 1

    def commands(self) -> list[str]:
        return [command(n) for n in self.needed.values()]

    def findings(self) -> list[Finding]:
        found = []
        for needed in self.needed.values():
            line = command(needed)
            files = "a file" if needed.files == 1 else f"{needed.files:,} files"
            message = f"no backup holds {files} of {needed.name} {needed.version}: reinstall it with `{line}`"
            if needed.python is None:
                message += f", run by the interpreter of {needed.site_dir or 'its site-packages'}"
            data = {"command": line, "distribution": needed.name, "version": needed.version, "files": needed.files}
            found.append(make_finding("PRUNE007", needed.where, message, data=data))
        for (name, version), (dist_info, count) in self.gone.items():
            files = "a file" if count == 1 else f"{count:,} files"
            found.append(
                make_finding(
                    "PRUNE010",
                    dist_info,
                    f"{name} {version} is no longer installed: nothing to restore for it ({files} journalled)",
                    data={"distribution": name, "version": version, "files": count},
                )
            )
        return found


def command(needed: _Needed) -> str:
    python = shlex.quote(needed.python) if needed.python else "python"
    return f"{python} -m pip install --force-reinstall --no-deps {shlex.quote(f'{needed.name}=={needed.version}')}"


@dataclass(slots=True)
class RunFacts:
    """What the manifests' headers and marks say of each run: the backup it named, the manifest
    that journals it, and whether a revert has put it back."""

    backups: dict[str, str | None] = field(default_factory=dict)  # run id -> its --backup
    manifest_of: dict[str, str] = field(default_factory=dict)
    reverted: set[str] = field(default_factory=set)


def run_facts(manifests: list[str]) -> RunFacts:
    facts = RunFacts()
    for manifest in manifests:
        for record in read_records(manifest):
            run = record.get("run")
            if not isinstance(run, str):
                continue
            if "rocm_audit_prune_manifest" in record:
                facts.backups[run] = record.get("backup") if isinstance(record.get("backup"), str) else None
                facts.manifest_of[run] = manifest
            elif record.get("type") == REVERTED_TYPE:
                facts.reverted.add(run)
    return facts


def mark_reverted(facts: RunFacts) -> None:
    """Append a ``reverted`` record for each run not marked yet to the manifest that journals it; a
    manifest that cannot be written (a read-only copy) is left as it is: the mark only words a later
    revert."""
    stamp = int(time.time())
    by_manifest: dict[str, list[str]] = {}
    for run, manifest in facts.manifest_of.items():
        if run not in facts.reverted:
            by_manifest.setdefault(manifest, []).append(run)
    for manifest, runs in by_manifest.items():
        try:
            append_records(manifest, [{"type": REVERTED_TYPE, "run": run, "reverted_unix": stamp} for run in runs])
        except OSError:
            continue
