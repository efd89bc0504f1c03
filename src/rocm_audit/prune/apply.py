"""Carry out a prune plan safely, and undo it.

Order of every applying run (README "prune", Safety):

1. lock every SDK tree and audited directory (the same locks as dedup, tree/journal.py);
2. journal every removal before the first change: for each path its sha256, size, mode, owner,
   mtime, owning distribution, link text and backup path, fsync'ed;
3. per removal: re-check every file against the plan (``lstat``: inode, size, mtime, ctime); with
   ``--backup`` move (hardlink, or copy + fsync across filesystems) each file into the backup
   first; then remove: per-arch units with ``unlink``/``rmdir``, device distributions with the
   audited interpreter's own ``python -m pip uninstall -y`` and then the devel links TheRock made.

Revert restores each journalled path from the backup (sha256 checked), or names the exact
``pip install --force-reinstall --no-deps DIST==VERSION`` that brings it back.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from rocm_audit import __version__
from rocm_audit.errors import Interrupted, UsageError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.progress import SILENT, Progress
from rocm_audit.prune.plan import PrunePlan, Removal
from rocm_audit.prune.reinstall import Reinstalls
from rocm_audit.tree.discovery import default_site_packages, owning_interpreter
from rocm_audit.tree.inventory import TEMP_PREFIX, LinkRecord
from rocm_audit.tree.journal import (
    JOURNAL_DIR,
    append_records,
    fsync_directory,
    one_change,
    read_records,
    tree_locks,
)
from rocm_audit.tree.ownership import Distribution
from rocm_audit.units import plural

MANIFEST_NAME = "prune-manifest.jsonl"
MANIFEST_FORMAT = 1
_CHUNK = 1 << 20


def default_manifest_path(plan: PrunePlan) -> str:
    trees = plan.sdk_trees
    base = os.path.dirname(trees[0]) if trees else plan.roots[0].path
    if plan.roots[0].single_file and not trees:
        base = os.path.dirname(base)
    return os.path.join(base, JOURNAL_DIR, MANIFEST_NAME)


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(slots=True)
class ApplyResult:
    removed: int = 0  # removals carried out
    planned: int = 0  # removals the plan held
    bytes_freed: int = 0
    manifest: str | None = None
    backup: str | None = None


def _backup_path(backup_dir: str, path: str) -> str:
    return os.path.join(backup_dir, path.lstrip(os.sep))


def _removal_paths(removal: Removal) -> list[tuple[str, str]]:
    """(path, role) of everything one removal takes, in journal order (duplicates possible)."""
    distribution = removal.distribution
    paths: list[tuple[str, str]] = [(r.path, "file") for r in removal.files]
    if distribution is not None:
        on_disk = {r.path for r in removal.files} | set(removal.shared)
        paths += [(p, "file") for p in sorted(distribution.files) if p not in on_disk and os.path.lexists(p)]
    paths += [(path, "shared") for path in removal.shared]
    paths += [(link.path, "link") for link in removal.links]
    paths += [(d.path, "devel-link" if isinstance(d, LinkRecord) else "devel-file") for d in removal.devel_links]
    return paths


def _directory_entries(removal: Removal, index: int, run: str) -> list[dict[str, Any]]:
    """The journal lines of the directories one removal takes (mode and owner, to recreate them)."""
    lines: list[dict[str, Any]] = []
    for directory in removal.directories:
        try:
            st = os.lstat(directory)
        except FileNotFoundError:
            continue
        lines.append(
            {
                "run": run,
                "removal": index,
                "path": directory,
                "type": "dir",
                "mode": stat.S_IMODE(st.st_mode),
                "uid": st.st_uid,
                "gid": st.st_gid,
            }
        )
    return lines


def _entries(
    removal: Removal, index: int, run: str, backup_dir: str | None, hashes: dict[tuple[int, int], str]
) -> list[dict[str, Any]]:
    """The journal lines of one removal (files hashed once per inode)."""
    lines: list[dict[str, Any]] = []
    distribution = removal.distribution
    head: dict[str, Any] = {"run": run, "removal": index, "kind": removal.kind, "unit": removal.path}
    if distribution is not None:
        head.update({"distribution": distribution.name, "version": distribution.version})
    lines.append({**head, "type": "removal", "arches": list(removal.arches)})
    paths = _removal_paths(removal)
    first_name: dict[tuple[int, int], str] = {}
    done: set[str] = set()
    for path, role in paths:
        if path in done:
            continue
        done.add(path)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        entry: dict[str, Any] = {
            "run": run,
            "removal": index,
            "path": path,
            "role": role,
            "mode": stat.S_IMODE(st.st_mode),
            "uid": st.st_uid,
            "gid": st.st_gid,
            "mtime_ns": st.st_mtime_ns,
            "size": st.st_size,
            "dev": st.st_dev,
            "ino": st.st_ino,
            "ctime_ns": st.st_ctime_ns,
        }
        owner = removal.owners.get(path) or (distribution if role == "file" else None)
        if owner is not None:
            entry.update(
                {
                    "owner": owner.name,
                    "owner_version": owner.version,
                    "dist_info": owner.dist_info,
                    "site_dir": owner.site_dir,
                }
            )
        if stat.S_ISLNK(st.st_mode):
            entry.update({"type": "link", "link_text": os.readlink(path)})
        elif stat.S_ISREG(st.st_mode):
            identity = (st.st_dev, st.st_ino)
            if identity not in hashes:
                hashes[identity] = sha256_of(path)
            entry.update({"type": "file", "sha256": hashes[identity]})
            if identity in first_name:
                entry["hardlink_of"] = first_name[identity]
            else:
                first_name[identity] = path
            if backup_dir is not None:
                entry["backup"] = _backup_path(backup_dir, path)
        else:
            continue
        lines.append(entry)
    # A devel file that is a split copy, not a link, goes only when it holds a removed file's bytes.
    removed_bytes = {e["sha256"] for e in lines if e.get("role") == "file" and "sha256" in e}
    lines = [
        e
        for e in lines
        if not (e.get("role") == "devel-file" and "hardlink_of" not in e and e.get("sha256") not in removed_bytes)
    ]
    lines.extend(_directory_entries(removal, index, run))
    return lines


class _Changed(Exception):
    pass


def _unchanged(entry: dict[str, Any], *, ctime: bool = True) -> os.stat_result:
    """lstat the path and compare it with its journal line. Raises _Changed."""
    try:
        st = os.lstat(entry["path"])
    except FileNotFoundError:
        raise _Changed(f"{entry['path']} vanished") from None
    if entry["type"] == "link":
        if not stat.S_ISLNK(st.st_mode) or os.readlink(entry["path"]) != entry["link_text"]:
            raise _Changed(f"{entry['path']} is no longer the link it was")
        return st
    same = (
        stat.S_ISREG(st.st_mode)
        and (st.st_dev, st.st_ino) == (entry["dev"], entry["ino"])
        and st.st_size == entry["size"]
        and st.st_mtime_ns == entry["mtime_ns"]
        and (not ctime or st.st_ctime_ns == entry["ctime_ns"])
    )
    if not same:
        raise _Changed(f"{entry['path']} changed since it was planned")
    return st


class CopyMismatch(OSError):
    """The copy does not hash to the journalled sha256: its source changed under it."""


def copy_into_place(source: str, destination: str, entry: dict[str, Any], *, check_sha256: bool = False) -> None:
    """Copy with the journalled metadata under a temporary name, fsync, rename into place; with
    ``check_sha256`` the copy must hash to the entry's sha256 first (a backup that changed)."""
    os.makedirs(os.path.dirname(destination), exist_ok=True)
    temporary = os.path.join(os.path.dirname(destination), TEMP_PREFIX + secrets.token_hex(6))
    try:
        with open(source, "rb") as src, open(temporary, "wb") as dst:
            shutil.copyfileobj(src, dst, _CHUNK)
            dst.flush()
            os.fsync(dst.fileno())
        os.chmod(temporary, entry["mode"])
        with contextlib.suppress(PermissionError):
            os.chown(temporary, entry["uid"], entry["gid"])
        os.utime(temporary, ns=(entry["mtime_ns"], entry["mtime_ns"]))
        if check_sha256 and sha256_of(temporary) != entry["sha256"]:
            raise CopyMismatch(f"{source} changed while it was copied to {destination}")
        os.rename(temporary, destination)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _back_up(entry: dict[str, Any], backed_up: dict[str, str]) -> None:
    """Put the file into the backup: a hardlink on one filesystem, else a checked copy."""
    destination = entry["backup"]
    source = backed_up.get(entry.get("hardlink_of", ""), entry["path"])
    if os.path.lexists(destination):
        if os.path.isfile(destination) and sha256_of(destination) == entry["sha256"]:
            backed_up[entry["path"]] = destination
            return
        raise _Changed(f"backup {destination} exists and holds other bytes")
    os.makedirs(os.path.dirname(destination), exist_ok=True)
    try:
        os.link(source, destination)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
        copy_into_place(entry["path"], destination, entry)
        if sha256_of(destination) != entry["sha256"]:
            os.unlink(destination)
            raise _Changed(f"{entry['path']} changed while it was backed up") from None
    fsync_directory(os.path.dirname(destination))
    backed_up[entry["path"]] = destination


def _interpreter_for(site_dir: str, explicit: str | None) -> str:
    """The Python whose site-packages is ``site_dir``: ``--python``, this one, or the one that
    owns it (discovery.owning_interpreter: a venv's bin/python, <prefix>/bin/pythonX.Y).
    Raises UsageError."""
    if explicit:
        return explicit
    real = os.path.realpath(site_dir)
    if real in default_site_packages():
        return sys.executable
    owner = owning_interpreter(real)
    if owner is None:
        raise UsageError(f"cannot find the Python interpreter of {site_dir}: pass --python")
    return owner.executable


def pip_command(python: str) -> list[str]:
    """``python -m pip`` when that interpreter has pip, else this rocm-audit's pip driving it
    (``pip --python``, pip 22.3+). Raises UsageError when neither works."""
    probe = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, timeout=120)
    if probe.returncode == 0:
        return [python, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    own = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, timeout=120)
    if own.returncode == 0:
        return [sys.executable, "-m", "pip", "--python", python, "--disable-pip-version-check", "--no-input"]
    raise UsageError(f"{python} has no pip to uninstall device distributions with")


def backup_outside(plan: PrunePlan, backup_dir: str | None) -> str | None:
    """``--backup``'s absolute path, None without one. Raises UsageError when it lies inside an
    audited tree: the backup would be pruned, or listed, with what it keeps."""
    if not backup_dir:
        return None
    backup = os.path.abspath(backup_dir)
    for root in plan.roots:
        if backup == root.path or backup.startswith(root.path.rstrip(os.sep) + os.sep):
            raise UsageError(
                f"--backup {backup_dir}: inside the audited tree {root.path}",
                hint="give a directory outside every tree prune changes, e.g. --backup /var/tmp/rocm-audit-backup",
            )
    return backup


def apply_plan(
    plan: PrunePlan,
    manifest_path: str | None,
    backup_dir: str | None,
    python: str | None,
    findings: list[Finding],
    progress: Progress = SILENT,
) -> ApplyResult:
    """Journal, then carry out each removal. Raises UsageError, and Interrupted on Ctrl-C: a unit
    is removed whole (its backups first, then its files, under tree/journal.py one_change) or
    not at all."""
    result = ApplyResult(backup=backup_dir, planned=len(plan.removals))
    if not plan.removals:
        return result
    try:
        return _apply_locked(plan, manifest_path, backup_dir, python, findings, progress, result)
    except Interrupted:
        raise
    except KeyboardInterrupt:
        made = result.removed
        raise Interrupted("prune", made, len(plan.removals), result.manifest if made else None) from None


def _apply_locked(
    plan: PrunePlan,
    manifest_path: str | None,
    backup_dir: str | None,
    python: str | None,
    findings: list[Finding],
    progress: Progress,
    result: ApplyResult,
) -> ApplyResult:
    manifest = manifest_path or default_manifest_path(plan)
    backup = backup_outside(plan, backup_dir)
    pip: list[str] | None = None
    interpreter = os.path.abspath(python) if python else None
    if any(r.distribution is not None for r in plan.removals):
        site_dir = next(r.distribution.site_dir for r in plan.removals if r.distribution is not None)
        interpreter = os.path.abspath(_interpreter_for(site_dir, python))
        pip = pip_command(interpreter)
    locked = sorted({*plan.sdk_trees, *(r.path for r in plan.roots if not r.single_file)})
    with tree_locks(locked) as busy:
        if busy:
            for tree in busy:
                findings.append(
                    make_finding("PRUNE005", tree, "another rocm-audit run holds this tree; nothing changed")
                )
            for removal in plan.removals:
                removal.status, removal.reason = "skipped", "tree locked by another run"
            return result
        run = secrets.token_hex(8)
        hashes: dict[tuple[int, int], str] = {}
        journal: list[list[dict[str, Any]]] = [
            _entries(removal, index, run, backup, hashes) for index, removal in enumerate(plan.removals)
        ]
        header = {
            "rocm_audit_prune_manifest": MANIFEST_FORMAT,
            "run": run,
            "tool_version": __version__,
            "created_unix": int(time.time()),
            "backup": backup,
            "kept": [k.spelled for k in plan.kept],
            "python": interpreter,  # the audited site's interpreter, for the reinstall lines of a revert
        }
        try:
            append_records(manifest, [header, *(line for lines in journal for line in lines)])
        except OSError as exc:
            findings.append(
                make_finding("PRUNE004", manifest, f"cannot write the revert manifest: {exc.strerror}; nothing changed")
            )
            for removal in plan.removals:
                removal.status, removal.reason = "failed", "no manifest"
            return result
        result.manifest = manifest  # written: the run can be reverted from here on
        backed_up: dict[str, str] = {}
        progress.phase("removing", len(plan.removals), "units")
        for done, (removal, lines) in enumerate(zip(plan.removals, journal, strict=True)):
            progress.update(done)
            try:
                entries = _prepare(lines, backed_up, backup is not None)
            except _Changed as exc:
                _record_failure(removal, findings, "skipped", exc)
                continue
            except OSError as exc:
                _record_failure(removal, findings, "failed", exc)
                continue
            with one_change():  # a Ctrl-C waits until the unit is gone and counted
                try:
                    _remove(removal, lines, entries, pip, backup is not None)
                except _Changed as exc:
                    _record_failure(removal, findings, "skipped", exc)
                except (OSError, subprocess.SubprocessError) as exc:
                    _record_failure(removal, findings, "failed", exc)
                else:
                    removal.status = "removed"
                    result.removed += 1
                    result.bytes_freed += removal.bytes_on_disk
    return result


def plain_error(exc: Exception, about: str = "") -> str:
    """An error in plain words: the system's message (``Read-only file system``), with the file it
    names unless that is ``about`` (the path the message is on) or one of our own temporary files;
    never Python's ``[Errno 30]`` form."""
    if not isinstance(exc, OSError) or not exc.strerror:
        return str(exc)
    name = exc.filename if isinstance(exc.filename, str) else None
    if name is None or name == about or os.path.basename(name).startswith(TEMP_PREFIX):
        return exc.strerror
    return f"{exc.strerror}: {name}"


def _record_failure(removal: Removal, findings: list[Finding], status: str, exc: Exception) -> None:
    removal.status, removal.reason = status, plain_error(exc, removal.path)
    if status == "skipped":
        findings.append(make_finding("PRUNE003", removal.path, f"skipped: {removal.reason}"))
    else:
        findings.append(make_finding("PRUNE004", removal.path, f"could not remove: {removal.reason}"))


def _prepare(lines: list[dict[str, Any]], backed_up: dict[str, str], backup: bool) -> list[dict[str, Any]]:
    """Re-check a whole unit before any of it changes, and back its files up: nothing is removed
    yet, so a Ctrl-C here leaves the unit as it was. Returns its file and link entries."""
    entries = [e for e in lines if e.get("type") in ("file", "link")]
    for entry in entries:
        _unchanged(entry)
    if backup:
        for entry in entries:
            if entry["type"] == "file":
                _back_up(entry, backed_up)
    return entries


def _remove(
    removal: Removal, lines: list[dict[str, Any]], entries: list[dict[str, Any]], pip: list[str] | None, backup: bool
) -> None:
    distribution = removal.distribution
    if distribution is not None:
        assert pip is not None
        _uninstall(distribution, pip, entries)
        leftovers = [e for e in entries if e["role"] not in ("file", "shared") and os.path.lexists(e["path"])]
    else:
        leftovers = entries
    for entry in leftovers:
        # Linking a file into the backup, and removing another name of it, change the inode's ctime
        # and nothing else; the ctime is compared only where neither happened.
        ctime = not backup and distribution is None and "hardlink_of" not in entry
        try:
            _unchanged(entry, ctime=ctime)
        except _Changed as exc:
            if distribution is None:
                raise
            # pip has uninstalled the distribution already: a devel link someone changed stays
            removal.reason = f"uninstalled; left {entry['path']}: {exc}"
            continue
        os.unlink(entry["path"])
    for entry in lines:
        if entry.get("type") == "dir":
            with contextlib.suppress(FileNotFoundError, OSError):
                os.rmdir(entry["path"])


def _uninstall(distribution: Distribution, pip: list[str], files: list[dict[str, Any]]) -> None:
    """``pip uninstall -y``; files another installed distribution also owns (TheRock's device wheels
    list ``_rocm_sdk_libraries/__init__.py``) are put back afterwards from a hardlink kept aside."""
    aside: list[tuple[str, str]] = []
    for entry in files:
        if entry["role"] == "shared" and entry["type"] == "file":
            temporary = os.path.join(os.path.dirname(entry["path"]), TEMP_PREFIX + secrets.token_hex(6))
            os.link(entry["path"], temporary)
            aside.append((temporary, entry["path"]))
    try:
        # In a session of its own: a Ctrl-C at the terminal must not stop pip half-way through an
        # uninstall (pip rolls back on errors, not on KeyboardInterrupt); rocm-audit stops after it.
        done = subprocess.run(
            [*pip, "uninstall", "-y", distribution.name],
            capture_output=True,
            text=True,
            timeout=1800,
            start_new_session=True,
        )
    finally:
        for temporary, path in aside:
            if os.path.lexists(path):
                os.unlink(temporary)
            else:
                os.rename(temporary, path)
    if done.returncode != 0:
        raise subprocess.SubprocessError(
            f"pip uninstall {distribution.name} failed ({done.returncode}): {done.stderr.strip()[-400:]}"
        )
    if os.path.lexists(distribution.dist_info):
        raise subprocess.SubprocessError(f"pip uninstall left {distribution.dist_info} in place")


# --------------------------------------------------------------------------------------------
# Revert


@dataclass(slots=True)
class RevertResult:
    restored: list[str] = field(default_factory=list)
    original: list[str] = field(default_factory=list)
    reinstall: list[str] = field(default_factory=list)  # pip lines for what no backup holds
    findings: list[Finding] = field(default_factory=list)
    planned: int = 0  # journalled paths (directories aside)


def _is_original(entry: dict[str, Any]) -> bool:
    path = entry["path"]
    if entry["type"] == "link":
        return os.path.islink(path) and os.readlink(path) == entry["link_text"]
    if entry["type"] == "dir":
        return os.path.isdir(path)
    return os.path.isfile(path) and not os.path.islink(path) and sha256_of(path) == entry["sha256"]


def revert(
    manifest_paths: list[str], progress: Progress = SILENT, reinstalls: Reinstalls | None = None
) -> RevertResult:
    """Restore every journalled path; a path several runs journalled is judged by its latest entry
    and restored from whichever backup still holds its bytes. Raises UsageError, and Interrupted
    on Ctrl-C (each path is restored whole, or not at all)."""
    result = RevertResult()
    try:
        return _revert(manifest_paths, progress, result, Reinstalls() if reinstalls is None else reinstalls)
    except Interrupted:
        raise
    except KeyboardInterrupt:
        raise Interrupted("prune --revert", len(result.restored), result.planned, None) from None


def _revert(
    manifest_paths: list[str], progress: Progress, result: RevertResult, reinstalls: Reinstalls
) -> RevertResult:
    by_path: dict[str, list[dict[str, Any]]] = {}
    uninstalled_by_prune: set[tuple[str, int]] = set()  # (run, removal): a device distribution pip removed
    python_of_run: dict[str, str | None] = {}
    for manifest in manifest_paths:
        records = read_records(manifest)
        if not records or "rocm_audit_prune_manifest" not in records[0]:  # empty: a mistyped path, never "all back"
            raise UsageError(f"{manifest}: not a rocm-audit prune manifest (no run is journalled in it)")
        for entry in records:
            if "rocm_audit_prune_manifest" in entry:
                python_of_run[str(entry.get("run"))] = entry.get("python")
            if entry.get("type") == "removal" and entry.get("distribution"):
                uninstalled_by_prune.add((str(entry.get("run")), entry.get("removal", -1)))
            if entry.get("type") not in ("file", "link", "dir"):
                continue
            if not isinstance(entry.get("path"), str) or (entry["type"] == "file" and "sha256" not in entry):
                raise UsageError(f"{manifest}: a manifest entry lacks its path or sha256")
            by_path.setdefault(entry["path"], []).append(entry)
    directories = sorted((p for p, e in by_path.items() if e[-1]["type"] == "dir"), key=lambda p: p.count(os.sep))
    for path in directories:
        if not os.path.isdir(path):
            entry = by_path[path][-1]
            os.makedirs(path, exist_ok=True)
            os.chmod(path, entry["mode"])
            with contextlib.suppress(PermissionError, KeyError):
                os.chown(path, entry["uid"], entry["gid"])
    restored_at: dict[str, str] = {}
    devel: list[str] = []
    result.planned = sum(1 for entries in by_path.values() if entries[-1]["type"] != "dir")
    progress.phase("restoring", result.planned, "paths")
    for path, entries in by_path.items():
        latest = entries[-1]
        if latest["type"] == "dir":
            continue
        progress.update(len(result.restored) + len(result.original))
        removed_by_prune = (str(latest.get("run")), latest.get("removal", -1)) in uninstalled_by_prune
        if not os.path.lexists(path) and reinstalls.uninstalled(latest, removed_by_prune=removed_by_prune):
            continue  # its distribution was uninstalled after the prune: no file of it comes back
        if os.path.lexists(path):
            if any(_is_original(e) for e in reversed(entries)):
                result.original.append(path)
                restored_at[path] = path
            else:
                result.findings.append(
                    make_finding("PRUNE006", path, "not restored: the path holds something else now")
                )
            continue
        with one_change():  # a Ctrl-C waits until this path is back whole and counted
            try:
                done = any(_restore(e, restored_at) for e in reversed(entries))
            except OSError as exc:
                result.findings.append(make_finding("PRUNE006", path, f"not restored: {exc.strerror or exc}"))
                continue
            if done:
                result.restored.append(path)
                restored_at[path] = path
        if done:
            continue
        if latest.get("owner"):
            reinstalls.add(latest, python_of_run.get(str(latest.get("run"))))
        elif latest.get("role") in ("devel-file", "devel-link"):
            devel.append(path)  # TheRock re-creates its devel links
        else:
            result.findings.append(
                make_finding("PRUNE006", path, "not restored: no backup holds it and no distribution owns it")
            )
    if devel:
        result.reinstall.append("rocm-sdk init")
        message = f"no backup holds {plural(len(devel), 'devel link')} of TheRock: `rocm-sdk init` makes them again"
        result.findings.append(make_finding("PRUNE007", devel[0], message, data={"command": "rocm-sdk init"}))
    return result


def _restore(entry: dict[str, Any], restored_at: dict[str, str]) -> bool:
    """Put one path back; False when nothing holds its bytes."""
    path = entry["path"]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if entry["type"] == "link":
        os.symlink(entry["link_text"], path)
        return True
    partner = entry.get("hardlink_of")
    if partner and partner in restored_at and os.path.isfile(partner):
        os.link(partner, path)
        return True
    backup = entry.get("backup")
    if not backup or not os.path.isfile(backup) or sha256_of(backup) != entry["sha256"]:
        return False
    try:
        os.rename(backup, path)  # the backup's inode is the original file: mode, owner, mtime kept
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        copy_into_place(backup, path, entry)
    fsync_directory(os.path.dirname(path))
    return True
