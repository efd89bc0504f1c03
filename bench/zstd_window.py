"""How much zstd window a library's compressed offload bundles really need (issue 17, memory).

The memory targets of issue 17 (verify-arch at most 60 MB, scan --targets 80 MB) are below the
window the bundles declare: clang-offload-bundler writes each CCOB as one single-segment zstd frame,
so the window is the whole payload (75-113 MB in jax's xla_rocm_plugin.so). This script measures,
per CCOB of ``.hip_fatbin``:

* the declared window and whether the frame is single-segment (frame header, RFC 8878 3.1.1.1);
* the smallest window that still reproduces the payload when the frame header is rewritten to
  declare it (single-segment flag cleared, a Window_Descriptor added), checked against the CCOB's
  own MD5; a window the encoder really stayed within would let a decoder run in less memory;
* whether a narrower window fails loudly or silently: libzstd's streaming decoder does not check a
  match offset against the declared window, only against the history its buffer still holds, so a
  too-small window can hand out wrong bytes before (or without) any error. That rules the trick out
  for an auditor, which must never judge bytes it has not read correctly;
* the peak RSS of the reference decoder, ``zstd -d -c FRAME > /dev/null``, on the largest bundle
  (``rss_exec``): what any tool needs to inflate it.

Run on its own:

    python bench/zstd_window.py LIB [--bundles N]
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from zstd_floor import ccob_spans

HERE = Path(__file__).resolve().parent
SINGLE_SEGMENT = 0x20  # Frame_Header_Descriptor bit 5
LOWEST_WINDOW_LOG = 10  # Window_Descriptor: windowLog = 10 + Exponent


def narrowed(frame: bytes, window_log: int) -> bytes:
    """The same frame with a Window_Descriptor of 2**window_log instead of the single-segment flag.

    Single_Segment with FCS_Field_Size flag 0 means a 1-byte content size; without the flag, flag 0
    means none, so that one case changes the content-size field's width: only rewritten when the
    flag is 1-3 (4, 2 or 8 bytes either way), which every real bundle seen uses.
    """
    descriptor = frame[4]
    if not descriptor & SINGLE_SEGMENT or descriptor >> 6 == 0:
        raise ValueError("not a single-segment frame with a 2-, 4- or 8-byte content size")
    return frame[:4] + bytes([descriptor & ~SINGLE_SEGMENT, (window_log - LOWEST_WINDOW_LOG) << 3]) + frame[5:]


def inflate_md5(frame: bytes, window_log: int | None) -> tuple[bytes | None, int, str]:
    """(MD5[:8] of what came out or None on error, bytes out, error text) with the given window."""
    import zstandard

    if window_log is None:
        decompressor, source = zstandard.ZstdDecompressor(), frame
    else:
        decompressor = zstandard.ZstdDecompressor(max_window_size=1 << window_log)
        source = narrowed(frame, window_log)
    digest = hashlib.md5(usedforsecurity=False)
    out = 0
    buffer = memoryview(bytearray(1 << 20))
    reader = decompressor.stream_reader(source, read_across_frames=False)
    try:
        while got := reader.readinto(buffer):
            digest.update(buffer[:got])
            out += got
    except zstandard.ZstdError as exc:
        return None, out, str(exc)
    finally:
        reader.close()
    return digest.digest()[:8], out, ""


def smallest_window(frame: bytes, hash64: bytes, declared_log: int) -> tuple[int, list[str]]:
    """Binary search for the smallest window log that reproduces the payload, and what the narrower
    windows tried did ("error" or "wrong bytes, no error"). A window that reproduces the payload
    holds for every larger one (more history, the same offsets)."""
    low, high = 17, declared_log  # below 128 KiB (one block) nothing real fits
    seen = []
    while low < high:
        middle = (low + high) // 2
        digest, _out, error = inflate_md5(frame, middle)
        if digest == hash64:
            high = middle
        else:
            seen.append(f"2^{middle}: " + ("error" if error else "wrong bytes, no error"))
            low = middle + 1
    return low, seen


def reference_rss_kib(frame: bytes) -> int | None:
    """Peak RSS of ``zstd -d -c`` on the frame, through rss_exec (None without zstd or a C compiler)."""
    with tempfile.TemporaryDirectory() as work:
        helper = Path(work) / "rss_exec"
        built = subprocess.run(["cc", "-O2", "-o", str(helper), str(HERE / "rss_exec.c")], capture_output=True)
        if built.returncode != 0:
            return None
        path = Path(work) / "frame.zst"
        path.write_bytes(frame)
        figure = Path(work) / "rss"
        with open(os.devnull, "wb") as sink:
            done = subprocess.run([str(helper), str(figure), "zstd", "-d", "-c", str(path)], stdout=sink)
        return int(figure.read_text()) if done.returncode == 0 else None


def main(argv: list[str]) -> int:
    import zstandard

    path = argv[0]
    limit = int(argv[argv.index("--bundles") + 1]) if "--bundles" in argv else None
    spans = ccob_spans(path)[:limit]
    largest = None
    print("bundle  inflated  declared window  single-segment  smallest window that reproduces it  narrower")
    with open(path, "rb") as handle:
        for index, (offset, size, raw) in enumerate(spans):
            handle.seek(offset - 8)
            hash64 = handle.read(8)  # CCOB v2/v3: the hash ends the header
            frame = handle.read(size)
            parameters = zstandard.get_frame_parameters(frame)
            declared_log = max(parameters.window_size - 1, 1).bit_length()
            single = bool(frame[4] & SINGLE_SEGMENT)
            if single and frame[4] >> 6:
                needed, seen = smallest_window(frame, hash64, declared_log)
                smallest = f"2^{needed} ({(1 << needed) / 1e6:.1f} MB)"
            else:
                smallest, seen = "(not rewritten)", []
            print(
                f"{index:6}  {raw / 1e6:6.1f} MB  {parameters.window_size / 1e6:10.1f} MB  {single!s:>14}  "
                f"{smallest:>34}  {'; '.join(seen)}"
            )
            if largest is None or raw > largest[0]:
                largest = (raw, frame)
    if largest is not None:
        rss = reference_rss_kib(largest[1])
        shown = "n/a" if rss is None else f"{rss / 1024:.0f} MB"
        print(f"zstd -d -c on the largest bundle ({largest[0] / 1e6:.1f} MB inflated): peak RSS {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
