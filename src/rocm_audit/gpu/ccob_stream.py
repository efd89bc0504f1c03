"""Compressed offload bundles (CCOB v1/v2/v3, formats.md 2.2-2.5), read as a bounded stream.

A CCOB's payload is a plain bundle, zlib- or zstd-compressed. Only its entry table and the heads
of the entries a judgement needs are inflated: through a zstd frame index where the extension is
built (random access, no window), else as a forward stream closed after the last wanted head.
"""

from __future__ import annotations

from typing import Protocol

from rocm_audit.elf.codeobject import FileWindow, ReadAt, buffer_reader, inspect_code_object
from rocm_audit.errors import FormatError
from rocm_audit.formats import ccob, offload_bundle, zstd_index
from rocm_audit.gpu.bundles import is_amdgcn, next_magic, wanted_entries
from rocm_audit.gpu.records import (
    BUNDLE_WINDOW,
    CO_HEAD_BYTES,
    FileCodeObjects,
    consistency_findings,
    device_record,
    malformed,
)
from rocm_audit.tree.targets import TargetSelection

CCOB_HASH_CHECK_BYTES = 1 << 20  # payloads up to this size are inflated to the end for their MD5
MAX_CCOB_STREAM = 4 << 30  # hard cap on inflated bytes walked per CCOB, whatever it declares


def ccob_objects(
    result: FileCodeObjects,
    fh: FileWindow,
    start: int,
    available: int,
    tu: int | None,
    place: str,
    selection: TargetSelection | None,
) -> int:
    """List a CCOB at file offset ``start``; returns its size in bytes (v1: up to the next CCOB).

    A zstd payload is indexed (``zstd_index``) where the extension is built: the entry table and
    the chosen entries' heads are then read at random, without the frame's window. Otherwise, and
    for a frame past the index's limits, the payload is streamed: with a selection, only up to the
    chosen entries' heads, the stream closed after the last of them; without one, once to the last
    entry head."""
    header, total = ccob_extent(fh, start, available)
    result.add_container(f"ccob-v{header.version}-{header.method_name}")
    if not fh.inflates:
        return total  # a reading that needs only where each container lies (image/trim.py)
    compressed = total - header.header_size
    payload_start = start + header.header_size
    if not ccob.plausible_size(header, compressed):
        raise FormatError(
            ccob.FMT,
            start + 8,
            f"declares {header.uncompressed_size} uncompressed bytes from "
            f"{compressed} compressed: not a plausible bundle",
        )
    limit = min(header.uncompressed_size, MAX_CCOB_STREAM)
    # MD5 covers every byte of the payload: checked only where the whole payload is inflated
    # anyway and small (the HIP runtime never checks it; LLVM's bundler only with -verbose).
    check_hash = selection is None and header.uncompressed_size <= CCOB_HASH_CHECK_BYTES
    if indexable(header, compressed):
        # Listed apart and merged only when whole. A frame past the index's limits is streamed, and
        # so is one that does not decode: the stream lists what precedes the damage and says where
        # it is, as it always has, so a broken CCOB reads the same with or without the index.
        listed = FileCodeObjects(result.path, result.sdk_tree, result.file_kind)
        try:
            payload: _Payload = _IndexedPayload(fh.read(payload_start, compressed), payload_start, limit)
            _ccob_entries(listed, payload, header, start, tu, place, selection)
        except (zstd_index.IndexTooLarge, zstd_index.FrameCorrupt):
            pass
        else:
            result.code_objects.extend(listed.code_objects)
            result.findings.extend(listed.findings)
            return total
    stream = ccob.PayloadStream(
        header,
        fh.reader(payload_start, compressed),
        compressed,
        payload_start,
        limit=limit,
        hashed=check_hash,
    )
    try:
        _ccob_entries(result, _StreamedPayload(stream), header, start, tu, place, selection)
        if check_hash:
            stream.skip(header.uncompressed_size - stream.position)
            if stream.hash_matches(header) is False:
                malformed(
                    result,
                    FormatError(ccob.FMT, start + header.header_size - 8, "payload MD5 does not match"),
                    place,
                )
        return total
    finally:
        stream.close()  # frees zstd's window now, not when the garbage collector gets to it


def indexable(header: ccob.CcobHeader, compressed: int) -> bool:
    """Whether a CCOB is read through a zstd index. Payloads up to CCOB_HASH_CHECK_BYTES are
    streamed whatever the selection (their window is small, and a full scan checks their MD5), so
    one CCOB is read one way by every command."""
    return (
        header.method == ccob.METHOD_ZSTD
        and header.uncompressed_size > CCOB_HASH_CHECK_BYTES
        and compressed <= zstd_index.MAX_INPUT
        and zstd_index.available()
    )


class _Payload(Protocol):
    """A CCOB's inflated payload as ``_ccob_entries`` reads it: its first bytes, then entry heads."""

    table_window: int  # bytes read first for the entry table

    def first(self, length: int) -> bytes:
        """The payload's first ``length`` bytes (fewer at its end)."""
        ...

    def head(self, offset: int, length: int) -> ReadAt | None:
        """A reader of [offset, offset+length); None when the payload ends before that."""
        ...


class _StreamedPayload:
    """Forward only: the first bytes are kept, entry heads are read in offset order (64 KiB each)."""

    table_window = BUNDLE_WINDOW

    def __init__(self, stream: ccob.PayloadStream) -> None:
        self._stream = stream
        self._prefix = b""

    def first(self, length: int) -> bytes:
        if length > len(self._prefix) and self._stream.position == len(self._prefix):
            self._prefix += self._stream.read(length - len(self._prefix))
        return self._prefix[:length]

    def head(self, offset: int, length: int) -> ReadAt | None:
        data = _stream_slice(self._stream, self._prefix, offset, length)
        return buffer_reader(data) if len(data) == length else None


class _IndexedPayload:
    """Random access through a zstd frame index; reads are resolved where they are asked for."""

    table_window = 4 << 10  # an entry table of 28 entries takes about 2 KiB

    def __init__(self, compressed: bytes, base: int, limit: int) -> None:
        self._index = zstd_index.FrameIndex(compressed, base, ccob.FMT)
        self._size = min(self._index.size, limit)  # never past what the header declares

    def _read(self, offset: int, length: int) -> bytes:
        if offset >= self._size or length <= 0:
            return b""
        return self._index.read(offset, min(length, self._size - offset))

    def first(self, length: int) -> bytes:
        return self._read(0, length)

    def head(self, offset: int, length: int) -> ReadAt | None:
        if offset + length > self._size:
            return None

        def read_at(at: int, size: int) -> bytes:
            return self._read(offset + at, min(size, length - at)) if at < length else b""

        return read_at


def _inflated_table(payload: _Payload, start: int, declared: int) -> offload_bundle.Bundle:
    """The bundle entry table at the start of a CCOB's payload. Raises FormatError."""
    prefix = payload.first(min(payload.table_window, declared))
    while True:
        try:
            return offload_bundle.parse_bundle(prefix, 0, declared)
        except offload_bundle.IncompleteTable as more:
            limit = min(declared, offload_bundle.max_table_bytes())
            if len(prefix) >= limit:
                raise FormatError(ccob.FMT, start, "inflated entry table is larger than any valid one") from None
            longer = payload.first(min(limit, max(len(prefix) * 2, more.needed)))
            if len(longer) <= len(prefix):
                raise FormatError(ccob.FMT, start, "stream ends inside the bundle entry table") from None
            prefix = longer
        except FormatError as exc:
            raise FormatError(
                ccob.FMT,
                start,
                f"inflated bundle: {exc.reason} (at inflated offset {exc.offset:#x})",
            ) from None


def _ccob_entries(
    result: FileCodeObjects,
    payload: _Payload,
    header: ccob.CcobHeader,
    start: int,
    tu: int | None,
    place: str,
    selection: TargetSelection | None,
) -> None:
    """List a CCOB's entries, reading the heads of those the selection wants (all without one)."""
    bundle = _inflated_table(payload, start, header.uncompressed_size)
    wanted = wanted_entries(bundle, selection)
    for number, entry in sorted(enumerate(bundle.entries), key=lambda item: item[1].offset):
        location = f"{place} entry {number}"
        facts = None
        if (wanted is None or number in wanted) and is_amdgcn(entry.entry_id) and entry.size:
            want = min(entry.size, CO_HEAD_BYTES)
            head = payload.head(entry.offset, want)
            if head is None:
                malformed(
                    result,
                    FormatError(
                        ccob.FMT,
                        start,
                        f"stream ends before entry {number} ({entry.size} bytes at inflated {entry.offset:#x})",
                    ),
                    location,
                )
            else:
                try:
                    facts = inspect_code_object(head, entry.size, start, kept=want)
                except FormatError as exc:
                    malformed(result, exc, location + " (inflated)")
        obj = device_record(
            container="ccob",
            location=location,
            file_offset=None,
            size=entry.size,
            tu=tu,
            entry_id=entry.entry_id.raw,
            kind=entry.entry_id.kind,
            bundle_target=entry.entry_id.target,
            facts=facts,
            listed_source="bundle-id",
        )
        result.code_objects.append(obj)
        result.findings.extend(consistency_findings(result.path, obj, facts, start))


def ccob_extent(fh: FileWindow, start: int, available: int) -> tuple[ccob.CcobHeader, int]:
    """A CCOB's header and its size in the file (v1: up to the next CCOB magic). Raises FormatError."""
    header = ccob.parse_header(fh.read(start, ccob.MAX_HEADER_SIZE), start, available)
    if header.total_size is not None:
        return header, header.total_size
    return header, next_ccob(fh, start + 4, start + available) - start


def next_ccob(fh: FileWindow, start: int, end: int) -> int:
    """File offset of the next CCOB in [start, end), else ``end``: a v1 header has no size, so a
    bundle runs to the next magic (LLVM's rule). Its compressed stream is random-looking bytes that
    hold ``CCOB`` about once in 4 GiB; a hit counts only when a known version and method follow
    (as the header reader checks them), so such bytes no longer cut a bundle short."""
    pos = start
    while pos < end:
        hit = next_magic(fh, pos, end, ccob.CCOB_MAGIC)
        if hit >= end:
            return end
        fields = fh.read(hit + 4, 4)
        version, method = int.from_bytes(fields[:2], "little"), int.from_bytes(fields[2:4], "little")
        if version in ccob.HEADER_SIZES and method in (ccob.METHOD_ZLIB, ccob.METHOD_ZSTD):
            return hit
        pos = hit + 1
    return end


def _stream_slice(stream: ccob.PayloadStream, buffered: bytes, offset: int, length: int) -> bytes:
    """Bytes [offset, offset+length) of the inflated payload; ``buffered`` holds its first bytes.

    The stream only moves forward, so an entry that starts before the stream position and is not
    wholly inside ``buffered`` (overlapping entries) cannot be read and gives b"".
    """
    if offset + length <= len(buffered):
        return buffered[offset : offset + length]
    if offset < len(buffered) and stream.position == len(buffered):
        return buffered[offset:] + stream.read(offset + length - len(buffered))
    if stream.position < offset:
        stream.skip(offset - stream.position)
    if stream.position != offset:
        return b""
    return stream.read(length)
