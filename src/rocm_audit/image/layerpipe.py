"""Decompress an image's layers in parallel, hand them out in order.

One thread per layer, at most ``workers`` at a time (default: the CPU count), reads the layer's
blob, hashes it against its descriptor digest, decompresses it (tarstream.decompressed: igzip,
zlib-ng or zlib; zstandard) and queues the tar bytes in a bounded queue. The caller applies the
layers one after another through ``LayerStream.read``; a thread ahead of the caller stops when its
queue is full, so memory stays at ``workers * QUEUE_CHUNKS * tarstream.CHUNK`` bytes whatever the
layer sizes. The inflaters and hashlib release the GIL on large buffers: decompression runs beside
the caller's tar parsing and writing.

A decompression error reaches the caller at the byte where it happened (FormatError, as when read
directly); the raw blob is still read to its end, so its digest is known as before.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from rocm_audit.errors import FormatError
from rocm_audit.hashing import ThreadedHash
from rocm_audit.image import tarstream

QUEUE_CHUNKS = 8  # per layer: 8 MiB of decompressed tar waiting at most
_POLL = 0.5  # seconds between checks for a cancelled pipeline while a queue is full


class _Hashing:
    """What passes through, hashed on a thread of its own: the blob's digest is not on the path of
    its decompression (SHA-256 of a gzip layer took a fifth of its layer thread's time)."""

    def __init__(self, raw: tarstream.Readable, digest: str | None) -> None:
        import hashlib  # noqa: PLC0415 - small

        self.raw = raw
        algorithm = digest.split(":", 1)[0] if digest else "sha256"
        hasher = hashlib.new(algorithm if algorithm in ("sha256", "sha512") else "sha256")
        self.hasher = ThreadedHash(hasher, backlog=QUEUE_CHUNKS, name="rocm-audit-blob-digest")

    def read(self, size: int = -1, /) -> bytes:
        piece = self.raw.read(size)
        if piece:
            self.hasher.update(piece)
        return piece

    def hexdigest(self) -> str:
        return self.hasher.digest().hex()


class VerifiedStream(Protocol):
    """A layer's tar stream whose stored bytes are checked against their digest at the end."""

    def read(self, size: int = -1, /) -> bytes: ...

    def finish(self) -> str: ...

    def matches(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Blob:
    """One layer to read: ``open`` gives its stored (compressed) bytes, ``digest`` their digest."""

    open: Callable[[], AbstractContextManager[tarstream.Readable]]
    digest: str | None


@dataclass(frozen=True, slots=True)
class _End:
    hexdigest: str
    error: FormatError | None


class LayerStream:
    """The decompressed tar of one layer, read by the caller while a thread produces it."""

    def __init__(self, blob: Blob, cancelled: threading.Event) -> None:
        self.blob = blob
        self.cancelled = cancelled
        self.queue: queue.Queue[bytes | _End | BaseException] = queue.Queue(QUEUE_CHUNKS)
        self.pending = b""
        self.start = 0
        self.end: _End | None = None

    # -- producer (worker thread) --
    def produce(self) -> None:
        try:
            with self.blob.open() as raw:
                hashing = _Hashing(raw, self.blob.digest)
                try:
                    error = self._decompress(hashing)
                    while hashing.read(tarstream.CHUNK):  # the rest of the blob, for its digest
                        if self.cancelled.is_set():
                            return
                    self._put(_End(hashing.hexdigest(), error))
                finally:
                    hashing.hasher.close()  # its thread ends whatever happened
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, raised there
            self._put(exc)

    def _decompress(self, hashing: _Hashing) -> FormatError | None:
        """Queue the decompressed tar; the error that stopped it, if any (None when cancelled)."""
        try:
            stream = tarstream.decompressed(hashing)
            while piece := stream.read(tarstream.CHUNK):
                if not self._put(piece):
                    return None
        except FormatError as exc:
            return exc
        return None

    def _put(self, item: bytes | _End | BaseException) -> bool:
        while not self.cancelled.is_set():
            try:
                self.queue.put(item, timeout=_POLL)
                return True
            except queue.Full:
                continue
        return False

    # -- consumer (the caller) --
    def _next(self) -> bool:
        """Take the next piece; False at the end of the decompressed stream."""
        if self.end is not None:
            return False
        item = self.queue.get()
        if isinstance(item, _End):
            self.end = item
            if item.error is not None:
                raise item.error
            return False
        if isinstance(item, BaseException):
            self.end = _End("", None)
            raise item
        self.pending, self.start = item, 0
        return True

    def read(self, size: int = -1, /) -> bytes:
        size = tarstream.CHUNK if size < 0 else size
        while self.start >= len(self.pending):
            if not self._next():
                return b""
        if self.start == 0 and size >= len(self.pending):
            piece, self.pending = self.pending, b""
            return piece
        piece = self.pending[self.start : self.start + size]
        self.start += len(piece)
        return piece

    def finish(self) -> str:
        """Discard what the caller left unread (the tar's end padding); the blob's hex digest.

        A decompression error past the point the caller stopped reading is not raised (the layer
        was read to the end of its tar, as with a direct read)."""
        while self.end is None:
            item = self.queue.get()
            if isinstance(item, _End):
                self.end = item
            elif isinstance(item, BaseException):
                self.end = _End("", None)
                raise item
        return self.end.hexdigest

    def matches(self) -> bool:
        expected = self.blob.digest
        return not expected or expected.split(":", 1)[1] == self.finish()


class Pipeline:
    """``with Pipeline(blobs) as layers: for stream in layers: ...`` (streams in layer order)."""

    def __init__(self, blobs: Sequence[Blob], workers: int | None = None) -> None:
        self.blobs = list(blobs)
        self.workers = max(1, min(workers or os.cpu_count() or 1, len(self.blobs) or 1))
        self.cancelled = threading.Event()
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.streams: list[LayerStream] = []

    def __enter__(self) -> Iterator[LayerStream]:
        self.pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="rocm-audit-layer")
        self.streams = [LayerStream(blob, self.cancelled) for blob in self.blobs]
        for stream in self.streams:  # FIFO: layer k waits only for layers before it
            self.pool.submit(stream.produce)
        return iter(self.streams)

    def __exit__(self, *exc: object) -> None:
        self.cancelled.set()
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
