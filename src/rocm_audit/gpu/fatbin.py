"""``.hip_fatbin`` (formats.md 2.9): one container per translation unit, located from the headers
alone, then read in file order, CCOBs shared with forked helpers when there is much to inflate."""

from __future__ import annotations

from dataclasses import dataclass

from rocm_audit.elf.codeobject import FileWindow
from rocm_audit.elf.sections import Section
from rocm_audit.errors import FormatError
from rocm_audit.formats import ccob, offload_bundle
from rocm_audit.gpu.bundles import bundle_objects, read_bundle_table
from rocm_audit.gpu.ccob_stream import ccob_extent, ccob_objects, indexable
from rocm_audit.gpu.records import SCAN_CHUNK, FileCodeObjects, malformed
from rocm_audit.tree.targets import TargetSelection

# The smallest alignment of a TU's .hip_fatbin input section clang has used (8 before LLVM 12's 4096).
TU_SECTION_MIN_ALIGN = 8


def first_nonzero(fh: FileWindow, pos: int, end: int) -> int:
    """File offset of the first non-zero byte in [pos, end), else ``end``. Reads grow from 4 KiB to
    SCAN_CHUNK: padding between TUs is under 4 KiB, and a whole chunk per gap read 45 MiB of the
    jax plugin's 45 bundles for nothing."""
    step = 4096
    while pos < end:
        chunk = fh.read(pos, min(step, end - pos))
        if not chunk:
            return end
        rest = chunk.lstrip(b"\0")
        if rest:
            return pos + len(chunk) - len(rest)
        pos += len(chunk)
        step = min(step * 2, SCAN_CHUNK)
    return end


@dataclass(frozen=True, slots=True)
class Container:
    """One container found in ``.hip_fatbin`` (or the error that ended the walk there)."""

    kind: str  # offload-bundle | ccob | error
    pos: int
    available: int  # section bytes from pos on
    tu: int
    place: str
    inflated: int = 0  # the work of reading it: declared inflated bytes, or INDEX_WORK_PER_BYTE x compressed
    size: int = 0  # its bytes in the section, as its header gives them (0: not located)
    error: FormatError | None = None  # kind "error": bytes that start no container


# Inflating CCOBs is the work; above this many declared bytes in one section, helpers share it.
PARALLEL_INFLATE_BYTES = 256 << 20
# Indexing a compressed byte costs about what inflating 32 does (jax's PJRT plugin: 8.6 ns per
# compressed byte to index, 0.23 ns per byte to inflate), so an indexed CCOB weighs 32x its size.
INDEX_WORK_PER_BYTE = 32


def walk_fatbin(
    result: FileCodeObjects,
    fh: FileWindow,
    section: Section,
    selection: TargetSelection | None,
    label: str = ".hip_fatbin",
) -> int:
    """Each container in ``.hip_fatbin`` is one translation unit; returns how many were read.

    First the containers are located from their headers alone (a CCOB's header gives its size);
    then each is read, CCOBs in forked helpers as well as here when there is much to inflate (each
    stream is one zstd frame, so one stream cannot be split, but bundles can). Results are merged
    in file order. A container that fails to read (a corrupt stream, an entry past its end) is a
    finding and its TU keeps what was listed before the failure; the containers after it are still
    read, since each was located from its own header and the runtime registers every TU's bundle
    on its own (a TU past a corrupt one loads as it would without it)."""
    return read_containers(result, fh, locate_containers(fh, section, label), selection)


def read_containers(
    result: FileCodeObjects, fh: FileWindow, located: list[Container], selection: TargetSelection | None
) -> int:
    """Read located containers as translation units, in order (``walk_fatbin``); returns how many."""
    items = [c for c in located if c.kind != "error"]
    weight = sum(c.inflated for c in items)
    from rocm_audit.tree.forkmap import fork_imap, worker_count  # noqa: PLC0415 - fork helpers only when needed

    workers = (
        worker_count(weight, PARALLEL_INFLATE_BYTES) if fh.inflates and sum(c.kind == "ccob" for c in items) > 1 else 1
    )
    if workers > 1:
        ccob.release_shared_decompressor()  # each process then holds only its own window

    def read(container: Container) -> tuple[FileCodeObjects, int, tuple[str, int, str] | None]:
        partial = FileCodeObjects(result.path, result.sdk_tree, result.file_kind)
        size = 0
        try:
            if container.kind == "offload-bundle":
                partial.add_container("offload-bundle")
                size = bundle_objects(
                    partial, fh, container.pos, container.available, container.tu, container.place, selection
                )
            else:
                size = ccob_objects(
                    partial, fh, container.pos, container.available, container.tu, container.place, selection
                )
        except FormatError as exc:  # sent back as data: an exception does not pickle its fields
            return partial, size, (exc.fmt, exc.offset, exc.reason)
        return partial, size, None

    answers: dict[int, tuple[FileCodeObjects, int, tuple[str, int, str] | None]] = dict(
        fork_imap(read, items, [c.inflated for c in items], workers)
    )
    tu = 0
    for number, container in enumerate(items):
        partial, size, error = answers[number]
        for name in partial.containers:
            result.add_container(name)
        result.code_objects.extend(partial.code_objects)
        result.findings.extend(partial.findings)
        tu += 1
        if error is not None:
            malformed(result, FormatError(*error), container.place)
            size = container.size  # what its header claims: the TU's place in the list is kept
        result.bundles.append((container.pos, size, container.kind))
    if located and located[-1].error is not None:
        malformed(result, located[-1].error, located[-1].place)
    return tu


def container_at(fh: FileWindow, head: bytes, pos: int, end: int, tu: int, place: str) -> Container | None:
    """The bundle or CCOB starting at ``pos`` (``head``: its first bytes), located from its header
    alone; None when no magic starts there. Raises FormatError for a header that does not hold."""
    if head.startswith(offload_bundle.BUNDLE_MAGIC):
        size = read_bundle_table(fh.reader(pos, end - pos), pos, end - pos).end
        return Container("offload-bundle", pos, end - pos, tu, place, size=size)
    if head.startswith(ccob.CCOB_MAGIC):
        header, size = ccob_extent(fh, pos, end - pos)
        compressed = size - header.header_size
        work = compressed * INDEX_WORK_PER_BYTE if indexable(header, compressed) else header.uncompressed_size
        return Container("ccob", pos, end - pos, tu, place, inflated=work, size=size)
    return None


def _no_container_reason(head: bytes, at: int, padding_from: int | None, start: int) -> str:
    """Why no container starts at section offset ``at`` (``head``: its first bytes)."""
    if padding_from is None:
        return f"no bundle or CCOB magic at section offset {at:#x}"
    after = f"after zero padding from section offset {padding_from - start:#x}"
    if head.startswith((offload_bundle.BUNDLE_MAGIC, ccob.CCOB_MAGIC)):
        # Only a linker's padding comes before a TU here, and it aligns each TU's section.
        return f"container magic at section offset {at:#x} {after} is not {TU_SECTION_MIN_ALIGN}-aligned"
    return f"no bundle or CCOB magic at section offset {at:#x}, the first non-zero byte {after}"


def locate_containers(fh: FileWindow, section: Section, label: str = ".hip_fatbin") -> list[Container]:
    """The containers of ``.hip_fatbin`` from their headers, in file order.

    Containers follow each other directly (LLVM's CCOB search) or after zero padding, which the
    linker leaves to align each TU's input section: 4096 bytes since LLVM 12, 8 before
    (tensorflow-rocm 2.2 and 2.4 hold 216 and 229 bundles 8 bytes apart). So the next container
    starts at the first non-zero byte after the padding, which must be 8-aligned within the section
    and begin with a magic. A container that cannot be located ends the list as an ``error`` entry."""
    start, end = section.offset, section.offset + section.size
    pos = start
    found: list[Container] = []
    while pos < end:
        head = fh.read(pos, min(32, end - pos))
        is_container = head.startswith((offload_bundle.BUNDLE_MAGIC, ccob.CCOB_MAGIC))
        padding_from = None
        if not is_container:
            first = first_nonzero(fh, pos, end)
            if first >= end:
                break  # padding to the end of the section
            if first > pos:
                # Padding: the next container (or what stands in its place) starts at the first
                # non-zero byte, which is what a finding names, aligned or not.
                padding_from, pos = pos, first
                head = fh.read(pos, min(32, end - pos))
                aligned = (first - start) % TU_SECTION_MIN_ALIGN == 0
                is_container = aligned and head.startswith((offload_bundle.BUNDLE_MAGIC, ccob.CCOB_MAGIC))
        place = f"{label}+{pos - start:#x}"
        tu = len(found)
        try:
            container = container_at(fh, head, pos, end, tu, place) if is_container else None
            if container is None:
                raise FormatError(label, pos, _no_container_reason(head, pos - start, padding_from, start))
            found.append(container)
            size = container.size
        except FormatError as exc:
            if is_container:
                # Its own reader meets the same error when the containers are read, in order.
                kind = "offload-bundle" if head.startswith(offload_bundle.BUNDLE_MAGIC) else "ccob"
                found.append(Container(kind, pos, end - pos, tu, place))
            else:
                found.append(Container("error", pos, end - pos, tu, place, error=exc))
            break
        pos += max(size, 1)
    return found
