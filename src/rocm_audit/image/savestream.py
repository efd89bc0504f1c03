"""Read a `docker save` export as it streams from the engine: no full copy on disk.

`docker save` writes ``manifest.json`` (the layer order) last, after the layers, in the order of
their names (digests or layer ids: no order at all). The engine's image inspection gives the
layers' diff IDs in order before the export starts, and the export shows where each layer goes
before its bytes come:

- Docker 25+ names each blob by its digest (``blobs/sha256/<hex>``; uncompressed layers, so
  digest = diff ID): the layer whose diff ID it is, when no other layer has the same one.
- The legacy layout of older engines (Debian's and Ubuntu's docker.io: ``<id>/layer.tar``) writes
  ``<id>/json`` just before each ``<id>/layer.tar``, and that document names the layer id below it
  (``parent``; none for the bottom layer): the layer's place is its number of ancestors.

A layer whose place is the next one is applied while it streams past; its digest is checked
against the engine's diff ID for that place as it streams, and the manifest must list it there.
A layer that arrives before one below it is spooled into the private work directory and applied
as soon as the layers below it are (still while the export streams); JSON documents stay in
memory. What no place is known for (a layer two places share, an export that names no parent) is
applied in order once the manifest arrives. Scratch disk is then the layers that arrived early.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import posixpath
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any, BinaryIO

from rocm_audit.errors import FormatError, UsageError
from rocm_audit.hashing import ThreadedHash
from rocm_audit.image import tarstream
from rocm_audit.image.archive import MAX_JSON_BYTES, ImageLayout, Store, _clean, read_again, read_layout, tarstream_name
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


class _Places:
    """Where each layer member of the export goes, from what arrived before it (the module says how)."""

    def __init__(self, diff_ids: list[str]) -> None:
        self.diff_ids = diff_ids
        self.uses: dict[str, int] = {}
        for digest in diff_ids:
            self.uses[digest] = self.uses.get(digest, 0) + 1
        self.parents: dict[str, str] = {}  # legacy layer id -> the id below it ("" for the bottom one)

    def note_legacy_json(self, name: str, text: bytes) -> None:
        """``<id>/json`` of the legacy layout: remember the layer below ``<id>``."""
        layer_id = posixpath.dirname(name)
        try:
            document = json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: nested too deeply
            return  # no place for this layer before the manifest: it waits for it
        parent = document.get("parent", "") if isinstance(document, dict) else None
        if isinstance(parent, str) and document.get("id") == layer_id:
            self.parents[layer_id] = parent

    def place(self, name: str) -> int | None:
        """The layer index of member ``name`` when the export has shown it, else None."""
        if name.startswith(_BLOB):
            digest = "sha256:" + name[len(_BLOB) :]
            index = self.diff_ids.index(digest) if digest in self.uses else None
        elif posixpath.basename(name) == "layer.tar":
            index = self._depth(posixpath.dirname(name))
        else:
            return None
        if index is None or index >= len(self.diff_ids) or self.uses[self.diff_ids[index]] != 1:
            return None  # a layer two places share is read from the spool once the manifest says which
        return index

    def _depth(self, layer_id: str) -> int | None:
        depth = 0
        while (parent := self.parents.get(layer_id)) is not None:
            if parent == "":
                return depth
            layer_id, depth = parent, depth + 1
            if depth >= len(self.diff_ids):
                return None  # a loop, or a chain longer than the image
        return None


class _InOrder:
    """Applies the export's layers in their order as soon as each one's turn comes (a layer that
    arrives early waits in the store): ``applied`` names them in layer order."""

    def __init__(self, places: _Places, store: SpoolStore, apply: Callable[..., None], state: MergeState) -> None:
        self.places = places
        self.store = store
        self.apply = apply
        self.state = state
        self.applied: list[str] = []
        self.early: list[str] = []  # layer members kept in the store, waiting for the layers below

    def now(self, name: str, data: Iterable[bytes], again: Callable[[], Any]) -> None:
        """Apply member ``name`` (its turn has come), its digest checked as it streams."""
        stream = _MemberStream(data, self.places.diff_ids[len(self.applied)])
        legacy = not name.startswith(_BLOB)  # its layers are named by the manifest, as from a saved file
        try:
            self.apply(
                self.state,
                stream,
                stream.digest,
                len(self.applied),
                name if legacy else stream.digest,
                f"{self.store.label}:{name}",
                len(self.places.diff_ids),
                again,
            )
            stream.finish()
        finally:
            stream.close()
        self.applied.append(name)

    def kept(self, name: str) -> None:
        """Member ``name`` went to the store: apply it and what waited for it, when their turn has come."""
        if name.startswith(_BLOB) or posixpath.basename(name) == "layer.tar":
            self.early.append(name)
        self.from_store()

    def from_store(self) -> None:
        while ready := [name for name in self.early if self.places.place(name) == len(self.applied)]:
            self.early.remove(ready[0])
            with self.store.open(ready[0]) as kept:
                pieces = iter(functools.partial(kept.read, tarstream.CHUNK), b"")
                self.now(ready[0], pieces, functools.partial(read_again, self.store, ready[0]))


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
) -> tuple[ImageLayout, Store, int, int]:
    """Apply the export's layers over ``state.root``: while streaming where the order allows,
    the rest from the spool once ``manifest.json`` arrives. ``apply(state, stream, digest, index,
    name, where, count, again)`` applies one layer (audit.apply_layer_stream); ``again(member)``
    streams one member once more from a new export; ``apply_rest(store, layout, start)`` applies
    the layers from ``start`` on after the manifest. Returns the layout, the store, how many layers
    were applied as they streamed past and how many before the manifest (those and the spooled
    ones whose layers below came first). Raises FormatError for an unusable export, UsageError past
    max_bytes."""
    spool = os.path.join(workdir, "spool")
    os.mkdir(spool, 0o700)
    store = SpoolStore(spool, label)
    places = _Places(diff_ids)
    layers = _InOrder(places, store, apply, state)
    streamed = 0
    reader = ChunkReader(chunks, max_bytes, label)
    for entry, data in tarstream.iter_entries(reader):
        name = tarstream_name(entry.name)
        if entry.kind in (tarstream.HARDLINK, tarstream.SYMLINK):
            base = "" if entry.kind == tarstream.HARDLINK else posixpath.dirname(name)
            store.links[name] = posixpath.normpath(posixpath.join(base, entry.linkname))
            continue
        if entry.kind != tarstream.REGULAR:
            continue
        if places.place(name) == len(layers.applied) and entry.size > MAX_MEMORY_MEMBER:
            layers.now(name, data, functools.partial(again, name))
            streamed += 1
            layers.from_store()
            continue
        store.keep(name, data, entry.size)
        if posixpath.basename(name) == "json" and name in store.memory:
            places.note_legacy_json(name, store.memory[name])
        layers.kept(name)
    if not store.exists("manifest.json"):
        raise FormatError("image", reader.total, f"{label}: the export has no manifest.json")
    if store.size("manifest.json") > MAX_JSON_BYTES:
        raise FormatError("image", 0, f"{label}: manifest.json is too large")
    layout = read_layout(store, None)
    for index, member in enumerate(layers.applied):
        if index >= len(layout.layers) or layout.layers[index].member != member:
            raise FormatError(
                "image", 0, f"{label}: manifest.json does not list {member} as layer {index}, as the engine said"
            )
    apply_rest(store, layout, len(layers.applied))
    return layout, store, streamed, len(layers.applied)


@contextlib.contextmanager
def member_again(chunks: Iterable[bytes], member: str) -> Iterator[tarstream.Readable]:
    """One member of a new export, decompressed (merge.apply_layer's ``again``)."""
    for entry, data in tarstream.iter_entries(ChunkReader(chunks)):
        if tarstream_name(entry.name) == member and entry.kind == tarstream.REGULAR:
            yield tarstream.decompressed(ChunkReader(data))
            return
    yield io.BytesIO(b"")
