"""How many bytes of device code each distribution carries for each target, and how much of it goes.

Per (distribution, target): bytes on disk of plain bundle entries, raw code objects and per-arch
files; for compressed bundles (CCOB) the entry's share of the bundle's bytes on disk (shared out by
the entries' inflated sizes, which are reported too); whether any kept target can use it; and how
much of it a planned removal frees. Each inode counts once (TheRock's devel hardlinks share their
file's bytes); a split copy counts again, as it takes disk again. Code objects a kpack'd library
finds in its archives are counted on the archive, not on the library.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rocm_audit.prune.plan import DeviceCodeOf, PrunePlan, device_entries, serves_any
from rocm_audit.report_types import PruneTotals, PruneWeightRow
from rocm_audit.tree.archfiles import device_distribution_arch
from rocm_audit.tree.inventory import FileRecord, Inventory
from rocm_audit.tree.ownership import Distribution

NO_DISTRIBUTION = "(no distribution)"
# Per-arch files whose code objects are compressed as a whole (their sizes are inflated sizes).
COMPRESSED_ARCHIVES = ("aks2",)


@dataclass(slots=True)
class WeightRow:
    distribution: str
    target: str
    bytes: int = 0  # on disk
    compressed_bytes: int = 0  # the part of ``bytes`` inside compressed bundles
    inflated_bytes: int = 0  # what that part inflates to
    needed: bool = True  # a kept target can load it
    removable_bytes: int = 0  # freed by the plan (whole per-arch units and device distributions)

    @property
    def unused_bytes(self) -> int:
        return 0 if self.needed else self.bytes

    def to_dict(self) -> PruneWeightRow:
        return {
            "distribution": self.distribution,
            "target": self.target,
            "bytes": self.bytes,
            "compressed_bytes": self.compressed_bytes,
            "inflated_bytes": self.inflated_bytes,
            "needed": self.needed,
            "unused_bytes": self.unused_bytes,
            "removable_bytes": self.removable_bytes,
        }


@dataclass(slots=True)
class Weight:
    rows: list[WeightRow]
    # path -> [bytes, unused bytes, removable bytes] of device code in that file (image: per layer)
    by_path: dict[str, list[int]]

    def total(self, name: str) -> int:
        return sum(getattr(row, name) for row in self.rows)

    def totals(self, fatbins_estimate: int = 0) -> PruneTotals:
        """The sums; ``fatbins_estimate``: the part ``prune --fatbins`` would slim (the caller's)."""
        unused = self.total("unused_bytes")
        removable = self.total("removable_bytes")
        return {
            "device_bytes": self.total("bytes"),
            "compressed_bytes": self.total("compressed_bytes"),
            "inflated_bytes": self.total("inflated_bytes"),
            "unused_bytes": unused,
            "removable_bytes": removable,
            "unused_in_host_libraries_bytes": unused - removable,
            "fatbins_estimate_bytes": fatbins_estimate,
        }


def _label(plan: PrunePlan, record: FileRecord) -> str:
    owner = plan.owner_of.get(record.path)
    if owner is not None:
        return owner.name
    if record.sdk_tree:
        return os.path.basename(record.sdk_tree)
    return NO_DISTRIBUTION


def weigh(inventory: Inventory, plan: PrunePlan, device_code: DeviceCodeOf) -> Weight:
    """Device-code bytes per (distribution, target) over every file of ``inventory`` (the one
    ``plan`` was made from), and per file."""
    rows: dict[tuple[str, str], WeightRow] = {}
    removed = {r.path for removal in plan.removals for r in [*removal.files, *removal.devel_links]}
    seen: set[tuple[int, int]] = set()
    by_path: dict[str, list[int]] = {}

    def add(record: FileRecord, target: str, size: int, *, compressed: int = 0, inflated: int = 0) -> None:
        key = (_label(plan, record), target)
        row = rows.get(key)
        if row is None:
            row = rows[key] = WeightRow(key[0], target, needed=serves_any(target, plan.kept))
        row.bytes += size
        row.compressed_bytes += compressed
        row.inflated_bytes += inflated
        if record.path in removed:
            row.removable_bytes += size
        per = by_path.setdefault(record.path, [0, 0, 0])
        per[0] += size
        per[1] += 0 if row.needed else size
        per[2] += size if record.path in removed else 0

    for record in sorted(inventory.files, key=lambda r: r.path):
        if record.identity in seen:
            continue
        unit = plan.unit_of_path.get(record.path)
        distribution = plan.device_dist_of_path.get(record.path)
        entries = device_entries(device_code(record))
        # a device distribution's metadata, byte-code and link lists are no device code
        if unit is not None or (distribution is not None and entries):
            seen.add(record.identity)
            inflated: dict[str, int] = {}
            if entries and sum(e.size for e in entries):
                # the file's bytes, shared out by its code objects' sizes
                total = sum(e.size for e in entries)
                shares = _shares(record.size, [(e.target or "unknown", e.size) for e in entries], total)
                if any(e.container in COMPRESSED_ARCHIVES for e in entries):
                    for e in entries:  # an xz archive (AOTriton .aks2): sizes are inflated ones
                        inflated[e.target or "unknown"] = inflated.get(e.target or "unknown", 0) + e.size
            else:
                arches = (unit.arches or ("unknown",)) if unit is not None else _dist_arch(distribution)
                shares = _shares(record.size, [(a, 1) for a in arches], len(arches))
            for target, size in shares:
                if target in inflated:
                    add(record, target, size, compressed=size, inflated=inflated[target])
                else:
                    add(record, target, size)
            continue
        entries = [e for e in entries if e.container != "kpack"]  # counted on the archive
        if not entries:
            continue
        seen.add(record.identity)
        code = device_code(record)
        bundles = list(code.bundles) if code is not None else []
        inflated_per_bundle: dict[int, int] = {}
        for entry in entries:
            if entry.container == "ccob" and entry.tu is not None:
                inflated_per_bundle[entry.tu] = inflated_per_bundle.get(entry.tu, 0) + entry.size
        for entry in entries:
            target = entry.target or "unknown"
            if entry.container == "ccob" and entry.tu is not None and entry.tu < len(bundles):
                bundle_bytes = bundles[entry.tu][1]
                share = bundle_bytes * entry.size // max(inflated_per_bundle[entry.tu], 1)
                add(record, target, share, compressed=share, inflated=entry.size)
            else:
                add(record, target, entry.size)
    ordered = sorted(rows.values(), key=lambda r: (-r.bytes, r.distribution, r.target))
    return Weight(ordered, by_path)


def _dist_arch(distribution: Distribution | None) -> tuple[str, ...]:
    arch = device_distribution_arch(distribution.name) if distribution is not None else None
    return (arch or "unknown",)


def _shares(size: int, parts: list[tuple[str, int]], total: int) -> list[tuple[str, int]]:
    """``size`` shared out by weight; the rounding remainder goes to the first part."""
    merged: dict[str, int] = {}
    for name, weight in parts:
        merged[name] = merged.get(name, 0) + weight
    shares = [(name, size * weight // max(total, 1)) for name, weight in merged.items()]
    if shares:
        name, first = shares[0]
        shares[0] = (name, first + size - sum(s for _, s in shares))
    return shares
