"""Slim the fat binaries of one host library in place, keeping every address.

Layout kept simple and provably safe (docs/prune.md, "--fatbins"): each slimmed bundle is written
at the start of its original place in ``.hip_fatbin``, so every wrapper pointer (its
``R_X86_64_RELATIVE`` addend or ``R_X86_64_64`` symbol value) still points at its bundle and no
relocation, symbol, section or segment changes; the bytes the bundle no longer needs are zeroed.
The file keeps its size: what shrinks is the compressed image layer (or the wheel), not the bytes
on disk. A file is refused whole, with the reason, when any wrapper points at something that is
not a bundle this code reads, when a wrapper is kpack'd (HIPK), or when a slimmed bundle would not
select byte-identical code for every setting of every kept target.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from rocm_audit.elf import read as elfread
from rocm_audit.elf.relocations import file_place, loaded_pointers
from rocm_audit.elf.sections import Section, read_sections
from rocm_audit.errors import FormatError
from rocm_audit.formats import ccob, hip_fatbin, offload_bundle
from rocm_audit.prune.fatbins.rewrite import Slimmed, prove_same_selection, slim
from rocm_audit.tree.targets import TargetId

FATBIN_SECTION = ".hip_fatbin"
WRAPPER_SECTION = ".hipFatBinSegment"
_ZERO_CHUNK = 1 << 20


class Refused(Exception):
    """The library stays as it is; the message says why."""


@dataclass(slots=True)
class BundlePlace:
    offset: int  # file offset of the bundle's first byte
    extent: int  # bytes the original bundle covers from there
    format: str  # "bundle" or "ccob-v<N>-<method>"


@dataclass(slots=True)
class BundleResult:
    place: BundlePlace
    new_size: int
    kept: tuple[str, ...]
    removed: tuple[str, ...]

    @property
    def freed(self) -> int:
        return self.place.extent - self.new_size


@dataclass(slots=True)
class LibraryResult:
    path: str
    bundles: list[BundleResult] = field(default_factory=list)

    @property
    def freed(self) -> int:
        """Bytes of device code the slimmed library no longer holds (zeroed in place)."""
        return sum(b.freed for b in self.bundles)

    @property
    def removed_targets(self) -> list[str]:
        seen: dict[str, None] = {}
        for bundle in self.bundles:
            for raw in bundle.removed:
                seen[offload_bundle.parse_entry_id(raw).target or raw] = None
        return list(seen)


def _pread(fd: int, offset: int, size: int) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise FormatError("ELF", offset, f"file ends before {size} bytes at {offset:#x}")
    return data


def _bundle_extent(fd: int, offset: int, end: int) -> tuple[int, str]:
    """How many bytes the bundle at ``offset`` covers (``end``: the section's end)."""
    head = _pread(fd, offset, min(ccob.MAX_HEADER_SIZE, end - offset))
    if head.startswith(ccob.CCOB_MAGIC):
        header = ccob.parse_header(head, offset, end - offset)
        if header.total_size is None:
            raise Refused(f"a CCOB v1 at {offset:#x} has no size field: its end cannot be proved")
        return header.total_size, f"ccob-v{header.version}-{header.method_name}"
    if head.startswith(offload_bundle.BUNDLE_MAGIC[: len(head)]) and len(head) >= 24:
        table = _pread(fd, offset, min(end - offset, offload_bundle.max_table_bytes()))
        bundle = offload_bundle.parse_bundle(table, offset, end - offset)
        return bundle.end, "bundle"
    raise Refused(f"no bundle a wrapper can register at {offset:#x}")


def _wrapper_targets(fd: int, header: elfread.ElfHeader, sections: Sequence[Section], size: int) -> list[int]:
    """File offsets each HIPF wrapper's pointer reaches, in wrapper order. Raises Refused."""
    by_name = {s.name: s for s in sections}
    segment = by_name.get(WRAPPER_SECTION)
    if segment is None or not segment.has_file_bytes:
        raise Refused(f"no {WRAPPER_SECTION}: nothing says which bundles the runtime registers")
    wrappers = hip_fatbin.parse_wrappers(_pread(fd, segment.offset, segment.size), segment.offset)
    if any(w.magic != hip_fatbin.HIPF_MAGIC for w in wrappers):
        raise Refused("kpack'd wrappers (HIPK): the device code lives in .kpack archives")
    slots = [segment.addr + w.index * hip_fatbin.WRAPPER_SIZE + 8 for w in wrappers]
    loaded = loaded_pointers(fd, header, sections, size, slots)
    offsets = []
    for wrapper, slot in zip(wrappers, slots, strict=True):
        address = loaded.get(slot) or (wrapper.binary_ptr if header.e_type == elfread.ET_EXEC else None)
        where = file_place(sections, address) if address else None
        if where is None or where[0].name != FATBIN_SECTION:
            raise Refused(f"wrapper {wrapper.index} points outside {FATBIN_SECTION}")
        offsets.append(where[1])
    return offsets


def locate(fd: int) -> tuple[Section, list[BundlePlace]]:
    """The ``.hip_fatbin`` section and each bundle a wrapper registers (once each, file order).
    Raises Refused, FormatError, OSError."""
    size = os.fstat(fd).st_size
    header = elfread.parse_header(_pread(fd, 0, 64))
    if not header.is_64 or header.endian != "<" or header.e_machine != 62:  # EM_X86_64
        raise Refused("not an x86-64 little-endian ELF file")
    sections = read_sections(fd, header, size)
    fatbin = next((s for s in sections if s.name == FATBIN_SECTION), None)
    if fatbin is None or not fatbin.has_file_bytes:
        raise Refused(f"no {FATBIN_SECTION} section")
    end = fatbin.offset + fatbin.size
    places = []
    for offset in sorted(set(_wrapper_targets(fd, header, sections, size))):
        extent, kind = _bundle_extent(fd, offset, end)
        places.append(BundlePlace(offset, extent, kind))
    for first, second in zip(places, places[1:], strict=False):
        if first.offset + first.extent > second.offset:
            raise Refused(f"the bundles at {first.offset:#x} and {second.offset:#x} overlap")
    return fatbin, places


def slim_library(
    path: str, kept: Sequence[TargetId], out_fd: int | None = None, *, level: int | None = None
) -> LibraryResult:
    """Slim every registered bundle of ``path`` for ``kept``. With ``out_fd`` (a byte-identical
    copy of the file, opened for writing) each slimmed bundle is written there and its freed tail
    zeroed; without, only the result is computed (dry run). Raises Refused, FormatError, OSError."""
    result = LibraryResult(path)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        _fatbin, places = locate(fd)
        for place in places:
            original = _pread(fd, place.offset, place.extent)
            slimmed: Slimmed = slim(original, kept, level)
            if not slimmed.removed:
                result.bundles.append(BundleResult(place, place.extent, slimmed.kept, ()))
                continue
            if len(slimmed.data) >= place.extent:
                result.bundles.append(BundleResult(place, place.extent, slimmed.kept + slimmed.removed, ()))
                continue  # recompression gained nothing: leave this bundle as it is
            problem = prove_same_selection(original, slimmed.data, kept)
            if problem is not None:
                raise Refused(f"bundle at {place.offset:#x}: {problem}")
            if out_fd is not None:
                _write_in_place(out_fd, place, slimmed.data)
            result.bundles.append(BundleResult(place, len(slimmed.data), slimmed.kept, slimmed.removed))
    finally:
        os.close(fd)
    return result


def _write_in_place(out_fd: int, place: BundlePlace, data: bytes) -> None:
    """The slimmed bundle at the original's start, zeros after it to the original's end; read
    back to make sure the bytes landed."""
    os.pwrite(out_fd, data, place.offset)
    position, end = place.offset + len(data), place.offset + place.extent
    zeros = bytes(min(_ZERO_CHUNK, end - position))
    while position < end:
        position += os.pwrite(out_fd, zeros[: end - position], position)
    if os.pread(out_fd, len(data), place.offset) != data:
        raise OSError(f"the slimmed bundle at {place.offset:#x} did not read back as written")


def unchanged_outside(before_fd: int, after_fd: int, result: LibraryResult) -> str | None:
    """None when the two files differ only inside the bundles' original places (so every
    relocation, dynamic entry, symbol and header points at the same bytes), else the first
    offset where they differ."""
    size = os.fstat(before_fd).st_size
    if os.fstat(after_fd).st_size != size:
        return "the sizes differ"
    ranges = sorted((b.place.offset, b.place.offset + b.place.extent) for b in result.bundles)
    position = 0
    for start, stop in [*ranges, (size, size)]:
        while position < start:
            step = min(_ZERO_CHUNK, start - position)
            if os.pread(before_fd, step, position) != os.pread(after_fd, step, position):
                return f"bytes differ near {position:#x}, outside every bundle"
            position += step
        position = max(position, stop)
    return None


__all__ = ["BundlePlace", "BundleResult", "LibraryResult", "Refused", "locate", "slim_library"]
