"""The threaded digest (rocm_audit/hashing.py) is the digest of its chunks in order."""

from __future__ import annotations

import hashlib
import random

import pytest

from rocm_audit.hashing import ThreadedHash


@pytest.mark.parametrize("algorithm", ["sha256", "md5"])  # image/digests.py, prune/fatbins/rewrite.py
def test_the_digest_of_the_chunks_in_order_with_more_chunks_than_the_backlog(algorithm):
    rng = random.Random(3)
    chunks = [rng.randbytes(rng.randint(0, 300_000)) for _ in range(60)]
    threaded = ThreadedHash(hashlib.new(algorithm), backlog=4, name="test-hash")
    for chunk in chunks:
        threaded.update(chunk)
    expected = hashlib.new(algorithm, b"".join(chunks)).digest()
    assert threaded.digest() == expected
    threaded.close()  # idempotent, the digest stays readable
    assert threaded.digest() == expected
    assert not threaded._thread.is_alive()


def test_close_before_any_chunk_ends_the_thread():
    threaded = ThreadedHash(hashlib.sha256(), backlog=2, name="test-hash")
    threaded.close()
    assert not threaded._thread.is_alive()
    assert threaded.digest() == hashlib.sha256().digest()


class _Recording:
    """A hasher that notes the size of every update it is given (on the hashing thread)."""

    def __init__(self) -> None:
        self.inner = hashlib.sha256()
        self.sizes: list[int] = []

    def update(self, data: bytes, /) -> None:
        self.sizes.append(len(data))
        self.inner.update(data)

    def digest(self) -> bytes:
        return self.inner.digest()


def test_small_chunks_are_handed_over_in_batches_and_the_digest_is_unchanged():
    """image/savestream.py hashes what a tar parser reads (512-byte headers among large pieces)."""
    rng = random.Random(5)
    chunks = [rng.randbytes(rng.choice((0, 1, 512, 512, 4096, 70_000, 300_000))) for _ in range(400)]
    recording = _Recording()
    threaded = ThreadedHash(recording, backlog=3, name="test-hash", batch=100_000)
    for chunk in chunks:
        threaded.update(chunk)
    assert threaded.digest() == hashlib.sha256(b"".join(chunks)).digest()
    assert sum(recording.sizes) == sum(map(len, chunks))
    assert all(size >= 100_000 for size in recording.sizes[:-1])  # only the last may be short
    assert len(recording.sizes) <= sum(map(len, chunks)) // 100_000 + 1
