"""Plain offload bundles (formats.md 2.1): the entry table, which entries a judgement reads, and
one record per entry; also the forward search for a magic that CCOB v1 bundles end at."""

from __future__ import annotations

from rocm_audit.elf.codeobject import FileWindow, ReadAt, inspect_code_object
from rocm_audit.errors import FormatError
from rocm_audit.formats import offload_bundle
from rocm_audit.formats.offload_bundle import DEVICE_KINDS
from rocm_audit.gpu.records import (
    BUNDLE_WINDOW,
    SCAN_CHUNK,
    FileCodeObjects,
    consistency_findings,
    device_record,
    malformed,
)
from rocm_audit.tree.targets import TargetSelection


def is_amdgcn(entry_id: offload_bundle.EntryId) -> bool:
    """Entries holding AMDGPU ELF code objects (not host, SPIR-V or another offload target)."""
    return not entry_id.is_host and entry_id.triple.startswith("amdgcn-")


def read_bundle_table(read_at: ReadAt, base: int, available: int) -> offload_bundle.Bundle:
    window = min(BUNDLE_WINDOW, available)
    while True:
        buf = read_at(0, window)
        try:
            return offload_bundle.parse_bundle(buf, base, available)
        except offload_bundle.IncompleteTable as more:
            limit = min(available, offload_bundle.max_table_bytes())
            if window >= limit:
                raise FormatError(offload_bundle.FMT, base, "entry table is larger than any valid one") from None
            window = min(limit, max(window * 2, more.needed))


def wanted_entries(bundle: offload_bundle.Bundle, selection: TargetSelection | None) -> set[int] | None:
    """Indices of the entries whose code objects are read (None: all of them)."""
    if selection is None:
        return None
    named = [e.entry_id.target if e.entry_id.kind in DEVICE_KINDS else "" for e in bundle.entries]
    return {i for i in selection.wanted(named) if bundle.entries[i].entry_id.kind in DEVICE_KINDS}


def bundle_objects(
    result: FileCodeObjects,
    fh: FileWindow,
    start: int,
    available: int,
    tu: int | None,
    place: str,
    selection: TargetSelection | None,
) -> int:
    """List a plain bundle at file offset ``start``; returns its size in bytes."""
    bundle = read_bundle_table(fh.reader(start, available), start, available)
    wanted = wanted_entries(bundle, selection)
    for number, entry in enumerate(bundle.entries):
        location = f"{place} entry {number}"
        entry_start = start + entry.offset
        facts = None
        kind = entry.entry_id.kind
        if is_amdgcn(entry.entry_id) and entry.size and (wanted is None or number in wanted):
            try:
                facts = inspect_code_object(fh.reader(entry_start, entry.size), entry.size, entry_start)
            except FormatError as exc:
                malformed(result, exc, location)
        obj = device_record(
            container="offload-bundle",
            location=location,
            file_offset=entry_start,
            size=entry.size,
            tu=tu,
            entry_id=entry.entry_id.raw,
            kind=kind,
            bundle_target=entry.entry_id.target,
            facts=facts,
            listed_source="bundle-id",
        )
        result.code_objects.append(obj)
        result.findings.extend(consistency_findings(result.path, obj, facts, entry_start))
    return bundle.end


def next_magic(fh: FileWindow, start: int, end: int, magic: bytes) -> int:
    """File offset of the next ``magic`` in [start, end), else ``end`` (LLVM's CCOB v1 rule)."""
    pos = start
    while pos < end:
        chunk = fh.read(pos, min(SCAN_CHUNK, end - pos))
        if not chunk:
            break
        hit = chunk.find(magic)
        if hit >= 0:
            return pos + hit
        pos += max(len(chunk) - len(magic) + 1, 1)
    return end
