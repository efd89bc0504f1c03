"""Give back the disk blocks of the bytes of a large ELF file that no check reads.

``image`` writes every ELF file of the extracted directories into the merged view, because the
checks read them by path (image/needed.py). They read a small part of a large library: headers,
the dynamic section and symbol tables, versions, notes, ``.hip_fatbin``'s bundle tables and each
code object's ELF structures, what searches of the data sections find (embedded device images,
LLVM's CommandLine messages), and the machine code only of libraries that may register LLVM
options (llvm/linkage.py walks their static initialisers). So once a library is written, the
blocks none of them reads are punched out (``fallocate(PUNCH_HOLE)``): the file keeps its size
and every byte a check reads, and the rest reads as zeros. Which bytes stay is not a list kept
beside the checks: the readers themselves run once on the file, through views that note every
range they read (``_RecordingView``, elf/codeobject.py ``RecordingWindow``), so the kept ranges
follow the checks. What is given back:

- sections no check opens: ``.debug*``, ``.symtab``, ``.strtab``, ``.comment``;
- machine code (``SHF_EXECINSTR`` sections), ``.eh_frame`` and ``.gcc_except_table``, but the
  ranges llvm/linkage.py reads (all of them when its reading fails);
- in ``.hip_fatbin`` and the data sections (``.rodata*``, ``.data*``, ``.ldata``, ``.lrodata``),
  every byte that the code-object scan (gpu/codeobjects.py ``host_reads``, every entry read) and
  llvm/roles.py's search do not read; a search's own reading is not kept, what it finds is:
  zeros hold no magic and no message, so a search of the trimmed file finds the same things and
  reads the same bytes after them. A section holding a CCOB stays whole (its reading may run in
  helper processes).

The headers, the program and section header tables, every other section and every segment a
program header names besides PT_LOAD are kept, whatever overlaps them; only whole blocks inside a
range are punched. Byte comparisons and content digests need the whole file: image/merge.py
hashes a trimmed file as it streams and image/whole.py gives it its bytes back before a byte
comparison may read it (image/digests.py).
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable, Iterable, Iterator

from rocm_audit.elf import read as elfread
from rocm_audit.elf.sections import SHT_NOBITS, Section, read_sections
from rocm_audit.elf.view import ElfView
from rocm_audit.errors import FormatError
from rocm_audit.gpu.codeobjects import host_reads
from rocm_audit.gpu.embedded import EMBEDDED_SECTION_PREFIXES
from rocm_audit.image.needed import ELF_MAGIC
from rocm_audit.llvm.libfacts import LINKAGE_FACT, ROLE_FACT, reads_linkage
from rocm_audit.llvm.linkage import read_linkage
from rocm_audit.llvm.roles import classify

TRIM_MIN_BYTES = 1 << 20  # smaller files give back too little for the work of reading their tables
BLOCK = 4096
UNREAD_SECTIONS = frozenset({".symtab", ".strtab", ".comment"})
UNREAD_PREFIXES = (".debug", ".zdebug")
CODE_SECTIONS = frozenset({".eh_frame", ".gcc_except_table"})  # read only with the code, if at all
SHF_EXECINSTR = 0x4
EM_AMDGPU = 224
PT_LOAD = 1

_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 0x01, 0x02


def unread_ranges(path: str, fd: int, size: int) -> tuple[list[tuple[int, int]], dict[str, object]]:
    """Block-aligned [start, end) file ranges of the host ELF file open at ``fd`` (at ``path``)
    that no check reads (the module docstring says which; none for a file whose tables do not
    read cleanly, AMDGPU code objects, 32-bit and big-endian files), and the LLVM facts read on
    the way (llvm/libfacts.py names), which the checks would read again from the same bytes."""
    try:
        head = os.pread(fd, 64, 0)
        header = elfread.parse_header(head)
        if not (header.is_64 and header.little_endian) or header.e_machine == EM_AMDGPU:
            return [], {}
        sections = read_sections(fd, header, size)
        phdrs = elfread.read_program_headers(fd, header, head, size)
        device_reads, found = host_reads(path, fd, size, header)
    except (FormatError, OSError):
        return [], {}
    whole = _holding_ccobs(sections, found.bundles)
    llvm_reads, facts = _llvm_reads(path, fd, size, header, sections)
    with_code = llvm_reads is None  # what llvm/ reads stays whole
    if llvm_reads is None:
        whole |= {s.index for s in sections if _searched(s)}
    dropped: list[tuple[int, int]] = []
    kept: list[tuple[int, int]] = [(0, 64)]  # the ELF64 header
    if header.e_phnum:
        kept.append((header.e_phoff, header.e_phoff + header.e_phnum * header.e_phentsize))
    kept.append((header.e_shoff, header.e_shoff + header.e_shnum * header.e_shentsize))
    kept += [(p.p_offset, p.p_offset + p.p_filesz) for p in phdrs if p.p_type != PT_LOAD]
    kept += llvm_reads or []
    kept += device_reads
    linked = {s.link for s in sections if not _unread(s, with_code)}
    for section in sections:
        if section.sh_type == SHT_NOBITS or not section.size:
            continue
        extent = (section.offset, section.offset + section.size)
        if _searched(section):
            (kept if section.index in whole else dropped).append(extent)
        elif _unread(section, with_code) and section.index not in linked:
            dropped.append(extent)
        else:
            kept.append(extent)
    return _blocks(_subtract(_merged(dropped), _merged(kept))), facts


def worth_trimming(size: int, head: list[bytes], read_again: bool) -> bool:
    """Whether a file of ``size`` starting with ``head`` is worth trimming: a large ELF file, in a
    layer that can be read again. image/merge.py trims it only if the view shows no copy of its
    size (image/digests.py ``shows_size``: a later copy of its size is then kept whole, so a
    duplicate group keeps a whole member to give the trimmed one its bytes: image/whole.py)."""
    return size >= TRIM_MIN_BYTES and read_again and b"".join(head).startswith(ELF_MAGIC)


def trim_file(path: str, fd: int, size: int) -> tuple[tuple[int, int], int, dict[str, object], list[tuple[int, int]]]:
    """Punch out of the file open for writing at ``fd`` the blocks no check reads: its inode, the
    bytes given back, the facts read on the way (``unread_ranges``), and the ranges punched (none
    where the file system cannot punch holes)."""
    ranges, facts = unread_ranges(path, fd, size)
    info = os.fstat(fd)
    given = punch(fd, ranges)
    punched = ranges if given == sum(end - start for start, end in ranges) else []
    return (info.st_dev, info.st_ino), given, facts, punched


def punch(fd: int, ranges: Iterable[tuple[int, int]]) -> int:
    """Punch the ranges out of the file (its size stays); the bytes given back, 0 where the file
    system cannot punch holes (the file then keeps every byte). Raises OSError for other errors."""
    fallocate = _fallocate()
    given = 0
    for start, end in ranges:
        if fallocate is None:
            return given
        flags = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
        if fallocate(fd, flags, start, end - start) != 0:
            code = ctypes.get_errno()
            if code in (errno.EOPNOTSUPP, errno.ENOSYS):
                return given
            raise OSError(code, os.strerror(code))
        given += end - start
    return given


def _searched(section: Section) -> bool:
    """A section the code-object scan reads only where it finds device code."""
    if section.flags & SHF_EXECINSTR:
        return False
    return section.name == ".hip_fatbin" or section.name.startswith(EMBEDDED_SECTION_PREFIXES)


def _holding_ccobs(sections: tuple[Section, ...], bundles: list[tuple[int, int, str]]) -> set[int]:
    """Indices of the sections a CCOB the scan found starts in."""
    starts = [offset for offset, _size, kind in bundles if kind == "ccob"]
    return {s.index for s in sections if s.has_file_bytes and any(s.offset <= at < s.offset + s.size for at in starts)}


def _unread(section: Section, with_code: bool) -> bool:
    if section.name in UNREAD_SECTIONS or section.name.startswith(UNREAD_PREFIXES):
        return True
    return not with_code and (bool(section.flags & SHF_EXECINSTR) or section.name in CODE_SECTIONS)


class _RecordingView(ElfView):
    """An ElfView that notes the file range of every read but a search's, and of what a search
    finds: the bytes a reading depends on (zeros elsewhere hold no needle)."""

    def __init__(self, fd: int, *, file_size: int | None = None, header: elfread.ElfHeader | None = None) -> None:
        super().__init__(fd, file_size=file_size, header=header)
        self.reads: list[tuple[int, int]] = []
        self._searching = False

    def pread(self, size: int, offset: int) -> bytes:
        data = super().pread(size, offset)
        if not self._searching:
            self.reads.append((offset, offset + len(data)))
        return data

    def find_all(self, section: Section, needle: bytes) -> Iterator[int]:
        self._searching = True
        try:
            hits = list(super().find_all(section, needle))
        finally:
            self._searching = False
        self.reads += [(section.offset + hit, section.offset + hit + len(needle)) for hit in hits]
        return iter(hits)


def _llvm_reads(
    path: str, fd: int, size: int, header: elfread.ElfHeader, sections: tuple[Section, ...]
) -> tuple[list[tuple[int, int]] | None, dict[str, object]]:
    """The ranges llvm/ reads of this library: its role (roles.py: names and messages it searches
    for) and, where llvm/libfacts.py reads it, its linkage (linkage.py: the call walk reads only
    the code the static initialisers reach), and those facts; None when a reading fails (then the
    sections they search and the code stay whole)."""
    view = _RecordingView.of_sections(fd, header, sections, size)
    facts: dict[str, object] = {}
    try:
        facts[ROLE_FACT] = role = classify(path, view.dynamic, view)
        if reads_linkage(role):
            facts[LINKAGE_FACT] = read_linkage(path, view.dynamic, view)
    except (FormatError, OSError):
        return None, {}
    return view.reads, facts


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _subtract(ranges: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` without ``holes`` (both sorted and merged)."""
    out: list[tuple[int, int]] = []
    index = 0
    for start, end in ranges:
        while index < len(holes) and holes[index][1] <= start:
            index += 1
        position, scan = start, index
        while scan < len(holes) and holes[scan][0] < end:
            if holes[scan][0] > position:
                out.append((position, holes[scan][0]))
            position = max(position, holes[scan][1])
            scan += 1
        if position < end:
            out.append((position, end))
    return out


def _blocks(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Each range shrunk to the whole blocks inside it."""
    out = []
    for start, end in ranges:
        first, last = -(-start // BLOCK) * BLOCK, end // BLOCK * BLOCK
        if last > first:
            out.append((first, last))
    return out


_FALLOCATE: list[Callable[[int, int, int, int], int] | None] = []


def _fallocate() -> Callable[[int, int, int, int], int] | None:
    """libc's fallocate(2) (Python's os has only posix_fallocate), None where it is missing."""
    if not _FALLOCATE:
        function = getattr(ctypes.CDLL(None, use_errno=True), "fallocate", None)  # this process's libc
        if function is not None:
            function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
            function.restype = ctypes.c_int
        _FALLOCATE.append(function)
    return _FALLOCATE[0]
