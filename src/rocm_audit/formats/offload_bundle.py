"""Uncompressed clang offload bundle (``__CLANG_OFFLOAD_BUNDLE__``) and bundle entry IDs.

Layout: formats.md 2.2 [LLVM: clang/lib/Driver/OffloadBundler.cpp,
clang/docs/ClangOffloadBundler.rst];
entry IDs: formats.md 2.3. Unlike clang's reader, which silently stops at the first bad entry, every
bound is checked and reported.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from rocm_audit.errors import FormatError

FMT = "offload bundle"
BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
# Entry kinds the HIP runtime may load on a GPU (comgr's lookup takes hip, hipv4 and hcc ids);
# "device" is what the code-object scan calls an entry with no bundle id (raw ELF, kpack kernel).
DEVICE_KINDS = ("hip", "hipv4", "hcc", "device")
HEADER_SIZE = 32  # magic + u64 entry count
ENTRY_FIXED_SIZE = 24  # u64 offset, u64 size, u64 id length
MAX_ENTRIES = 4096  # far above the ~30 targets real bundles carry; bounds the table we read
MAX_ID_BYTES = 1024
BUNDLE_ALIGN = 4096  # HIP fat binaries use -bundle-align=4096 (formats.md 2.2)


class IncompleteTable(FormatError):
    """The entry table continues past the bytes given; retry with at least ``needed`` bytes."""

    def __init__(self, offset: int, needed: int) -> None:
        super().__init__(FMT, offset, f"entry table needs {needed} bytes")
        self.needed = needed


@dataclass(frozen=True, slots=True)
class EntryId:
    """A parsed bundle entry ID ``<kind>-<triple>[-<target-id>]``."""

    raw: str
    kind: str
    triple: str
    target: str | None  # target ID, trailing-dash artefacts removed; None for host entries

    @property
    def is_host(self) -> bool:
        return self.kind == "host"


_FEATURE_TAIL = re.compile(r":(sramecc|xnack)-$")


def _strip_trailing_dashes(text: str) -> str:
    """LLVM 19 writes ``gfx950-`` for a processor it does not know; ``xnack-`` is a real feature."""
    while text.endswith("-") and not _FEATURE_TAIL.search(text):
        text = text[:-1]
    return text


def parse_entry_id(raw: str) -> EntryId:
    """Split an entry ID; tolerant of both triple spellings, trailing dashes and NUL padding."""
    text = raw.rstrip("\0")
    kind, _, rest = text.partition("-")
    if kind == "host":
        return EntryId(text, kind, _strip_trailing_dashes(rest), None)
    parts = rest.split("-", 4)
    # amdgcn-amd-amdhsa-<env>-<target>: env is "" or "unknown"; old writers had 3 fields only.
    if len(parts) == 5:
        triple = "-".join(parts[:4])
        target = parts[4]
    elif len(parts) == 4 and parts[3].startswith(("gfx", "amdgcnspirv")):
        triple, target = "-".join(parts[:3]), parts[3]
    else:
        return EntryId(text, kind, _strip_trailing_dashes(rest), None)
    target = _strip_trailing_dashes(target)
    return EntryId(text, kind, triple, target or None)


@dataclass(frozen=True, slots=True)
class BundleEntry:
    offset: int  # from the bundle start
    size: int
    entry_id: EntryId
    table_offset: int  # where this entry's record starts, from the bundle start


@dataclass(frozen=True, slots=True)
class Bundle:
    entries: tuple[BundleEntry, ...]
    table_size: int
    end: int  # one past the last byte any entry covers, from the bundle start (>= table_size)


def parse_bundle(
    buf: bytes | memoryview,
    base: int,
    available: int,
    *,
    written_ids_only: bool = False,
    max_entries: int = MAX_ENTRIES,
) -> Bundle:
    """Parse a bundle's header and entry table.

    ``buf`` is a prefix of the bundle; ``available`` is how many bytes the container holds from the
    bundle start (entries must lie inside it). Raises ``IncompleteTable`` when the table continues
    past ``buf`` but fits in ``available``, and ``FormatError`` for anything malformed.

    ``written_ids_only`` (a magic found in data, which may be a string constant): each record must
    also lie inside ``available`` and carry an id a writer produces (``is_written_entry_id``), checked
    record by record, so that the table is rejected at its first bad record and the records read
    before it (which cannot hold the magic: no valid id has an upper-case letter) are not read again
    from a later hit.
    """
    if len(buf) < HEADER_SIZE:
        if available > len(buf):
            raise IncompleteTable(base, HEADER_SIZE)
        raise FormatError(FMT, base + len(buf), "bundle ends inside its 32-byte header")
    if bytes(buf[:24]) != BUNDLE_MAGIC:
        raise FormatError(FMT, base, "no __CLANG_OFFLOAD_BUNDLE__ magic")
    (count,) = struct.unpack_from("<Q", buf, 24)
    if count == 0:
        raise FormatError(FMT, base + 24, "bundle declares no entries")
    if count > max_entries:
        raise FormatError(FMT, base + 24, f"bundle declares {count} entries (limit {max_entries})")
    pos = HEADER_SIZE
    entries = []
    for _ in range(count):
        if pos + ENTRY_FIXED_SIZE > len(buf):
            _need_more(buf, base, pos + ENTRY_FIXED_SIZE, available)
        offset, size, id_len = struct.unpack_from("<QQQ", buf, pos)
        if id_len == 0 or id_len > MAX_ID_BYTES:
            raise FormatError(FMT, base + pos + 16, f"entry id length {id_len} is out of range")
        id_start = pos + ENTRY_FIXED_SIZE
        if id_start + id_len > len(buf):
            _need_more(buf, base, id_start + id_len, available)
        raw = bytes(buf[id_start : id_start + id_len]).decode("ascii", "replace")
        if written_ids_only and (offset + size > available or not is_written_entry_id(raw)):
            raise FormatError(FMT, base + pos, f"entry {raw[:80]!r} is not one a bundle writer produces")
        entries.append((pos, offset, size, raw))
        pos = id_start + id_len
    table_size = pos
    parsed = []
    end = table_size
    for record_at, offset, size, raw in entries:
        if size and offset < table_size:
            raise FormatError(FMT, base + record_at, f"entry {raw!r} at {offset:#x} overlaps the entry table")
        if offset + size > available:
            raise FormatError(
                FMT,
                base + record_at,
                f"entry {raw!r} ({size} bytes at {offset:#x}) runs past the end of its container ({available} bytes)",
            )
        end = max(end, offset + size)
        parsed.append(BundleEntry(offset, size, parse_entry_id(raw), record_at))
    return Bundle(tuple(parsed), table_size, end)


def _need_more(buf: bytes | memoryview, base: int, needed: int, available: int) -> None:
    if needed <= available and len(buf) < available:
        raise IncompleteTable(base, needed)
    raise FormatError(FMT, base + len(buf), "entry table runs past the end of the bundle")


# What a bundle entry id looks like when written by clang, the bundler or Tensile (formats.md 2.3):
# a host entry (host triples are lower case), or hip/hipv4/hcc/openmp for AMDGPU or AMD SPIR-V with
# a target id; LLVM 19 appends "-" to a processor it does not know (gfx950-), NUL padding is
# stripped first.
_TARGET = r"(?:gfx[0-9a-z]+(?:-[0-9a-z]+)*|amdgcnspirv)-?(?::(?:sramecc|xnack)[+-])*"
_ENTRY_ID = re.compile(
    r"host-[a-z0-9_.]+(?:-[a-z0-9_.]*){1,4}"
    rf"|(?:hip|hipv4|hcc|openmp)-(?:amdgcn|spirv64)-amd-amdhsa-(?:(?:unknown)?-)?{_TARGET}"
)


def is_written_entry_id(raw: str) -> bool:
    """Whether ``raw`` is an id a real bundle writer produces (not merely parsable text): the test
    that tells a bundle embedded in data from the magic string followed by other data."""
    return _ENTRY_ID.fullmatch(raw.rstrip("\0")) is not None


# comgr's lookUpCodeObject (comgr-metadata.cpp), which the HIP runtime asks for each uncompressed
# bundle it registers or loads (hip_fatbin.cpp PopulateCodeObjectMap; a CCOB goes through comgr's
# unbundle action instead): an entry counts if its kind is one of these and the rest of its id is
# an ISA name comgr knows, "amdgcn-amd-amdhsa--<processor>[:features]" (parseTargetIdentifier ->
# getIsaIndex compares with its table's names, whose environment is empty), or one of the two
# SPIR-V names it accepts.
COMGR_KINDS = ("hip", "hipv4", "hcc")
_COMGR_TRIPLES = ("amdgcn-amd-amdhsa-", "spirv64-amd-amdhsa-")
_COMGR_SPIRV_UNKNOWN = ("spirv64-amd-amdhsa-unknown", "amdgcnspirv")


def comgr_selectable(entry: EntryId) -> bool:
    """Whether comgr's lookup can ever select this entry of an uncompressed bundle. ROCm 4.0's clang
    wrote a 3-field triple (``hip-amdgcn-amd-amdhsa-gfx906``) and Tensile's bundler call names the
    environment (``hipv4-amdgcn-amd-amdhsa-unknown-gfx942``, which it compresses): neither is an
    ISA name comgr knows, so no query matches them (checked with a real comgr, tests/gpu/
    test_arch_comgr.py: cupy-rocm-4-0's bundles answer no query)."""
    if entry.kind not in COMGR_KINDS or entry.target is None:
        return False
    return entry.triple in _COMGR_TRIPLES or (entry.triple, entry.target) == _COMGR_SPIRV_UNKNOWN


def max_table_bytes() -> int:
    """Upper bound of a valid entry table: what a reader may need to fetch at most."""
    return HEADER_SIZE + MAX_ENTRIES * (ENTRY_FIXED_SIZE + MAX_ID_BYTES)


# --- writing (prune --fatbins builds slimmed bundles through these) -----------------------------


def raw_ids(table: bytes, bundle: Bundle) -> list[bytes]:
    """Each record's id bytes exactly as written (NUL padding kept), from the table ``bundle`` was
    parsed from (its entries' ``table_offset`` point into ``table``)."""
    ids = []
    for entry in bundle.entries:
        (id_len,) = struct.unpack_from("<Q", table, entry.table_offset + 16)
        start = entry.table_offset + ENTRY_FIXED_SIZE
        ids.append(table[start : start + id_len])
    return ids


def table_size(ids: list[bytes]) -> int:
    """Bytes of a bundle's header and entry records for these ids."""
    return HEADER_SIZE + sum(ENTRY_FIXED_SIZE + len(one) for one in ids)


def pack_table(records: list[tuple[int, int, bytes]]) -> bytes:
    """A bundle's header and entry table: (offset, size, id bytes) per entry, in order."""
    packed = [BUNDLE_MAGIC, struct.pack("<Q", len(records))]
    packed += [struct.pack("<QQQ", offset, size, len(raw)) + raw for offset, size, raw in records]
    return b"".join(packed)
