"""Plan, apply and revert ``prune --fatbins`` over a set of host libraries.

Order of an applying run (the safety of prune/apply.py, for a file changed in place):

1. lock every SDK tree and audited directory (tree/journal.py, shared with dedup and prune);
2. journal each library before the first change: its sha256, size, mode, owner, identity, the
   distribution that installed it and its RECORD line, the backup path; fsync'ed;
3. per library: copy it to a temporary file in its own directory and slim every bundle there,
   once (library.py: each bundle's selection proved by sha256, comgr's agreement asked), prove
   the copy (layout.py ``prove``), fsync; with ``--backup`` copy the original (and its RECORD)
   into the backup and check the copy's sha256; re-check the original's identity with its ctime
   against the journal (nothing can change the file and leave that); ``os.replace``; fsync the
   directory; then rewrite its RECORD line the way pip writes it (``sha256=`` urlsafe base64
   without padding, and the size), atomically too.

An applying run plans with ``defer=True``: the plan only refuses what needs no slimming (kept
distributions, hard links, no owner without a backup, what ``check_library`` reads from the
wrappers), and each library is slimmed once, by the step that writes its replacement.
A dry run or ``--check`` slims in memory (nothing written) to give the exact figures and proofs.
At most one temporary file exists at a time: the library being slimmed, at most its own size.

Revert puts back each journalled library whose current bytes are the slimmed ones we wrote: from
the backup (byte-identical, sha256 checked) with its RECORD line, else it names the exact
``pip install --force-reinstall --no-deps DIST==VERSION``.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rocm_audit.errors import FormatError, Interrupted
from rocm_audit.findings import Finding, make_finding
from rocm_audit.prune.apply import CopyMismatch, copy_into_place, plain_error, sha256_of
from rocm_audit.prune.fatbins.comgr import AGREED, KNOWS_NONE, NOT_AVAILABLE, ComgrError, ComgrProof, system_comgr
from rocm_audit.prune.fatbins.library import LibraryResult, Refused, check_library, prove_file, slim_library
from rocm_audit.prune.plan import distribution_matches
from rocm_audit.prune.reinstall import Reinstalls
from rocm_audit.tree.inventory import TEMP_PREFIX
from rocm_audit.tree.journal import append_records, fsync_directory, one_change, read_records, tree_locks
from rocm_audit.tree.ownership import Distribution
from rocm_audit.tree.targets import TargetId

_CHUNK = 1 << 20
_UNOWNED = "no distribution owns it: slimmed only with --backup"
_NO_FATBIN = "no .hip_fatbin"  # a refusal that is no finding: the library has nothing to slim
ENTRY_TYPE = "fatbin-file"
DONE_TYPE = "fatbin-done"


def record_hash(hexdigest: str) -> str:
    """A RECORD hash field as pip writes it: ``sha256=`` and urlsafe base64 without padding."""
    return "sha256=" + base64.urlsafe_b64encode(bytes.fromhex(hexdigest)).rstrip(b"=").decode("ascii")


@dataclass(slots=True)
class FatbinLibrary:
    path: str
    owner: Distribution | None
    result: LibraryResult | None = None  # what slimming gives (dry run), None when refused
    refused: str = ""  # why the library stays as it is
    status: str = "planned"  # planned | slimmed | unchanged | skipped | failed
    comgr: str = ""  # proof (d): agreed | not available | knows none of the kept targets | ...
    replaced: bool = False  # the slimmed copy took its place: a change made, whatever comes after

    @property
    def freed(self) -> int:
        return self.result.freed if self.result is not None else 0

    @property
    def saved(self) -> int:
        """Bytes the file shrinks by on disk."""
        return self.result.saved if self.result is not None and not self.refused else 0


@dataclass(slots=True)
class FatbinPlan:
    kept: list[TargetId]
    kept_spelled: list[str]
    libraries: list[FatbinLibrary] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    deferred: bool = False  # the libraries are slimmed by apply_fatbins, once (nothing slimmed yet)
    comgr_library: str | None = None

    @property
    def freed(self) -> int:
        return sum(library.freed for library in self.libraries)

    @property
    def saved(self) -> int:
        return sum(library.saved for library in self.libraries)

    def freed_by_distribution(self, *, applied: bool = False) -> dict[str, int]:
        """Device code removed per distribution, largest first; ``applied``: only from the
        libraries an applying run slimmed (not those it skipped or failed on)."""
        by: dict[str, int] = {}
        for library in self.libraries:
            if library.freed and (not applied or library.status == "slimmed"):
                name = library.owner.name if library.owner is not None else "(no distribution)"
                by[name] = by.get(name, 0) + library.freed
        return dict(sorted(by.items(), key=lambda item: -item[1]))


def plan_fatbins(
    candidates: Sequence[tuple[str, Distribution | None]],
    kept: list[TargetId],
    kept_spelled: list[str],
    keep_dists: Sequence[str | tuple[str, str]] = (),
    *,
    backup: bool = False,
    comgr_library: str | None = None,
    defer: bool = False,
) -> FatbinPlan:
    """Work out what slimming each candidate library gives (nothing is written) and keep the
    result. A library a kept distribution owns, one no distribution owns when no backup is asked
    for (nothing could bring it back), one with several hard links, or one the slimming refuses,
    stays; the refusals are PRUNE008 findings.
    ``comgr_library``: the comgr that must agree on every slimmed bundle (comgr.py; None: the
    system's, if one loads). ``defer``: slim nothing here, only refuse what needs no slimming;
    apply_fatbins then slims each library once, with every proof, as it writes it."""
    plan = FatbinPlan(kept, kept_spelled, deferred=defer, comgr_library=comgr_library)
    if not candidates:
        return plan
    keep = [(k, f"--keep-dist {k}") if isinstance(k, str) else k for k in keep_dists]
    with contextlib.ExitStack() as stack:
        proof, comgr_state = (None, "") if defer else _open_comgr(stack, kept, comgr_library)
        comgr = [proof]
        for path, owner in candidates:
            library = FatbinLibrary(path, owner)
            plan.libraries.append(library)
            _plan_one(plan, library, keep, comgr, comgr_state, backup=backup)
    return plan


def _open_comgr(
    stack: contextlib.ExitStack, kept: list[TargetId], comgr_library: str | None
) -> tuple[ComgrProof | None, str]:
    """The comgr child for the run (or None) and the proof's state when it does not run."""
    where = comgr_library or system_comgr()
    if where is None:
        return None, NOT_AVAILABLE
    try:
        proof = stack.enter_context(ComgrProof(where, kept))
    except (ComgrError, OSError) as exc:
        return None, f"{NOT_AVAILABLE}: {exc}"
    if not proof.queries:
        return None, KNOWS_NONE
    return proof, AGREED


def _slim_proved(
    library: FatbinLibrary,
    kept: list[TargetId],
    comgr: list[ComgrProof | None],
    state: str,
    copy: tuple[int, int] | None = None,
) -> LibraryResult:
    """slim_library with comgr's proof; a comgr child that fails is not asked again (the state
    says why, and the library is slimmed again without it). ``copy``: (the original's descriptor,
    its byte-identical copy's) to write the slimmed library into; None: a dry run. Raises Refused,
    FormatError, OSError."""
    out_fd = copy[1] if copy is not None else None
    proof = comgr[0]
    if proof is None:
        # the run's child was dropped when it failed on an earlier library: say so, not "agreed"
        library.comgr = state if state != AGREED else "not run: the comgr child failed on an earlier library"
        return slim_library(library.path, kept, out_fd)
    agreed_before = proof.checked
    try:
        result = slim_library(library.path, kept, out_fd, comgr=proof)
    except ComgrError as exc:
        comgr[0] = None
        library.comgr = f"not run: {exc}"
        if copy is not None:  # the copy is half written: start again from the original
            os.ftruncate(copy[1], 0)
            _copy_whole(*copy)
        return slim_library(library.path, kept, out_fd)
    library.comgr = AGREED if proof.checked > agreed_before else ""
    return result


def _plan_one(
    plan: FatbinPlan,
    library: FatbinLibrary,
    keep: Sequence[tuple[str, str]],
    comgr: list[ComgrProof | None],
    comgr_state: str,
    *,
    backup: bool,
) -> None:
    owner, path = library.owner, library.path
    source = distribution_matches(owner.name, keep) if owner is not None else None
    if source is not None:
        library.refused, library.status = f"{owner.name if owner else ''} is kept whole ({source})", "unchanged"
        return
    try:
        st = os.lstat(path)
        if st.st_nlink > 1:
            raise Refused(f"{st.st_nlink} hard links share it: slimming one name would keep both copies")
        if plan.deferred:
            check_library(path)
            if owner is None and not backup:
                raise Refused(_UNOWNED)
            return  # slimmed once, by apply_fatbins
        result = _slim_proved(library, plan.kept, comgr, comgr_state)
    except Refused as exc:
        library.refused, library.status = str(exc), "unchanged"
    except (FormatError, OSError) as exc:
        library.refused, library.status = f"cannot read it: {exc}", "unchanged"
    else:
        if not result.freed:
            library.status = "unchanged"
            library.result = result
            return
        if owner is None and not backup:
            library.refused, library.status = _UNOWNED, "unchanged"
            return
        library.result = result
    if library.refused and not library.refused.startswith(_NO_FATBIN):
        plan.findings.append(make_finding("PRUNE008", path, f"fat binaries left as they are: {library.refused}"))


# --------------------------------------------------------------------------------------------
# Apply


@dataclass(slots=True)
class FatbinApplyResult:
    slimmed: int = 0
    planned: int = 0  # libraries with device code to remove
    bytes_zeroed: int = 0  # device code removed (kept name: the report's "bytes")
    bytes_saved: int = 0  # bytes the files shrank by on disk
    manifest: str | None = None
    backup: str | None = None


def _record_line(distribution: Distribution, path: str) -> tuple[str, int] | None:
    """(the RECORD line naming ``path`` as written, its index), or None."""
    relpath = os.path.relpath(path, distribution.site_dir)
    with open(os.path.join(distribution.dist_info, "RECORD"), encoding="utf-8", newline="") as handle:
        lines = handle.read().splitlines(keepends=True)
    for index, line in enumerate(lines):
        first = line.split(",", 1)[0].strip('"')
        if os.path.normpath(first) == os.path.normpath(relpath):
            return line, index
    return None


def _rewrite_record(distribution: Distribution, path: str, new_line_of: Any) -> None:
    """Replace ``path``'s RECORD line (``new_line_of(old_line)``), atomically, every other byte kept."""
    record = os.path.join(distribution.dist_info, "RECORD")
    with open(record, encoding="utf-8", newline="") as handle:
        lines = handle.read().splitlines(keepends=True)
    found = _record_line(distribution, path)
    if found is None:
        return
    line, index = found
    lines[index] = new_line_of(line)
    st = os.stat(record)
    temporary = os.path.join(os.path.dirname(record), TEMP_PREFIX + secrets.token_hex(6))
    try:
        with open(temporary, "w", encoding="utf-8", newline="") as handle:
            handle.write("".join(lines))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, stat.S_IMODE(st.st_mode))
        os.replace(temporary, record)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    fsync_directory(os.path.dirname(record))


def pip_record_line(line: str, relpath_field: str, sha256_hex: str, size: int) -> str:
    ending = line[len(line.rstrip("\r\n")) :]
    return f"{relpath_field},{record_hash(sha256_hex)},{size}{ending}"


def _journal_entry(library: FatbinLibrary, run: str, backup: str | None) -> dict[str, Any]:
    st = os.lstat(library.path)
    entry: dict[str, Any] = {
        "run": run,
        "type": ENTRY_TYPE,
        "path": library.path,
        "sha256": sha256_of(library.path),
        "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode),
        "uid": st.st_uid,
        "gid": st.st_gid,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        "dev": st.st_dev,
        "ino": st.st_ino,
    }
    owner = library.owner
    if owner is not None:
        entry.update(
            {
                "owner": owner.name,
                "owner_version": owner.version,
                "dist_info": owner.dist_info,
                "site_dir": owner.site_dir,
            }
        )
        found = _record_line(owner, library.path)
        if found is not None:
            entry["record_line"] = found[0]
    if backup is not None:
        entry["backup"] = os.path.join(backup, library.path.lstrip(os.sep))
    return entry


class _Changed(Exception):
    pass


class _Unproved(Exception):
    """The new file is not exactly what was planned: the library stays as it is."""


def _same_file(entry: dict[str, Any], *, ctime: bool = False) -> None:
    st = os.lstat(entry["path"])
    same = stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == (
        entry["dev"],
        entry["ino"],
        entry["size"],
        entry["mtime_ns"],
    )
    if not same or (ctime and st.st_ctime_ns != entry["ctime_ns"]):
        raise _Changed(f"{entry['path']} changed since it was planned")


def _copy_whole(src_fd: int, dst_fd: int) -> None:
    """The whole file into an empty one, in the kernel where it can (copy_file_range: no pass of
    the bytes through this process; a reflink on filesystems that share extents)."""
    size = os.fstat(src_fd).st_size
    done = 0
    try:
        while done < size:
            step = os.copy_file_range(src_fd, dst_fd, size - done, done, done)
            if step == 0:
                break
            done += step
    except OSError:
        pass  # not across these filesystems: copy the rest through the process
    while done < size:
        chunk = os.pread(src_fd, min(_CHUNK, size - done), done)
        if not chunk:
            raise OSError(f"the file ended at {done} of {size} bytes while it was copied")
        done += os.pwrite(dst_fd, chunk, done)


def _back_up(entry: dict[str, Any]) -> None:
    """The original into the backup with its journalled metadata, the copy checked by sha256
    (prune/apply.py's copy). A copy, never a hardlink: a link would change the original's link
    count and ctime, which the re-check before the replace compares."""
    try:
        copy_into_place(entry["path"], entry["backup"], entry, check_sha256=True)
    except CopyMismatch as exc:
        raise _Changed(str(exc)) from None
    fsync_directory(os.path.dirname(entry["backup"]))


def apply_fatbins(
    plan: FatbinPlan,
    locked: list[str],
    manifest: str,
    backup_dir: str | None,
    findings: list[Finding],
    python: str | None = None,
) -> FatbinApplyResult:
    """Journal, then slim each planned library in place, once (see the module docstring). A
    deferred plan's libraries are slimmed here for the first time; a plan that slimmed them in
    memory already names those that free nothing, which are left out."""
    todo = [
        lib
        for lib in plan.libraries
        if not lib.refused and (lib.result.freed if lib.result is not None else lib.status == "planned")
    ]
    backup = os.path.abspath(backup_dir) if backup_dir else None
    result = FatbinApplyResult(planned=len(todo), backup=backup)
    if not todo:
        return result
    with tree_locks(locked) as busy:
        if busy:
            for tree in busy:
                findings.append(
                    make_finding("PRUNE005", tree, "another rocm-audit run holds this tree; nothing changed")
                )
            _not_attempted(todo, "tree locked by another run")
            return result
        run = secrets.token_hex(8)
        entries = [_journal_entry(library, run, backup) for library in todo]
        header = {
            "rocm_audit_prune_manifest": 1,
            "run": run,
            "fatbins": True,
            "kept": plan.kept_spelled,
            "backup": backup,
            "python": os.path.abspath(python) if python else None,  # for the reinstall lines of a revert
        }
        try:
            append_records(manifest, [header, *entries])
        except OSError as exc:
            findings.append(
                make_finding("PRUNE004", manifest, f"cannot write the revert manifest: {exc.strerror}; nothing changed")
            )
            _not_attempted(todo, "no revert manifest")
            return result
        result.manifest = manifest  # written: the run can be reverted from here on
        try:
            with contextlib.ExitStack() as stack:
                proof, comgr_state = _open_comgr(stack, plan.kept, plan.comgr_library)
                comgr = [proof]  # a child that fails is dropped for the libraries after it too
                for library, entry in zip(todo, entries, strict=True):
                    _apply_one(library, entry, plan.kept, comgr, comgr_state, (manifest, run), result, findings)
        except KeyboardInterrupt:
            # Each library is replaced whole (one_change) or not at all: say how many were.
            made = sum(1 for library in todo if library.replaced)
            raise Interrupted("prune", made, len(todo), manifest if made else None) from None
    return result


def _not_attempted(libraries: list[FatbinLibrary], why: str) -> None:
    for library in libraries:
        library.status, library.refused = "skipped", why


def _apply_one(
    library: FatbinLibrary,
    entry: dict[str, Any],
    kept: list[TargetId],
    comgr: list[ComgrProof | None],
    comgr_state: str,
    journal: tuple[str, str],
    result: FatbinApplyResult,
    findings: list[Finding],
) -> None:
    """Slim one journalled library in place and say what happened (findings, ``result``).
    ``journal``: the manifest and the run's id."""
    try:
        done = _slim_one(library, entry, kept, comgr, comgr_state)
    except _Unproved as exc:
        library.status, library.refused = "skipped", str(exc)
        findings.append(
            make_finding(
                "PRUNE008", library.path, f"fat binaries left as they are: the new file failed its proof: {exc}"
            )
        )
        return
    except Refused as exc:  # a proof failed while slimming (as a dry run would have said)
        library.status, library.refused, library.result = "unchanged", str(exc), None
        if not library.refused.startswith(_NO_FATBIN):
            findings.append(make_finding("PRUNE008", library.path, f"fat binaries left as they are: {exc}"))
        return
    except _Changed as exc:
        library.status, library.refused = "skipped", str(exc)
        findings.append(make_finding("PRUNE003", library.path, f"skipped: {exc}"))
        return
    except (OSError, FormatError) as exc:
        library.status, library.refused = "failed", plain_error(exc, library.path)
        findings.append(make_finding("PRUNE004", library.path, f"could not slim: {library.refused}"))
        return
    if done is None:  # nothing to remove after all: left as it is, nothing written, not counted
        library.status = "unchanged"
        result.planned -= 1
        return
    manifest, run = journal
    append_records(manifest, [{"run": run, "type": DONE_TYPE, "path": library.path, "sha256_after": done}])
    library.status = "slimmed"
    result.slimmed += 1
    result.bytes_zeroed += library.freed
    result.bytes_saved += library.saved
    findings.append(
        make_finding(
            "PRUNE009",
            library.path,
            _slimmed_message(library),
            data={
                "bytes": library.freed,
                "file_bytes": library.saved,
                "layout": library.result.layout if library.result else "",
                "removed_targets": library.result.removed_targets if library.result else [],
            },
        )
    )


def _slimmed_message(library: FatbinLibrary) -> str:
    removed = f"{_size(library.freed)} of device code for other GPUs removed"
    result = library.result
    if result is None or result.layout == "zeroed":
        reason = f" ({result.plan.reason})" if result is not None and result.plan and result.plan.reason else ""
        return (
            f"{removed} and zeroed in place: the file keeps its size on disk{reason}; a compressed image "
            "layer or archive shrinks by about that much"
        )
    how = (
        "the segment holding the fat binaries ends earlier"
        if result.layout == "truncated"
        else ("the segment holding the fat binaries is split so the sections after them keep their addresses")
    )
    return f"{removed}; the file is {_size(library.saved)} smaller on disk ({how})"


def _size(nbytes: int) -> str:
    from rocm_audit.units import size_text  # noqa: PLC0415

    return size_text(nbytes)


def _slim_one(
    library: FatbinLibrary,
    entry: dict[str, Any],
    kept: list[TargetId],
    comgr: list[ComgrProof | None],
    comgr_state: str,
) -> str | None:
    """Slim one library, once: into a copy in its own directory, proved, then in its place.
    Returns the new sha256, or None when nothing is removed (nothing written). The copy is
    removed whatever happens (an error, a refusal, Ctrl-C) unless it became the library. Raises
    _Changed, _Unproved, Refused, OSError, FormatError."""
    path = library.path
    _same_file(entry)
    directory = os.path.dirname(path)
    temporary = os.path.join(directory, TEMP_PREFIX + secrets.token_hex(6))
    try:
        with open(path, "rb") as src, open(temporary, "w+b") as dst:
            _copy_whole(src.fileno(), dst.fileno())
            result = _slim_proved(library, kept, comgr, comgr_state, (src.fileno(), dst.fileno()))
            library.result = result
            if not result.freed:
                return None
            problem = prove_file(src.fileno(), dst.fileno(), result)
            if problem is not None:
                library.result = None
                raise _Unproved(problem)
            os.fsync(dst.fileno())
        os.chmod(temporary, entry["mode"])
        with contextlib.suppress(PermissionError):
            os.chown(temporary, entry["uid"], entry["gid"])
        new_sha = sha256_of(temporary)
        new_size = os.path.getsize(temporary)
        if "backup" in entry:  # only a library about to change is backed up
            _back_up(entry)
        with one_change():  # a Ctrl-C waits until the library and its RECORD line are both new
            # The identity with the ctime: no write, chmod or rename since the journal (and the
            # sha256 in it) can leave all of it as it was, so the file slimmed is the one hashed.
            _same_file(entry, ctime=True)
            os.replace(temporary, path)
            library.replaced = True
            fsync_directory(directory)
            owner = library.owner
            if owner is not None and "record_line" in entry:
                relpath_field = entry["record_line"].split(",", 1)[0]
                _rewrite_record(owner, path, lambda line: pip_record_line(line, relpath_field, new_sha, new_size))
    finally:  # gone already when it replaced the library
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    return new_sha


# --------------------------------------------------------------------------------------------
# Revert


@dataclass(slots=True)
class FatbinRevertResult:
    restored: list[str] = field(default_factory=list)
    original: list[str] = field(default_factory=list)
    reinstall: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)


def revert_fatbins(manifest_paths: list[str], reinstalls: Reinstalls | None = None) -> FatbinRevertResult:
    """Put back every library a ``--fatbins`` run slimmed (see the module docstring); what no
    backup holds goes to ``reinstalls``."""
    result = FatbinRevertResult()
    reinstalls = Reinstalls() if reinstalls is None else reinstalls
    latest: dict[str, dict[str, Any]] = {}
    after: dict[tuple[str, str], str] = {}
    python_of_run: dict[str, str | None] = {}
    for manifest in manifest_paths:
        for record in read_records(manifest):
            if "rocm_audit_prune_manifest" in record:
                python_of_run[str(record.get("run"))] = record.get("python")
            elif record.get("type") == ENTRY_TYPE and isinstance(record.get("path"), str):
                latest.setdefault(record["path"], record)  # the first run's original is the original
            elif record.get("type") == DONE_TYPE and isinstance(record.get("path"), str):
                after[record["run"], record["path"]] = record.get("sha256_after", "")
    try:
        for path, entry in latest.items():
            _revert_one(path, entry, after, python_of_run, reinstalls, result)
    except KeyboardInterrupt:  # each library is restored whole (one_change) or not at all
        raise Interrupted("prune --revert", len(result.restored), len(latest), None) from None
    return result


def _revert_one(
    path: str,
    entry: dict[str, Any],
    after: dict[tuple[str, str], str],
    python_of_run: dict[str, str | None],
    reinstalls: Reinstalls,
    result: FatbinRevertResult,
) -> None:
    """Restore one slimmed library from its backup, or hand it to ``reinstalls``; say why not."""
    try:
        current = sha256_of(path)
    except OSError as exc:
        if not reinstalls.uninstalled(entry):  # uninstalled after the prune: nothing to restore
            why = exc.strerror or str(exc)
            owner = f", though {entry['owner']} is still installed" if entry.get("owner") else ""
            result.findings.append(make_finding("PRUNE006", path, f"not restored: {why}{owner}"))
        return
    if current == entry["sha256"]:
        result.original.append(path)
        return
    written = after.get((entry.get("run", ""), path))
    if written is not None and current != written:
        result.findings.append(make_finding("PRUNE006", path, "not restored: the path holds something else now"))
        return
    backup = entry.get("backup")
    if backup and os.path.isfile(backup) and sha256_of(backup) == entry["sha256"]:
        with one_change():
            _restore(entry, backup)
            result.restored.append(path)  # inside: a Ctrl-C comes after the count, not before it
        return
    if entry.get("owner"):
        reinstalls.add(entry, python_of_run.get(str(entry.get("run"))))
    else:
        result.findings.append(
            make_finding("PRUNE006", path, "not restored: no backup holds it and no distribution owns it")
        )


def _restore(entry: dict[str, Any], backup: str) -> None:
    path = entry["path"]
    directory = os.path.dirname(path)
    copy_into_place(backup, path, entry, check_sha256=True)
    fsync_directory(directory)
    line = entry.get("record_line")
    dist_info = entry.get("dist_info")
    if line and dist_info and os.path.isdir(dist_info):
        site_dir = entry.get("site_dir") or os.path.dirname(dist_info)
        owner = Distribution(entry["owner"], entry["owner_version"], dist_info, site_dir)
        _rewrite_record(owner, path, lambda _current: line)
