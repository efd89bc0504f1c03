"""AOTriton kernel storage v2 (``.aks2``): the archives ``libaotriton_v2.so`` opens from
``aotriton.images/amd-<arch or family>/...`` (formats.md 2.10, 8.3).

Layout, as AOTriton's own reader takes it [ROCm/aotriton: v2src/packed_kernel.cc, class
PackedKernel and the "AKS2 Format" comment there; include/aotriton/_internal/packed_kernel.h]:

- 16 bytes, not compressed, little-endian: the magic ``AKS2``, a u32 total uncompressed size,
  a u32 number of kernels N and a u32 directory size (struct ``AKS2_Header``);
- then one xz stream (read with ``lzma_stream_decoder``, 64 KiB of input at a time:
  ``AOTRITON_LZMA_BUFSIZ``) whose content is the directory followed by the kernel images;
- the directory: N entries, each five u32 (struct ``AKS2_Metadata``: shared memory, threads per
  block, offset, image size, name length M counting the trailing NUL) and then M bytes of name;
  the reader checks that the entries end exactly at the directory size;
- an entry's image starts ``offset`` bytes after the end of the directory and is ``image size``
  bytes long: an AMDGPU code object (ELF). Size 0 marks a kernel that failed to compile (the
  reader returns no image for it).

Older AOTriton (the first packed_kernel.cc, before ``number_of_threads`` was added) wrote four u32
per entry; no archive in a real wheel we have seen uses it, and the directory-size check rejects
it here as it does in the runtime.

AOTriton 0.12 and later may also keep ``.aks2`` entries inside a STORED (uncompressed) ZIP file
[ROCm/aotriton: include/aotriton/_internal/lszip.h, flat_zip.h]; no such file has been seen in a
wheel yet, so it is not read here.

Nothing here trusts a size field for an allocation: the count is bounded by the directory size,
the directory by :data:`MAX_DIRECTORY_BYTES`, and the xz content is streamed and only the
directory and the first :data:`HEAD_BYTES` of each image (its ELF header, which names the
processor) are kept. Decompression stops once the last of those is read.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from rocm_audit.errors import FormatError

FMT = "AKS2"
CONTENT_FMT = "AKS2 content"  # FormatError offsets in the decompressed content, not in the file
MAGIC = b"AKS2"
HEADER = struct.Struct("<4sIII")  # magic, uncompressed size, number of kernels, directory size
ENTRY = struct.Struct("<5I")  # shared memory, threads, offset, image size, name length (with NUL)
MIN_ENTRY_BYTES = ENTRY.size + 1  # an empty name still has its NUL
HEAD_BYTES = 64  # an ELF64 header: e_flags names the processor
MAX_DIRECTORY_BYTES = 16 << 20  # real ones: about 115 bytes per kernel (20 KiB for 176 kernels)
XZ_MEMLIMIT = 256 << 20  # the decoder's memory for the dictionary (xz -9 needs 65 MiB)
INPUT_CHUNK = 64 << 10  # compressed bytes read at a time (as the runtime does)
OUTPUT_CHUNK = 1 << 20  # decompressed bytes produced at a time

ReadAt = Callable[[int, int], bytes]  # (offset, size) -> bytes; shorter at the end of the file


@dataclass(frozen=True, slots=True)
class Aks2Header:
    uncompressed_size: int
    kernel_count: int
    directory_size: int


@dataclass(frozen=True, slots=True)
class Aks2Kernel:
    """One directory entry: ``offset`` counts from the end of the directory in the decompressed
    content; ``head`` holds the first :data:`HEAD_BYTES` of the image (fewer when it is smaller;
    empty for a size-0 entry)."""

    name: str
    shared_memory: int
    threads: int
    offset: int
    size: int
    head: bytes


@dataclass(frozen=True, slots=True)
class Aks2Archive:
    header: Aks2Header
    kernels: tuple[Aks2Kernel, ...]
    decompressed: int  # content bytes decompressed to read the directory and the heads


def parse_header(buf: bytes | memoryview, file_size: int) -> Aks2Header:
    """The 16-byte header. Raises FormatError naming the file offset of what is wrong."""
    if len(buf) < HEADER.size or file_size < HEADER.size:
        raise FormatError(FMT, 0, f"file of {file_size} bytes is shorter than the {HEADER.size}-byte header")
    magic, uncompressed, count, directory = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise FormatError(FMT, 0, f"magic {bytes(magic)!r} is not {MAGIC!r}")
    if directory > uncompressed:
        raise FormatError(FMT, 12, f"directory size {directory} exceeds the content size {uncompressed}")
    if directory > MAX_DIRECTORY_BYTES:
        raise FormatError(FMT, 12, f"directory size {directory} is absurd (more than {MAX_DIRECTORY_BYTES})")
    if count * MIN_ENTRY_BYTES > directory:
        raise FormatError(FMT, 8, f"kernel count {count} cannot fit a directory of {directory} bytes")
    return Aks2Header(uncompressed, count, directory)


def parse_directory(buf: bytes | bytearray | memoryview, header: Aks2Header) -> list[Aks2Kernel]:
    """The directory (the first ``header.directory_size`` content bytes), heads left empty.
    Raises FormatError with an offset into the decompressed content (:data:`CONTENT_FMT`)."""
    view = memoryview(buf)
    end = header.directory_size
    if len(view) < end:
        raise FormatError(CONTENT_FMT, len(view), f"directory ends after {len(view)} of {end} bytes")
    images = header.uncompressed_size - end
    kernels = []
    pos = 0
    for index in range(header.kernel_count):
        if pos + ENTRY.size > end:
            raise FormatError(CONTENT_FMT, pos, f"entry {index} runs past the directory end ({end})")
        shared, threads, offset, size, name_length = ENTRY.unpack_from(view, pos)
        name_at = pos + ENTRY.size
        if name_length == 0 or name_at + name_length > end:
            raise FormatError(
                CONTENT_FMT, pos + 16, f"entry {index}: name of {name_length} bytes runs past the directory end ({end})"
            )
        raw = bytes(view[name_at : name_at + name_length])
        if raw[-1] != 0:
            raise FormatError(CONTENT_FMT, name_at, f"entry {index}: name is not NUL-terminated")
        if offset + size > images:
            raise FormatError(
                CONTENT_FMT,
                pos + 8,
                f"entry {index}: image at {offset} of {size} bytes runs past the {images} bytes of images",
            )
        name = raw[:-1].split(b"\0", 1)[0].decode("utf-8", "replace")
        kernels.append(Aks2Kernel(name, shared, threads, offset, size, b""))
        pos = name_at + name_length
    if pos != end:
        raise FormatError(CONTENT_FMT, pos, f"entries end at {pos}, not at the directory size {end}")
    return kernels


def read_archive(read_at: ReadAt, file_size: int) -> Aks2Archive:
    """Header, directory and each image's ELF header of one ``.aks2`` file. Raises FormatError:
    :data:`FMT` offsets are file offsets, :data:`CONTENT_FMT` ones are in the decompressed content."""
    import lzma  # noqa: PLC0415 - only when an archive is read

    header = parse_header(read_at(0, HEADER.size), file_size)
    decoder = lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=XZ_MEMLIMIT)
    content = _Content(header)
    file_pos = HEADER.size
    pending = b""
    planned = False
    while True:
        if not planned and content.produced >= header.directory_size:
            content.plan_heads(parse_directory(content.directory, header))
            planned = True
        if planned and content.produced >= content.need_until:
            break
        if decoder.eof:
            raise FormatError(
                CONTENT_FMT,
                content.produced,
                f"xz stream ends after {content.produced} bytes, before byte {content.need_until} is read",
            )
        if decoder.needs_input:
            pending = read_at(file_pos, INPUT_CHUNK)
            if not pending:
                raise FormatError(
                    FMT, file_pos, f"xz stream is truncated: the file ends after {content.produced} content bytes"
                )
            feed_at = file_pos
            file_pos += len(pending)
        else:
            pending, feed_at = b"", file_pos
        # up to the directory's end first, so that no image byte passes before the heads are planned
        limit = min(OUTPUT_CHUNK, content.need_until - content.produced)
        try:
            chunk = decoder.decompress(pending, max_length=limit)
        except lzma.LZMAError as exc:
            raise FormatError(FMT, feed_at, f"xz data is corrupt: {exc}") from None
        if content.produced + len(chunk) > header.uncompressed_size:
            raise FormatError(
                CONTENT_FMT,
                content.produced,
                f"content is longer than the {header.uncompressed_size} bytes the header says",
            )
        content.absorb(chunk)
    done = tuple(
        Aks2Kernel(k.name, k.shared_memory, k.threads, k.offset, k.size, bytes(content.heads.get(i, b"")))
        for i, k in enumerate(content.kernels)
    )
    return Aks2Archive(header, done, content.produced)


class _Content:
    """What :func:`read_archive` keeps of the decompressed content as it streams past: the
    directory, then the first :data:`HEAD_BYTES` of each image."""

    def __init__(self, header: Aks2Header) -> None:
        self.header = header
        self.directory = bytearray()
        self.kernels: list[Aks2Kernel] = []
        self.heads: dict[int, bytearray] = {}
        # (start, end, index) of each head to keep, in content order; filled as the stream passes
        self.wanted: list[tuple[int, int, int]] = []
        self.next_wanted = 0
        self.active: list[tuple[int, int, int]] = []
        self.need_until = header.directory_size  # content offset past the last byte still needed
        self.produced = 0  # content bytes decompressed so far

    def absorb(self, chunk: bytes) -> None:
        """Keep what ``chunk``, the next decompressed bytes, holds of the directory and the heads."""
        start = self.produced
        self.produced += len(chunk)
        if len(self.directory) < self.header.directory_size:
            self.directory.extend(chunk[: self.header.directory_size - start])
        while self.next_wanted < len(self.wanted) and self.wanted[self.next_wanted][0] < self.produced:
            self.active.append(self.wanted[self.next_wanted])
            self.next_wanted += 1
        still = []
        for lo, hi, index in self.active:
            a, b = max(lo, start), min(hi, self.produced)
            if a < b:
                self.heads[index].extend(chunk[a - start : b - start])
            if hi > self.produced:
                still.append((lo, hi, index))
        self.active = still

    def plan_heads(self, kernels: list[Aks2Kernel]) -> None:
        """Once the directory is read: which content ranges hold the heads, and where to stop."""
        self.kernels = kernels
        base = self.header.directory_size  # every image starts at or after it: nothing is read yet
        for index, kernel in enumerate(kernels):
            if kernel.size:
                lo = base + kernel.offset
                self.wanted.append((lo, lo + min(kernel.size, HEAD_BYTES), index))
                self.heads[index] = bytearray()
        self.wanted.sort()
        self.need_until = max((hi for _lo, hi, _i in self.wanted), default=base)


def parse(buf: bytes | memoryview) -> Aks2Archive:
    """:func:`read_archive` over a whole archive in memory."""
    view = memoryview(buf)

    def read_at(offset: int, length: int) -> bytes:
        return bytes(view[offset : offset + length])

    return read_archive(read_at, len(view))
