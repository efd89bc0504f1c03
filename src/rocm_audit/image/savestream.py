"""Read a `docker save` export as it streams from the engine: no full copy on disk.

`docker save` writes ``manifest.json`` (the layer order) last, after the layer blobs. The engine's
image inspection gives the layers' diff IDs in order before the export starts, and Docker 25+
names each blob by its digest (``blobs/sha256/<hex>``; uncompressed layers, so digest = diff ID).
So a layer blob is applied while it streams past when its name says it is the next layer in order
and its digest is used by that one layer only; its digest is checked as it streams. Every other
member is kept until the manifest arrives: JSON documents in memory, layer blobs in a spool file
in the private work directory, applied in order once the manifest gives their place: a layer blob
arriving before one below it, a blob several layers share, and every layer of the legacy layout of
Docker before 25 (``<id>/layer.tar``, whose name does not say which layer it is). Scratch disk is
then the spooled blobs only; with Docker 25+ and layers in order, none.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import posixpath
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import BinaryIO

from rocm_audit.errors import FormatError, UsageError
from rocm_audit.hashing import ThreadedHash
from rocm_audit.image import tarstream
from rocm_audit.image.archive import MAX_JSON_BYTES, ImageLayout, Store, _clean, read_layout, tarstream_name
from rocm_audit.image.merge import MergeState

MAX_MEMORY_MEMBER = 1 << 20  # members up to this size (manifests, configs, index) stay in memory
MAX_MEMORY_TOTAL = 64 << 20  # past this, small members are spooled too
_BLOB = "blobs/sha256/"


class ChunkReader:
    """A read() interface over an iterator of byte chunks, counting against a byte limit."""

    def __init__(self, chunks: Iterable[bytes], limit: int | None = None, label: str = "") -> None:
        self.chunks = iter(chunks)
        self.pending = b""
        self.start = 0
        self.total = 0
        self.limit = limit
        self.label = label

    def read(self, size: int = -1, /) -> bytes:
        size = tarstream.CHUNK if size < 0 else size
        while self.start >= len(self.pending):
            try:
                self.pending, self.start = next(self.chunks), 0
            except StopIteration:
                return b""
            self.total += len(self.pending)
            if self.limit is not None and self.total > self.limit:
                raise UsageError(f"image {self.label!r} is larger than --max-bytes {self.limit}")
        piece = self.pending[self.start : self.start + size]
        self.start += len(piece)
        return piece


class _MemberStream:
    """One member's data read as a stream, hashed on a thread of its own (beside the merge that
    reads it: an export's layers are uncompressed tars, so their SHA-256 is most of the reading);
    the rest is drained by ``finish``; ``close`` ends the hash's thread whatever happened."""

    def __init__(self, data: Iterable[bytes], digest: str) -> None:
        self.digest = digest
        self.reader = ChunkReader(data)
        self.hasher = ThreadedHash(hashlib.sha256(), backlog=8, name="rocm-audit-blob-digest", batch=1 << 20)
        self.done = ""

    def read(self, size: int = -1, /) -> bytes:
        piece = self.reader.read(size)
        if piece:
            self.hasher.update(piece)
        return piece

    def finish(self) -> str:
        if not self.done:
            while self.read(tarstream.CHUNK):
                pass
            self.done = self.hasher.digest().hex()
        return self.done

    def close(self) -> None:
        self.hasher.close()

    def matches(self) -> bool:
        return self.digest.split(":", 1)[1] == self.finish()


class SpoolStore(Store):
    """The members kept from the stream: small ones in memory, layer blobs in spool files."""

    def __init__(self, directory: str, label: str) -> None:
        self.directory = directory
        self.label = label
        self.memory: dict[str, bytes] = {}
        self.files: dict[str, str] = {}
        self.links: dict[str, str] = {}
        self.in_memory = 0

    def _resolve(self, name: str) -> str | None:
        name = _clean(name, self.label)
        for _ in range(8):
            if name in self.memory or name in self.files:
                return name
            if name not in self.links:
                return None
            name = self.links[name]
        return None

    def exists(self, name: str) -> bool:
        return self._resolve(name) is not None

    def size(self, name: str) -> int:
        real = self._resolve(name)
        if real is None:
            raise FormatError("image", 0, f"{self.label}: {name} is missing")
        return len(self.memory[real]) if real in self.memory else os.path.getsize(self.files[real])

    def open(self, name: str) -> BinaryIO:
        real = self._resolve(name)
        if real is None:
            raise FormatError("image", 0, f"{self.label}: {name} is missing")
        if real in self.memory:
            return io.BytesIO(self.memory[real])
        return open(self.files[real], "rb")

    def keep(self, name: str, data: Iterable[bytes], size: int) -> None:
        if size <= MAX_MEMORY_MEMBER and self.in_memory + size <= MAX_MEMORY_TOTAL:
            self.memory[name] = b"".join(data)
            self.in_memory += size
            return
        path = os.path.join(self.directory, f"{len(self.files)}.blob")
        with open(path, "xb") as out:
            for piece in data:
                out.write(piece)
        self.files[name] = path


def apply_save_stream(
    chunks: Iterable[bytes],
    diff_ids: list[str],
    state: MergeState,
    workdir: str,
    label: str,
    apply: Callable[..., None],
    again: Callable[[str], AbstractContextManager[tarstream.Readable]],
    apply_rest: Callable[[Store, ImageLayout, int], None],
    max_bytes: int,
) -> tuple[ImageLayout, Store, int]:
    """Apply the export's layers over ``state.root``: while streaming where the order allows,
    the rest from the spool once ``manifest.json`` arrives. ``apply(state, stream, digest, index,
    name, where, count, again)`` applies one layer (audit.apply_layer_stream); ``again(member)``
    streams one member once more from a new export; ``apply_rest(store, layout, start)`` applies
    the spooled layers from ``start`` on. Returns the layout, the store and how many layers were
    applied while streaming. Raises FormatError for an unusable export, UsageError past max_bytes."""
    spool = os.path.join(workdir, "spool")
    os.mkdir(spool, 0o700)
    store = SpoolStore(spool, label)
    uses: dict[str, int] = {}
    for digest in diff_ids:
        uses[digest] = uses.get(digest, 0) + 1
    streamed: list[str] = []  # members applied while streaming, in layer order
    reader = ChunkReader(chunks, max_bytes, label)
    for entry, data in tarstream.iter_entries(reader):
        name = tarstream_name(entry.name)
        if entry.kind in (tarstream.HARDLINK, tarstream.SYMLINK):
            base = "" if entry.kind == tarstream.HARDLINK else posixpath.dirname(name)
            store.links[name] = posixpath.normpath(posixpath.join(base, entry.linkname))
            continue
        if entry.kind != tarstream.REGULAR:
            continue
        digest = "sha256:" + name[len(_BLOB) :] if name.startswith(_BLOB) else ""
        index = len(streamed)
        if (
            digest
            and index < len(diff_ids)
            and diff_ids[index] == digest
            and uses[digest] == 1
            and entry.size > MAX_MEMORY_MEMBER
        ):
            stream = _MemberStream(data, digest)
            try:
                apply(
                    state,
                    stream,
                    digest,
                    index,
                    digest,
                    f"{label}:{name}",
                    len(diff_ids),
                    functools_partial(again, name),
                )
                stream.finish()
            finally:
                stream.close()
            streamed.append(name)
            continue
        store.keep(name, data, entry.size)
    if not store.exists("manifest.json"):
        raise FormatError("image", reader.total, f"{label}: the export has no manifest.json")
    if store.size("manifest.json") > MAX_JSON_BYTES:
        raise FormatError("image", 0, f"{label}: manifest.json is too large")
    layout = read_layout(store, None)
    for index, member in enumerate(streamed):
        if index >= len(layout.layers) or layout.layers[index].member != member:
            raise FormatError(
                "image", 0, f"{label}: manifest.json does not list {member} as layer {index}, as the engine said"
            )
    apply_rest(store, layout, len(streamed))
    return layout, store, len(streamed)


def functools_partial(
    again: Callable[[str], AbstractContextManager[tarstream.Readable]], name: str
) -> Callable[[], AbstractContextManager[tarstream.Readable]]:
    return lambda: again(name)


@contextlib.contextmanager
def member_again(chunks: Iterable[bytes], member: str) -> Iterator[tarstream.Readable]:
    """One member of a new export, decompressed (merge.apply_layer's ``again``)."""
    for entry, data in tarstream.iter_entries(ChunkReader(chunks)):
        if tarstream_name(entry.name) == member and entry.kind == tarstream.REGULAR:
            yield tarstream.decompressed(ChunkReader(data))
            return
    yield io.BytesIO(b"")
