"""The revert manifest (format 1): one JSON line per planned change, fsync'ed before the first change; its reader."""

from __future__ import annotations

import collections
import fcntl
import json
import os
import stat
import time
from typing import Any

from rocm_audit import __version__
from rocm_audit.dedup.plan import DedupGroup, DedupPlan
from rocm_audit.errors import UsageError
from rocm_audit.tree.journal import JOURNAL_DIR, open_append, read_records
from rocm_audit.tree.smallfile import open_regular

MANIFEST_NAME = "dedup-manifest.jsonl"
MANIFEST_FORMAT = 1


def default_manifest_path(plan: DedupPlan) -> str:
    """`.rocm-audit/dedup-manifest.jsonl` in the directory holding the (first) SDK tree."""
    trees = sorted({g.keeper.sdk_tree for g in plan.groups if g.keeper.sdk_tree})
    base = os.path.dirname(trees[0]) if trees else plan.inventory.roots[0].path
    return os.path.join(base, JOURNAL_DIR, MANIFEST_NAME)


def list_in_record(manifest_path: str, plan: DedupPlan) -> str | None:
    """Add the default manifest to the RECORD of the distribution whose files the plan replaces
    (rocm-sdk-devel's expansions, in TheRock), as ``rocm-sdk init`` adds the files it creates: a
    row without hash, under the same ``fcntl.lockf`` of RECORD. `pip uninstall` then removes the
    manifest with the links it describes, and ``.rocm-audit/`` with it. Returns the RECORD written,
    None when no distribution owns the replaced paths (or the manifest lies outside its directory)."""
    owners = collections.Counter(
        row.distribution
        for g in plan.groups
        for d in g.duplicates
        if (row := plan.ownership.row(d.record.path)) is not None
    )
    if not owners:
        return None
    distribution = min(owners, key=lambda name: (-owners[name], name))
    record = plan.ownership.records.get(distribution)
    if record is None:
        return None
    site_dir = os.path.dirname(os.path.dirname(record))
    relpath = os.path.relpath(manifest_path, site_dir)
    if relpath.startswith(".." + os.sep) or "," in relpath or "\n" in relpath:
        return None
    if os.path.islink(os.path.dirname(record)):
        return None  # a .dist-info planted as a link out of the site directory: not pip's
    # Never through a link, never a FIFO (its read would wait for a writer): the RECORD pip wrote.
    fd = open_regular(record, os.O_RDWR | os.O_APPEND, follow_symlinks=False)
    with os.fdopen(fd, "a+", encoding="utf-8") as handle:
        fcntl.lockf(handle, fcntl.LOCK_EX)
        try:
            handle.seek(0)
            listed = {line.split(",", 1)[0] for line in handle.read().splitlines()}
            if relpath not in listed:
                handle.write(f"{relpath},,\n")
                handle.flush()
                os.fsync(handle.fileno())
        finally:
            fcntl.lockf(handle, fcntl.LOCK_UN)
    return record


def journal_changes(manifest_path: str, groups: list[DedupGroup], run_id: str, *, header: bool) -> None:
    """Append every planned change to the manifest and fsync it before any of them is made."""
    if not groups:
        return
    os.makedirs(os.path.dirname(os.path.abspath(manifest_path)), exist_ok=True)
    lines = (
        [
            json.dumps(
                {
                    "rocm_audit_manifest": MANIFEST_FORMAT,
                    "run": run_id,
                    "tool_version": __version__,
                    "created_unix": int(time.time()),
                }
            )
        ]
        if header
        else []
    )
    for group in groups:
        keeper = group.keeper
        for planned in group.duplicates:
            victim = planned.record
            lines.append(
                json.dumps(
                    {
                        "run": run_id,
                        "path": victim.path,
                        "keeper": keeper.path,
                        "link_text": planned.link_text,
                        "hardlink": planned.hardlink,
                        "made": planned.make,
                        "mode": stat.S_IMODE(victim.mode),
                        "uid": victim.uid,
                        "gid": victim.gid,
                        "mtime_ns": victim.mtime_ns,
                        "size": victim.size,
                        "keeper_dev": keeper.dev,
                        "keeper_ino": keeper.ino,
                        "keeper_size": keeper.size,
                        "keeper_mtime_ns": keeper.mtime_ns,
                    }
                )
            )  # ASCII escapes keep undecodable file-name bytes exact (\udcXX round-trips)
    with os.fdopen(open_append(manifest_path), "a", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_manifest(path: str) -> list[dict[str, Any]]:
    """The journalled links of a dedup manifest (tree/journal.py reads its lines). Raises
    UsageError for a file that is none: one that does not start with the header every run's
    journal starts with (an empty or mistyped file would otherwise read as "nothing to restore")."""
    entries = []
    headed = False
    for number, entry in enumerate(read_records(path), 1):
        where = f"{path}: record {number}"
        if "rocm_audit_manifest" in entry:
            if entry["rocm_audit_manifest"] != MANIFEST_FORMAT:
                raise UsageError(f"{where}: unsupported manifest format {entry['rocm_audit_manifest']}")
            headed = True
            continue
        if not headed:
            raise UsageError(f"{where}: not a rocm-audit dedup manifest (no header before it)")
        _check_entry(entry, where)
        entries.append(entry)
    if not headed:
        raise UsageError(f"{path}: not a rocm-audit dedup manifest (no run is journalled in it)")
    return entries


_INT_FIELDS = ("uid", "gid", "mtime_ns", "size", "keeper_dev", "keeper_ino", "keeper_size", "keeper_mtime_ns")


def _check_entry(entry: dict[str, Any], where: str) -> None:
    if (
        not all(isinstance(entry.get(k), str) and entry[k] for k in ("path", "keeper", "link_text"))
        or not isinstance(entry.get("mode"), int)
        or isinstance(entry.get("mode"), bool)
    ):
        raise UsageError(f"{where}: manifest entry lacks path/keeper/link_text/mode")
    if entry.get("made", "symlink") not in ("symlink", "hardlink"):
        raise UsageError(f"{where}: manifest field made must be symlink or hardlink")
    for key in _INT_FIELDS:
        if key in entry and (not isinstance(entry[key], int) or isinstance(entry[key], bool)):
            raise UsageError(f"{where}: manifest field {key} must be an integer")
