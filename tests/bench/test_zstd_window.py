"""bench/zstd_window.py measures what it says: the window a frame's matches really reach back.

A payload whose only long match lies 3 MiB back, compressed by libzstd as one single-segment frame
(the shape clang-offload-bundler writes), needs a 2^22 window however large the declared one; with
2^21 its decode must not pass the MD5 check.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import zstd_window

pytestmark = pytest.mark.toolchain  # builds the benchmark's CCOB library


def _frame() -> tuple[bytes, bytes]:
    block = hashlib.shake_256(b"a").digest(1 << 20)
    payload = block + hashlib.shake_256(b"b").digest(2 << 20) + block
    parameters = zstandard.ZstdCompressionParameters.from_level(3, window_log=23, enable_ldm=True)
    frame = zstandard.ZstdCompressor(compression_params=parameters).compress(payload)
    return frame, hashlib.md5(payload, usedforsecurity=False).digest()[:8]


def test_single_segment_frame_is_narrowed_and_the_far_match_sets_the_window():
    frame, hash64 = _frame()
    assert frame[4] & zstd_window.SINGLE_SEGMENT  # libzstd writes what the bundler writes
    declared = zstandard.get_frame_parameters(frame).window_size
    assert declared == 4 << 20
    needed, narrower = zstd_window.smallest_window(frame, hash64, 22)
    assert needed == 22
    assert narrower and narrower[-1].startswith("2^21: ")
    digest, out, error = zstd_window.inflate_md5(frame, 22)
    assert (digest, out, error) == (hash64, 4 << 20, "")
    wrong, _out, _error = zstd_window.inflate_md5(frame, 21)
    assert wrong != hash64
