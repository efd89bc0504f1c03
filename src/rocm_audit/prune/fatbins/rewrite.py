"""Build a slimmed offload bundle, and prove it selects what the original selected.

An uncompressed bundle (formats.md 2.2) keeps its kept entries in their order, compacted, each at
the alignment the original's entries had (HIP writes 4096); every record keeps its id bytes
exactly (NUL padding included), and a size-0 entry gets a non-zero offset (clang's reader stops
at an offset of 0). The whole table must lie in the first 4096 bytes (CLR hands comgr only those,
formats.md 8.1). A CCOB (2.4) is inflated, slimmed the same way and compressed again with its own
method and version; header fields are rewritten to match (v1 u32 sizes, v2 u32 total and
inflated sizes, v3 u64 both; the hash is MD5 of the inflated bundle, low 8 bytes).

The bundle is held in memory while it is rewritten (one bundle at a time, not the library).
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from rocm_audit.errors import FormatError
from rocm_audit.formats import ccob, offload_bundle
from rocm_audit.prune.fatbins.select import entries_to_keep, selected
from rocm_audit.tree.targets import TargetId, agents_of

COMGR_WINDOW = 4096  # bytes of an uncompressed bundle CLR hands comgr for the lookup
MAX_ALIGN = 4096
# Levels chosen by measuring (docs/prune.md, "--fatbins"): zstd 9 is where the size stops falling
# much for the time it costs on jax-rocm7-plugin's CCOB v3 bundles; zlib 6 is LLVM's own default.
ZSTD_LEVEL = 9
ZLIB_LEVEL = 6
MAX_INFLATED = 4 << 30  # refuse a CCOB that declares more than this (one bundle is held in memory)


@dataclass(frozen=True, slots=True)
class Slimmed:
    data: bytes  # the new bundle (plain, or the whole CCOB with its header)
    kept: tuple[str, ...]  # raw ids kept, in order
    removed: tuple[str, ...]  # raw ids removed
    compressed: str | None  # "zstd"/"zlib" for a CCOB


def _entries(bundle: offload_bundle.Bundle) -> list[tuple[str, int]]:
    return [(entry.entry_id.raw, entry.size) for entry in bundle.entries]


def _raw_ids(data: bytes, bundle: offload_bundle.Bundle) -> list[bytes]:
    """Each record's id bytes exactly as written (NUL padding kept)."""
    ids = []
    for entry in bundle.entries:
        (id_len,) = struct.unpack_from("<Q", data, entry.table_offset + 16)
        start = entry.table_offset + offload_bundle.ENTRY_FIXED_SIZE
        ids.append(data[start : start + id_len])
    return ids


def _alignment(bundle: offload_bundle.Bundle) -> int:
    """The largest power of two (at most 4096) every non-empty entry's offset is a multiple of."""
    align = MAX_ALIGN
    for entry in bundle.entries:
        if entry.size:
            while align > 1 and entry.offset % align:
                align //= 2
    return align


def _round_up(value: int, align: int) -> int:
    return -(-value // align) * align


def parse_plain(data: bytes) -> offload_bundle.Bundle:
    return offload_bundle.parse_bundle(data, 0, len(data))


def slim_plain(data: bytes, kept: Sequence[TargetId]) -> Slimmed:
    """The slimmed uncompressed bundle. Raises FormatError when it cannot be made valid."""
    bundle = parse_plain(data)
    entries = _entries(bundle)
    keep = entries_to_keep(entries, kept)
    ids = _raw_ids(data, bundle)
    table_size = offload_bundle.HEADER_SIZE + sum(offload_bundle.ENTRY_FIXED_SIZE + len(ids[i]) for i in keep)
    if table_size > COMGR_WINDOW:
        raise FormatError(offload_bundle.FMT, 0, f"the entry table would take {table_size} bytes, past the first 4096")
    align = _alignment(bundle)
    records = [offload_bundle.BUNDLE_MAGIC, struct.pack("<Q", len(keep))]
    body: list[bytes] = []
    end = table_size  # one past the last byte laid out so far
    for index in keep:
        entry = bundle.entries[index]
        position = _round_up(end, align)
        records.append(struct.pack("<QQQ", position, entry.size, len(ids[index])) + ids[index])
        if entry.size:
            body.append(b"\0" * (position - end))
            body.append(data[entry.offset : entry.offset + entry.size])
            end = position + entry.size
    out = b"".join(records) + b"".join(body)
    return Slimmed(
        out,
        tuple(entries[i][0] for i in keep),
        tuple(entries[i][0] for i in range(len(entries)) if i not in keep),
        None,
    )


def inflate(data: bytes) -> tuple[ccob.CcobHeader, bytes]:
    """A whole CCOB's header and inflated bundle. Raises FormatError."""
    header = ccob.parse_header(data, 0, len(data))
    end = header.total_size if header.total_size is not None else len(data)
    if header.uncompressed_size > MAX_INFLATED:
        raise FormatError(ccob.FMT, 0, f"declares {header.uncompressed_size} inflated bytes")
    payload = data[header.header_size : end]
    import zstandard  # noqa: PLC0415 - heavy module, loaded on first use (style.md 3)

    try:
        if header.method == ccob.METHOD_ZSTD:
            inflated = zstandard.ZstdDecompressor().decompress(payload, max_output_size=header.uncompressed_size)
        else:
            inflated = zlib.decompress(payload)
    except (zstandard.ZstdError, zlib.error) as exc:
        raise FormatError(ccob.FMT, header.header_size, f"cannot inflate: {exc}") from None
    if len(inflated) != header.uncompressed_size:
        raise FormatError(
            ccob.FMT, 0, f"inflates to {len(inflated)} bytes, not the declared {header.uncompressed_size}"
        )
    if hashlib.md5(inflated, usedforsecurity=False).digest()[:8] != header.hash64:
        raise FormatError(ccob.FMT, 0, "the inflated bundle does not match the header's hash")
    return header, inflated


def compress(method: int, data: bytes, level: int | None = None) -> bytes:
    if method == ccob.METHOD_ZSTD:
        import zstandard  # noqa: PLC0415

        compressor = zstandard.ZstdCompressor(level=level or ZSTD_LEVEL, write_content_size=True)
        return bytes(compressor.compress(data))
    return zlib.compress(data, level or ZLIB_LEVEL)


def ccob_bytes(version: int, method: int, inflated: bytes, level: int | None = None) -> bytes:
    """A CCOB of ``version`` holding ``inflated`` compressed with ``method``."""
    payload = compress(method, inflated, level)
    digest = hashlib.md5(inflated, usedforsecurity=False).digest()[:8]
    size = ccob.HEADER_SIZES[version]
    total = size + len(payload)
    if version == 1:
        if len(inflated) >= 1 << 32:
            raise FormatError(ccob.FMT, 0, "a CCOB v1 cannot hold 4 GiB")
        head = ccob.CCOB_MAGIC + struct.pack("<HHI", version, method, len(inflated)) + digest
    elif version == 2:
        if total >= 1 << 32 or len(inflated) >= 1 << 32:
            raise FormatError(ccob.FMT, 0, "a CCOB v2 cannot hold 4 GiB")
        head = ccob.CCOB_MAGIC + struct.pack("<HHII", version, method, total, len(inflated)) + digest
    else:
        head = ccob.CCOB_MAGIC + struct.pack("<HHQQ", version, method, total, len(inflated)) + digest
    assert len(head) == size
    return head + payload


def slim_ccob(data: bytes, kept: Sequence[TargetId], level: int | None = None) -> Slimmed:
    header, inflated = inflate(data)
    inner = slim_plain(inflated, kept)
    out = ccob_bytes(header.version, header.method, inner.data, level)
    return Slimmed(out, inner.kept, inner.removed, header.method_name)


def slim(data: bytes, kept: Sequence[TargetId], level: int | None = None) -> Slimmed:
    """Slim one bundle, plain or CCOB (sniffed). Raises FormatError."""
    if data.startswith(ccob.CCOB_MAGIC):
        return slim_ccob(data, kept, level)
    return slim_plain(data, kept)


def plain_of(data: bytes) -> bytes:
    """The uncompressed bundle a bundle's bytes stand for."""
    return inflate(data)[1] if data.startswith(ccob.CCOB_MAGIC) else data


def selections(data: bytes, kept: Sequence[TargetId]) -> dict[str, bytes | None]:
    """For every device setting of every kept target: the code object the runtime selects from
    this bundle (its bytes), or None."""
    plain = plain_of(data)
    bundle = parse_plain(plain)
    entries = _entries(bundle)
    chosen: dict[str, bytes | None] = {}
    for agent in (a for k in kept for a in agents_of(k)):
        index = selected(entries, agent)
        if index is None:
            chosen[str(agent)] = None
        else:
            entry = bundle.entries[index]
            chosen[str(agent)] = plain[entry.offset : entry.offset + entry.size]
    return chosen


def prove_same_selection(before: bytes, after: bytes, kept: Sequence[TargetId]) -> str | None:
    """None when ``after`` selects byte-identical code objects for every setting of every kept
    target, else what differs (both parsed again from their bytes)."""
    try:
        old, new = selections(before, kept), selections(after, kept)
    except FormatError as exc:
        return f"the slimmed bundle does not parse: {exc}"
    for agent, code in old.items():
        if new.get(agent) != code:
            return f"for {agent} the slimmed bundle selects other code"
    return None
