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
