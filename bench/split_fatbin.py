#!/usr/bin/env python3
"""Split a dumped .hip_fatbin into its offload bundles (the "split" step of the user route).

Usage: split_fatbin.py FATBIN OUTDIR. Writes OUTDIR/NNNNN.bundle per bundle, in order; for a
compressed bundle (CCOB) also OUTDIR/NNNNN.hdr holding its header length, so the caller can inflate
the payload with ``zstd -d`` where LLVM 19's bundler cannot read the header. Reads with pread and
copies with copy_file_range: memory stays small whatever the fatbin size.
"""

import os
import struct
import sys

PLAIN = b"__CLANG_OFFLOAD_BUNDLE__"
CCOB = b"CCOB"
CCOB_HEADER = {2: 24, 3: 32}


def bundle_length(fd: int, pos: int) -> tuple[int, int]:
    """(length, ccob header length or 0) of the bundle starting at pos."""
    head = os.pread(fd, 32, pos)
    if head.startswith(PLAIN):
        (count,) = struct.unpack_from("<Q", head, 24)
        table = os.pread(fd, 1 << 20, pos + 32)
        end, at = 0, 0
        for _ in range(count):
            offset, size, id_len = struct.unpack_from("<QQQ", table, at)
            at += 24 + id_len
            end = max(end, offset + size)
        return end, 0
    if head.startswith(CCOB):
        (version,) = struct.unpack_from("<H", head, 4)
        if version == 2:
            return struct.unpack_from("<I", head, 8)[0], 24
        if version == 3:
            return struct.unpack_from("<Q", head, 8)[0], 32
        raise SystemExit(f"CCOB version {version} at {pos:#x}: no total size in the header")
    raise SystemExit(f"no offload bundle magic at {pos:#x}")


def main() -> None:
    source, outdir = sys.argv[1:3]
    os.makedirs(outdir, exist_ok=True)
    fd = os.open(source, os.O_RDONLY)
    size = os.fstat(fd).st_size
    pos, index = 0, 0
    while pos < size:
        block = os.pread(fd, 4096, pos)
        skipped = len(block) - len(block.lstrip(b"\0"))
        if skipped:  # zero padding between bundles (each TU's section is 4096-aligned)
            pos += skipped
            continue
        length, header = bundle_length(fd, pos)
        name = os.path.join(outdir, f"{index:05d}")
        out = os.open(name + ".bundle", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        left, at = length, pos
        while left:
            sent = os.copy_file_range(fd, out, left, at)
            if sent == 0:
                raise SystemExit("short fatbin")
            left -= sent
            at += sent
        os.close(out)
        if header:
            with open(name + ".hdr", "w") as handle:
                handle.write(str(header))
        pos += length
        index += 1
    print(f"{index} bundles", file=sys.stderr)


if __name__ == "__main__":
    main()
