"""A streaming tar reader for untrusted layer archives: bytes in, entries out, no extraction.

Python's ``tarfile`` reads a pax or GNU long-name header with one ``read(size)`` of the size the
header declares, so a hostile archive chooses the allocation. This reader checks every declared
size against a fixed cap before reading, reads member data in bounded chunks, and raises
``FormatError("tar", offset, reason)`` with the byte offset (in the uncompressed stream) of the
header at fault. Formats: ustar / POSIX.1-2001 pax (``x`` and ``g`` headers: path, linkpath, size)
and GNU (``L``/``K`` long names, base-256 numbers); GNU sparse members are reported, not expanded.
"""

from __future__ import annotations

import functools
import os
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any, Protocol, cast

import zstandard

from rocm_audit.errors import FormatError

BLOCK = 512
CHUNK = 1 << 20
MAX_META_BYTES = 1 << 20  # a pax header or GNU long name larger than this is refused, not read
MAX_NAME_BYTES = 4096

REGULAR, HARDLINK, SYMLINK, CHARDEV, BLOCKDEV, DIRECTORY, FIFO = "0", "1", "2", "3", "4", "5", "6"
CONTIGUOUS, GNU_SPARSE = "7", "S"
PAX_LOCAL, PAX_GLOBAL, GNU_LONGNAME, GNU_LONGLINK = "x", "g", "L", "K"

_NO_DATA = frozenset((HARDLINK, SYMLINK, CHARDEV, BLOCKDEV, DIRECTORY, FIFO))

GZIP_MAGIC = b"\x1f\x8b"
# gzip inflaters with zlib's decompressobj interface, fastest first (bench/image_layers.py,
# docs/benchmarks.md): python-isal's igzip, zlib-ng, then the standard zlib. The first two come
# with the ``fast`` extra; $ROCM_AUDIT_GZIP (isal, zlib-ng, zlib) picks one, for comparisons.
GZIP_BACKENDS = ("isal", "zlib-ng", "zlib")
GZIP_ENV = "ROCM_AUDIT_GZIP"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


@dataclass(frozen=True, slots=True)
class TarEntry:
    """One member: ``name`` and ``linkname`` exactly as stored (decoded as UTF-8 with escapes)."""

    name: str
    linkname: str
    kind: str  # typeflag, "0" for regular files (and the old "\0" / "7")
    mode: int
    size: int
    offset: int  # of the member's first header block in the uncompressed stream
    data_offset: int  # of its first data byte


class _Counted:
    """Reads exactly what is asked from a raw stream and counts the bytes consumed."""

    def __init__(self, raw: Readable) -> None:
        self.raw = raw
        self.position = 0

    def skip(self, size: int, offset_for_error: int) -> None:
        """Skip data: a seek on a seekable file (checked against its end), else bounded reads."""
        seek = getattr(self.raw, "seek", None)
        if seek is not None and getattr(self.raw, "seekable", lambda: False)():
            here = self.raw.tell()  # type: ignore[attr-defined]
            end = seek(0, 2)
            if here + size > end:
                raise FormatError("tar", offset_for_error, "archive ends inside member data")
            seek(here + size)
            self.position += size
            return
        while size:
            step = min(size, CHUNK)
            self.read_exact(step, offset_for_error, "member data")
            size -= step

    def read_exact(self, size: int, offset_for_error: int, what: str) -> bytes:
        pieces: list[bytes] = []
        wanted = size
        while wanted:
            piece = self.raw.read(min(wanted, CHUNK))
            if not piece:
                raise FormatError("tar", offset_for_error, f"archive ends inside {what}")
            pieces.append(piece)
            wanted -= len(piece)
        self.position += size
        return b"".join(pieces)


def _number(field: bytes, offset: int, what: str) -> int:
    """Octal with NUL/space padding, or GNU base-256 (high bit of the first byte set)."""
    if field and field[0] & 0x80:
        if field[0] == 0xFF:
            raise FormatError("tar", offset, f"negative base-256 {what}")
        value = field[0] & 0x7F
        for byte in field[1:]:
            value = (value << 8) | byte
        return value
    text = field.replace(b"\0", b" ").strip()
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        raise FormatError("tar", offset, f"{what} is not an octal number: {text[:16]!r}") from None


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _cstring(field: bytes) -> bytes:
    end = field.find(b"\0")
    return field if end < 0 else field[:end]


def _parse_pax(raw: bytes, offset: int) -> dict[str, str]:
    """``"<len> <key>=<value>\\n"`` records (POSIX.1-2001 pax); every length is bounds-checked."""
    records: dict[str, str] = {}
    position = 0
    while position < len(raw):
        if raw[position] == 0:  # padding some writers leave at the end
            break
        space = raw.find(b" ", position, position + 20)
        if space < 0:
            raise FormatError("tar", offset, "pax record without a length")
        try:
            length = int(raw[position:space])
        except ValueError:
            raise FormatError("tar", offset, "pax record length is not a number") from None
        end = position + length
        if length <= space - position + 1 or end > len(raw) or raw[end - 1 : end] != b"\n":
            raise FormatError("tar", offset, "pax record length points past its header")
        key, sep, value = raw[space + 1 : end - 1].partition(b"=")
        if not sep:
            raise FormatError("tar", offset, "pax record without '='")
        records[_text(key)] = _text(value)
        position = end
    return records


def iter_entries(raw: Readable) -> Iterator[tuple[TarEntry, Iterable[bytes]]]:
    """Yield each member with an iterator over its data chunks; unread data is skipped for you.

    Raises FormatError with the offset of the faulty header. Stops at the end-of-archive blocks.
    """
    stream = _Counted(raw)
    global_pax: dict[str, str] = {}
    pending: dict[str, str] = {}
    while True:
        offset = stream.position
        header = stream.raw.read(BLOCK)
        if not header:
            return  # some writers omit the two zero blocks
        stream.position += len(header)
        if len(header) < BLOCK:
            header += stream.read_exact(BLOCK - len(header), offset, "a header block")
        if len(header) != BLOCK:
            raise FormatError("tar", offset, "short header block")
        if header == bytes(BLOCK):
            return
        stored = _number(header[148:156], offset, "checksum")
        unsigned = sum(header[:148]) + 8 * 32 + sum(header[156:])
        # Old writers summed signed chars: each byte above 127 counts 256 less.
        if stored != unsigned and stored != unsigned - 256 * _high_bytes(header[:148] + header[156:]):
            raise FormatError("tar", offset, "header checksum mismatch (not a tar archive, or corrupt)")
        kind = chr(header[156]) if header[156] else REGULAR
        size = _number(header[124:136], offset, "size")
        if kind in (PAX_LOCAL, PAX_GLOBAL, GNU_LONGNAME, GNU_LONGLINK):
            if size > MAX_META_BYTES:
                raise FormatError(
                    "tar",
                    offset,
                    f"{kind!r} header of {size} bytes is larger than the {MAX_META_BYTES} allowed",
                )
            body = stream.read_exact(size, offset, "an extended header")
            stream.read_exact(-size % BLOCK, offset, "extended header padding")
            if kind == PAX_LOCAL:
                pending.update(_parse_pax(body, offset))
            elif kind == PAX_GLOBAL:
                global_pax.update(_parse_pax(body, offset))
            else:
                pending["path" if kind == GNU_LONGNAME else "linkpath"] = _text(_cstring(body))
            continue
        records = {**global_pax, **pending}
        pending = {}
        name_raw = _cstring(header[0:100])
        magic = header[257:263]
        if magic in (b"ustar\x00", b"ustar "):
            prefix = _cstring(header[345:500])
            if prefix and magic == b"ustar\x00":
                name_raw = prefix + b"/" + name_raw
        name = records.get("path", _text(name_raw))
        linkname = records.get("linkpath", _text(_cstring(header[157:257])))
        if "size" in records:
            try:
                size = int(records["size"])
            except ValueError:
                raise FormatError("tar", offset, "pax size is not a number") from None
        if size < 0:
            raise FormatError("tar", offset, "negative member size")
        if kind == CONTIGUOUS:
            kind = REGULAR
        # As tarfile does: only regular files (and unknown types) are followed by data.
        if kind in _NO_DATA:
            size = 0
        if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
            raise FormatError("tar", offset, f"member name longer than {MAX_NAME_BYTES} bytes")
        mode = _number(header[100:108], offset, "mode") & 0o7777
        entry = TarEntry(
            name=name,
            linkname=linkname,
            kind=kind,
            mode=mode,
            size=size,
            offset=offset,
            data_offset=stream.position,
        )
        data = _Data(stream, size, offset)
        yield entry, data
        stream.skip(data.remaining + (-size % BLOCK), offset)  # whatever the consumer left unread


_HIGH_BYTES = bytes(range(128, 256))


def _high_bytes(data: bytes) -> int:
    """How many bytes of ``data`` are above 127 (counted in C: this runs for every header)."""
    return len(data) - len(data.translate(None, _HIGH_BYTES))


class _Data:
    """The data chunks of the current member (at most CHUNK bytes each)."""

    def __init__(self, stream: _Counted, size: int, offset: int) -> None:
        self.stream = stream
        self.remaining = size
        self.offset = offset

    def __iter__(self) -> Iterator[bytes]:
        # Whatever one read gives (up to CHUNK): pieces are not joined to a fixed size.
        while self.remaining:
            piece = self.stream.raw.read(min(self.remaining, CHUNK))
            if not piece:
                raise FormatError("tar", self.offset, "archive ends inside member data")
            self.stream.position += len(piece)
            self.remaining -= len(piece)
            yield piece


def _load_gzip_backend(name: str) -> Any:
    if name == "isal":
        from isal import isal_zlib  # noqa: PLC0415 - optional (the ``fast`` extra)

        return isal_zlib
    if name == "zlib-ng":
        from zlib_ng import zlib_ng  # noqa: PLC0415 - optional (the ``fast`` extra)

        return zlib_ng
    return zlib


@functools.cache
def gzip_backend() -> tuple[str, Any]:
    """The gzip inflater in use: ``(name, module)``; the first of GZIP_BACKENDS that imports, or
    the one $ROCM_AUDIT_GZIP names (the standard zlib when that one is not installed)."""
    chosen = os.environ.get(GZIP_ENV, "")
    for name in (chosen,) if chosen in GZIP_BACKENDS else GZIP_BACKENDS:
        try:
            return name, _load_gzip_backend(name)
        except ImportError:
            continue
    return "zlib", zlib


class _GzipReader:
    """Streaming gzip (concatenated members allowed) with a bounded output per read."""

    def __init__(self, raw: Readable) -> None:
        self.raw = raw
        self.backend = gzip_backend()[1]
        self.inflater = self.backend.decompressobj(16 + zlib.MAX_WBITS)
        self.pending = b""
        self.start = 0  # of the unread part of ``pending`` (read(512) must not copy the rest)
        self.done = False
        self.consumed = 0  # compressed bytes read, for error offsets

    def _raw_read(self) -> bytes:
        piece = self.raw.read(CHUNK)
        self.consumed += len(piece)
        return piece

    def read(self, size: int = -1) -> bytes:
        size = CHUNK if size < 0 else size
        if self.start >= len(self.pending):
            self.pending, self.start = b"", 0
        while not self.pending and not self.done:
            if self.inflater.eof:
                rest = self.inflater.unused_data
                if len(rest) < 2:
                    rest += self._raw_read()
                if not rest.startswith(GZIP_MAGIC):
                    self.done = True  # trailing zeros or garbage: gzip(1) ignores them too
                    break
                self.inflater = self.backend.decompressobj(16 + zlib.MAX_WBITS)
                source = rest
            else:
                source = self.inflater.unconsumed_tail or self._raw_read()
                if not source:
                    raise FormatError("gzip", self.consumed, "compressed stream ends early")
            try:
                self.pending = self.inflater.decompress(source, CHUNK)
            except self.backend.error as exc:
                raise FormatError("gzip", self.consumed, f"corrupt compressed data: {exc}") from None
        if self.start == 0 and size >= len(self.pending):
            piece, self.pending = self.pending, b""
            return piece
        piece = self.pending[self.start : self.start + size]
        self.start += len(piece)
        return piece


def decompressed(raw: Readable) -> Readable:
    """Sniff gzip, zstd or plain tar from the first bytes (media types are not trusted)."""
    head = raw.read(4)
    prefixed = _Prefixed(head, raw)
    if head.startswith(GZIP_MAGIC):
        return _GzipReader(prefixed)
    if head == ZSTD_MAGIC:
        # zstandard only calls read() on its source; the stub asks for a full IO.
        source = cast("IO[bytes]", prefixed)
        return _ZstdReader(zstandard.ZstdDecompressor().stream_reader(source, read_size=CHUNK))
    return prefixed


class _ZstdReader:
    def __init__(self, inner: Readable) -> None:
        self.inner = inner

    def read(self, size: int = -1) -> bytes:
        try:
            return self.inner.read(CHUNK if size < 0 else size)
        except zstandard.ZstdError as exc:
            raise FormatError("zstd", 0, f"corrupt compressed data: {exc}") from None


class _Prefixed:
    def __init__(self, head: bytes, raw: Readable) -> None:
        self.head = head
        self.raw = raw

    def read(self, size: int = -1) -> bytes:
        if self.head:
            if size < 0 or size >= len(self.head):
                piece, self.head = self.head, b""
                rest = self.raw.read(-1 if size < 0 else size - len(piece))
                return piece + rest
            piece, self.head = self.head[:size], self.head[size:]
            return piece
        return self.raw.read(size)
