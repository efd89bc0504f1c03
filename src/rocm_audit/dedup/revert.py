"""`dedup --revert`: turn the links a manifest records back into the files they replaced, newest first."""

from __future__ import annotations

import os
import re
import stat
from typing import Any

from rocm_audit.dedup.link import Skip, remove_leftover, unlink_quietly
from rocm_audit.dedup.manifest import read_manifest
from rocm_audit.errors import Interrupted
from rocm_audit.findings import Finding, make_finding
from rocm_audit.outcome import CommandOutcome
from rocm_audit.progress import SILENT, Progress
from rocm_audit.tree.inventory import TEMP_PREFIX
from rocm_audit.tree.journal import journalled_trees, one_change
from rocm_audit.units import plural

_TEMP_NAME = re.compile(re.escape(TEMP_PREFIX) + r"[0-9a-f]{12}")


def _restore_one(entry: dict[str, Any]) -> str:
    """Turn one manifest link back into a regular file. Returns "restored", "original", or
    "relinked" (rocm-sdk hardlinked the path to the keeper since: left as rocm-sdk made it). Raises Skip."""
    path, keeper_path = entry["path"], entry["keeper"]
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        raise Skip("DUP007", "path is missing") from None
    on_keeper_inode = (now.st_dev, now.st_ino) == (entry.get("keeper_dev"), entry.get("keeper_ino"))
    if stat.S_ISREG(now.st_mode) and not (on_keeper_inode and entry.get("made") == "hardlink"):
        if on_keeper_inode and not entry.get("hardlink"):
            # TheRock's device reconcile (rocm-sdk init/path/test) replaces a symlink by a hardlink.
            return "relinked"
        return "original"  # never replaced, or already reverted
    if stat.S_ISREG(now.st_mode):
        pass  # the hardlink this run's dedup made
    elif not stat.S_ISLNK(now.st_mode) or os.readlink(path) != entry["link_text"]:
        raise Skip("DUP007", "path is no longer the link rocm-audit made")
    try:
        keeper_now = os.stat(keeper_path)
        through_link = os.stat(path)
    except OSError as exc:
        raise Skip("DUP007", f"keeper does not resolve: {exc.strerror}") from None
    if (through_link.st_dev, through_link.st_ino) != (keeper_now.st_dev, keeper_now.st_ino):
        raise Skip("DUP007", "link no longer resolves to the keeper")
    if keeper_now.st_size != entry.get("keeper_size", entry.get("size")) or (
        "keeper_mtime_ns" in entry and keeper_now.st_mtime_ns != entry["keeper_mtime_ns"]
    ):
        raise Skip("DUP007", "the keeper changed since dedup; its bytes are not the original bytes")
    directory = os.path.dirname(path)
    temp_path = os.path.join(directory, f"{TEMP_PREFIX}{os.urandom(6).hex()}")
    try:
        if entry.get("hardlink") and (keeper_now.st_dev, keeper_now.st_ino) == (
            entry.get("keeper_dev"),
            entry.get("keeper_ino"),
        ):
            os.link(keeper_path, temp_path)  # it was a hardlink of the keeper: make it one again
        else:
            _copy_file(keeper_path, temp_path, entry)
        os.replace(temp_path, path)
    except OSError as exc:
        unlink_quietly(temp_path)
        raise Skip("DUP007", f"cannot restore: {exc.strerror}") from None
    except BaseException:
        unlink_quietly(temp_path)
        raise
    return "restored"


def _copy_file(source: str, destination: str, entry: dict[str, Any]) -> None:
    with open(source, "rb") as src:
        fd = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as dst:
            remaining = os.fstat(src.fileno()).st_size
            while remaining:
                sent = os.sendfile(dst.fileno(), src.fileno(), None, min(remaining, 1 << 30))
                if sent == 0:
                    raise OSError(5, "short copy")
                remaining -= sent
            if os.geteuid() == 0:
                os.fchown(dst.fileno(), entry.get("uid", -1), entry.get("gid", -1))
            os.fchmod(dst.fileno(), entry["mode"])
            dst.flush()
            os.fsync(dst.fileno())
    if "mtime_ns" in entry:
        os.utime(destination, ns=(entry["mtime_ns"], entry["mtime_ns"]), follow_symlinks=False)
    if os.path.getsize(destination) != entry.get("size", os.path.getsize(destination)):
        raise OSError(5, "restored size differs from the recorded size")


def _revert_entries(
    entries: list[dict[str, Any]], outcome_of: dict[str, str], progress: Progress = SILENT
) -> list[Finding]:
    """Restore each path from its newest entry that finds it changed; fills ``outcome_of`` (path ->
    "restored", "relinked", "failed" or "original") as it goes. Returns the findings."""
    findings: list[Finding] = []
    # A run killed between creating a temporary name and renaming it leaves it behind.
    _remove_temporaries_in({os.path.dirname(e["path"]) for e in entries}, findings)
    progress.phase("restoring", len({e["path"] for e in entries}), "files")
    for entry in reversed(entries):
        progress.update(len(outcome_of))
        path = entry["path"]
        if outcome_of.get(path, "original") != "original":
            continue  # a newer entry of this path settled it
        with one_change():  # a Ctrl-C waits until this file is back whole and counted
            try:
                outcome_of[path] = _restore_one(entry)
            except Skip as skip:
                findings.append(make_finding(skip.rule, path, skip.message, related=[entry["keeper"]]))
                outcome_of[path] = "failed"
    return findings


def _remove_temporaries_in(directories: set[str], findings: list[Finding]) -> None:
    """Remove rocm-audit's own temporary names (TEMP_PREFIX + 12 hex digits) from directories."""
    for directory in sorted(directories):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            if _TEMP_NAME.fullmatch(name):
                remove_leftover(os.path.join(directory, name), findings)


def revert_manifests(manifest_paths: list[str], progress: Progress = SILENT) -> CommandOutcome:
    """Undo the replacements recorded in the manifests, newest first. Raises Interrupted on Ctrl-C
    (each file is restored whole or not at all)."""
    entries = [e for path in manifest_paths for e in read_manifest(path)]
    paths = {e["path"] for e in entries}
    outcome_of: dict[str, str] = {}
    try:
        findings = _revert_entries(entries, outcome_of, progress)
    except KeyboardInterrupt:
        made = sum(1 for o in outcome_of.values() if o == "restored")
        raise Interrupted("dedup --revert", made, len(paths), None) from None
    # One count per path: a manifest holds a path once per run that planned it (an interrupted run
    # and the run that finished its work; a member regrouped during a run), and the newest entry
    # that finds the path changed decides what was done with it.
    restored = sorted(p for p, o in outcome_of.items() if o == "restored")
    relinked = sorted(p for p, o in outcome_of.items() if o == "relinked")
    failed = sum(1 for o in outcome_of.values() if o == "failed")
    already = len(paths) - len(restored) - len(relinked) - failed
    summary = (
        f"dedup --revert: {plural(len(restored), 'file')} restored, {already} already original, "
        f"{failed} could not be restored"
    )
    if relinked:
        summary += f", {len(relinked)} left as rocm-sdk re-linked them (hardlinks of the keeper, as TheRock makes them)"
    return CommandOutcome(
        command="dedup",
        findings=findings,
        inputs=[os.path.abspath(p) for p in manifest_paths],
        roots=journalled_trees(manifest_paths, paths),
        sections={
            "revert": {
                "manifests": [os.path.abspath(p) for p in manifest_paths],
                "restored": sorted(restored),
                "already_original": already,
                "relinked_by_rocm_sdk": sorted(relinked),
                "failed": failed,
            }
        },
        summary=summary,
    )
