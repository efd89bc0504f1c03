"""Random access into a zstd frame without holding its window (the C extension ``_zstdindex``).

Why: clang's offload bundler compresses a whole bundle as one zstd frame with long-distance
matching, so the window is the bundle (75-113 MB in jax's PJRT plugin) and a streaming decoder
must hold all of it to reach an entry near the end (formats.md 2.4). The index decodes only the
entropy layer (Huffman literals, FSE sequences; RFC 8878), keeps one 24-byte record per sequence
and the literals (8.6 MB for the plugin's largest bundle), and serves any byte range by following
each match back to the literals it copies. Building it costs less than inflating the frame.

The extension is optional (setup.py): without it ``available()`` is False and callers stream.
``ROCM_AUDIT_NO_ZSTD_INDEX=1`` turns it off too, to compare both paths on the same install.
"""

from __future__ import annotations

import os
from typing import Protocol

from rocm_audit.errors import FormatError

FMT = "zstd"
# Sequences can cost no input bits at all (RLE-mode tables), so their number is capped apart from
# the input's size: 2 Mi records are 48 MiB. A frame past it is streamed instead (real bundles:
# 0.31 records per compressed byte, 345,680 for the plugin's largest).
MAX_RECORDS = 2 << 20
# Literals are bounded by the input (Huffman codes are at least one bit: 8 per input byte).
LITERALS_PER_INPUT_BYTE = 8
# Resolution steps a read may take: this many, plus STEPS_PER_BYTE per byte asked for (reads of
# real bundles take about 1.5 per byte: the chains of matches are short). Past it: IndexTooLarge.
STEP_BUDGET = 1 << 20
STEPS_PER_BYTE = 64
# Compressed input read whole to build an index; a larger frame is streamed.
MAX_INPUT = 256 << 20


class FrameIndex(Protocol):
    """What ``index_frame`` returns (the extension's type)."""

    @property
    def size(self) -> int: ...  # bytes the frame regenerates

    @property
    def consumed(self) -> int: ...  # input bytes the frame takes

    @property
    def records(self) -> int: ...

    @property
    def nbytes(self) -> int: ...  # memory the index holds

    def read(self, offset: int, length: int, /) -> bytes: ...


def available() -> bool:
    """Whether frames can be indexed here (the extension is built and not turned off)."""
    if os.environ.get("ROCM_AUDIT_NO_ZSTD_INDEX", "") not in ("", "0"):
        return False
    try:
        from rocm_audit.formats import _zstdindex  # noqa: F401, PLC0415 - optional, compiled
    except ImportError:
        return False
    return True


class IndexTooLarge(Exception):
    """The frame needs more records, literals or resolution steps than an index may take."""


def index_frame(data: bytes, base: int, fmt: str = FMT) -> FrameIndex:
    """Index the zstd frame at ``data[0]`` (``base``: its file offset, ``fmt``: the container's
    name, both for findings).

    Raises FormatError for a frame that does not decode (the offset names the input byte where
    decoding stopped), IndexTooLarge when it needs more than the limits above."""
    from rocm_audit.formats import _zstdindex  # noqa: PLC0415 - optional, compiled

    try:
        index: FrameIndex = _zstdindex.index_frame(
            data,
            max_records=MAX_RECORDS,
            max_literals=max(len(data), 1) * LITERALS_PER_INPUT_BYTE,
            step_budget=STEP_BUDGET,
            steps_per_byte=STEPS_PER_BYTE,
        )
    except _zstdindex.Corrupt as exc:
        offset, reason = exc.args
        raise FormatError(fmt, base + offset, f"zstd stream is corrupt: {reason}") from None
    except _zstdindex.TooLarge as exc:
        raise IndexTooLarge(exc.args[0]) from None
    return index


def read(index: FrameIndex, offset: int, length: int) -> bytes:
    """``index.read``, with a resolution that runs out of steps raised as IndexTooLarge."""
    from rocm_audit.formats import _zstdindex  # noqa: PLC0415 - optional, compiled

    try:
        return index.read(offset, length)
    except _zstdindex.TooLarge as exc:
        raise IndexTooLarge(exc.args[0]) from None
