"""AOTriton ``.aks2`` archives (formats/aks2.py): every kernel image in one, each judged by the
processor its own ELF header names; the folder it lies in (``amd-gfx11xx``) names nothing."""

from __future__ import annotations

from rocm_audit.elf.codeobject import CodeObjectFacts, FileWindow
from rocm_audit.errors import FormatError
from rocm_audit.findings import make_finding
from rocm_audit.formats import aks2, amdgpu_elf
from rocm_audit.gpu.records import FileCodeObjects, consistency_findings, device_record


def aks2_listing(result: FileCodeObjects, fh: FileWindow) -> None:
    """An AOTriton ``.aks2`` archive: every kernel image in it, each judged by the processor its own
    ELF header names (formats/aks2.py); the folder it lies in (``amd-gfx11xx``) names nothing."""
    result.add_container("aks2")
    try:
        archive = aks2.read_archive(fh.reader(0, fh.size), fh.size)
    except FormatError as exc:
        _aks2_malformed(result, exc, "AKS2 archive")
        return
    images_at = archive.header.directory_size
    for number, kernel in enumerate(archive.kernels):
        if not kernel.size:
            continue  # a kernel AOTriton failed to compile: its runtime hands out no image for it
        location = f"kernel {number} ({kernel.name})"
        facts = None
        try:
            identity = amdgpu_elf.parse_header(kernel.head, images_at + kernel.offset).identity
            facts = CodeObjectFacts(identity, None, False)
        except FormatError as exc:
            _aks2_malformed(result, FormatError(aks2.CONTENT_FMT, exc.offset, f"{exc.fmt}: {exc.reason}"), location)
        obj = device_record(
            container="aks2",
            location=location,
            file_offset=None,
            size=kernel.size,
            tu=None,
            entry_id=kernel.name,
            kind="device",
            bundle_target=None,
            facts=facts,
            listed_source="none",
        )
        result.code_objects.append(obj)
        result.findings.extend(consistency_findings(result.path, obj, facts, images_at + kernel.offset))


def _aks2_malformed(result: FileCodeObjects, exc: FormatError, what: str) -> None:
    """ARCH004 for an archive, saying whether the offset is in the file or in the xz content."""
    where = "of the decompressed content" if exc.fmt == aks2.CONTENT_FMT else "in the file"
    result.findings.append(
        make_finding(
            "ARCH004",
            result.path,
            f"{what}: {aks2.FMT}: {exc.reason} (at offset {exc.offset:#x} {where})",
            data={"offset": exc.offset, "format": exc.fmt},
        )
    )
