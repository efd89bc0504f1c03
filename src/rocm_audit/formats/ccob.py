"""Compressed offload bundle ``CCOB`` v1/v2/v3 (zlib or zstd), read as a stream.

Layout: formats.md 2.4 [LLVM: clang/include/clang/Driver/OffloadBundler.h, OffloadBundler.cpp]. The
payload inflates to a plain bundle (``offload_bundle``). Nothing here inflates a whole payload in
memory: ``PayloadStream`` hands out bounded reads, so a reader can take the entry table from the
first kilobytes and skip through the rest, and a hostile declared size never drives an allocation.
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rocm_audit.errors import FormatError

FMT = "CCOB"
CCOB_MAGIC = b"CCOB"
METHOD_ZLIB, METHOD_ZSTD = 0, 1  # llvm::compression::Format
HEADER_SIZES = {1: 20, 2: 24, 3: 32}
MAX_HEADER_SIZE = 32
# Real bundles inflate 10-40x (jax _prng.so: 40x); zeros from -bundle-align padding push it higher.
# Beyond this ratio the declared size is treated as hostile and the payload is not streamed.
MAX_PLAUSIBLE_RATIO = 4096


@dataclass(frozen=True, slots=True)
class CcobHeader:
    version: int
    method: int
    total_size: int | None  # whole CCOB incl. header; None in v1
    uncompressed_size: int
    hash64: bytes  # MD5(uncompressed)[:8]
    header_size: int

    @property
    def method_name(self) -> str:
        return "zstd" if self.method == METHOD_ZSTD else "zlib"


def parse_header(buf: bytes | memoryview, base: int, available: int) -> CcobHeader:
    """Parse and validate a CCOB header; ``available`` = container bytes from the CCOB start."""
    if len(buf) < 8:
        raise FormatError(FMT, base + len(buf), "file ends inside the CCOB header")
    if bytes(buf[:4]) != CCOB_MAGIC:
        raise FormatError(FMT, base, "no CCOB magic")
    version, method = struct.unpack_from("<HH", buf, 4)
    header_size = HEADER_SIZES.get(version)
    if header_size is None:
        raise FormatError(FMT, base + 4, f"unknown CCOB version {version}")
    if method not in (METHOD_ZLIB, METHOD_ZSTD):
        raise FormatError(FMT, base + 6, f"unknown compression method {method} (0 zlib, 1 zstd)")
    if len(buf) < header_size:
        raise FormatError(FMT, base + len(buf), f"file ends inside the {header_size}-byte CCOB v{version} header")
    total: int | None
    if version == 1:
        total = None
        (uncompressed,) = struct.unpack_from("<I", buf, 8)
        hash64 = bytes(buf[12:20])
    elif version == 2:
        total, uncompressed = struct.unpack_from("<II", buf, 8)
        hash64 = bytes(buf[16:24])
    else:
        total, uncompressed = struct.unpack_from("<QQ", buf, 8)
        hash64 = bytes(buf[24:32])
    if total is not None:
        if total < header_size:
            raise FormatError(FMT, base + 8, f"total size {total} is smaller than the header")
        if total > available:
            raise FormatError(
                FMT,
                base + 8,
                f"total size {total} runs past the end of its container ({available} bytes)",
            )
    compressed = (total if total is not None else available) - header_size
    if uncompressed == 0:
        raise FormatError(
            FMT,
            base + (8 if version == 1 else 12 if version == 2 else 16),
            "declared uncompressed size is 0",
        )
    if compressed <= 0:
        raise FormatError(FMT, base + header_size, "no compressed payload")
    return CcobHeader(version, method, total, uncompressed, hash64, header_size)


def pack_header(version: int, method: int, inflated: int, compressed: int, digest: bytes) -> bytes:
    """The header of a CCOB of ``version`` for a payload of ``compressed`` bytes that inflates to
    ``inflated`` bytes whose MD5 starts with ``digest`` (8 bytes). Raises FormatError where the
    version's fields cannot hold the sizes (v1 and v2 have u32 fields)."""
    size = HEADER_SIZES[version]
    total = size + compressed
    if version == 1:
        if inflated >= 1 << 32:
            raise FormatError(FMT, 0, "a CCOB v1 cannot hold 4 GiB")
        head = CCOB_MAGIC + struct.pack("<HHI", version, method, inflated) + digest
    elif version == 2:
        if total >= 1 << 32 or inflated >= 1 << 32:
            raise FormatError(FMT, 0, "a CCOB v2 cannot hold 4 GiB")
        head = CCOB_MAGIC + struct.pack("<HHII", version, method, total, inflated) + digest
    else:
        head = CCOB_MAGIC + struct.pack("<HHQQ", version, method, total, inflated) + digest
    if len(head) != size:
        raise FormatError(FMT, 0, f"a {len(digest)}-byte hash does not make a v{version} header")
    return head


def plausible_size(header: CcobHeader, compressed_size: int) -> bool:
    """False when the declared uncompressed size is out of proportion to the payload (a bomb)."""
    return header.uncompressed_size <= max(compressed_size, 1) * MAX_PLAUSIBLE_RATIO


ZSTD_FRAME_MAGIC = b"\x28\xb5\x2f\xfd"  # RFC 8878 3.1.1, little-endian 0xFD2FB528
MIN_BUNDLE_BYTES = 32 + 24 + 1  # a bundle header and one entry record with a one-byte id (formats.md 2.2)


def starts_a_frame(header: CcobHeader, payload_head: bytes) -> bool:
    """Whether the compressed payload begins as the header's method says: a zstd frame header
    (magic, Frame_Header_Descriptor reserved bit 3 clear; RFC 8878 3.1.1.1.1) or a zlib stream
    header (CM 8, CINFO <= 7, FCHECK, no preset dictionary; RFC 1950 2.2)."""
    if header.method == METHOD_ZSTD:
        return len(payload_head) >= 5 and payload_head[:4] == ZSTD_FRAME_MAGIC and not payload_head[4] & 0x08
    if len(payload_head) < 2:
        return False
    cmf, flg = payload_head[0], payload_head[1]
    return cmf & 0x0F == 8 and cmf >> 4 <= 7 and (cmf << 8 | flg) % 31 == 0 and not flg & 0x20


ReadAt = Callable[[int, int], bytes]  # (offset, size) -> bytes; shorter at end of data


class PayloadStream:
    """Sequential, bounded reads of a CCOB's uncompressed payload.

    ``read_at`` reads the compressed bytes (offsets relative to the compressed payload start,
    ``compressed_size`` of them). Output never exceeds ``limit`` bytes in total. ``hashed``: keep
    an MD5 of every byte handed out or skipped, for ``hash_matches`` (it costs more than zstd
    itself, so only callers that will check it ask).
    """

    CHUNK = 64 << 10
    SKIP_CHUNK = 1 << 20  # one reused buffer: skipped bytes are inflated into it and dropped

    def __init__(
        self,
        header: CcobHeader,
        read_at: ReadAt,
        compressed_size: int,
        base: int,
        limit: int,
        *,
        hashed: bool = True,
    ) -> None:
        self._read_at = read_at
        self._compressed_size = compressed_size
        self._base = base
        self._in_pos = 0
        self._limit = limit
        self.position = 0  # uncompressed bytes handed out (or skipped) so far
        self._md5: Any = None
        if hashed:
            import hashlib  # noqa: PLC0415 - only where a hash is checked: 3 ms of every run else

            self._md5 = hashlib.md5(usedforsecurity=False)
        self._skip_buffer: bytearray | None = None
        self._pending = b""
        self._eof = False
        self._zlib: Any = None
        self._zstd_reader: Any = None
        self._zstd_error: type[Exception] = zlib.error
        if header.method == METHOD_ZLIB:
            self._zlib = zlib.decompressobj()
        else:
            import zstandard  # noqa: PLC0415 - heavy module, loaded on first use (style.md 3)

            self._zstd_error = zstandard.ZstdError
            # stream_reader.read(n) returns at most n bytes: a bomb never inflates past a request.
            self._zstd_reader = _shared_decompressor().stream_reader(
                _CompressedInput(self),  # any object with read() works
                read_size=self.CHUNK,
                read_across_frames=False,
            )

    def _next_input(self, size: int) -> bytes:
        if self._in_pos >= self._compressed_size:
            return b""
        data = self._read_at(self._in_pos, min(size, self._compressed_size - self._in_pos))
        self._in_pos += len(data)
        return data

    def _feed(self, want: int) -> bytes:
        """Produce at most ``want`` new bytes (fewer, or none, at end of stream)."""
        try:
            if self._zstd_reader is not None:
                return bytes(self._zstd_reader.read(want))
            while True:
                data = self._zlib.unconsumed_tail or self._next_input(self.CHUNK)
                if not data or self._zlib.eof:
                    return b""
                out = self._zlib.decompress(data, want)
                if out:
                    return bytes(out)
        except zlib.error as exc:
            raise FormatError(FMT, self._base + self._in_pos, f"zlib stream is corrupt: {exc}") from None
        except self._zstd_error as exc:
            raise FormatError(FMT, self._base + self._in_pos, f"zstd stream is corrupt: {exc}") from None

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes of the payload; fewer only at the end of the stream."""
        parts = []
        got = 0
        if self._pending:
            take = self._pending[:size]
            self._pending = self._pending[len(take) :]
            parts.append(take)
            got = len(take)
        while got < size and not self._eof:
            room = self._limit - self.position - got
            if room <= 0:
                break  # never hand out more than the declared (or capped) size
            out = self._feed(min(size - got, self.CHUNK, room))
            if not out:
                self._eof = True
                break
            if len(out) > size - got:
                self._pending = out[size - got :]
                out = out[: size - got]
            parts.append(out)
            got += len(out)
        self.position += got
        data = b"".join(parts)
        if self._md5 is not None:
            self._md5.update(data)
        return data

    def hash_matches(self, header: CcobHeader) -> bool | None:
        """After the whole payload was read: does MD5(payload)[:8] equal the header's hash?

        None when the stream was not read to its declared end (the hash covers every byte).
        """
        if self._md5 is None or self.position != header.uncompressed_size or self.read(1):
            return None
        return bool(self._md5.digest()[:8] == header.hash64)

    def close(self) -> None:
        """Release the decompressor: a zstd window (up to 128 MiB with long-distance matching) per
        stream would otherwise stay allocated until the objects are collected."""
        if self._zstd_reader is not None:
            self._zstd_reader.close()
            self._zstd_reader = None
        self._zlib = None
        self._eof = True

    def skip(self, size: int) -> int:
        """Discard ``size`` bytes in bounded steps; returns how many were skipped."""
        if self._md5 is None and self._zstd_reader is not None:
            return self._skip_unhashed(size)
        done = 0
        while done < size:
            chunk = self.read(min(self.CHUNK, size - done))
            if not chunk:
                break
            done += len(chunk)
        return done

    def _skip_unhashed(self, size: int) -> int:
        """zstd without a hash: inflate into one reused buffer, no copy per chunk."""
        done = min(len(self._pending), size)
        self._pending = self._pending[done:]
        self.position += done
        if self._skip_buffer is None:
            self._skip_buffer = bytearray(self.SKIP_CHUNK)
        view = memoryview(self._skip_buffer)
        while done < size and not self._eof:
            room = self._limit - self.position
            if room <= 0:
                break
            want = min(size - done, self.SKIP_CHUNK, room)
            try:
                got = self._zstd_reader.readinto(view[:want])
            except self._zstd_error as exc:
                raise FormatError(FMT, self._base + self._in_pos, f"zstd stream is corrupt: {exc}") from None
            if not got:
                self._eof = True
                break
            done += got
            self.position += got
        return done


# One context per thread: python-zstandard's contexts must not be shared by threads at once
# (prune --fatbins slims bundles on several threads).
_DECOMPRESSORS = threading.local()


def _shared_decompressor() -> Any:
    """One zstd decompression context per thread, for one stream at a time (every stream is
    closed before the next opens). zstd keeps the context's window buffer between frames; a new
    context per CCOB mapped and page-faulted a fresh window each time (75-113 MB per bundle in
    jax's xla_rocm_plugin.so: 1.5 s of kernel time for its 45 bundles, against 0.14 s reused)."""
    context = getattr(_DECOMPRESSORS, "context", None)
    if context is None:
        import zstandard  # noqa: PLC0415 - heavy module, loaded on first use (style.md 3)

        context = _DECOMPRESSORS.context = zstandard.ZstdDecompressor()
    return context


def release_shared_decompressor() -> None:
    """Free this thread's context and its window now. Called before forking helpers: a child's
    RSS starts with every page its parent has resident, a window of up to 113 MB included."""
    _DECOMPRESSORS.context = None


class _CompressedInput:
    """File-like view of the compressed payload for zstandard's stream reader."""

    def __init__(self, stream: PayloadStream) -> None:
        self._stream = stream

    def read(self, size: int | None = -1) -> bytes:
        return self._stream._next_input(PayloadStream.CHUNK if size is None or size < 0 else size)


# --------------------------------------------------------------------------------------------
# Where a CCOB v1 ends. v1 has no total size (LLVM 18 wrote it, formats.md 2.4): its end is where
# its compressed stream ends. LLVM finds the next bundle by searching for "CCOB" (OffloadBundle.cpp),
# which a payload may contain by chance; the stream's own structure says where it ends exactly.

MAX_ZSTD_BLOCKS = 1 << 22  # 512 GiB of 128 KiB blocks: far beyond any bundle


def zstd_frame_size(read_at: ReadAt, available: int) -> int:
    """Bytes of the one zstd frame at offset 0 of ``read_at`` (``available`` bytes at most), from
    its frame and block headers alone (RFC 8878 3.1.1): nothing is inflated, one 3-byte read per
    block. Raises FormatError."""
    head = read_at(0, 18)
    if len(head) < 6 or head[:4] != ZSTD_FRAME_MAGIC:
        raise FormatError("zstd", 0, "no zstd frame magic where the CCOB payload begins")
    descriptor = head[4]
    if descriptor & 0x08:
        raise FormatError("zstd", 4, "reserved bit set in the zstd frame header descriptor")
    single_segment = descriptor >> 5 & 1
    content_size_bytes = (single_segment, 2, 4, 8)[descriptor >> 6]
    position = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3] + content_size_bytes
    for _ in range(MAX_ZSTD_BLOCKS):
        block = read_at(position, 3)
        if len(block) < 3:
            raise FormatError("zstd", position, "the frame ends inside a block header")
        value = int.from_bytes(block, "little")
        last, kind, size = value & 1, value >> 1 & 3, value >> 3
        if kind == 3:
            raise FormatError("zstd", position, "reserved block type")
        position += 3 + (1 if kind == 1 else size)  # an RLE block stores its one byte
        if position > available:
            raise FormatError("zstd", position, "a block runs past the end of the section")
        if last:
            break
    else:
        raise FormatError("zstd", position, f"more than {MAX_ZSTD_BLOCKS} blocks")
    if descriptor & 0x04:
        position += 4  # Content_Checksum
    if position > available:
        raise FormatError("zstd", position, "the frame's checksum runs past the end of the section")
    return position


def zlib_stream_size(read_at: ReadAt, available: int, inflated_limit: int) -> int:
    """Bytes of the zlib stream at offset 0 (RFC 1950): it is inflated in bounded steps and the
    output dropped, since deflate blocks carry no compressed size. More than ``inflated_limit``
    bytes of output is an error (the CCOB declared less). Raises FormatError."""
    inflater = zlib.decompressobj()
    position = inflated = 0
    step = 1 << 20
    try:
        while not inflater.eof:
            chunk = read_at(position, min(step, available - position))
            if not chunk:
                raise FormatError("zlib", position, "the section ends before the zlib stream does")
            position += len(chunk)
            pending = chunk
            while pending and not inflater.eof:
                inflated += len(inflater.decompress(pending, step))
                pending = inflater.unconsumed_tail
                if inflated > inflated_limit:
                    raise FormatError("zlib", position, f"inflates past the declared {inflated_limit} bytes")
    except zlib.error as exc:
        raise FormatError("zlib", position, f"cannot inflate: {exc}") from None
    return position - len(inflater.unused_data)


def v1_total_size(header: CcobHeader, read_at: ReadAt, available: int) -> int:
    """A CCOB v1's whole size (header and compressed stream); ``read_at`` reads from the CCOB's
    first byte, ``available`` bytes of it at most. Raises FormatError."""

    def payload_at(offset: int, size: int) -> bytes:
        return read_at(header.header_size + offset, size)

    room = available - header.header_size
    if header.method == METHOD_ZSTD:
        return header.header_size + zstd_frame_size(payload_at, room)
    return header.header_size + zlib_stream_size(payload_at, room, header.uncompressed_size)
