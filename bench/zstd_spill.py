"""What it costs to keep a bundle's zstd window out of memory (issue 17, memory).

The window of each of jax's xla_rocm_plugin.so bundles is the whole bundle (``zstd_window.py``), so
a decoder that holds it in its own memory needs 75-113 MB. libzstd can instead decode straight into
a caller's buffer and use that as the window (``ZSTD_d_stableOutBuffer``, experimental parameter
1001 of zstd.h: the buffer must not move and must hold the whole frame). Made a shared mapping of
a temporary file, and with the pages written so far dropped from the process every ``--step``
bytes (``madvise(MADV_DONTNEED)``: a shared file mapping keeps its contents in the page cache and
faults them back on the next read), the window leaves the process's resident set: it lives in the
page cache, which the kernel can write back and reclaim. This script measures, per run in a fresh
process, wall time and peak RSS of inflating every CCOB of ``.hip_fatbin`` that way against the
ordinary in-memory window, with libzstd through ctypes in both (no python-zstandard), and checks
each payload against the CCOB's MD5 so that a fast wrong answer cannot win.

Each call is given whole zstd blocks only (RFC 8878 3.1.1.2), as many as can inflate to at most
``--step`` bytes (a compressed block to at most 128 KiB), so the pages one call can pull back in
are bounded by what it writes. They are not bounded by what it reads: a read fault on a file
mapping maps up to 64 KiB of cached neighbours (the kernel's fault-around), so each long-distance
match of a call brings back 16 pages. ``--grain G`` splits the mapping into areas of G bytes with
alternating flags (``MADV_RANDOM``), which the kernel cannot merge and fault-around cannot cross.

Run on its own:

    python bench/zstd_spill.py LIB [--step BYTES] [--grain BYTES] [--runs N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import mmap
import os
import resource
import struct
import subprocess
import sys
import tempfile
import time

from zstd_floor import ccob_spans, libzstd

STABLE_OUT_BUFFER = 1001  # ZSTD_d_experimentalParam2 (zstd.h 1.4+), alias ZSTD_d_stableOutBuffer
RESET_SESSION = 1  # ZSTD_reset_session_only
MADV_DONTNEED = 4
PAGE = mmap.PAGESIZE
MADV_RANDOM = 1
BLOCK_MAX = 128 << 10  # ZSTD_BLOCKSIZE_MAX: the most one compressed block inflates to


def frame_header_size(frame: bytes) -> int:
    """Bytes before the first block: magic, descriptor, window byte, dictionary id, content size."""
    descriptor = frame[4]
    single_segment = descriptor >> 5 & 1
    return 5 + (not single_segment) + (0, 1, 2, 4)[descriptor & 3] + (single_segment, 2, 4, 8)[descriptor >> 6]


def blocks_until(frame: bytes, at: int, step: int) -> tuple[int, bool]:
    """End of the run of whole blocks from ``at`` that inflates to at most ``step`` bytes (at
    least one block), and whether it ends the frame (its checksum included)."""
    bound = 0
    while True:
        header = frame[at] | frame[at + 1] << 8 | frame[at + 2] << 16
        kind, size = header >> 1 & 3, header >> 3
        at += 3 + (1 if kind == 1 else size)  # an RLE block stores one byte
        bound += BLOCK_MAX if kind == 2 else size
        if header & 1:
            return at + 4 * (frame[4] >> 2 & 1), True
        if bound >= step:
            return at, False


class _Buffer(ctypes.Structure):  # ZSTD_inBuffer / ZSTD_outBuffer
    _fields_ = [("data", ctypes.c_void_p), ("size", ctypes.c_size_t), ("pos", ctypes.c_size_t)]


def _zstd() -> ctypes.CDLL:
    return libzstd(
        {
            "ZSTD_DCtx_setParameter": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]),
            "ZSTD_DCtx_reset": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_int]),
            "ZSTD_decompressStream": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]),
        }
    )


def inflate(path: str, spill: bool, step: int, directory: str, hashed: bool, grain: int) -> dict[str, object]:
    """Inflate every CCOB; returns seconds, bytes, peak RSS (MB) and, when ``hashed``, how many
    payloads matched their CCOB's MD5 (hashing costs several times the inflation: timed runs skip it)."""
    zstd = _zstd()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    spans = ccob_spans(path)
    largest = max(raw for _, _, raw in spans)
    context = zstd.ZSTD_createDCtx()
    started = time.perf_counter()
    if spill:
        backing = tempfile.TemporaryFile(dir=directory)
        backing.truncate(largest)
        window = mmap.mmap(backing.fileno(), largest, mmap.MAP_SHARED)
        start = ctypes.addressof(ctypes.c_char.from_buffer(window))
        for offset in range(0, largest - grain, 2 * grain) if grain else ():
            libc.madvise(start + offset, grain, MADV_RANDOM)
    else:
        window = mmap.mmap(-1, largest)  # the same bytes, anonymous: what a decoder holds itself
    base = ctypes.addressof(ctypes.c_char.from_buffer(window))
    total = matched = 0
    with open(path, "rb") as handle:
        for payload_at, payload_size, raw in spans:
            (stored_hash,) = struct.unpack_from("8s", os.pread(handle.fileno(), 8, payload_at - 8))
            compressed = ctypes.create_string_buffer(os.pread(handle.fileno(), payload_size, payload_at), payload_size)
            zstd.ZSTD_DCtx_reset(context, RESET_SESSION)
            status = zstd.ZSTD_DCtx_setParameter(context, STABLE_OUT_BUFFER, 1)
            if zstd.ZSTD_isError(status):
                raise SystemExit(f"libzstd refuses stableOutBuffer: {zstd.ZSTD_getErrorName(status).decode()}")
            source = _Buffer(ctypes.addressof(compressed), 0, 0)
            target = _Buffer(base, raw, 0)
            done = 0
            digest = hashlib.md5(usedforsecurity=False)  # fed as bytes come out: no second pass
            frame = compressed.raw
            cut, last = frame_header_size(frame), False
            while not last:
                cut, last = blocks_until(frame, cut, step)
                source.size = cut
                status = zstd.ZSTD_decompressStream(context, ctypes.byref(target), ctypes.byref(source))
                if zstd.ZSTD_isError(status):
                    raise SystemExit(f"zstd: {zstd.ZSTD_getErrorName(status).decode()}")
                if hashed:
                    digest.update(memoryview(window)[done : target.pos])
                    done = target.pos
                if spill:
                    # All of it, not only the new part: reads of older history fault pages back in.
                    libc.madvise(base, target.pos // PAGE * PAGE, MADV_DONTNEED)
            matched += hashed and digest.digest()[:8] == stored_hash
            total += target.pos
            if spill:
                libc.madvise(base, raw, MADV_DONTNEED)
    return {
        "seconds": round(time.perf_counter() - started, 3),
        "bytes": total,
        "bundles": len(spans),
        "hashes_matched": matched,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("library")
    parser.add_argument("--step", type=int, default=1 << 20, help="inflate at most STEP bytes between drops")
    parser.add_argument("--grain", type=int, default=0, help="split the spill mapping into GRAIN-byte areas")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the spill file lives")
    parser.add_argument("--child", choices=("memory", "spill"), help=argparse.SUPPRESS)
    parser.add_argument("--hashed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = inflate(args.library, args.child == "spill", args.step, args.dir, args.hashed, args.grain)
        print(json.dumps(result))
        return
    for variant in ("memory", "spill"):
        results = []
        command = [sys.executable, __file__, args.library, "--child", variant, "--step", str(args.step)]
        command += ["--dir", args.dir, "--grain", str(args.grain)]
        for hashed in [True] + [False] * args.runs:  # the first run checks the bytes, the rest are timed
            output = subprocess.run(command + ["--hashed"] * hashed, capture_output=True, text=True, check=True)
            results.append(json.loads(output.stdout))
        checked, results = results[0], results[1:]
        seconds = sorted(r["seconds"] for r in results)
        print(
            f"{variant:6}: median {seconds[len(seconds) // 2]:.3f} s (runs {', '.join(map(str, seconds))}), "
            f"peak RSS {max(r['peak_rss_mb'] for r in results)} MB, {checked['bytes']} bytes from "
            f"{checked['bundles']} bundles, {checked['hashes_matched']} of them match their MD5"
        )


if __name__ == "__main__":
    main()
