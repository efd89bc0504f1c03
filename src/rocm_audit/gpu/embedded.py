"""Raw AMDGPU ELFs (a standalone code object, or one embedded in a data section) and the offload
bundles and CCOBs embedded in data sections that programs load with ``hipModuleLoadData``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rocm_audit.elf import search as bytesearch
from rocm_audit.elf.codeobject import ChunkWindow, CodeObjectFacts, FileWindow, inspect_code_object
from rocm_audit.elf.sections import SHF_EXECINSTR, Section
from rocm_audit.errors import FormatError
from rocm_audit.formats import amdgpu_elf, ccob, offload_bundle
from rocm_audit.formats.offload_bundle import DEVICE_KINDS
from rocm_audit.gpu.bundles import bundle_objects
from rocm_audit.gpu.ccob_stream import ccob_objects, next_ccob
from rocm_audit.gpu.records import (
    BUNDLE_WINDOW,
    SCAN_CHUNK,
    CodeObject,
    FileCodeObjects,
    consistency_findings,
    device_record,
    malformed,
)
from rocm_audit.tree.targets import TargetSelection

MAX_EMBEDDED = 4096
MAX_EMBEDDED_IMAGES = 16384  # embedded bundles/CCOBs per file; tensorflow-rocm 2.14 holds 1,149
MAX_EMBEDDED_ENTRIES = 256  # real bundles carry a host entry and up to ~30 targets (jax: 28 entries)
RAW_ELF_SIGNATURE = b"\x7fELF\x02\x01\x01"  # 64-bit, LSB, EV_CURRENT: AMDGPU code objects
EMBEDDED_SECTION_PREFIXES = (".rodata", ".data", ".ldata", ".lrodata")  # HSA runtime: .data


def raw_elf_object(
    result: FileCodeObjects,
    fh: FileWindow,
    start: int,
    size: int,
    container: str,
    place: str,
    tu: int | None,
) -> CodeObject | None:
    try:
        facts = inspect_code_object(fh.reader(start, size), size, start)
    except FormatError as exc:
        malformed(result, exc, place)
        return None
    return _raw_elf_record(result, start, size, container, place, tu, facts)


def _raw_elf_record(
    result: FileCodeObjects, start: int, size: int, container: str, place: str, tu: int | None, facts: CodeObjectFacts
) -> CodeObject:
    obj = device_record(
        container=container,
        location=place,
        file_offset=start,
        size=size,
        tu=tu,
        entry_id=None,
        kind="device",
        bundle_target=None,
        facts=facts,
        listed_source="none",
    )
    result.code_objects.append(obj)
    result.findings.extend(consistency_findings(result.path, obj, facts, start))
    return obj


@dataclass(frozen=True, slots=True)
class _EmbeddedImage:
    """A bundle or CCOB found in a data section whose header validated: a hipModuleLoadData image."""

    kind: str  # offload-bundle | ccob
    pos: int
    available: int  # section bytes from pos on: every entry must lie inside the section
    place: str  # "<section>+<offset in it>", how findings name the image


def _embedded_bundle(window: ChunkWindow, at: int, available: int) -> offload_bundle.Bundle | None:
    """The entry table of a plain bundle at ``at``, or None when the magic is not followed by one.

    Libraries that parse bundles (clang, LLVM, the HIP runtime) hold the magic as a string, so only
    a table that fully validates counts: at most ``MAX_EMBEDDED_ENTRIES`` entries, every entry inside
    the section, every id one a bundle writer produces (checked record by record: garbage is
    rejected at its first bad record), and at least one entry the HIP runtime could load."""
    read_at = window.reader(at, available)
    length = min(BUNDLE_WINDOW, available)
    limit = min(
        available,
        offload_bundle.HEADER_SIZE
        + MAX_EMBEDDED_ENTRIES * (offload_bundle.ENTRY_FIXED_SIZE + offload_bundle.MAX_ID_BYTES),
    )
    while True:
        try:
            bundle = offload_bundle.parse_bundle(
                read_at(0, length), at, available, written_ids_only=True, max_entries=MAX_EMBEDDED_ENTRIES
            )
        except offload_bundle.IncompleteTable as more:
            if length >= limit:
                return None
            length = min(limit, max(length * 2, more.needed))
        except FormatError:
            return None
        else:
            return bundle if any(entry.entry_id.kind in DEVICE_KINDS for entry in bundle.entries) else None


def _embedded_ccob(fh: FileWindow, window: ChunkWindow, at: int, end: int) -> int | None:
    """How far to step over a CCOB at ``at`` whose header validates (known version and method,
    sizes inside the section and in proportion, the payload starting as a zstd or zlib stream), else
    None: its size; for v1, which records none, its header only (what follows its stream is not
    known without inflating it, and may be another image)."""
    try:
        header = ccob.parse_header(window.read(at, ccob.MAX_HEADER_SIZE), at, end - at)
    except FormatError:
        return None
    total = header.total_size if header.total_size is not None else next_ccob(fh, at + 4, end) - at
    compressed = total - header.header_size
    if compressed <= 0 or header.uncompressed_size < ccob.MIN_BUNDLE_BYTES:
        return None
    if not ccob.plausible_size(header, compressed):
        return None
    if not ccob.starts_a_frame(header, window.read(at + header.header_size, 8)):
        return None
    return total if header.total_size is not None else header.header_size


def _next_hit(window: ChunkWindow, magic: bytes, pos: int) -> int:
    """File offset of ``magic`` at or after ``pos`` inside the window, else -1."""
    hit = bytesearch.find(window.data, magic, pos - window.start)
    return window.start + hit if hit >= 0 else -1


@dataclass(slots=True)
class _Found:
    """What the search of a file's data sections accepted, in file order."""

    images: list[_EmbeddedImage] = field(default_factory=list)
    elfs: list[tuple[int, int, str, CodeObjectFacts]] = field(default_factory=list)  # recorded last


def embedded_images(
    result: FileCodeObjects,
    fh: FileWindow,
    sections: Sequence[Section],
    selection: TargetSelection | None,
    *,
    with_elfs: bool,
    registered: frozenset[int] = frozenset(),
) -> None:
    """Device images in data sections: offload bundles and CCOBs (loaded by hipModuleLoadData:
    tensorflow's MLIR kernels, ``.incbin``'d ``--genco`` output) and raw AMDGPU ELFs (HSA runtime
    blit kernels, Mojo kernels; only with ``with_elfs``, when no fat binary serves as the TU list).

    One pass per section over a streamed window looks for the three magics at once; an accepted
    image is stepped over, so a code object inside an uncompressed bundle is not also counted as
    an embedded ELF. Each bundle or CCOB is one unit (the runtime loads it as one module and picks
    an entry for the device from it), numbered after the fat binary's TUs; the raw ELFs together
    are one more, last (the program picks one of them itself: any that serves the device will do).
    A magic whose header does not validate is data and gives nothing; an image whose header
    validates but whose payload then fails is ARCH004 naming its place, and the next is read."""
    found = _Found()
    # Each magic is a search of the whole section (elf/search.py: memmem, about 0.3 ms per MB for
    # a 4-byte magic): the ELF magic is looked for only where raw ELFs can count.
    magics = (ccob.CCOB_MAGIC, offload_bundle.BUNDLE_MAGIC) + ((RAW_ELF_SIGNATURE,) if with_elfs else ())
    for section in sections:
        if not section.has_file_bytes or section.flags & SHF_EXECINSTR:
            continue
        if section.name.startswith(EMBEDDED_SECTION_PREFIXES):
            _search_section(result, fh, section, magics, registered, found)
    _record_units(result, fh, found, selection)


def _search_section(
    result: FileCodeObjects,
    fh: FileWindow,
    section: Section,
    magics: tuple[bytes, ...],
    registered: frozenset[int],
    found: _Found,
) -> None:
    """Add the images one data section holds to ``found`` (``embedded_images``)."""
    overlap = max(len(m) for m in magics) - 1
    start, end = section.offset, section.offset + section.size
    pos = start
    # One chunk serves the search and the objects inside it: Mojo libraries hold a thousand
    # code objects in 24 MB, and reading a fresh 1 MiB chunk after each of them copied 1.3 GB.
    window = ChunkWindow(fh)
    hits = [-1] * len(magics)  # next hit of each magic in the window, -1 once none is left in it
    while pos < end and len(found.images) < MAX_EMBEDDED_IMAGES:
        if not window.holds(pos, 1):
            window.load(pos, min(SCAN_CHUNK, end - pos))
            if not window.data:
                break
            hits = [_next_hit(window, m, pos) for m in magics]
        for index, magic in enumerate(magics):
            if 0 <= hits[index] < pos:
                hits[index] = _next_hit(window, magic, pos)
        live = [h for h in hits if h >= 0]
        if not live:
            if window.start + len(window.data) >= end:
                break
            # the next window starts early enough to see a magic cut by this one's end
            pos = max(pos, window.start + len(window.data) - overlap)
            window.data = b""
            continue
        at = min(live)
        place = f"{section.name}+{at - start:#x}"
        step = _accept(result, fh, window, magics[hits.index(at)], at, end, place, registered, found)
        pos = at + step


def _accept(
    result: FileCodeObjects,
    fh: FileWindow,
    window: ChunkWindow,
    magic: bytes,
    at: int,
    end: int,
    place: str,
    registered: frozenset[int],
    found: _Found,
) -> int:
    """Add the image whose ``magic`` starts at ``at`` when its header validates; returns how far
    to step (1 for a magic that starts no image)."""
    if magic is ccob.CCOB_MAGIC:
        size = _embedded_ccob(fh, window, at, end)
        if size is None:
            return 1
        if at not in registered:
            found.images.append(_EmbeddedImage("ccob", at, end - at, place))
        return size
    if magic is offload_bundle.BUNDLE_MAGIC:
        bundle = _embedded_bundle(window, at, end - at)
        if bundle is None:
            return 1
        if at not in registered:  # a registered fat binary is a TU already
            found.images.append(_EmbeddedImage("offload-bundle", at, end - at, place))
        return bundle.end
    if len(found.elfs) >= MAX_EMBEDDED:
        return 1
    head = window.read(at, amdgpu_elf.ELF64_HEADER_SIZE)
    if not amdgpu_elf.is_amdgpu_elf(head):
        return 1
    try:
        extent = amdgpu_elf.parse_header(head, at).min_size
    except FormatError:
        extent = 0
    if not 0 < extent <= end - at:
        return 1
    try:
        found.elfs.append((at, extent, place, inspect_code_object(window.reader(at, extent), extent, at)))
    except FormatError as exc:
        malformed(result, exc, place)
        return 1
    return extent


def _record_units(result: FileCodeObjects, fh: FileWindow, found: _Found, selection: TargetSelection | None) -> None:
    """Read each accepted bundle or CCOB as one unit after the fat binary's; the raw ELFs last."""
    images = found.images
    first = result.tu_count
    for number, image in enumerate(images):
        tu = first + number
        result.unit_places[tu] = image.place
        result.add_container(f"embedded-{image.kind}")
        try:
            if image.kind == "offload-bundle":
                size = bundle_objects(result, fh, image.pos, image.available, tu, image.place, selection)
            else:
                size = ccob_objects(result, fh, image.pos, image.available, tu, image.place, selection)
        except FormatError as exc:
            malformed(result, exc, f"embedded image at {image.place} (file offset {image.pos:#x})")
            size = 0  # not read: the unit keeps its place in the list
        result.bundles.append((image.pos, size, image.kind))
    result.tu_count = first + len(images)
    if found.elfs:
        tu = result.tu_count
        result.add_container("embedded-elf")
        for at, extent, place, facts in found.elfs:
            _raw_elf_record(result, at, extent, "embedded-elf", place, tu, facts)
        if images:
            result.unit_places[tu] = "the raw AMDGPU ELFs in data sections"
        result.tu_count += 1
