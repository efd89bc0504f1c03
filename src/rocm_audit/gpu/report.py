"""The report sections verify-arch and ``scan --targets`` share: a carrier, a code object, and
every finding the readers raised."""

from __future__ import annotations

from rocm_audit.findings import Finding
from rocm_audit.gpu.carriers import Carrier
from rocm_audit.gpu.codeobjects import CodeObject, FileCodeObjects
from rocm_audit.report_types import CarrierRecord, CodeObjectRecord
from rocm_audit.tree.targets import processor_sort_key


def scan_findings(scans: list[FileCodeObjects]) -> list[Finding]:
    """Every finding the readers raised while scanning (malformed containers, kpack problems)."""
    return [finding for scanned in scans for finding in scanned.findings]


def carrier_to_dict(carrier: Carrier) -> CarrierRecord:
    found_via = sorted({(obj.target or "", obj.target_source, obj.container) for obj in carrier.code_objects})
    return {
        "path": carrier.path,
        "package": carrier.package,
        "kind": carrier.kind,
        "containers": sorted(carrier.containers),
        "tu_count": len(carrier.tus) if carrier.kind in ("library", "code-object-file") else None,
        "members": sorted(carrier.members),
        "targets": carrier.targets(),
        "found_via": [{"target": t, "source": s, "container": c} for t, s, c in found_via if t],
        "matches": carrier.matches,
        "missing": sorted(carrier.missing, key=processor_sort_key),
        "embedded_images": [{"tu": tu, "place": place} for tu, place in sorted(carrier.unit_places.items())],
    }


def code_object_to_dict(path: str, obj: CodeObject) -> CodeObjectRecord:
    return {
        "path": path,
        "container": obj.container,
        "location": obj.location,
        "file_offset": obj.file_offset,
        "size": obj.size,
        "tu": obj.tu,
        "entry_id": obj.entry_id,
        "kind": obj.kind,
        "target": obj.target,
        "target_source": obj.target_source,
        "bundle_target": obj.bundle_target,
        "code_object_version": obj.code_object_version,
        "generic_version": obj.generic_version,
        "metadata_target": obj.metadata_target,
        "kernels": obj.kernels,
    }
