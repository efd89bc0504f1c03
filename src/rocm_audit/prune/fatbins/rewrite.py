"""Build a slimmed offload bundle as a stream, and prove it selects what the original selected.

An uncompressed bundle (formats.md 2.2) keeps its kept entries in their order, compacted, each at
the alignment the original's entries had (HIP writes 4096); every record keeps its id bytes
exactly (NUL padding included), and a size-0 entry gets a non-zero offset (clang's reader stops
at an offset of 0). The whole table must lie in the first 4096 bytes (CLR hands comgr only those,
formats.md 8.1). A CCOB (2.4) is inflated, slimmed the same way and compressed again with its own
method and version; header fields are rewritten to match (v1 u32 sizes, v2 u32 total and
inflated sizes, v3 u64 both; the hash is MD5 of the inflated bundle, low 8 bytes).

Nothing holds a whole bundle in memory. A plain bundle is read as its entry table (the first 4096
bytes, more only when the table is longer) and the slimmed one is a list of pieces (the new table,
zero padding, ranges of the source file) copied 1 MiB at a time when written. A CCOB's table and
the entries that stay go into a spool (an unnamed temporary file) at their inflated offsets. A zstd
CCOB is read through the zstd frame index (formats/zstd_index.py) where it is built: the whole
frame is decoded down to its sequences (damage to its coding anywhere is found there, and it must
regenerate the declared size), then only the table and the kept entries are resolved, so no window
is held (clang's bundler compresses with one as large as the bundle: 108 MiB in jax's plugin). The
header's MD5 covers every inflated byte, so it is checked only where everything is read: bundles up
to 1 MiB through the index, and every bundle streamed (zlib ones, zstd ones the index refuses,
ROCM_AUDIT_NO_ZSTD_INDEX=1), where a streaming decompressor inflates all of it, hashed on a second
thread. What proves a slimmed bundle instead is the selection proof: each kept setting's code
object, read from the original (through the same index verify-arch reads it with, so the verdicts
rest on the same bytes) and from the new CCOB, inflated again whole and checked against its own new
header, must have the same sha256. The slimmed bundle is compressed by a streaming compressor into
a second spool, its MD5 and sizes counted as it goes, and the header is built last. zlib's output
is byte for byte the one-shot ``zlib.compress``'s; zstd's frame records its content size as the
one-shot's does, and equals it while the bundle fits one 128 KiB block (zstd 1.5.7 splits blocks by
content only when one call hands it several, which a stream never does).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO

from rocm_audit.errors import FormatError
from rocm_audit.formats import ccob, offload_bundle, zstd_index
from rocm_audit.hashing import ThreadedHash
from rocm_audit.prune.fatbins.select import entries_to_keep, selected
from rocm_audit.tree.targets import TargetId, agents_of

COMGR_WINDOW = 4096  # bytes of an uncompressed bundle CLR hands comgr for the lookup
MAX_ALIGN = 4096
# Levels chosen by measuring (docs/prune.md, "--fatbins"): zstd 9 is where the size stops falling
# much for the time it costs on jax-rocm7-plugin's CCOB v3 bundles; zlib 6 is LLVM's own default.
ZSTD_LEVEL = 9
ZLIB_LEVEL = 6
MAX_INFLATED = 4 << 30  # refuse a CCOB that declares more than this (it is spooled to disk)
CHUNK = 1 << 20  # bytes copied or compressed at a time
INFLATE_CHUNK = 256 << 10  # bytes inflated at a time (up to four more wait to be hashed)
# A zstd CCOB read through the index is read whole, for its MD5, up to this many inflated bytes
# (the bundles of small libraries, clang-built ones among them: cheap, and one check more).
INDEX_HASH_BYTES = 1 << 20
# Bytes read through the index at a time, and the largest gap read between two wanted ranges. A
# read resolves a match into its own earlier output by copying it; reading gfx942's and gfx950's
# entries of jax's plugin in one read instead of 1 MiB steps halves the time (16.8 s to 7.7 s).
INDEX_READ = 16 << 20
INDEX_GAP = 64 << 10

ReadAt = Callable[[int, int], bytes]  # (offset, size) -> exactly size bytes, or FormatError
# A piece of a slimmed bundle: literal bytes, or (fd, offset, size) of a file (fd -1: zeros).
Piece = bytes | tuple[int, int, int]


def _fd_reader(fd: int, base: int, extent: int) -> ReadAt:
    def read_at(offset: int, size: int) -> bytes:
        if offset < 0 or offset + size > extent:
            raise FormatError(offload_bundle.FMT, base + offset, f"{size} bytes at {offset:#x} leave the bundle")
        data = os.pread(fd, size, base + offset)
        if len(data) != size:
            raise FormatError(offload_bundle.FMT, base + offset, f"file ends before {size} bytes at {offset:#x}")
        return data

    return read_at


def _pieces_chunks(pieces: Sequence[Piece], start: int = 0, stop: int | None = None) -> Iterator[bytes]:
    """The bytes of ``pieces`` from ``start`` to ``stop``, at most CHUNK bytes at a time."""
    position = 0
    for piece in pieces:
        length = len(piece) if isinstance(piece, bytes) else piece[2]
        lo, hi = max(start, position), min(position + length, stop if stop is not None else position + length)
        position += length
        if lo >= hi:
            continue
        skip = lo - (position - length)
        if isinstance(piece, bytes):
            for at in range(skip, skip + hi - lo, CHUNK):
                yield piece[at : min(at + CHUNK, skip + hi - lo)]
            continue
        fd, offset, _size = piece
        done = 0
        while done < hi - lo:
            step = min(CHUNK, hi - lo - done)
            if fd < 0:
                yield bytes(step)
            else:
                data = os.pread(fd, step, offset + skip + done)
                if len(data) != step:
                    raise OSError(f"the source ended before {step} bytes at {offset + skip + done:#x}")
                yield data
            done += step


@dataclass(slots=True, eq=False)
class Slimmed:
    """A slimmed bundle, ``size`` bytes, not held in memory: ``write`` puts it into a file.
    Pieces may refer to the source file's descriptor (keep it open until written) and to spools
    this object owns (``close``, or use it as a context manager)."""

    size: int
    kept: tuple[str, ...]  # raw ids kept, in order
    removed: tuple[str, ...]  # raw ids removed
    compressed: str | None  # "zstd"/"zlib" for a CCOB
    pieces: list[Piece] = field(default_factory=list)
    # the original's uncompressed bundle (the source file, or the checked inflated spool)
    original: ReadAt | None = None
    original_extent: int = 0
    spools: list[IO[bytes]] = field(default_factory=list)
    spool_dir: str | None = None

    def chunks(self, start: int = 0, stop: int | None = None) -> Iterator[bytes]:
        return _pieces_chunks(self.pieces, start, self.size if stop is None else stop)

    def read_at(self, offset: int, size: int) -> bytes:
        if offset < 0 or offset + size > self.size:
            raise FormatError(offload_bundle.FMT, offset, f"{size} bytes at {offset:#x} leave the slimmed bundle")
        return b"".join(self.chunks(offset, offset + size))

    def write(self, out_fd: int, offset: int) -> None:
        """Write the slimmed bundle at ``offset`` of ``out_fd``."""
        position = offset
        for chunk in self.chunks():
            _pwrite_all(out_fd, chunk, position)
            position += len(chunk)

    def close(self) -> None:
        for spool in self.spools:
            spool.close()
        self.spools.clear()

    def __enter__(self) -> Slimmed:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _entries(bundle: offload_bundle.Bundle) -> list[tuple[str, int]]:
    return [(entry.entry_id.raw, entry.size) for entry in bundle.entries]


def _alignment(bundle: offload_bundle.Bundle) -> int:
    """The largest power of two (at most 4096) every non-empty entry's offset is a multiple of."""
    align = MAX_ALIGN
    for entry in bundle.entries:
        if entry.size:
            while align > 1 and entry.offset % align:
                align //= 2
    return align


def _round_up(value: int, align: int) -> int:
    return -(-value // align) * align


def read_table(read_at: ReadAt, extent: int) -> tuple[bytes, offload_bundle.Bundle]:
    """A plain bundle's table bytes (the first 4096, more only if the table is longer) and its
    parse. Raises FormatError."""
    table = read_at(0, min(extent, COMGR_WINDOW))
    try:
        return table, offload_bundle.parse_bundle(table, 0, extent)
    except offload_bundle.IncompleteTable:
        table = read_at(0, min(extent, offload_bundle.max_table_bytes()))
        return table, offload_bundle.parse_bundle(table, 0, extent)


def _slim_plain(read_at: ReadAt, extent: int, source: tuple[int, int], kept: Sequence[TargetId]) -> Slimmed:
    """The slimmed uncompressed bundle whose entries come from ``source`` (fd, offset of the
    bundle in it). Raises FormatError when it cannot be made valid."""
    table, bundle = read_table(read_at, extent)
    entries = _entries(bundle)
    keep = entries_to_keep(entries, kept)
    ids = offload_bundle.raw_ids(table, bundle)
    table_size = offload_bundle.table_size([ids[i] for i in keep])
    if table_size > COMGR_WINDOW:
        raise FormatError(offload_bundle.FMT, 0, f"the entry table would take {table_size} bytes, past the first 4096")
    align = _alignment(bundle)
    records: list[tuple[int, int, bytes]] = []
    body: list[Piece] = []
    end = table_size  # one past the last byte laid out so far
    fd, base = source
    for index in keep:
        entry = bundle.entries[index]
        position = _round_up(end, align)
        records.append((position, entry.size, ids[index]))
        if entry.size:
            if position > end:
                body.append((-1, 0, position - end))
            body.append((fd, base + entry.offset, entry.size))
            end = position + entry.size
    return Slimmed(
        size=end,
        kept=tuple(entries[i][0] for i in keep),
        removed=tuple(entries[i][0] for i in range(len(entries)) if i not in keep),
        compressed=None,
        pieces=[offload_bundle.pack_table(records), *body],
        original=read_at,
        original_extent=extent,
    )


def _spool(directory: str | None) -> IO[bytes]:
    """An unnamed temporary file (O_TMPFILE where the filesystem has it): nothing is left behind."""
    return tempfile.TemporaryFile(dir=directory)


# Given the first bytes of an inflated bundle and its size: the ranges worth keeping in the spool
# (start, stop), or None while the entry table runs past the bytes given.
Wanted = Callable[[bytes, int], list[tuple[int, int]] | None]


def _kept_ranges(kept: Sequence[TargetId]) -> Wanted:
    """The table and every entry slimming keeps or a kept target selects: nothing else of the
    inflated bundle is read again, so nothing else is written to the spool."""

    def wanted(head: bytes, size: int) -> list[tuple[int, int]] | None:
        try:
            bundle = offload_bundle.parse_bundle(head, 0, size)
        except offload_bundle.IncompleteTable:
            return None
        except FormatError:
            return [(0, size)]  # everything: the size and hash checks speak first, then the parse
        entries = _entries(bundle)
        keep = set(entries_to_keep(entries, kept))
        keep.update(i for k in kept for a in agents_of(k) if (i := selected(entries, a)) is not None)
        ranges = [(0, bundle.table_size)]
        ranges += [(e.offset, e.offset + e.size) for i, e in enumerate(bundle.entries) if i in keep and e.size]
        return sorted(ranges)

    return wanted


def _payload_size(header: ccob.CcobHeader, extent: int) -> int:
    """The compressed payload's size, after the checks both ways of inflating make first (the
    declared inflated size bounded, and in proportion to the payload). Raises FormatError."""
    end = header.total_size if header.total_size is not None else extent
    if header.uncompressed_size > MAX_INFLATED:
        raise FormatError(ccob.FMT, 0, f"declares {header.uncompressed_size} inflated bytes")
    compressed = end - header.header_size
    if not ccob.plausible_size(header, compressed):
        raise FormatError(ccob.FMT, 0, f"declares {header.uncompressed_size} inflated bytes from {compressed}")
    return compressed


def indexable(header: ccob.CcobHeader, extent: int) -> bool:
    """Whether a CCOB is read through a zstd frame index (the extension built, not turned off
    by ROCM_AUDIT_NO_ZSTD_INDEX, a zstd payload the index may take whole)."""
    end = header.total_size if header.total_size is not None else extent
    return (
        header.method == ccob.METHOD_ZSTD
        and end - header.header_size <= zstd_index.MAX_INPUT
        and zstd_index.available()
    )


def _coalesced(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` sorted, those at most INDEX_GAP apart joined: read as one, a kept entry's matches
    into the kept entry before it are copied from the read's own output, not followed back."""
    joined: list[tuple[int, int]] = []
    for start, stop in sorted(ranges):
        if joined and start - joined[-1][1] <= INDEX_GAP:
            joined[-1] = (joined[-1][0], max(joined[-1][1], stop))
        else:
            joined.append((start, stop))
    return joined


def index_to(
    header: ccob.CcobHeader, read_at: ReadAt, extent: int, spool: IO[bytes], wanted: Wanted | None = None
) -> int:
    """``inflate_to`` through a zstd frame index: the whole frame is decoded down to its
    sequences (damage to its coding is found, and it must regenerate the declared size), then the
    ranges ``wanted`` names are resolved and written to ``spool`` at their offsets. A bundle up
    to INDEX_HASH_BYTES is read whole and checked against the header's MD5 too; a larger one is
    not (its removed entries are never read; docs/prune.md). Returns the size. Raises FormatError;
    IndexTooLarge or FrameCorrupt when the frame is past the index (the caller streams it)."""
    compressed = _payload_size(header, extent)
    size = header.uncompressed_size
    # the compressed payload is passed, not kept: the index lets go of it once every block is decoded
    index = zstd_index.FrameIndex(read_at(header.header_size, compressed), header.header_size, ccob.FMT)
    index.decode_all()
    if index.size != size:
        raise FormatError(ccob.FMT, 0, f"inflates to {index.size} bytes, not the declared {size}")
    fd = spool.fileno()

    def copy(start: int, stop: int, md5: hashlib._Hash | None = None) -> None:
        for at in range(start, stop, INDEX_READ):
            chunk = index.read(at, min(INDEX_READ, stop - at))
            if len(chunk) != min(INDEX_READ, stop - at):
                raise FormatError(ccob.FMT, 0, f"the frame ends before inflated offset {stop:#x}")
            if md5 is not None:
                md5.update(chunk)
            _pwrite_all(fd, chunk, at)

    if size <= INDEX_HASH_BYTES or wanted is None:
        md5 = hashlib.md5(usedforsecurity=False)
        copy(0, size, md5)
        if md5.digest()[:8] != header.hash64:
            raise FormatError(ccob.FMT, 0, "the inflated bundle does not match the header's hash")
    else:
        ranges = wanted(index.read(0, min(size, COMGR_WINDOW)), size)
        if ranges is None:
            ranges = wanted(index.read(0, min(size, offload_bundle.max_table_bytes())), size)
        for start, stop in _coalesced(ranges if ranges is not None else [(0, size)]):
            copy(start, stop)
    os.ftruncate(fd, size)
    return size


def inflate_to(
    header: ccob.CcobHeader, read_at: ReadAt, extent: int, spool: IO[bytes], wanted: Wanted | None = None
) -> int:
    """Inflate the CCOB read by ``read_at`` (``extent`` bytes from its header) into ``spool`` at
    the same offsets, checking the declared inflated size and the header's MD5 on the way;
    returns the size. With ``wanted``, only the ranges it names are written (the rest of the
    spool is a hole). Raises FormatError."""
    compressed = _payload_size(header, extent)
    wide = _wide_window(header, read_at(header.header_size, min(compressed, _FRAME_HEADER_MAX)))
    with _WIDE_WINDOW_LOCK if wide else contextlib.nullcontext():
        return _inflate_to(header, read_at, compressed, spool, wanted)


# A zstd frame's header is at most 18 bytes (RFC 8878 3.1.1.1).
_FRAME_HEADER_MAX = 18
# Streams whose window is larger than this inflate one at a time in a process: clang's bundler
# writes windows as large as the bundle (108 MiB in jax's plugin), and the bundles slimmed at
# once on several threads (library.py) must not hold one each. Ours (level 9) are 4 MiB.
WIDE_WINDOW = 16 << 20
_WIDE_WINDOW_LOCK = threading.Lock()


def _wide_window(header: ccob.CcobHeader, frame_head: bytes) -> bool:
    """Whether the payload is a zstd frame with a window past WIDE_WINDOW (or an unreadable
    frame header: the stream reports it, one at a time)."""
    if header.method != ccob.METHOD_ZSTD:
        return False  # zlib's window is 32 KiB
    import zstandard  # noqa: PLC0415 - heavy module, loaded on first use (style.md 3)

    try:
        return bool(zstandard.get_frame_parameters(frame_head).window_size > WIDE_WINDOW)
    except zstandard.ZstdError:
        return True


def _inflate_to(
    header: ccob.CcobHeader, read_at: ReadAt, compressed: int, spool: IO[bytes], wanted: Wanted | None
) -> int:
    stream = ccob.PayloadStream(
        header,
        lambda offset, size: read_at(header.header_size + offset, size),
        compressed,
        header.header_size,
        header.uncompressed_size + 1,  # one byte more: a longer stream is caught
        hashed=False,
    )
    # Hashing is the slowest step of inflating: it runs beside the decompressor, not after it.
    md5 = ThreadedHash(hashlib.md5(usedforsecurity=False), backlog=4, name="ccob-md5")
    fd = spool.fileno()
    ranges: list[tuple[int, int]] | None = None
    head = b""
    try:
        while chunk := stream.read(INFLATE_CHUNK):
            md5.update(chunk)
            position = stream.position - len(chunk)
            if wanted is not None and ranges is None and len(head) < offload_bundle.max_table_bytes():
                head += chunk
                ranges = wanted(head, header.uncompressed_size)
            if ranges is None:
                _pwrite_all(fd, chunk, position)
                continue
            for start, stop in ranges:
                lo, hi = max(start, position), min(stop, position + len(chunk))
                if lo < hi:
                    _pwrite_all(fd, chunk[lo - position : hi - position], lo)
        if stream.position != header.uncompressed_size:
            raise FormatError(
                ccob.FMT,
                0,
                f"inflates to {stream.position} bytes or more, not the declared {header.uncompressed_size}",
            )
        if md5.digest()[:8] != header.hash64:
            raise FormatError(ccob.FMT, 0, "the inflated bundle does not match the header's hash")
    finally:
        md5.close()
        stream.close()
        # Free the decompressor's window (as large as the frame's, 108 MiB in jax's plugin) before
        # the compressor's tables (28 MiB at level 9) are allocated: the peak is one, not both.
        ccob.release_shared_decompressor()
    os.ftruncate(fd, header.uncompressed_size)
    return header.uncompressed_size


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        offset += written
        view = view[written:]


def compress_to(method: int, chunks: Iterator[bytes], size: int, out: IO[bytes], level: int | None = None) -> bytes:
    """Compress ``size`` bytes from ``chunks`` into ``out`` as one zstd frame that records its
    content size, or one zlib stream; returns the low 8 bytes of their MD5."""
    md5 = hashlib.md5(usedforsecurity=False)
    if method == ccob.METHOD_ZSTD:
        import zstandard  # noqa: PLC0415 - heavy module, loaded on first use (style.md 3)

        compressor = zstandard.ZstdCompressor(level=level or ZSTD_LEVEL, write_content_size=True)
        with compressor.stream_writer(out, size=size, closefd=False) as writer:
            for chunk in chunks:
                md5.update(chunk)
                writer.write(chunk)
    else:
        deflate = zlib.compressobj(level or ZLIB_LEVEL)
        for chunk in chunks:
            md5.update(chunk)
            out.write(deflate.compress(chunk))
        out.write(deflate.flush())
    out.flush()
    return md5.digest()[:8]


def _slim_ccob(
    read_at: ReadAt,
    extent: int,
    source: tuple[int, int],
    kept: Sequence[TargetId],
    level: int | None,
    spool_dir: str | None,
) -> Slimmed:
    header = ccob.parse_header(read_at(0, min(extent, ccob.MAX_HEADER_SIZE)), 0, extent)
    inflated = _spool(spool_dir)
    out = None
    try:
        size = None
        if indexable(header, extent):
            try:
                size = index_to(header, read_at, extent, inflated, _kept_ranges(kept))
            except (zstd_index.IndexTooLarge, zstd_index.FrameCorrupt):
                # streamed instead: a frame past the index's limits, or one the stream judges
                # (and names the damage of) as it always has
                os.ftruncate(inflated.fileno(), 0)
        if size is None:
            size = inflate_to(header, read_at, extent, inflated, _kept_ranges(kept))
        inner = _slim_plain(_fd_reader(inflated.fileno(), 0, size), size, (inflated.fileno(), 0), kept)
        if not inner.removed:
            inflated.close()  # nothing to remove: the original itself, not compressed again
            return Slimmed(extent, inner.kept, (), header.method_name, pieces=[(*source, extent)])
        out = _spool(spool_dir)
        digest = compress_to(header.method, inner.chunks(), inner.size, out, level)
        compressed = out.tell()
        head = ccob.pack_header(header.version, header.method, inner.size, compressed, digest)
        return Slimmed(
            size=len(head) + compressed,
            kept=inner.kept,
            removed=inner.removed,
            compressed=header.method_name,
            pieces=[head, (out.fileno(), 0, compressed)],
            original=inner.original,
            original_extent=size,
            spools=[inflated, out],
            spool_dir=spool_dir,
        )
    except BaseException:
        inflated.close()
        if out is not None:
            out.close()
        raise


def slim(
    fd: int, offset: int, extent: int, kept: Sequence[TargetId], level: int | None = None, spool_dir: str | None = None
) -> Slimmed:
    """Slim the bundle (plain or CCOB, sniffed) of ``extent`` bytes at ``offset`` of ``fd``.
    Spools go to ``spool_dir`` (default: the temporary directory). Raises FormatError."""
    read_at = _fd_reader(fd, offset, extent)
    if read_at(0, min(extent, 4)) == ccob.CCOB_MAGIC:
        return _slim_ccob(read_at, extent, (fd, offset), kept, level, spool_dir)
    slimmed = _slim_plain(read_at, extent, (fd, offset), kept)
    if not slimmed.removed:
        return Slimmed(extent, slimmed.kept, (), None, pieces=[(fd, offset, extent)])
    return slimmed


def _digest(read_at: ReadAt, offset: int, size: int) -> str:
    sha = hashlib.sha256()
    for at in range(offset, offset + size, CHUNK):
        sha.update(read_at(at, min(CHUNK, offset + size - at)))
    return sha.hexdigest()


def plain_selections(read_at: ReadAt, extent: int, kept: Sequence[TargetId]) -> dict[str, str | None]:
    """For every device setting of every kept target: the sha256 of the code object the runtime
    selects from this uncompressed bundle, or None. Raises FormatError."""
    _table, bundle = read_table(read_at, extent)
    entries = _entries(bundle)
    digests: dict[int, str] = {}
    chosen: dict[str, str | None] = {}
    for agent in (a for k in kept for a in agents_of(k)):
        index = selected(entries, agent)
        if index is None:
            chosen[str(agent)] = None
            continue
        if index not in digests:
            entry = bundle.entries[index]
            digests[index] = _digest(read_at, entry.offset, entry.size)
        chosen[str(agent)] = digests[index]
    return chosen


def _selections_of(
    read_at: ReadAt, extent: int, kept: Sequence[TargetId], spool_dir: str | None
) -> dict[str, str | None]:
    """``plain_selections`` of a bundle, plain or CCOB (inflated into a spool and checked)."""
    if read_at(0, min(extent, 4)) != ccob.CCOB_MAGIC:
        return plain_selections(read_at, extent, kept)
    header = ccob.parse_header(read_at(0, min(extent, ccob.MAX_HEADER_SIZE)), 0, extent)
    with _spool(spool_dir) as spool:
        size = inflate_to(header, read_at, extent, spool)
        return plain_selections(_fd_reader(spool.fileno(), 0, size), size, kept)


def selections(data: bytes, kept: Sequence[TargetId]) -> dict[str, str | None]:
    """``plain_selections`` of a bundle's bytes, plain or CCOB (for tests and small bundles)."""

    def read_at(offset: int, size: int) -> bytes:
        if offset < 0 or offset + size > len(data):
            raise FormatError(offload_bundle.FMT, offset, f"{size} bytes at {offset:#x} leave the bundle")
        return data[offset : offset + size]

    return _selections_of(read_at, len(data), kept, None)


def _selected_entries(
    read_at: ReadAt, extent: int, kept: Sequence[TargetId]
) -> tuple[offload_bundle.Bundle, dict[str, int | None]]:
    """The uncompressed bundle, and for every device setting of every kept target the index of
    the entry the runtime selects from it, or None. Raises FormatError."""
    _table, bundle = read_table(read_at, extent)
    entries = _entries(bundle)
    return bundle, {str(agent): selected(entries, agent) for k in kept for agent in agents_of(k)}


def _same_bytes(old: ReadAt, old_at: int, new: ReadAt, new_at: int, size: int) -> bool:
    done = 0
    while done < size:
        step = min(CHUNK, size - done)
        if old(old_at + done, step) != new(new_at + done, step):
            return False
        done += step
    return True


def prove_same_selection(slimmed: Slimmed, kept: Sequence[TargetId]) -> str | None:
    """None when ``slimmed`` selects byte-identical code objects for every setting of every kept
    target as its original, else what differs. The slimmed bundle is parsed again from its bytes
    (a CCOB inflated again and checked against its header); the original from its file, or from
    its inflated spool, checked against its header when it was written. The two code objects are
    compared byte for byte, once per pair of entries (the settings of a target mostly share one)."""
    if slimmed.original is None:
        return None  # nothing removed: the original itself
    original = slimmed.original
    try:
        old_bundle, old = _selected_entries(original, slimmed.original_extent, kept)
    except FormatError as exc:
        return f"the original bundle does not parse: {exc}"
    with contextlib.ExitStack() as stack:
        try:
            read_new, extent = _opened(slimmed.read_at, slimmed.size, slimmed.spool_dir, stack)
            new_bundle, new = _selected_entries(read_new, extent, kept)
        except FormatError as exc:
            return f"the slimmed bundle does not parse: {exc}"
        compared: dict[tuple[int, int], bool] = {}
        for agent, index in old.items():
            there = new.get(agent)
            if index is None or there is None:
                if index != there:
                    return f"for {agent} the slimmed bundle selects other code"
                continue
            if (index, there) not in compared:
                a, b = old_bundle.entries[index], new_bundle.entries[there]
                try:
                    compared[index, there] = a.size == b.size and _same_bytes(
                        original, a.offset, read_new, b.offset, a.size
                    )
                except FormatError as exc:
                    return f"the slimmed bundle does not parse: {exc}"
            if not compared[index, there]:
                return f"for {agent} the slimmed bundle selects other code"
    return None


def _opened(read_at: ReadAt, extent: int, spool_dir: str | None, stack: contextlib.ExitStack) -> tuple[ReadAt, int]:
    """A reader of the bundle's uncompressed bytes and their size: the bundle itself, or a CCOB
    inflated into a spool (closed with ``stack``) and checked against its header."""
    if read_at(0, min(extent, 4)) != ccob.CCOB_MAGIC:
        return read_at, extent
    header = ccob.parse_header(read_at(0, min(extent, ccob.MAX_HEADER_SIZE)), 0, extent)
    spool = stack.enter_context(_spool(spool_dir))
    size = inflate_to(header, read_at, extent, spool)
    return _fd_reader(spool.fileno(), 0, size), size
