"""Apply image layers in order into a private directory: whiteouts, opaque dirs, and no escapes.

Layer semantics follow the OCI image spec (image-spec layer.md; peers.md 5) as Docker's overlay2
driver applies it (each layer unpacked into an empty directory of its own, overlayfs on top;
checked against ``docker export`` of the same images): ``.wh.<name>`` deletes ``<name>`` of the
layers below, ``.wh..wh..opq`` hides everything the layers below put in its directory (at the
layer's root it hides nothing: overlayfs ignores the root's opaque mark); both act on lower layers
only, so an entry of the same layer survives its own layer's whiteout whatever the order inside
the tar. A type change (file over directory) drops the children. A layer's entry below a path
that a lower layer made a file or a symbolic link replaces that path by a directory (the layer's
own parents are directories: the shape ``COPY --link`` and independently built layers have).

Names are cleaned as the engine cleans them (Go's ``filepath.Clean``): a rooted name
(``/usr/lib/x``) is taken from the image root, ``..`` inside a name is applied lexically, and a
relative name that climbs above the root is refused, as the engine refuses it.

Safety (hostile input): nothing is written through a symbolic link this layer made; hardlinks
must name a regular file of the image; device nodes and FIFOs are never created;
setuid/setgid/sticky bits are dropped; every byte written and every entry counts against limits.
Symbolic links are stored relative (an absolute target is taken from the image root) and, after
the last layer, every link is re-aimed at what the container's kernel would resolve it to, inside
the root: ``..`` stops at the root and is taken after each link it passes, as the kernel does, so
nothing in the merged view points outside it. Every refusal is a finding naming the layer and the
offset of the tar header; nothing here raises on bad input except FormatError for an unreadable
stream and LimitExceeded.
"""

from __future__ import annotations

import errno
import hashlib
import io
import itertools
import logging
import os
import posixpath
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from rocm_audit.errors import FormatError, RocmAuditError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.hashing import Hasher
from rocm_audit.image import digests, needed, tarstream, trim, whole
from rocm_audit.image.budget import Budget, LayerStats, LimitExceeded, Limits
from rocm_audit.image.digests import Copy, StreamedHashes, Trimmed
from rocm_audit.image.links import aim_links, stored_link_text
from rocm_audit.image.offload import Offload
from rocm_audit.progress import SILENT, Progress

log = logging.getLogger(__name__)

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
HASH_MIN_BYTES = 4096  # files smaller than this are not hashed for the waste analysis
SNIFF_BYTES = 64  # first bytes image/needed.py decides on
_LIBRARY_NAME = ".so"  # in every soname a DT_NEEDED search opens ("libx.so.1", "ld-linux-x86-64.so.2")


class ExtractionError(RocmAuditError):
    """The private work directory cannot take the merged view (disk full, read-only): TMPDIR."""

    exit_code = 2  # a setting of the user's that does not fit, as a usage error


NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


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
    # size -> index in ``copies`` of the one copy of that size not hashed yet (its bytes are in the
    # merged view): a second copy of the same size needs both digests, a unique size needs none.
    unhashed_by_size: dict[int, int] = field(default_factory=dict)
    by_size: dict[int, list[int]] = field(default_factory=dict)  # size -> index of every copy so far
    # image paths sharing a copy through a tar hardlink: path -> copy index
    hardlinked: dict[str, int] = field(default_factory=dict)
    # image path -> the layer that wrote the regular file (or hardlink) the merged view shows there
    layer_of: dict[str, int] = field(default_factory=dict)
    # Image paths of the shared libraries ("*.so*" names) the merged view holds but ``keep`` did
    # not write: the loader model finds them there and knows it cannot read them.
    streamed_past: set[str] = field(default_factory=set)
    progress: Progress = SILENT  # told how far each layer's reading is (the caller names the phase)
    # Files ``keep`` names that no check reads (image/needed.py) become sparse placeholders of
    # their size (``image`` only; off with --full); ``sparse`` holds their image paths.
    placeholders: bool = False
    sparse: set[str] = field(default_factory=set)
    # With placeholders, a large ELF file of a size no copy had before keeps only the blocks a
    # check reads (image/trim.py), in layers that can be read again (image/digests.py says how
    # its digest is found); ``finish`` makes whole again those a byte comparison may read.
    trimmed: dict[int, Trimmed] = field(default_factory=dict)  # by copy index
    trimmed_by_size: dict[int, list[int]] = field(default_factory=dict)
    # Facts the checks read from a library's bytes, read while trimming it: inode -> (path, facts);
    # ``facts_due`` names the inodes (-> path) whose trim is still running (image/offload.py).
    read_facts: dict[tuple[int, int], tuple[str, dict[str, object]]] = field(default_factory=dict)
    facts_due: dict[tuple[int, int], str] = field(default_factory=dict)
    # inode -> (path, ranges a trim gave back); files missing bytes a reused trim left out: inode -> path
    punched: dict[tuple[int, int], tuple[str, list[tuple[int, int]]]] = field(default_factory=dict)
    incomplete: dict[tuple[int, int], str] = field(default_factory=dict)
    hashing: set[int] = field(default_factory=set)  # copies whose digest a job is computing
    offload: Offload = field(default_factory=Offload)  # trims and hashes beside the merge
    again: dict[int, tuple[str, Callable[[], AbstractContextManager[tarstream.Readable]]]] = field(default_factory=dict)
    # This layer's kept hardlinks waiting for its second reading, by root-relative path: a later
    # member of the same name removes its path from the wait (``_drop``).
    waiting_links: dict[str, _Pending] = field(default_factory=dict)
    # The last parent (root-relative) whose every part was checked to be a real directory: the
    # next member in the same directory (the usual case) needs no walk. ``_drop`` forgets it when
    # it removes that directory or one above it; a layer starts and ends without it.
    parent_checked: str | None = None


def normalise(name: str) -> str | None:
    """A member name as a root-relative path ("usr/lib/x"), "" for the root, None when unsafe.

    As the engine cleans it (``filepath.Clean``, then its breakout check): ``.`` and empty parts
    go, ``..`` removes the part before it, a rooted name cannot climb above the root, and a
    relative name that does is refused."""
    if "\0" in name:
        return None
    rooted = name.startswith("/")
    parts: list[str] = []
    for part in name.split("/"):
        if part in ("", "."):
            continue
        if part != "..":
            parts.append(part)
        elif parts:
            parts.pop()
        elif not rooted:
            return None
    return "/".join(parts)


def apply_layer(
    state: MergeState,
    stream: tarstream.Readable,
    index: int,
    name: str,
    where: str,
    again: Callable[[], AbstractContextManager[tarstream.Readable]] | None = None,
) -> LayerStats:
    """Extract one layer's tar stream over the merged root. ``where`` names the layer in findings.

    ``again`` reads the layer once more from its start: it is used only when a hardlink the audit
    keeps shares its bytes with a file it does not (stored first under ``/opt/...``, say), whose
    bytes were streamed past unwritten.

    Raises FormatError (unreadable tar: the caller reports it) and LimitExceeded.
    """
    stats = LayerStats(index=index, name=name)
    state.layers.append(stats)
    if again is not None and state.placeholders:
        state.again[index] = (where, again)
    work = _LayerWork()
    state.parent_checked = None
    for entry, data in tarstream.iter_entries(Budget(stream, state.limits, state.progress, stats)):
        state.limits.entries += 1
        stats.entries += 1
        if state.limits.entries > state.limits.max_entries:
            raise LimitExceeded(
                f"{where}: more than {state.limits.max_entries} entries in the image (raise --max-entries)"
            )
        rel = normalise(entry.name)
        if rel is None:
            _refuse(state, stats, where, entry, f"unsafe member name {entry.name!r} (climbs above the root)")
            continue
        if rel == "":
            continue  # "./": the root itself
        try:
            _apply_entry(state, stats, where, entry, data, rel, index, work)
        except OSError as exc:
            if exc.errno in NO_ROOM:
                raise ExtractionError(f"{where}: cannot write the merged view: {exc.strerror}") from None
            # ENAMETOOLONG, ELOOP, EEXIST from a hostile layout: this entry only.
            _refuse(state, stats, where, entry, f"could not be extracted: {exc.strerror}")
        state.offload.poll()  # the answers of trims and hashes beside the merge (image/offload.py)
    if work.pending:
        _fill_pending(state, stats, where, work.pending, again)
    state.waiting_links.clear()
    state.parent_checked = None  # whiteouts and opaque directories remove what they hide
    _finish_layer(state, where, index, work)
    return stats


@dataclass(slots=True)
class _LayerWork:
    """What one layer's entries leave for the end of the layer."""

    created: set[str] = field(default_factory=set)  # relative paths this layer put in place
    hidden_by_whiteout: list[tuple[str, int]] = field(default_factory=list)  # applied after: lower layers only
    opaque: list[tuple[str, int]] = field(default_factory=list)
    devices: list[tuple[int, str, str]] = field(default_factory=list)  # (offset, path, type): one finding
    pending: dict[str, _Pending] = field(default_factory=dict)  # unwritten source -> kept hardlinks waiting


def _apply_entry(
    state: MergeState,
    stats: LayerStats,
    where: str,
    entry: tarstream.TarEntry,
    data: Iterable[bytes],
    rel: str,
    index: int,
    work: _LayerWork,
) -> None:
    """Put one tar member in place over the merged root, or refuse it with a finding. Raises OSError."""
    created = work.created
    parent, base = posixpath.split(rel)
    if base.startswith(WHITEOUT_PREFIX):
        _whiteout(state, stats, where, entry, parent, base, created, work.hidden_by_whiteout, work.opaque)
        return
    problem = _prepare_parent(state, parent, created)
    if problem:
        _refuse(state, stats, where, entry, problem)
        return
    if rel in created:  # the layer names this path again: what it stored there first goes unseen
        digests.stored_again(state, "/" + rel, index)
    target = os.path.join(state.root, rel)
    _mark_created(created, parent)
    if entry.kind == tarstream.DIRECTORY:
        state.streamed_past.discard("/" + rel)
        if os.path.lexists(target) and not _is_real_dir(target):
            _drop(state, rel, target)
        if not os.path.lexists(target):
            os.mkdir(target, 0o755)
        os.chmod(target, (entry.mode & 0o777) | 0o700)
        created.add(rel)
        return
    if entry.kind in (tarstream.CHARDEV, tarstream.BLOCKDEV, tarstream.FIFO):
        work.devices.append((entry.offset, "/" + rel, entry.kind))
        return
    if entry.kind not in (tarstream.REGULAR, tarstream.HARDLINK, tarstream.SYMLINK):
        _refuse(state, stats, where, entry, f"unsupported tar member type {entry.kind!r}")
        return
    if entry.kind == tarstream.HARDLINK:
        _hardlink(state, stats, where, entry, rel, target, index, work)
        created.add(rel)
        return
    reuse = whole.reusable_trim(state, "/" + rel, target, entry.size) if entry.kind == tarstream.REGULAR else None
    _drop(state, rel, target)
    if entry.kind == tarstream.SYMLINK:
        link_text = stored_link_text(rel, entry.linkname)
        if link_text is None:
            _refuse(state, stats, where, entry, f"symbolic link with an empty or NUL target {entry.linkname!r}")
            return
        os.symlink(link_text, target)
        created.add(rel)
        return
    stats.files += 1
    stats.file_bytes += entry.size
    _regular(state, entry, data, rel, target, index, reuse)
    created.add(rel)


def _finish_layer(state: MergeState, where: str, index: int, work: _LayerWork) -> None:
    """After a layer: its device nodes as one finding; its opaque dirs and whiteouts hide lower layers."""
    devices = work.devices
    if devices:
        paths = [path for _, path, _ in devices]
        # The image path as the finding's path: the layer's member name is a digest, too long a
        # token for a line; the layer is in the message and the data ("where" names its member).
        data = {"layer": index, "offset": devices[0][0], "type": devices[0][2], "paths": paths, "member": where}
        kinds = "device node or FIFO" if len(devices) == 1 else "device nodes or FIFOs"
        message = f"layer {index}: {len(devices)} {kinds} not extracted"
        state.findings.append(make_finding("IMG003", devices[0][1], message, related=paths[1:], data=data))
    for directory, _offset in work.opaque:
        _clear_lower(state, directory, work.created)
    for rel, _offset in work.hidden_by_whiteout:
        if rel in work.created:
            continue  # same-layer content is not hidden by its own layer's whiteout
        target = os.path.join(state.root, rel)
        if _parent_is_safe(state.root, rel):
            _drop(state, rel, target)


def _whiteout(
    state: MergeState,
    stats: LayerStats,
    where: str,
    entry: tarstream.TarEntry,
    parent: str,
    base: str,
    created: set[str],
    hidden_by_whiteout: list[tuple[str, int]],
    opaque: list[tuple[str, int]],
) -> None:
    """Note a whiteout or opaque marker, applied after the layer; its parent directories are the
    layer's own (the engine makes them in the layer's directory, hiding a lower non-directory)."""
    hidden = base[len(WHITEOUT_PREFIX) :]
    if base != OPAQUE_MARKER and hidden.startswith(WHITEOUT_PREFIX):
        state.findings.append(
            make_finding(
                "IMG006",
                f"{where}:/{posixpath.join(parent, base)}",
                f"unknown whiteout marker {base!r} ignored (the opaque marker is {OPAQUE_MARKER!r})",
                data={"layer": stats.index, "offset": entry.offset},
            )
        )
        return
    if base != OPAQUE_MARKER and hidden in ("", ".", ".."):
        # overlay2 would make a whiteout device at the parent itself: the engine fails the layer.
        _refuse(state, stats, where, entry, f"whiteout {base!r} names no entry (it would hide its own directory)")
        return
    problem = _prepare_parent(state, parent, created)
    if problem:
        _refuse(state, stats, where, entry, problem)
        return
    _mark_created(created, parent)
    if base == OPAQUE_MARKER:
        stats.opaque_dirs += 1
        if parent:  # overlayfs ignores the opaque mark of a layer's root
            opaque.append((parent, entry.offset))
        return
    stats.whiteouts += 1
    hidden_by_whiteout.append((posixpath.join(parent, hidden), entry.offset))


def _mark_created(created: set[str], parent: str) -> None:
    """A member implies its parent directories in the same layer (overlayfs keeps them)."""
    while parent and parent not in created:
        created.add(parent)
        parent = posixpath.dirname(parent)


def finish(state: MergeState) -> None:
    """After the last layer: every trim and hash beside the merge answered (image/offload.py), its
    helpers gone; trimmed files a byte comparison may read made whole (``make_whole``); every
    symbolic link aimed where the container resolves it (links.py)."""
    state.offload.settle()
    state.offload.close()
    whole.make_whole(state, lambda path: _drop(state, path[1:], os.path.join(state.root, path[1:])))
    aim_links(state.root)


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
    reuse: whole.Reuse | None,
) -> None:
    keep = state.keep("/" + rel)
    chunks = iter(data)
    head = _head(chunks) if keep and state.placeholders and entry.size >= HASH_MIN_BYTES else []
    sparse = bool(head) and not needed.needs_bytes("/" + rel, b"".join(head))
    # A large ELF file keeps only the blocks the checks read (image/trim.py), and its identity.
    trimming = keep and not sparse and trim.worth_trimming(entry.size, head, index in state.again)
    trimming = trimming and not digests.shows_size(state, entry.size)
    # A written file is hashed later, only if a verdict needs it (image/digests.py); a file whose bytes
    # are not written (streamed past, a sparse placeholder) is hashed now, while they go by.
    hashing = entry.size >= HASH_MIN_BYTES and (sparse or not keep)
    hasher = hashlib.blake2b(digest_size=32) if hashing else None
    streamed = StreamedHashes(with_digest=entry.size in state.by_size) if trimming else None
    identity: StreamedHashes | Hasher | None = streamed
    if hashing and entry.size in state.trimmed_by_size:
        identity = digests.new_identity()
    reuse = reuse if trimming else None  # a trimmed file's successor: written without what it gave back
    # Unbuffered: the pieces are the tar stream's (up to 1 MiB), and most files are small.
    out = (
        (whole.KeptWriter(target, reuse.punched if reuse else []) if trimming else open(target, "wb", buffering=0))
        if keep
        else None
    )
    trimmed: tuple[int, int] | None = None  # the inode of a file handed to a trim
    try:
        for chunk in itertools.chain(head, chunks):
            if hasher is not None:
                hasher.update(chunk)
            if identity is not None:
                identity.update(chunk)
            if out is not None and not sparse:
                _write_all(out, chunk)
        if out is not None and sparse:
            out.truncate(entry.size)  # the apparent size, no data blocks: see image/needed.py
        if out is not None:
            os.fchmod(out.fileno(), (entry.mode & 0o777) | 0o600)
        if out is not None and trimming:
            trimmed = whole.start_trim(state, target, out.fileno(), entry.size, reuse, streamed)
    finally:
        if out is not None:
            out.close()
        if streamed is not None:
            streamed.close()  # its thread ends whatever happened (the digests stay readable)
    if sparse:
        state.sparse.add("/" + rel)
    if out is None and _LIBRARY_NAME in posixpath.basename(rel):
        state.streamed_past.add("/" + rel)
    state.layer_of["/" + rel] = index
    if entry.size >= HASH_MIN_BYTES:
        state.copies.append(Copy(layer=index, path="/" + rel, size=entry.size, digest=None, offset=entry.offset))
        copy_index = len(state.copies) - 1
        state.visible["/" + rel] = copy_index
        digest = hasher.digest() if hasher is not None else None
        if trimmed is not None and streamed is not None:
            state.trimmed[copy_index] = Trimmed(trimmed, streamed.digest())
            state.trimmed_by_size.setdefault(entry.size, []).append(copy_index)
            digest = streamed.blake2b()
        known = identity.digest() if identity is not None and (not trimming or digest is not None) else None
        digests.note_size(state, copy_index, digest, known)


def _head(chunks: Iterator[bytes]) -> list[bytes]:
    """The first chunks of a member, enough to hold every magic image/needed.py sniffs."""
    head: list[bytes] = []
    while sum(map(len, head)) < SNIFF_BYTES and (piece := next(chunks, b"")):
        head.append(piece)
    return head


@dataclass(slots=True)
class _Pending:
    """Kept hardlinks whose bytes the layer stored under a path the audit does not write: an empty
    placeholder (one inode, every such link) is filled when the layer is read again."""

    paths: list[str]  # root-relative paths of the links still waiting, the placeholder first
    inode: tuple[int, int]
    entry: tarstream.TarEntry  # the first link's header, for findings

    @property
    def placeholder(self) -> str:
        return self.paths[0]


def _hardlink(
    state: MergeState,
    stats: LayerStats,
    where: str,
    entry: tarstream.TarEntry,
    rel: str,
    target: str,
    index: int,
    work: _LayerWork,
) -> None:
    # The engine joins the link name onto the layer's directory: cleaned like a member name.
    pending = work.pending
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
    safe = _parent_is_safe(state.root, source_rel)
    # A name a check reads (image/needed.py) must not share a placeholder's missing bytes: when the
    # placeholder is this layer's, its bytes are read again into the link (the pending path).
    refill = "/" + source_rel in state.sparse and source_rel in work.created and needed.needs_bytes_by_name("/" + rel)
    if safe and _is_regular(source) and not refill:
        os.link(source, target, follow_symlinks=False)
        if "/" + source_rel in state.sparse:
            state.sparse.add("/" + rel)
        return
    if (safe and os.path.lexists(source) and not refill) or not state.keep("/" + rel):
        if _is_real_dir(source) or state.keep("/" + rel):
            _refuse(
                state, stats, where, entry, f"hardlink to {entry.linkname!r}, which is not a regular file of the image"
            )
        elif _LIBRARY_NAME in posixpath.basename(rel):
            state.streamed_past.add("/" + rel)  # shares the bytes of a file streamed past
        return
    # Nothing at the source: a file of this layer the audit did not write (its bytes were streamed
    # past), or no file at all; the second reading of the layer tells which.
    waiting = pending.get(source_rel)
    if (
        waiting is not None
        and waiting.paths
        and whole.same_inode(waiting_place := os.path.join(state.root, waiting.placeholder), waiting.inode)
    ):
        os.link(waiting_place, target, follow_symlinks=False)
        waiting.paths.append(rel)
        state.waiting_links[rel] = waiting
        return
    with open(target, "xb"):
        pass
    info = os.lstat(target)
    pending[source_rel] = state.waiting_links[rel] = _Pending([rel], (info.st_dev, info.st_ino), entry)


def _fill_pending(
    state: MergeState,
    stats: LayerStats,
    where: str,
    pending: dict[str, _Pending],
    again: Callable[[], AbstractContextManager[tarstream.Readable]] | None,
) -> None:
    """Read the layer again for the bytes of the files its kept hardlinks share, write them into
    the placeholders, and refuse (leaving nothing behind) the links no regular file serves."""
    if again is not None:
        try:
            with again() as stream:
                for entry, data in tarstream.iter_entries(stream):
                    source_rel = normalise(entry.name) if entry.kind == tarstream.REGULAR else None
                    waiting = pending.get(source_rel) if source_rel else None
                    if source_rel is None or waiting is None:
                        continue
                    place = os.path.join(state.root, waiting.placeholder) if waiting.paths else ""
                    if place and whole.same_inode(place, waiting.inode):
                        descriptor = os.open(place, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
                        with open(descriptor, "wb") as out:
                            for chunk in data:
                                out.write(chunk)
                        os.chmod(place, (entry.mode & 0o777) | 0o600)
                    del pending[source_rel]
                    if not pending:
                        break
        except FormatError:
            pass  # the first reading already reported what is wrong with this layer
    for source_rel, waiting in pending.items():
        reason = (
            "which the layer holds no regular file at"
            if again is not None
            else "whose bytes lie outside the extracted directories (use --full, or --layers for a daemon image)"
        )
        _refuse(state, stats, where, waiting.entry, f"hardlink to {'/' + source_rel!r}, {reason}")
        _drop_links(state, waiting)


def _drop_links(state: MergeState, waiting: _Pending) -> None:
    """Remove an unfilled placeholder and the links of this layer made to it."""
    for rel in list(waiting.paths):  # _drop takes each out of the list
        place = os.path.join(state.root, rel)
        if whole.same_inode(place, waiting.inode):
            _drop(state, rel, place)


def _write_all(out: whole.KeptWriter | io.FileIO, chunk: bytes) -> None:
    """Write all of ``chunk``: an unbuffered file's ``write`` may take part of it."""
    if isinstance(out, whole.KeptWriter):
        out.write(chunk)  # writes everything (pwrite to the end of each piece)
        return
    view = memoryview(chunk)
    while view:
        view = view[out.write(view) :]


def _is_regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _prepare_parent(state: MergeState, parent: str, created: set[str]) -> str | None:
    """Create the parent directories of an entry. A parent a lower layer made a file or a link is
    replaced by a directory, as overlay2 makes it (the layer's own directory holds a real one,
    which hides the lower entry). A link this layer made is never written through: refused."""
    if parent and parent == state.parent_checked:
        return None  # every part a real directory, and nothing above or at it removed since
    root = state.root
    current = root
    so_far = ""
    for part in parent.split("/") if parent else []:
        current = os.path.join(current, part)
        so_far = posixpath.join(so_far, part) if so_far else part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            state.streamed_past.discard("/" + so_far)  # a lower file not written: now a directory
            os.mkdir(current, 0o755)
            continue
        if stat.S_ISDIR(mode):
            continue
        if stat.S_ISLNK(mode) and so_far in created:
            return f"parent {so_far!r} is a symbolic link of the same layer; not written through it"
        _drop(state, so_far, current)
        os.mkdir(current, 0o755)
    state.parent_checked = parent
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
    below = "/" + directory + "/"
    for path in [p for p in state.streamed_past if p.startswith(below) and p[1:] not in created]:
        state.streamed_past.discard(path)
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
    checked = state.parent_checked
    # Defensive: a member's own removal is of a child of the parent just checked, which the next
    # walk sees; this keeps the skip sound should a removal above it ever come between two members.
    if checked is not None and (checked == rel or checked.startswith(rel + "/")):
        state.parent_checked = None
    try:
        mode: int | None = os.lstat(target).st_mode
    except FileNotFoundError:
        mode = None  # a new name: the usual case
    if mode is not None and stat.S_ISDIR(mode):
        _forget(state, rel)
        whole.forget_facts(state, target, below=True)
        state.offload.left_view("/" + rel, below=True)
        shutil.rmtree(target)
        return
    digests.hash_before_removal(state, state.visible.get("/" + rel))
    state.offload.left_view("/" + rel)
    state.visible.pop("/" + rel, None)
    state.hardlinked.pop("/" + rel, None)
    state.streamed_past.discard("/" + rel)
    state.sparse.discard("/" + rel)
    waiting = state.waiting_links.pop(rel, None)
    if waiting is not None:  # a later member of this name: its file is not the placeholder
        waiting.paths.remove(rel)
    if mode is not None:
        whole.forget_facts(state, target)
        os.unlink(target)


def _forget(state: MergeState, rel: str) -> None:
    prefix = "/" + rel
    for key in [k for k in state.visible if k.startswith(prefix + "/")]:
        digests.hash_before_removal(state, state.visible[key])
    for table in (state.visible, state.hardlinked):
        for key in [k for k in table if k == prefix or k.startswith(prefix + "/")]:
            del table[key]
    for paths in (state.streamed_past, state.sparse):
        for path in [p for p in paths if p.startswith(prefix + "/")]:
            paths.discard(path)
    for path in [p for p in state.waiting_links if p.startswith(rel + "/")]:
        state.waiting_links.pop(path).paths.remove(path)


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
