"""Where the slimmed bundles go in a host library, and how the freed bytes leave the file without
moving any virtual address (formats.md 8.4). Pure planning, writing and proving; no output.

**Compaction.** The slimmed bundles are placed one after another from the start of
``.hip_fatbin``, in their original order, each at an address with the alignment its original
start had (at most 4096). Every pointer to a bundle moves with it: the wrapper's
``R_X86_64_RELATIVE`` addend in ``.rela.dyn``, the 8 bytes of the wrapper's slot when the linker
also wrote the address there, and every ``.dynsym``/``.symtab`` symbol whose value is a bundle's
old start (so an ``R_X86_64_64`` against such a symbol follows). Any other relocation or symbol
that points into ``.hip_fatbin`` refuses the file: its meaning could not be kept. Code does not
address bundles (hip-clang references only the wrapper), which the dlopen tests confirm.

**Giving the bytes back** (``layout``):

- ``"truncated"``: ``.hip_fatbin`` ends the file part of its PT_LOAD (onnxruntime-rocm's provider).
  The segment's ``p_filesz`` (and ``p_memsz`` when it equalled ``p_filesz``) and the section's
  ``sh_size`` end at the last bundle; everything after it in the file (non-alloc sections, the
  section header table, any later segment) moves down by the freed bytes rounded down to the
  largest alignment among what moves (``sh_addralign``, later ``p_align``, 8 for the tables).
- ``"split"``: ``.hip_fatbin`` sits mid-segment (cupy's cub module, the jax plugin: followed by
  ``.eh_frame_hdr`` and ``.eh_frame``). The segment becomes A (its start up to the compacted end)
  and B (the first section after ``.hip_fatbin`` up to the old end, same addresses and flags,
  the old ``p_align``); the file offsets of B and of everything after it move down by a multiple
  of the largest ``p_align`` among B and the later segments, so ``p_offset % p_align == p_vaddr %
  p_align`` still holds for each. A and B never share a page. Every program header and section
  header after the cut follows, ``e_shoff`` too.

  The extra PT_LOAD needs a slot in the program header table. When the bytes after the table are
  free it grows in place. Otherwise (the usual case: ``.note`` or ``.dynsym`` follows it) the new
  table is written into A's slack, right after the compacted bundles (inside the old
  ``.hip_fatbin`` address range, so it is mapped), ``e_phoff`` points there and ``PT_PHDR`` (lld
  writes one) moves with it. Why this is safe for glibc (elf/dl-load.c, dl-map-segments.h): the
  loader reads the table through ``e_phoff`` with ``pread`` when it lies beyond the first read; it
  takes ``l_phdr`` from ``PT_PHDR``'s ``p_vaddr`` when there is one, else it searches the mapped
  PT_LOADs for the one whose file range holds ``e_phoff`` and the whole table (A does), and it
  copies the table to the heap when none does. ``dl_iterate_phdr`` (how libgcc's unwinder finds
  ``PT_GNU_EH_FRAME``) reports that ``l_phdr``. The old table's bytes stay where they were, unused.
- ``"zeroed"``: no layout allows a true shrink (``.hip_fatbin`` is not wholly inside one PT_LOAD,
  another program header overlaps the freed range, the freed bytes are fewer than the alignment
  the cut needs, or the file is not a shared library whose pointers this module can move). The
  file keeps its size and the freed bytes are zeros; a compressed layer or archive still shrinks.

**Proof** (``prove``, before the new file replaces the old): the new size is the planned one; the
ELF header, program header table and section header table are exactly the planned ones; every
byte the original loads outside ``.hip_fatbin`` is, at the same virtual address through the new
program headers, the original byte or the planned moved pointer; every non-alloc section is
byte-identical at its new offset (``.symtab`` values aside, as planned); and each wrapper, read
again from the new file, reaches a bundle whose bytes are the slimmed bundle that was proved.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from rocm_audit.elf import read as elfread
from rocm_audit.elf.relocations import R_X86_64_64, R_X86_64_GLOB_DAT, R_X86_64_RELATIVE, file_place
from rocm_audit.elf.sections import SHF_ALLOC, Section
from rocm_audit.elf.tables import (
    PT_LOAD,
    PT_PHDR,
    Phdr,
    Shdr,
    defined_symbols_in,
    header_with,
    read_phdrs,
    relocations_touching,
)
from rocm_audit.elf.tables import read_shdrs as read_shdr_table
from rocm_audit.elf.view import ElfView
from rocm_audit.errors import FormatError

PAGE = 4096  # x86-64: glibc maps segments in 4 KiB pages; p_align is at least this
MAX_BUNDLE_ALIGN = 4096
PHDR_SIZE = 56
_CHUNK = 1 << 20
TRUNCATED, SPLIT, ZEROED = "truncated", "split", "zeroed"


class LayoutRefused(Exception):
    """A pointer into ``.hip_fatbin`` that is not a bundle's start: no layout may move bundles."""


def _round_up(value: int, align: int) -> int:
    return -(-value // align) * align


def _round_down(value: int, align: int) -> int:
    return value // align * align


def start_alignment(vaddr: int) -> int:
    """The largest power of two, at most 4096, that ``vaddr`` is a multiple of."""
    align = MAX_BUNDLE_ALIGN
    while align > 1 and vaddr % align:
        align //= 2
    return align


@dataclass(frozen=True, slots=True)
class Layout:
    """The new file, as planned. Offsets in ``patches`` are the ORIGINAL file's; ``moved(offset)``
    gives where an original byte outside the freed range lands."""

    kind: str
    reason: str  # why "zeroed"
    old_offsets: tuple[int, ...]
    new_offsets: tuple[int, ...]
    bundles_end: int  # file offset just past the last placed bundle
    cut: int  # original bytes from here on move down by shift
    shift: int
    old_size: int
    header: bytes  # the new 64-byte ELF header
    phoff: int
    phdrs: tuple[Phdr, ...]
    shoff: int
    shdrs: tuple[Shdr, ...]
    patches: tuple[tuple[int, bytes], ...]  # (original offset, new bytes) of moved pointers, sorted
    table_in_slack: bool = False  # the program header table was written after the bundles
    compacted: bool = True  # bundles packed from the section's start (else each at its old start)
    fatbin: tuple[int, int, int] = (0, 0, 0)  # (offset, addr, size) of the original .hip_fatbin
    hole_end: int = 0  # vaddr where what the layout keeps resumes (B's start when split)

    @property
    def new_size(self) -> int:
        return self.old_size - self.shift

    def moved(self, offset: int) -> int:
        return offset - self.shift if offset >= self.cut else offset


@dataclass(slots=True)
class Prepared:
    """What a library offers a layout, read once before slimming (``prepare``)."""

    size: int
    head: bytes
    fatbin: Section
    phdrs: list[Phdr]
    shdrs: list[Shdr]
    starts: list[int]  # original file offsets of the bundles, in order
    pointer_moves: list[tuple[int, int]] = field(default_factory=list)  # (file offset of a u64, old vaddr)
    reason: str = ""  # set: no compaction, bundles stay at their starts

    @property
    def compacts(self) -> bool:
        return not self.reason

    def vaddr(self, offset: int) -> int:
        return self.fatbin.addr + offset - self.fatbin.offset

    def place(self, cursor: int, index: int) -> int:
        """File offset of bundle ``index`` when the previous one ended at ``cursor``."""
        if not self.compacts:
            return self.starts[index]
        if index == 0:
            cursor = self.fatbin.offset
        return (
            self.fatbin.offset
            + _round_up(self.vaddr(cursor), start_alignment(self.vaddr(self.starts[index])))
            - (self.fatbin.addr)
        )


def prepare(fd: int, starts: Sequence[int], slots: Sequence[int]) -> Prepared:
    """Read the tables and every pointer into ``.hip_fatbin`` (``starts``: file offsets of the
    registered bundles; ``slots``: vaddrs of the wrappers' pointer slots). Raises LayoutRefused,
    FormatError."""
    size = os.fstat(fd).st_size
    head = os.pread(fd, 64, 0)
    header = elfread.parse_header(head)
    view = ElfView(fd, file_size=size, header=header)
    fatbin = next(s for s in view.sections if s.name == ".hip_fatbin")
    prepared = Prepared(size, head, fatbin, read_phdrs(fd, header), read_shdr_table(fd, header), list(starts))
    if header.e_type != elfread.ET_DYN:
        prepared.reason = "not a shared library"
        return prepared
    low, high = fatbin.addr, fatbin.addr + fatbin.size
    starts_v = {prepared.vaddr(s) for s in starts}
    symbols = defined_symbols_in(view, low, high)
    for symbol in symbols:
        if symbol.value not in starts_v:
            raise LayoutRefused(
                f"symbol {symbol.index} of {symbol.table.name} points inside .hip_fatbin at "
                f"{symbol.value:#x}, not at a bundle"
            )
        prepared.pointer_moves.append((symbol.value_offset, symbol.value))
    in_fatbin = {(s.table.index, s.index) for s in symbols}
    by_table: dict[int, set[int]] = {}
    for table_index, symbol_index in in_fatbin:
        by_table.setdefault(table_index, set()).add(symbol_index)
    slot_set = set(slots)
    # Only the entries the checks below can act on: the others are not decoded (see
    # relocations_touching); the order, and so the first refusal, is the file's.
    for reloc in relocations_touching(view, addends=range(low, high), symbols=by_table, r_offsets=slot_set):
        if reloc.kind == R_X86_64_RELATIVE and low <= reloc.addend < high:
            if reloc.addend not in starts_v:
                raise LayoutRefused(
                    f"a relocation at {reloc.r_offset:#x} points inside .hip_fatbin at {reloc.addend:#x}, "
                    "not at a bundle"
                )
            prepared.pointer_moves.append((reloc.addend_offset, reloc.addend))
        elif reloc.symbols is not None and (reloc.symbols.index, reloc.symbol) in in_fatbin:
            if reloc.kind not in (R_X86_64_64, R_X86_64_GLOB_DAT) or reloc.addend:
                raise LayoutRefused(f"a relocation at {reloc.r_offset:#x} points inside a bundle")
        elif reloc.r_offset in slot_set and reloc.kind not in (R_X86_64_RELATIVE, R_X86_64_64, R_X86_64_GLOB_DAT):
            prepared.reason = f"wrapper slot {reloc.r_offset:#x} has relocation type {reloc.kind}"
    for slot in slots:
        where = file_place(view.sections, slot)
        if where is None:
            continue
        (value,) = struct.unpack("<Q", os.pread(fd, 8, where[1]))
        if value in starts_v:  # some linkers also write the address into the slot
            prepared.pointer_moves.append((where[1], value))
    return prepared


def _zeroed(prepared: Prepared, new_offsets: Sequence[int], end: int, reason: str) -> Layout:
    """Same size; when the bundles were compacted, their pointers still move."""
    header = elfread.parse_header(prepared.head)
    patches = _pointer_patches(prepared, new_offsets) if prepared.compacts else []
    fat = prepared.fatbin
    return Layout(
        ZEROED,
        reason,
        tuple(prepared.starts),
        tuple(new_offsets),
        end,
        prepared.size,
        0,
        prepared.size,
        prepared.head[:64],
        header.e_phoff,
        tuple(prepared.phdrs),
        header.e_shoff,
        tuple(prepared.shdrs),
        tuple(sorted(patches)),
        compacted=prepared.compacts,
        fatbin=(fat.offset, fat.addr, fat.size),
        hole_end=fat.addr + fat.size,
    )


def _pointer_patches(prepared: Prepared, new_offsets: Sequence[int]) -> list[tuple[int, bytes]]:
    new_of = {prepared.vaddr(old): prepared.vaddr(new) for old, new in zip(prepared.starts, new_offsets, strict=True)}
    return [(offset, struct.pack("<Q", new_of[old])) for offset, old in prepared.pointer_moves]


def plan(prepared: Prepared, new_offsets: Sequence[int], new_sizes: Sequence[int]) -> Layout:
    """The layout for bundles placed at ``new_offsets`` (from ``Prepared.place``) with these sizes."""
    fat = prepared.fatbin
    end = max((o + s for o, s in zip(new_offsets, new_sizes, strict=True)), default=fat.offset)
    if not prepared.compacts:
        return _zeroed(prepared, new_offsets, end, prepared.reason)
    loads = [p for p in prepared.phdrs if p.p_type == PT_LOAD]
    holding = [p for p in loads if p.p_offset <= fat.offset and fat.offset + fat.size <= p.p_offset + p.p_filesz]
    if len(holding) != 1 or holding[0].p_vaddr - holding[0].p_offset != fat.addr - fat.offset:
        return _zeroed(prepared, new_offsets, end, ".hip_fatbin is not inside one loaded segment")
    segment = holding[0]
    fat_end = fat.offset + fat.size
    segment_end = segment.p_offset + segment.p_filesz
    if fat_end == segment_end:
        return _truncated(prepared, segment, new_offsets, end)
    return _split(prepared, segment, new_offsets, end)


def _others_overlap(prepared: Prepared, segment: Phdr, low: int, high: int) -> bool:
    """Whether a program header other than ``segment`` (and PT_PHDR) covers file bytes in [low, high)."""
    for ph in prepared.phdrs:
        if ph is segment or ph.p_type == PT_PHDR or ph.p_filesz == 0:
            continue
        if ph.p_offset < high and ph.p_offset + ph.p_filesz > low:
            return True
    return False


def _moved_alignment(prepared: Prepared, cut: int) -> int:
    align = 8
    for sh in prepared.shdrs:
        if sh.sh_offset >= cut and sh.sh_type != 0:
            align = max(align, sh.sh_addralign)
    for ph in prepared.phdrs:
        if ph.p_type == PT_LOAD and ph.p_offset >= cut:
            align = max(align, ph.p_align)
    return align


def _moved_tables(prepared: Prepared, cut: int, shift: int, fatbin_size: int) -> tuple[list[Phdr], list[Shdr], int]:
    header = elfread.parse_header(prepared.head)
    phdrs = [p.moved(p_offset=p.p_offset - shift) if p.p_offset >= cut else p for p in prepared.phdrs]
    shdrs = []
    for index, sh in enumerate(prepared.shdrs):
        if index == prepared.fatbin.index:
            sh = sh.moved(sh_size=fatbin_size)
        elif sh.sh_offset >= cut and sh.sh_type != 0:
            sh = sh.moved(sh_offset=sh.sh_offset - shift)
        shdrs.append(sh)
    shoff = header.e_shoff - shift if header.e_shoff >= cut else header.e_shoff
    return phdrs, shdrs, shoff


def _truncated(prepared: Prepared, segment: Phdr, new_offsets: Sequence[int], end: int) -> Layout:
    fat = prepared.fatbin
    cut = fat.offset + fat.size
    if _others_overlap(prepared, segment, end, cut):
        return _zeroed(prepared, new_offsets, end, "another program header covers the freed bytes")
    shift = _round_down(cut - end, _moved_alignment(prepared, cut))
    if shift <= 0:
        return _zeroed(prepared, new_offsets, end, "fewer bytes freed than the alignment of what follows")
    phdrs, shdrs, shoff = _moved_tables(prepared, cut, shift, end - fat.offset)
    filesz = end - segment.p_offset
    memsz = filesz if segment.p_memsz == segment.p_filesz else segment.p_memsz
    phdrs = [p.moved(p_filesz=filesz, p_memsz=memsz) if p is segment else p for p in phdrs]
    return _finished(prepared, TRUNCATED, new_offsets, end, cut, shift, phdrs, shdrs, shoff, None)


def _split(prepared: Prepared, segment: Phdr, new_offsets: Sequence[int], end: int) -> Layout:
    fat = prepared.fatbin
    header = elfread.parse_header(prepared.head)
    fat_end = fat.offset + fat.size
    after = [sh for sh in prepared.shdrs if sh.sh_type != 0 and sh.sh_offset >= fat_end and sh.sh_size]
    following = min(after, key=lambda sh: sh.sh_offset, default=None)
    delta = segment.p_vaddr - segment.p_offset
    if following is None or not following.sh_flags & SHF_ALLOC or following.sh_addr - following.sh_offset != delta:
        return _zeroed(prepared, new_offsets, end, "what follows .hip_fatbin is not the rest of its segment")
    cut = following.sh_offset
    count = len(prepared.phdrs) + 1
    table_bytes = count * PHDR_SIZE
    in_place = header.e_phoff + table_bytes <= min(
        [sh.sh_offset for sh in prepared.shdrs if sh.sh_type != 0 and sh.sh_size and sh.sh_offset >= header.e_phoff]
        + [p.p_offset for p in prepared.phdrs if p.p_offset > header.e_phoff and p.p_filesz]
    )
    a_end = end
    phoff = header.e_phoff
    if not in_place:
        phoff = _round_up(end, 8)
        a_end = phoff + table_bytes
    b_vaddr = following.sh_addr
    if a_end > fat_end or _round_up(a_end + delta, PAGE) > _round_down(b_vaddr, PAGE):
        return _zeroed(prepared, new_offsets, end, "too few bytes freed to split the segment")
    if _others_overlap(prepared, segment, fat.offset, cut):
        return _zeroed(prepared, new_offsets, end, "another program header covers the freed bytes")
    align = max(_moved_alignment(prepared, cut), segment.p_align, PAGE)
    shift = _round_down(cut - a_end, align)
    if shift <= 0:
        return _zeroed(prepared, new_offsets, end, "fewer bytes freed than the alignment of the segments")
    phdrs, shdrs, shoff = _moved_tables(prepared, cut, shift, end - fat.offset)
    skip = b_vaddr - segment.p_vaddr
    part_a = segment.moved(p_filesz=a_end - segment.p_offset, p_memsz=a_end - segment.p_offset)
    part_b = segment.moved(
        p_offset=cut - shift,
        p_vaddr=b_vaddr,
        p_paddr=segment.p_paddr + skip,
        p_filesz=segment.p_filesz - skip,
        p_memsz=segment.p_memsz - skip,
    )
    index = prepared.phdrs.index(segment)
    phdrs[index : index + 1] = [part_a, part_b]
    if not in_place:
        phdrs = [
            p.moved(
                p_offset=phoff, p_vaddr=phoff + delta, p_paddr=phoff + delta, p_filesz=table_bytes, p_memsz=table_bytes
            )
            if p.p_type == PT_PHDR
            else p
            for p in phdrs
        ]
    else:
        phdrs = [p.moved(p_filesz=table_bytes, p_memsz=table_bytes) if p.p_type == PT_PHDR else p for p in phdrs]
    return _finished(prepared, SPLIT, new_offsets, end, cut, shift, phdrs, shdrs, shoff, phoff, b_vaddr)


def _finished(
    prepared: Prepared,
    kind: str,
    new_offsets: Sequence[int],
    end: int,
    cut: int,
    shift: int,
    phdrs: list[Phdr],
    shdrs: list[Shdr],
    shoff: int,
    phoff: int | None,
    hole_end: int | None = None,
) -> Layout:
    header = elfread.parse_header(prepared.head)
    phoff = header.e_phoff if phoff is None else phoff
    head = header_with(prepared.head, e_phoff=phoff, e_phnum=len(phdrs), e_shoff=shoff)
    patches = _pointer_patches(prepared, new_offsets)
    patches.append((0, head))
    slack = phoff != header.e_phoff
    if not slack:  # the table (loaded with the first segment) changes where it is
        patches.append((phoff, b"".join(p.pack() for p in phdrs)))
    fat = prepared.fatbin
    return Layout(
        kind,
        "",
        tuple(prepared.starts),
        tuple(new_offsets),
        end,
        cut,
        shift,
        prepared.size,
        head,
        phoff,
        tuple(phdrs),
        shoff,
        tuple(shdrs),
        tuple(sorted(patches)),
        table_in_slack=slack,
        fatbin=(fat.offset, fat.addr, fat.size),
        hole_end=fat.addr + fat.size if hole_end is None else hole_end,
    )


# --------------------------------------------------------------------------------------------
# Writing


def _zero(fd: int, start: int, stop: int) -> None:
    zeros = bytes(min(_CHUNK, max(stop - start, 0)))
    while start < stop:
        start += os.pwrite(fd, zeros[: stop - start], start)


def finish_file(src_fd: int, out_fd: int, layout: Layout) -> None:
    """Complete ``out_fd`` (the original's copy, the bundles already written at their new
    places): move the tail down, zero the freed bytes, write the tables and moved pointers, and
    truncate. Raises OSError."""
    if layout.shift:
        position = layout.cut
        while position < layout.old_size:
            chunk = os.pread(src_fd, min(_CHUNK, layout.old_size - position), position)
            if not chunk:
                raise OSError(f"the original ended early at {position:#x}")
            os.pwrite(out_fd, chunk, position - layout.shift)
            position += len(chunk)
        os.ftruncate(out_fd, layout.new_size)
    fat_offset, _addr, fat_size = layout.fatbin
    if layout.compacted:  # nothing but the bundles in the range
        _zero(out_fd, layout.bundles_end, layout.cut - layout.shift if layout.shift else fat_offset + fat_size)
    for offset, data in layout.patches:
        os.pwrite(out_fd, data, layout.moved(offset))
    if layout.table_in_slack:
        os.pwrite(out_fd, b"".join(p.pack() for p in layout.phdrs), layout.phoff)
    if layout.shdrs:
        os.pwrite(out_fd, b"".join(s.pack() for s in layout.shdrs), layout.shoff)


# --------------------------------------------------------------------------------------------
# Proof


def _expected(before_fd: int, layout: Layout, offset: int, size: int) -> bytes:
    """The original's bytes at [offset, offset+size) with the planned patches laid over them."""
    data = bytearray(os.pread(before_fd, size, offset))
    if len(data) != size:
        raise FormatError("ELF", offset, "the original is shorter than planned")
    starts = [p[0] for p in layout.patches]
    index = max(bisect.bisect_right(starts, offset) - 1, 0)
    for at, patch in layout.patches[index:]:
        if at >= offset + size:
            break
        low, high = max(at, offset), min(at + len(patch), offset + size)
        if low < high:
            data[low - offset : high - offset] = patch[low - at : high - at]
    return bytes(data)


def _same(before_fd: int, after_fd: int, layout: Layout, old: int, new: int, size: int) -> bool:
    done = 0
    while done < size:
        step = min(_CHUNK, size - done)
        if _expected(before_fd, layout, old + done, step) != os.pread(after_fd, step, new + done):
            return False
        done += step
    return True


def prove(
    before_fd: int, after_fd: int, layout: Layout, digests: Sequence[str], wrapper_offsets: Sequence[int]
) -> str | None:
    """None when the new file is exactly the planned one outside the bundles (see the module
    docstring); else what differs. ``digests``: sha256 of each placed bundle as slimmed (or as it
    was); ``wrapper_offsets``: the bundle offsets the new file's wrappers reach."""
    if os.fstat(after_fd).st_size != layout.new_size:
        return "the new file has not the planned size"
    if os.pread(after_fd, 64, 0) != layout.header:
        return "the ELF header is not the planned one"
    if os.pread(after_fd, len(layout.phdrs) * PHDR_SIZE, layout.phoff) != b"".join(p.pack() for p in layout.phdrs):
        return "the program headers are not the planned ones"
    if os.pread(after_fd, len(layout.shdrs) * 64, layout.shoff) != b"".join(s.pack() for s in layout.shdrs):
        return "the section headers are not the planned ones"
    header = elfread.parse_header(os.pread(before_fd, 64, 0))
    old_loads = [p for p in read_phdrs(before_fd, header) if p.p_type == PT_LOAD]
    new_loads = [p for p in layout.phdrs if p.p_type == PT_LOAD]
    fat_offset, fat_addr, fat_size = layout.fatbin
    for load in old_loads:
        # the padding between .hip_fatbin and what follows it in a split segment is not kept
        for low, high in _minus((load.p_vaddr, load.p_vaddr + load.p_filesz), (fat_addr, layout.hole_end)):
            problem = _loaded_same(before_fd, after_fd, layout, load, new_loads, low, high)
            if problem:
                return problem
    for old, new in zip(_shdrs_of(before_fd, header), layout.shdrs, strict=True):
        if old.sh_flags & SHF_ALLOC or old.sh_type in (0, 8) or not old.sh_size:
            continue
        if new.sh_size != old.sh_size or not _same(
            before_fd, after_fd, layout, old.sh_offset, new.sh_offset, old.sh_size
        ):
            return f"a non-loaded section at {old.sh_offset:#x} changed"
    if layout.compacted and not _only_bundles(after_fd, layout, digests):
        return "bytes of .hip_fatbin outside the placed bundles are not zero"
    if sorted(wrapper_offsets) != sorted(layout.new_offsets):
        return "the wrappers of the new file do not reach the placed bundles"
    for offset, digest in zip(layout.new_offsets, digests, strict=True):
        if _digest_at(after_fd, offset, digest) is False:
            return f"the bundle at {offset:#x} is not the one proved"
    return None


def _only_bundles(fd: int, layout: Layout, digests: Sequence[str]) -> bool:
    """Whether every byte from the section's start to the cut (new offsets) that no placed bundle
    (nor the program header table) covers is zero."""
    fat_offset, _addr, fat_size = layout.fatbin
    used = sorted(
        [(o, o + int(d.split(":")[1])) for o, d in zip(layout.new_offsets, digests, strict=True)]
        + ([(layout.phoff, layout.phoff + len(layout.phdrs) * PHDR_SIZE)] if layout.table_in_slack else [])
    )
    position = fat_offset
    stop = layout.cut - layout.shift if layout.shift else fat_offset + fat_size
    for low, high in [*used, (stop, stop)]:
        while position < low:
            step = min(_CHUNK, low - position)
            if os.pread(fd, step, position).count(0) != step:
                return False
            position += step
        position = max(position, high)
    return True


def _shdrs_of(fd: int, header: elfread.ElfHeader) -> list[Shdr]:
    return read_shdr_table(fd, header)


def _minus(span: tuple[int, int], hole: tuple[int, int]) -> list[tuple[int, int]]:
    low, high = span
    parts = [(low, min(high, hole[0])), (max(low, hole[1]), high)]
    return [(a, b) for a, b in parts if a < b]


def _loaded_same(
    before_fd: int, after_fd: int, layout: Layout, load: Phdr, new_loads: list[Phdr], low: int, high: int
) -> str | None:
    position = low
    while position < high:
        holder = next(
            (p for p in new_loads if p.p_vaddr <= position < p.p_vaddr + p.p_filesz),
            None,
        )
        if holder is None:
            return f"address {position:#x} is no longer loaded from the file"
        stop = min(high, holder.p_vaddr + holder.p_filesz)
        old = load.p_offset + position - load.p_vaddr
        new = holder.p_offset + position - holder.p_vaddr
        if not _same(before_fd, after_fd, layout, old, new, stop - position):
            return f"loaded bytes near {position:#x} differ from the original's"
        position = stop
    return None


def _digest_at(fd: int, offset: int, digest_size: str) -> bool:
    hexdigest, size_text = digest_size.split(":")
    size = int(size_text)
    digest = hashlib.sha256()
    done = 0
    while done < size:
        chunk = os.pread(fd, min(_CHUNK, size - done), offset + done)
        if not chunk:
            return False
        digest.update(chunk)
        done += len(chunk)
    return digest.hexdigest() == hexdigest
