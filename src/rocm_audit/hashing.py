"""A digest computed on a thread of its own as a stream's chunks are handed over.

hashlib lets go of the GIL on buffers of 2 KiB and more, so the hash runs beside the caller's
work (image/merge.py writing and trimming a file, prune/fatbins inflating a CCOB) instead of
after it. At most ``backlog`` chunks wait: memory stays bounded when hashing falls behind.
"""

from __future__ import annotations

import queue
import threading
from typing import Protocol


class Hasher(Protocol):
    """What a hashlib object gives (``hashlib._Hash`` is private)."""

    def update(self, data: bytes, /) -> object: ...  # None (hashlib) or the hasher (blake3)

    def digest(self) -> bytes: ...


class ThreadedHash:
    """``hasher`` fed on a thread named ``name``; ``digest`` waits for every chunk handed over."""

    def __init__(self, hasher: Hasher, *, backlog: int, name: str, batch: int = 0) -> None:
        self._hasher = hasher
        self._chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=backlog)
        # Chunks under ``batch`` bytes are joined until they make ``batch``: a tar parser's 512-byte
        # reads would otherwise cost a hand-over each.
        self._batch = batch
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (chunk := self._chunks.get()) is not None:
            self._hasher.update(chunk)

    def update(self, chunk: bytes) -> None:
        if self._held or len(chunk) < self._batch:
            self._held.append(chunk)
            self._held_bytes += len(chunk)
            if self._held_bytes < self._batch:
                return
            chunk = b"".join(self._held)
            self._held.clear()
            self._held_bytes = 0
        self._chunks.put(chunk)

    def close(self) -> None:
        """Stop the thread once it has hashed every chunk handed over (idempotent)."""
        if self._thread.is_alive():
            if self._held:
                self._chunks.put(b"".join(self._held))
                self._held.clear()
            self._chunks.put(None)
            self._thread.join()

    def digest(self) -> bytes:
        self.close()
        return self._hasher.digest()
