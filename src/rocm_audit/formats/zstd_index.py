"""Random access into a zstd frame without holding its window (the C extension ``_zstdindex``).

Why: clang's offload bundler compresses a whole bundle as one zstd frame with long-distance
matching, so the window is the bundle (75-113 MB in jax's PJRT plugin) and a streaming decoder
must hold all of it to reach an entry near the end (formats.md 2.4). The index decodes only the
entropy layer (Huffman literals, FSE sequences; RFC 8878), keeps one 24-byte record per sequence,
a table of record numbers (one per 256 bytes of output, to find the record holding a position in
one step) and the literals (10.3 MB for the plugin's largest bundle), and serves any byte range by
following each match back to the literals it copies. Building it costs less than inflating the
frame.

The extension is optional (setup.py): without it ``available()`` is False and callers stream.
``ROCM_AUDIT_NO_ZSTD_INDEX=1`` turns it off too, to compare both paths on the same install.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from rocm_audit.errors import FormatError

FMT = "zstd"
# Sequences can cost no input bits at all (RLE-mode tables), so their number is capped apart from
# the input's size: 2 Mi records are 48 MiB. A frame past it is streamed instead (real bundles:
# 0.31 records per compressed byte, 345,680 for the plugin's largest). The lookup table holds at
# most as many entries, 4 bytes each (8 MiB; an RLE block makes 128 KiB of output from 4 input
# bytes, so the output does not bound it): past that, lookups search the records, same bytes.
MAX_RECORDS = 2 << 20
# Literals are bounded by the input (Huffman codes are at least one bit: 8 per input byte).
LITERALS_PER_INPUT_BYTE = 8
# Resolution steps a read may take: this many, plus STEPS_PER_BYTE per byte asked for (reads of
# real bundles take about 1.5 per byte: the chains of matches are short). Past it: IndexTooLarge.
STEP_BUDGET = 1 << 20
STEPS_PER_BYTE = 64
# Compressed input read whole to build an index; a larger frame is streamed.
MAX_INPUT = 256 << 20

T = TypeVar("T")


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


class FrameCorrupt(FormatError):
    """The frame does not decode; the offset names the input byte where decoding stopped."""


class FrameIndex:
    """One zstd frame, indexed as far as reads have needed (a read past what is indexed decodes
    the blocks up to it; what no read reaches is never decoded, as a stream stops early)."""

    def __init__(self, data: bytes, base: int, fmt: str = FMT) -> None:
        """``base``: the frame's file offset and ``fmt`` the container's name, for findings.
        Raises FrameCorrupt when the frame header does not hold, IndexTooLarge when the limits
        above are too small for it."""
        from rocm_audit.formats import _zstdindex  # noqa: PLC0415 - optional, compiled

        self._module = _zstdindex
        self._base, self._fmt = base, fmt
        self._index = self._call(
            _zstdindex.index_frame,
            data,
            max_records=MAX_RECORDS,
            max_literals=max(len(data), 1) * LITERALS_PER_INPUT_BYTE,
            step_budget=STEP_BUDGET,
            steps_per_byte=STEPS_PER_BYTE,
        )

    def _call(self, function: Callable[..., T], *args: object, **kwargs: object) -> T:
        try:
            return function(*args, **kwargs)
        except self._module.Corrupt as exc:
            offset, reason = exc.args
            raise FrameCorrupt(self._fmt, self._base + offset, f"zstd stream is corrupt: {reason}") from None
        except self._module.TooLarge as exc:
            raise IndexTooLarge(exc.args[0]) from None

    @property
    def size(self) -> int:
        """Bytes the frame regenerates (its header's content size, or all blocks decoded)."""
        return self._call(lambda: self._index.size)

    @property
    def nbytes(self) -> int:
        """Memory the index holds now."""
        return self._index.nbytes

    def read(self, offset: int, length: int) -> bytes:
        """The frame's bytes at [offset, offset+length); shorter only at its end."""
        return self._call(self._index.read, offset, length)

    def decode_all(self) -> int:
        """Decode every block (a frame's damage anywhere is then found); returns input bytes used."""
        return self._call(self._index.decode_all)
