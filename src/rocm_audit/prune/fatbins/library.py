"""Slim the fat binaries of one host library, keeping every virtual address.

Each registered bundle is slimmed (rewrite.py) and proved to select byte-identical code for every
setting of every kept target; the slimmed bundles are then compacted at the start of
``.hip_fatbin`` and the freed bytes leave the file (layout.py: "truncated" or "split"), or, where
no layout allows that, stay as zeros ("zeroed"). A file is refused whole, with the reason, when
any wrapper points at something that is not a bundle this code reads, when a wrapper is kpack'd
(HIPK), when a relocation or symbol points inside ``.hip_fatbin`` but not at a bundle's start,
or when a slimmed bundle would not select the same code.
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from rocm_audit.elf import read as elfread
from rocm_audit.elf.relocations import file_place, loaded_pointers
from rocm_audit.elf.sections import Section, read_sections
from rocm_audit.errors import FormatError
from rocm_audit.formats import ccob, hip_fatbin, offload_bundle
from rocm_audit.prune.fatbins import layout as layouts
from rocm_audit.prune.fatbins.comgr import ComgrProof
from rocm_audit.prune.fatbins.rewrite import Slimmed, prove_same_selection, slim
from rocm_audit.tree.targets import TargetId

FATBIN_SECTION = ".hip_fatbin"
WRAPPER_SECTION = ".hipFatBinSegment"
_ZERO_CHUNK = 1 << 20
# Bundles slimmed at once at most: each holds its own index, compressor and decompressor (up to
# about 40 MB for the largest of jax's plugin), and the whole run must stay under 150 MB.
MAX_WORKERS = 4


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
    plan: layouts.Layout | None = None  # where everything goes in the new file
    digests: list[str] = field(default_factory=list)  # "sha256:size" of each placed bundle

    @property
    def freed(self) -> int:
        """Bytes of device code the slimmed library no longer holds."""
        return sum(b.freed for b in self.bundles)

    @property
    def layout(self) -> str:
        """ "truncated", "split" or "zeroed" (layout.py)."""
        return self.plan.kind if self.plan is not None else layouts.ZEROED

    @property
    def saved(self) -> int:
        """Bytes the file itself shrinks by (0 when zeroed)."""
        return self.plan.shift if self.plan is not None else 0

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
        total = header.total_size
        if total is None:  # v1: its compressed stream's own end (formats/ccob.py)
            total = ccob.v1_total_size(header, lambda at, size: os.pread(fd, size, offset + at), end - offset)
        return total, f"ccob-v{header.version}-{header.method_name}"
    if head.startswith(offload_bundle.BUNDLE_MAGIC[: len(head)]) and len(head) >= 24:
        table = _pread(fd, offset, min(end - offset, offload_bundle.max_table_bytes()))
        bundle = offload_bundle.parse_bundle(table, offset, end - offset)
        return bundle.end, "bundle"
    raise Refused(f"no bundle a wrapper can register at {offset:#x}")


def _wrapper_targets(
    fd: int, header: elfread.ElfHeader, sections: Sequence[Section], size: int
) -> tuple[list[int], list[int]]:
    """File offsets each HIPF wrapper's pointer reaches, and the wrappers' pointer slots (vaddrs),
    in wrapper order. Raises Refused."""
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
    return offsets, slots


def wrapper_offsets(fd: int) -> list[int]:
    """The file offsets the wrappers of the library open at ``fd`` reach. Raises Refused,
    FormatError."""
    header = elfread.parse_header(_pread(fd, 0, 64))
    size = os.fstat(fd).st_size
    return _wrapper_targets(fd, header, read_sections(fd, header, size), size)[0]


def locate(fd: int) -> tuple[Section, list[BundlePlace]]:
    """The ``.hip_fatbin`` section and each bundle a wrapper registers (once each, file order).
    Raises Refused, FormatError, OSError."""
    fatbin, places, _slots = _locate(fd)
    return fatbin, places


def _locate(fd: int) -> tuple[Section, list[BundlePlace], list[int]]:
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
    targets, slots = _wrapper_targets(fd, header, sections, size)
    for offset in sorted(set(targets)):
        extent, kind = _bundle_extent(fd, offset, end)
        places.append(BundlePlace(offset, extent, kind))
    for first, second in zip(places, places[1:], strict=False):
        if first.offset + first.extent > second.offset:
            raise Refused(f"the bundles at {first.offset:#x} and {second.offset:#x} overlap")
    return fatbin, places, slots


def check_library(path: str) -> None:
    """Meet, without slimming anything, the refusals ``slim_library`` meets first: not an x86-64
    ELF file, no ``.hip_fatbin``, wrappers that reach no bundle, kpack'd wrappers, overlapping
    bundles. Reads the headers and the wrappers only (the layout's refusals need every
    relocation read: about 0.9 s on jax's plugin, so they wait for the slimming). Raises Refused,
    FormatError, OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        _locate(fd)
    finally:
        os.close(fd)


def workers_for(bundles: int) -> int:
    """Bundles slimmed at once: one per core, at most MAX_WORKERS, never more than there are."""
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS, bundles))


def _slim_and_prove(
    fd: int, place: BundlePlace, kept: Sequence[TargetId], level: int | None, spool_dir: str | None
) -> tuple[Slimmed, str | None]:
    """One bundle's work that needs nothing from the others (run on a worker thread): slim it
    and, where it changed and got smaller, prove it selects the same code. Returns the slimmed
    bundle (its spools open: the caller closes them) and the proof's problem, or None."""
    made = slim(fd, place.offset, place.extent, kept, level, spool_dir)
    try:
        problem = None
        if made.removed and made.size < place.extent:
            problem = prove_same_selection(made, kept)
        return made, problem
    except BaseException:
        made.close()
        raise


def slim_library(
    path: str,
    kept: Sequence[TargetId],
    out_fd: int | None = None,
    *,
    level: int | None = None,
    spool_dir: str | None = None,
    comgr: ComgrProof | None = None,
    workers: int | None = None,
) -> LibraryResult:
    """Slim every registered bundle of ``path`` for ``kept``. With ``out_fd`` (a byte-identical
    copy of the file, opened for reading and writing) the new file is written there, shrunk as
    ``result.layout`` says; without, only the result is computed (dry run). Prove the copy with
    ``prove_file`` before it replaces anything. No bundle is held in memory: a plain one is copied
    by ranges, a CCOB inflated and compressed through temporary files in ``spool_dir`` (default:
    the temporary directory). ``comgr``: a comgr child that must pick the same code from each
    slimmed bundle (comgr.py). ``workers``: bundles slimmed at once (default ``workers_for``);
    whatever the number, the bundles are placed, checked by comgr and written in file order, so
    the new file, the result and the first refusal are the same. Raises Refused, FormatError,
    OSError, ComgrError."""
    result = LibraryResult(path)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        fatbin, places, slots = _locate(fd)
        try:
            prepared = layouts.prepare(fd, [place.offset for place in places], slots)
        except layouts.LayoutRefused as exc:
            raise Refused(str(exc)) from None
        count = workers_for(len(places)) if workers is None else max(1, min(workers, len(places)))
        cursor = fatbin.offset
        offsets: list[int] = []
        sizes: list[int] = []
        # Up to ``count`` bundles are slimmed at once (the index, python-zstandard and hashlib let
        # go of the GIL); at most ``count`` results wait, their bundles in spools on disk, so
        # memory holds ``count`` bundles' working sets at most (docs/prune.md, "--fatbins").
        pool = ThreadPoolExecutor(count, thread_name_prefix="fatbin") if count > 1 else None
        pending: deque[Future[tuple[Slimmed, str | None]]] = deque()
        submitted = 0
        try:
            for index, place in enumerate(places):
                if pool is None:
                    made, problem = _slim_and_prove(fd, place, kept, level, spool_dir)
                else:
                    while submitted < len(places) and len(pending) < count:
                        pending.append(pool.submit(_slim_and_prove, fd, places[submitted], kept, level, spool_dir))
                        submitted += 1
                    made, problem = pending.popleft().result()
                with made:
                    bundle, slimmed = _placed(fd, place, made, problem, comgr)
                    result.bundles.append(bundle)
                    size = bundle.new_size
                    at = prepared.place(cursor, index)
                    if out_fd is not None:
                        if prepared.compacts:  # the padding before the bundle holds nothing
                            _zero_tail(out_fd, cursor, at)
                        moved = slimmed is made or at != place.offset
                        result.digests.append(_write_slimmed(out_fd, at, slimmed, write=moved))
                        if slimmed is made and not prepared.compacts:
                            _zero_tail(out_fd, at + size, place.offset + place.extent)
                offsets.append(at)
                sizes.append(size)
                cursor = at + size
        finally:
            if pool is not None:
                _drain(pool, pending)
        result.plan = layouts.plan(prepared, offsets, sizes)
        if out_fd is not None:
            layouts.finish_file(fd, out_fd, result.plan)
    finally:
        os.close(fd)
    return result


def _placed(
    fd: int, place: BundlePlace, made: Slimmed, problem: str | None, comgr: ComgrProof | None
) -> tuple[BundleResult, Slimmed]:
    """What goes into the bundle's place: the slimmed bundle once every proof holds, else the
    original itself, copied by ranges from the source file (nothing to remove, or recompression
    gained nothing). Raises Refused when a proof fails (``problem``, or comgr's)."""
    original = Slimmed(place.extent, made.kept, (), made.compressed, [(fd, place.offset, place.extent)])
    if not made.removed:
        return BundleResult(place, place.extent, made.kept, ()), original
    if made.size >= place.extent:
        return BundleResult(place, place.extent, made.kept + made.removed, ()), original
    if problem is None and comgr is not None and comgr.queries:
        problem = comgr.check_slimmed(made)
    if problem is not None:
        raise Refused(f"bundle at {place.offset:#x}: {problem}")
    return BundleResult(place, made.size, made.kept, made.removed), made


def _drain(pool: ThreadPoolExecutor, pending: deque[Future[tuple[Slimmed, str | None]]]) -> None:
    """Stop the workers after a refusal or an error (or at the end): bundles not started are
    cancelled, those running are waited for (they read the source descriptor) and their spools
    closed; their errors are dropped, as a serial run would never have reached them."""
    for future in pending:
        future.cancel()
    pool.shutdown(wait=True)
    for future in pending:
        if not future.cancelled() and future.exception() is None:
            future.result()[0].close()


def _write_slimmed(out_fd: int, offset: int, slimmed: Slimmed, *, write: bool = True) -> str:
    """Write the slimmed bundle at ``offset`` (unless it is already there); read it back 1 MiB at
    a time to make sure the bytes landed. Returns "sha256:size" of what was written."""
    if write:
        slimmed.write(out_fd, offset)
    digest = hashlib.sha256()
    position = offset
    for chunk in slimmed.chunks():
        if os.pread(out_fd, len(chunk), position) != chunk:
            raise OSError(f"the slimmed bundle at {offset:#x} did not read back as written")
        digest.update(chunk)
        position += len(chunk)
    return f"{digest.hexdigest()}:{slimmed.size}"


def _zero_tail(out_fd: int, position: int, end: int) -> None:
    zeros = bytes(min(_ZERO_CHUNK, max(end - position, 0)))
    while position < end:
        position += os.pwrite(out_fd, zeros[: end - position], position)


def prove_file(before_fd: int, after_fd: int, result: LibraryResult) -> str | None:
    """None when the new file at ``after_fd`` is what ``result`` planned (layout.py, "Proof"),
    else what differs."""
    if result.plan is None:
        return "nothing was planned"
    try:
        reached = wrapper_offsets(after_fd)
    except (Refused, FormatError) as exc:
        return f"the new file's wrappers cannot be read: {exc}"
    try:
        return layouts.prove(before_fd, after_fd, result.plan, result.digests, reached)
    except FormatError as exc:
        return f"the new file cannot be read: {exc}"


__all__ = [
    "BundlePlace",
    "BundleResult",
    "LibraryResult",
    "Refused",
    "check_library",
    "locate",
    "prove_file",
    "slim_library",
    "workers_for",
]
