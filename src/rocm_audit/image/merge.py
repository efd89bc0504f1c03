"""Apply image layers in order into a private directory: whiteouts, opaque dirs, and no escapes.

Layer semantics follow the OCI image spec (image-spec layer.md; peers.md 5): ``.wh.<name>``
deletes ``<name>`` of the layers below, ``.wh..wh..opq`` hides everything the layers below put in
its directory; both act on lower layers only, so an entry of the same layer survives its own
layer's whiteout whatever the order inside the tar. A type change (file over directory) drops the
children, as stereoscope's merge does.

Safety (hostile input): names are normalised and refused when absolute, when they climb with
``..``, or when a parent component on disk is a symbolic link (we never write through a link);
hardlinks must name a regular file already extracted; device nodes and FIFOs are never created;
setuid/setgid/sticky bits are dropped; every byte written and every entry counts against limits.
Symbolic links are stored with absolute targets rewritten relative to the root and, after the
last layer, any link whose resolution by the host kernel would leave the root is removed: nothing
in the merged view points outside it. Every refusal is a finding naming the layer and the offset
of the tar header; nothing here raises on bad input except FormatError for an unreadable stream
and LimitExceeded.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import posixpath
import shutil
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from rocm_audit.errors import FormatError, RocmAuditError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.image import tarstream

log = logging.getLogger(__name__)

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
DEFAULT_MAX_BYTES = 64 << 30  # a ROCm SDK image unpacks to tens of GB; override with --max-bytes
DEFAULT_MAX_ENTRIES = 4_000_000
HASH_MIN_BYTES = 4096  # files smaller than this are not hashed for the waste analysis


class LimitExceeded(RocmAuditError):
    """The image is larger than the extraction limits allow."""


class ExtractionError(RocmAuditError):
    """The private work directory cannot take the merged view (disk full, read-only)."""


@dataclass(slots=True)
class Limits:
    max_bytes: int = DEFAULT_MAX_BYTES  # tar bytes read, over all layers
    max_entries: int = DEFAULT_MAX_ENTRIES
    bytes_read: int = 0
    entries: int = 0


@dataclass(frozen=True, slots=True)
class Copy:
    """One stored copy of a file's bytes: a data-bearing tar member (hardlinks share it)."""

    layer: int
    path: str  # image path, "/usr/lib/x"
    size: int
    digest: bytes  # BLAKE2b-256 of the content


@dataclass(slots=True)
class LayerStats:
    index: int
    name: str  # digest or archive member
    entries: int = 0
    files: int = 0
    file_bytes: int = 0
    whiteouts: int = 0
    opaque_dirs: int = 0
    refused: int = 0


@dataclass(slots=True)
class MergeState:
    """The merged view being built and what the waste analysis needs about every layer."""

    root: str
    limits: Limits
    keep: Callable[[str], bool]  # which regular files to write (others are only hashed)
    findings: list[Finding] = field(default_factory=list)
    layers: list[LayerStats] = field(default_factory=list)
    copies: list[Copy] = field(default_factory=list)
    # image path -> index in ``copies`` of the copy the merged view shows there (hashed files only)
    visible: dict[str, int] = field(default_factory=dict)
    # image paths sharing a copy through a tar hardlink: path -> copy index
    hardlinked: dict[str, int] = field(default_factory=dict)
    # image path -> the layer that wrote the regular file (or hardlink) the merged view shows there
    layer_of: dict[str, int] = field(default_factory=dict)
    # relative symlink path -> (layer member, layer index, header offset), for findings in finish()
    link_origin: dict[str, tuple[str, int, int]] = field(default_factory=dict)


def normalise(name: str) -> str | None:
    """A member name as a root-relative path ("usr/lib/x"), "" for the root, None when unsafe."""
    if "\0" in name or name.startswith("/"):
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        return None
    return "/".join(parts)


def apply_layer(state: MergeState, stream: tarstream.Readable, index: int, name: str, where: str) -> LayerStats:
    """Extract one layer's tar stream over the merged root. ``where`` names the layer in findings.

    Raises FormatError (unreadable tar: the caller reports it) and LimitExceeded.
    """
    stats = LayerStats(index=index, name=name)
    state.layers.append(stats)
    created: set[str] = set()  # relative paths this layer put in place
    hidden_by_whiteout: list[tuple[str, int]] = []  # applied after the layer: lower layers only
    opaque: list[tuple[str, int]] = []
    devices: list[tuple[int, str, str]] = []  # (offset, path, type): one finding per layer
    for entry, data in tarstream.iter_entries(_Budget(stream, state.limits)):
        state.limits.entries += 1
        stats.entries += 1
        if state.limits.entries > state.limits.max_entries:
            raise LimitExceeded(
                f"{where}: more than {state.limits.max_entries} entries in the image (raise --max-entries)"
            )
        rel = normalise(entry.name)
        if rel is None:
            _refuse(state, stats, where, entry, f"unsafe member name {entry.name!r} (absolute or '..')")
            continue
        if rel == "":
            continue  # "./": the root itself
        parent, base = posixpath.split(rel)
        if base.startswith(WHITEOUT_PREFIX):
            if base == OPAQUE_MARKER:
                stats.opaque_dirs += 1
                opaque.append((parent, entry.offset))
            elif base.startswith(WHITEOUT_PREFIX + WHITEOUT_PREFIX):
                state.findings.append(
                    make_finding(
                        "IMG006",
                        f"{where}:/{rel}",
                        f"unknown whiteout marker {base!r} ignored (the opaque marker is {OPAQUE_MARKER!r})",
                        data={"layer": index, "offset": entry.offset},
                    )
                )
            else:
                stats.whiteouts += 1
                hidden_by_whiteout.append((posixpath.join(parent, base[len(WHITEOUT_PREFIX) :]), entry.offset))
            continue
        try:
            problem = _prepare_parent(state, parent)
            if problem:
                _refuse(state, stats, where, entry, problem)
                continue
            target = os.path.join(state.root, rel)
            _mark_created(created, parent)
            if entry.kind == tarstream.DIRECTORY:
                if _lexists(target) and not _is_real_dir(target):
                    _drop(state, rel, target)
                if not _lexists(target):
                    os.mkdir(target, 0o755)
                os.chmod(target, (entry.mode & 0o777) | 0o700)
                created.add(rel)
                continue
            if entry.kind in (tarstream.CHARDEV, tarstream.BLOCKDEV, tarstream.FIFO):
                devices.append((entry.offset, "/" + rel, entry.kind))
                continue
            if entry.kind not in (tarstream.REGULAR, tarstream.HARDLINK, tarstream.SYMLINK):
                _refuse(state, stats, where, entry, f"unsupported tar member type {entry.kind!r}")
                continue
            if entry.kind == tarstream.HARDLINK:
                _hardlink(state, stats, where, entry, rel, target, index)
                created.add(rel)
                continue
            _drop(state, rel, target)
            if entry.kind == tarstream.SYMLINK:
                link_text = _in_root_link_text(rel, entry.linkname)
                if link_text is None:
                    _refuse(
                        state,
                        stats,
                        where,
                        entry,
                        f"symbolic link to {entry.linkname!r} leaves the image root",
                    )
                    continue
                os.symlink(link_text, target)
                state.link_origin[rel] = (where, index, entry.offset)
                created.add(rel)
                continue
            stats.files += 1
            stats.file_bytes += entry.size
            _regular(state, entry, data, rel, target, index)
            created.add(rel)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
                raise ExtractionError(f"{where}: cannot write the merged view: {exc.strerror}") from None
            # ENAMETOOLONG, ELOOP, EEXIST from a hostile layout: this entry only.
            _refuse(state, stats, where, entry, f"could not be extracted: {exc.strerror}")
    if devices:
        state.findings.append(
            make_finding(
                "IMG003",
                f"{where}:{devices[0][1]}",
                f"{len(devices)} device node(s) or FIFO(s) not extracted: "
                + ", ".join(path for _, path, _ in devices[:8])
                + (", ..." if len(devices) > 8 else ""),
                data={
                    "layer": index,
                    "offset": devices[0][0],
                    "type": devices[0][2],
                    "paths": [path for _, path, _ in devices],
                },
            )
        )
    for directory, _offset in opaque:
        _clear_lower(state, directory, created)
    for rel, _offset in hidden_by_whiteout:
        if rel in created:
            continue  # same-layer content is not hidden by its own layer's whiteout
        target = os.path.join(state.root, rel)
        if _parent_is_safe(state.root, rel):
            _drop(state, rel, target)
    return stats


def _mark_created(created: set[str], parent: str) -> None:
    """A member implies its parent directories in the same layer (overlayfs keeps them)."""
    while parent and parent not in created:
        created.add(parent)
        parent = posixpath.dirname(parent)


def finish(state: MergeState) -> None:
    """After the last layer: remove every link the host kernel would resolve outside the root."""
    root_real = os.path.realpath(state.root)
    for _ in range(8):  # removing a link can only shorten other resolutions; a few passes settle it
        removed = 0
        for directory, dirnames, filenames in os.walk(state.root):
            for name in dirnames + filenames:
                path = os.path.join(directory, name)
                if not os.path.islink(path):
                    continue
                resolved = os.path.realpath(path)
                if resolved != root_real and not resolved.startswith(root_real + os.sep):
                    rel = os.path.relpath(path, state.root)
                    where, layer, offset = state.link_origin.get(rel, ("", -1, -1))
                    state.findings.append(
                        make_finding(
                            "IMG002",
                            f"{where}:/{rel}" if where else "/" + rel,
                            f"symbolic link resolves outside the image root "
                            f"({os.readlink(path)!r}); removed from the audited view",
                            data={"reason": "escaping-link", "layer": layer, "offset": offset},
                        )
                    )
                    os.unlink(path)
                    removed += 1
        if not removed:
            return


class _Budget:
    """Counts every uncompressed tar byte against the image limit."""

    def __init__(self, raw: tarstream.Readable, limits: Limits) -> None:
        self.raw = raw
        self.limits = limits

    def read(self, size: int = -1, /) -> bytes:
        piece = self.raw.read(size)
        self.limits.bytes_read += len(piece)
        if self.limits.bytes_read > self.limits.max_bytes:
            raise LimitExceeded(f"image is larger than the {self.limits.max_bytes} bytes allowed (raise --max-bytes)")
        return piece


def _refuse(state: MergeState, stats: LayerStats, where: str, entry: tarstream.TarEntry, reason: str) -> None:
    stats.refused += 1
    state.findings.append(
        make_finding(
            "IMG002",
            f"{where}:{entry.name}",
            f"refused: {reason}",
            data={"layer": stats.index, "offset": entry.offset, "reason": reason},
        )
    )


def _regular(
    state: MergeState,
    entry: tarstream.TarEntry,
    data: Iterable[bytes],
    rel: str,
    target: str,
    index: int,
) -> None:
    hasher = hashlib.blake2b(digest_size=32) if entry.size >= HASH_MIN_BYTES else None
    keep = state.keep("/" + rel)
    out = open(target, "wb") if keep else None  # noqa: SIM115 - closed below
    try:
        for chunk in data:
            if hasher is not None:
                hasher.update(chunk)
            if out is not None:
                out.write(chunk)
    finally:
        if out is not None:
            out.close()
    if out is not None:
        os.chmod(target, (entry.mode & 0o777) | 0o600)
    state.layer_of["/" + rel] = index
    if hasher is not None:
        state.copies.append(Copy(layer=index, path="/" + rel, size=entry.size, digest=hasher.digest()))
        state.visible["/" + rel] = len(state.copies) - 1


def _hardlink(
    state: MergeState,
    stats: LayerStats,
    where: str,
    entry: tarstream.TarEntry,
    rel: str,
    target: str,
    index: int,
) -> None:
    source_rel = normalise(entry.linkname)
    if not source_rel:
        _refuse(state, stats, where, entry, f"hardlink to unsafe name {entry.linkname!r}")
        return
    source = os.path.join(state.root, source_rel)
    copy_index = state.visible.get("/" + source_rel, state.hardlinked.get("/" + source_rel))
    _drop(state, rel, target)
    if copy_index is not None:
        state.hardlinked["/" + rel] = copy_index
    if "/" + source_rel in state.layer_of:
        state.layer_of["/" + rel] = state.layer_of["/" + source_rel]
    if not _parent_is_safe(state.root, source_rel) or not os.path.isfile(source) or os.path.islink(source):
        if state.keep("/" + rel) and state.keep("/" + source_rel):
            _refuse(
                state,
                stats,
                where,
                entry,
                f"hardlink to {entry.linkname!r}, which is not a regular file of the image",
            )
        return
    os.link(source, target, follow_symlinks=False)


def _in_root_link_text(rel: str, link_text: str) -> str | None:
    """The link text to store: absolute targets made relative to the root; None if it climbs out."""
    if not link_text or "\0" in link_text:
        return None
    directory = posixpath.dirname(rel)
    if link_text.startswith("/"):
        resolved = posixpath.normpath(link_text).lstrip("/")
        relative = (
            posixpath.relpath("/" + resolved, "/" + directory) if resolved else posixpath.relpath("/", "/" + directory)
        )
        return relative
    depth = len(directory.split("/")) if directory else 0
    for part in link_text.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return None
        elif part not in ("", "."):
            depth += 1
    return link_text


def _prepare_parent(state: MergeState, parent: str) -> str | None:
    """Create the parent directories of an entry; refuse to go through a symbolic link."""
    root = state.root
    current = root
    for part in parent.split("/") if parent else []:
        current = os.path.join(current, part)
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            os.mkdir(current, 0o755)
            continue
        if stat.S_ISLNK(mode):
            relative = os.path.relpath(current, root)
            return f"parent {relative!r} is a symbolic link; not written through it"
        if not stat.S_ISDIR(mode):  # a file replaced by a directory in a later layer
            _drop(state, os.path.relpath(current, root), current)
            os.mkdir(current, 0o755)
    return None


def _parent_is_safe(root: str, rel: str) -> bool:
    current = root
    for part in posixpath.dirname(rel).split("/") if posixpath.dirname(rel) else []:
        current = os.path.join(current, part)
        try:
            if not stat.S_ISDIR(os.lstat(current).st_mode):
                return False
        except FileNotFoundError:
            return False
    return True


def _clear_lower(state: MergeState, directory: str, created: set[str]) -> None:
    """Opaque directory: delete what lower layers put under it, keep this layer's entries."""
    if not _parent_is_safe(state.root, directory + "/x" if directory else "x"):
        return
    base = os.path.join(state.root, directory) if directory else state.root
    if not _is_real_dir(base):
        return
    for name in sorted(os.listdir(base)):
        rel = posixpath.join(directory, name) if directory else name
        path = os.path.join(base, name)
        if rel in created:
            if _is_real_dir(path):
                _clear_lower(state, rel, created)
            continue
        _drop(state, rel, path)


def _drop(state: MergeState, rel: str, target: str) -> None:
    """Remove a path of the merged view (a directory with its children) and forget its copies."""
    if _is_real_dir(target):
        _forget(state, rel)
        shutil.rmtree(target)
        return
    state.visible.pop("/" + rel, None)
    state.hardlinked.pop("/" + rel, None)
    if _lexists(target):
        os.unlink(target)


def _forget(state: MergeState, rel: str) -> None:
    prefix = "/" + rel
    for table in (state.visible, state.hardlinked):
        for key in [k for k in table if k == prefix or k.startswith(prefix + "/")]:
            del table[key]


def _lexists(path: str) -> bool:
    return os.path.lexists(path)


def _is_real_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


__all__ = [
    "Copy",
    "FormatError",
    "LayerStats",
    "Limits",
    "LimitExceeded",
    "MergeState",
    "apply_layer",
    "finish",
    "normalise",
]
