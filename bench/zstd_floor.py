"""The zstd stream floor of a library's compressed offload bundles.

Inflates every CCOB in ``.hip_fatbin`` with python-zstandard's stream reader into one reused
buffer and does nothing else: no parsing of what comes out, no hash. Nothing in rocm-audit can
list every code object of a compressed bundle faster than this, since the entry heads lie spread
over the whole stream. Run on its own to print the figure:

    python bench/zstd_floor.py LIB [--until-fraction F]
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
import time

_SHDR = struct.Struct("<IIQQQQIIQQ")


def libzstd(functions: dict[str, tuple[object, list[object]]]) -> ctypes.CDLL:
    """Debian's libzstd.so.1 through ctypes, with ``ZSTD_createDCtx``, the error helpers and each of
    ``functions`` (name: (restype, argtypes)) declared: for the scripts that need libzstd's own API."""
    lib = ctypes.CDLL("libzstd.so.1")
    declared = {
        "ZSTD_createDCtx": (ctypes.c_void_p, []),
        "ZSTD_isError": (ctypes.c_uint, [ctypes.c_size_t]),
        "ZSTD_getErrorName": (ctypes.c_char_p, [ctypes.c_size_t]),
        **functions,
    }
    for name, (restype, argtypes) in declared.items():
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes
    return lib


def hip_fatbin_range(path: str) -> tuple[int, int]:
    """(file offset, size) of ``.hip_fatbin`` in a 64-bit little-endian ELF (readelf-free)."""
    with open(path, "rb") as handle:
        head = handle.read(64)
        (shoff,) = struct.unpack_from("<Q", head, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
        handle.seek(shoff)
        table = handle.read(shentsize * shnum)
        sections = [_SHDR.unpack_from(table, i * shentsize) for i in range(shnum)]
        strtab = sections[shstrndx]
        handle.seek(strtab[4])
        names = handle.read(strtab[5])
    for name, _type, _flags, _addr, offset, size, *_rest in sections:
        if names[name : names.index(b"\0", name)] == b".hip_fatbin":
            return offset, size
    raise SystemExit(f"{path}: no .hip_fatbin")


def ccob_spans(path: str) -> list[tuple[int, int, int]]:
    """(payload offset, payload size, uncompressed size) of every CCOB v2/v3 in ``.hip_fatbin``."""
    start, size = hip_fatbin_range(path)
    spans = []
    with open(path, "rb") as handle:
        handle.seek(start)
        data = handle.read(size)
    pos = data.find(b"CCOB")
    while pos >= 0:
        version = struct.unpack_from("<H", data, pos + 4)[0]
        if version == 2:
            total, raw = struct.unpack_from("<II", data, pos + 8)
            header = 24
        else:
            total, raw = struct.unpack_from("<QQ", data, pos + 8)
            header = 32
        spans.append((start + pos + header, total - header, raw))
        pos = data.find(b"CCOB", pos + total)
    return spans


def inflate_all(path: str, until_fraction: float = 1.0) -> tuple[int, float]:
    """Inflate each bundle's first ``until_fraction`` of bytes; returns (bytes, seconds)."""
    import zstandard

    spans = ccob_spans(path)
    buffer = memoryview(bytearray(1 << 20))
    out = 0
    # One decompression context for every bundle: zstd keeps its window buffer between frames,
    # where a new context per frame maps and faults a fresh window (75-113 MB here) each time.
    decompressor = zstandard.ZstdDecompressor()
    began = time.perf_counter()
    with open(path, "rb", buffering=0) as handle:
        for offset, size, raw in spans:
            handle.seek(offset)
            reader = decompressor.stream_reader(handle.read(size), read_across_frames=False)
            want = int(raw * until_fraction)
            done = 0
            while done < want:
                got = reader.readinto(buffer[: min(len(buffer), want - done)])
                if not got:
                    break
                done += got
            reader.close()
            out += done
    return out, time.perf_counter() - began


def main(argv: list[str]) -> int:
    path = argv[0]
    fraction = float(argv[argv.index("--until-fraction") + 1]) if "--until-fraction" in argv else 1.0
    out, seconds = inflate_all(path, fraction)
    print(f"{len(ccob_spans(path))} bundles, {out} bytes inflated in {seconds:.3f} s ({os.path.basename(path)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
