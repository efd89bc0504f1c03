"""Can a bounded history inflate a library's CCOB zstd frames, failing loudly when it cannot?

``zstd_window.py`` shows that a narrower declared window makes libzstd's streaming decoder hand out
wrong bytes without an error. libzstd's buffer-less API (``ZSTD_decompressBegin`` /
``ZSTD_decompressContinue``, exported by Debian's libzstd.so.1) is stricter: it decodes each block
into a buffer the caller chooses, treats the previous contiguous output as the only other history
(zstd's "extDict"), and rejects a match that reaches further back than both with
``corruption_detected``. Two buffers of ``H`` bytes used in turn therefore give a decoder that holds
at most ``2H`` of history and never reads a byte it overwrote: the buffer it writes into is never
the history it reads from, except for the part it just wrote. This script measures, per ``H``, how
many of ``.hip_fatbin``'s CCOBs inflate that way to their CCOB MD5, and at what fraction of the
payload the others stopped (a verdict on gfx950 needs the first 96% of every jax plugin bundle).

Run on its own:

    python bench/zstd_history.py LIB [--halves MIB,MIB,...]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import resource
import statistics
import time

from zstd_floor import ccob_spans, libzstd

BLOCK_MAX = 128 << 10  # ZSTD_BLOCKSIZE_MAX: the most one block inflates to (RFC 8878 3.1.1.2.4)


def _zstd() -> ctypes.CDLL:
    return libzstd(
        {
            "ZSTD_freeDCtx": (ctypes.c_size_t, [ctypes.c_void_p]),
            "ZSTD_decompressBegin": (ctypes.c_size_t, [ctypes.c_void_p]),
            "ZSTD_nextSrcSizeToDecompress": (ctypes.c_size_t, [ctypes.c_void_p]),
            "ZSTD_decompressContinue": (ctypes.c_size_t, [ctypes.c_void_p] + [ctypes.c_void_p, ctypes.c_size_t] * 2),
        }
    )


def inflate_bounded(lib: ctypes.CDLL, payload: bytes, half: int) -> tuple[int, str, bytes]:
    """(bytes out, "ok" or libzstd's error, MD5[:8] of what came out) with 2 x ``half`` of history."""
    dctx = lib.ZSTD_createDCtx()
    lib.ZSTD_decompressBegin(dctx)
    buffers = [ctypes.create_string_buffer(half) for _ in range(2)]
    digest = hashlib.md5(usedforsecurity=False)
    current, at, consumed, produced = 0, 0, 0, 0
    status = "ok"
    try:
        while (want := lib.ZSTD_nextSrcSizeToDecompress(dctx)) != 0:
            if consumed + want > len(payload):
                status = "truncated"
                break
            if half - at < BLOCK_MAX:  # the next block might not fit: continue in the other buffer
                current, at = current ^ 1, 0
            source = payload[consumed : consumed + want]
            consumed += want
            out = lib.ZSTD_decompressContinue(dctx, ctypes.addressof(buffers[current]) + at, half - at, source, want)
            if lib.ZSTD_isError(out):
                status = lib.ZSTD_getErrorName(out).decode()
                break
            digest.update(memoryview(buffers[current])[at : at + out])
            at += out
            produced += out
    finally:
        lib.ZSTD_freeDCtx(dctx)
    return produced, status, digest.digest()[:8]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lib")
    parser.add_argument("--halves", default="2,8,32", help="history buffer sizes H in MiB")
    args = parser.parse_args()
    lib = _zstd()
    spans = ccob_spans(args.lib)
    with open(args.lib, "rb") as handle:
        bundles = []
        for offset, size, raw in spans:
            handle.seek(offset - 8)  # the CCOB hash sits just before the payload (v2 and v3)
            hash64 = handle.read(8)
            bundles.append((handle.read(size), raw, hash64))
    print(f"{args.lib}: {len(bundles)} CCOBs")
    for half in (int(m) << 20 for m in args.halves.split(",")):
        started = time.perf_counter()
        inflated, stops = 0, []
        for payload, raw, hash64 in bundles:
            produced, status, digest = inflate_bounded(lib, payload, half)
            if status == "ok" and produced == raw and digest == hash64:
                inflated += 1
            elif status == "ok":
                raise SystemExit(f"H={half >> 20} MiB: wrong bytes without an error (never expected)")
            else:
                stops.append(produced / raw)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
        where = f", stopped at a median {statistics.median(stops):.0%} of the payload" if stops else ""
        print(
            f"H={half >> 20} MiB: {inflated}/{len(bundles)} inflated to their MD5, "
            f"{len(stops)} stopped by a match beyond the history{where}; "
            f"{time.perf_counter() - started:.2f} s, peak RSS so far {peak} MB"
        )


if __name__ == "__main__":
    main()
