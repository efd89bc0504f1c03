"""Read one AMDGPU code object's ELF structures through ``pread`` windows: header, program headers
(or section headers when it has none), and the metadata notes they point at.

gpu/ finds code objects in containers (bundles, CCOBs, kpack archives, data sections); this module
is the one place that reads the ELF inside each. ``ReadAt`` abstracts where the bytes come from: a
window of an open file (``FileWindow``), an inflated head (``buffer_reader``), or a chunk the
embedded-image search holds in memory (``ChunkWindow``). Memory does not grow with section size.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from rocm_audit.errors import FormatError
from rocm_audit.formats import amdgpu_elf

ReadAt = Callable[[int, int], bytes]

MAX_NOTE_BYTES = 4 << 20
MAX_PHNUM = 512
MAX_SHNUM_FOR_NOTES = 4096


class FileWindow:
    """pread reads of one open file, bounded by its size."""

    inflates = True  # compressed containers are read inside; False: only located (RecordingWindow)

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size

    def read(self, offset: int, length: int) -> bytes:
        if offset >= self.size or length <= 0:
            return b""
        return os.pread(self.fd, min(length, self.size - offset), offset)

    def scan(self, offset: int, length: int) -> bytes:
        """A read for a search (ChunkWindow.load): what the search finds in it is read again."""
        return self.read(offset, length)

    def served(self, offset: int, length: int) -> None:
        """Told of a read a ChunkWindow served from its memory (RecordingWindow notes it)."""

    def reader(self, start: int, limit: int) -> ReadAt:
        """A ReadAt over [start, start+limit) of the file."""

        def read_at(offset: int, length: int) -> bytes:
            if offset >= limit:
                return b""
            return self.read(start + offset, min(length, limit - offset))

        return read_at


class RecordingWindow(FileWindow):
    """A FileWindow that notes the file range of every read but a search's (``scan``): the bytes
    a reading of the file depends on, given what its searches find (image/trim.py). It does not
    inflate CCOBs: image/trim.py keeps a section that holds one whole."""

    inflates = False

    def __init__(self, fd: int, size: int) -> None:
        super().__init__(fd, size)
        self.reads: list[tuple[int, int]] = []

    def read(self, offset: int, length: int) -> bytes:
        data = super().read(offset, length)
        self.reads.append((offset, offset + len(data)))
        return data

    def scan(self, offset: int, length: int) -> bytes:
        return FileWindow.read(self, offset, length)

    def served(self, offset: int, length: int) -> None:
        self.reads.append((offset, offset + length))


def buffer_reader(buf: bytes) -> ReadAt:
    """A ReadAt over bytes already in memory."""

    def read_at(offset: int, length: int) -> bytes:
        return buf[offset : offset + length]

    return read_at


class ChunkWindow:
    """A file window held in memory (the embedded-image search's); reads inside it are served from
    memory, others from the file."""

    def __init__(self, fh: FileWindow) -> None:
        self.fh = fh
        self.start = 0
        self.data = b""

    def load(self, start: int, length: int) -> None:
        self.start, self.data = start, self.fh.scan(start, length)

    def holds(self, offset: int, length: int) -> bool:
        return self.start <= offset and offset + length <= self.start + len(self.data)

    def read(self, offset: int, length: int) -> bytes:
        if self.holds(offset, length):
            self.fh.served(offset, length)
            return self.data[offset - self.start : offset - self.start + length]
        return self.fh.read(offset, length)

    def reader(self, base: int, limit: int) -> ReadAt:
        def read_at(offset: int, length: int) -> bytes:
            if offset >= limit:
                return b""
            return self.read(base + offset, min(length, limit - offset))

        return read_at


@dataclass(frozen=True, slots=True)
class CodeObjectFacts:
    identity: amdgpu_elf.CodeObjectIdentity
    metadata: amdgpu_elf.CodeObjectMetadata | None
    metadata_complete: bool  # False when the notes lie beyond the bytes we kept


def inspect_code_object(read_at: ReadAt, size: int, base: int, kept: int | None = None) -> CodeObjectFacts:
    """ELF header and metadata notes of one AMDGPU code object. Raises FormatError.

    ``kept``: only the first ``kept`` bytes can be read (a compressed entry's head): a table or
    note reaching past them is not read and leaves the metadata incomplete."""
    within = size if kept is None else min(size, kept)
    layout = amdgpu_elf.parse_header(read_at(0, amdgpu_elf.ELF64_HEADER_SIZE), base)
    ranges: list[tuple[int, int]] = []
    complete = True
    if layout.e_phnum:
        if layout.e_phnum > MAX_PHNUM:
            raise FormatError(amdgpu_elf.FMT, base + 0x38, f"e_phnum {layout.e_phnum} is absurd")
        length = layout.e_phnum * amdgpu_elf.ELF64_PHDR_SIZE
        if layout.e_phoff + length > size:
            raise FormatError(amdgpu_elf.FMT, base + 0x20, "program headers run past the code object")
        table = read_at(layout.e_phoff, length) if layout.e_phoff + length <= within else b""
        if len(table) < length:
            complete = False
        else:
            ranges = amdgpu_elf.note_ranges_from_phdrs(table, base + layout.e_phoff, layout.e_phnum)
    if not ranges and complete and layout.e_shnum and layout.e_shnum <= MAX_SHNUM_FOR_NOTES:
        length = layout.e_shnum * amdgpu_elf.ELF64_SHDR_SIZE
        if layout.e_shoff + length > size:
            raise FormatError(amdgpu_elf.FMT, base + 0x28, "section headers run past the code object")
        table = read_at(layout.e_shoff, length) if layout.e_shoff + length <= within else b""
        if len(table) < length:
            complete = False
        else:
            ranges = amdgpu_elf.note_ranges_from_shdrs(table, base + layout.e_shoff, layout.e_shnum)
    notes: list[amdgpu_elf.Note] = []
    for offset, length in ranges:
        if offset + length > size:
            raise FormatError(amdgpu_elf.FMT, base + offset, "note runs past the code object")
        if length > MAX_NOTE_BYTES:
            complete = False
            continue
        data = read_at(offset, length) if offset + length <= within else b""
        if len(data) < length:
            complete = False
            continue
        notes.extend(amdgpu_elf.iter_notes(data, base + offset))
    metadata = amdgpu_elf.parse_metadata(notes, base) if notes else None
    return CodeObjectFacts(layout.identity, metadata, complete)
