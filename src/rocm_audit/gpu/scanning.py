"""Reading the code objects of every file of an inventory (``scan_file`` per file, as a cached
fact), and the per-arch kernel databases whose files name their arch (formats.md 2.10)."""

from __future__ import annotations

import dataclasses
import os
import re

from rocm_audit.elf.view import ElfView
from rocm_audit.formats import triton_metadata
from rocm_audit.gpu.codeobjects import CodeObject, FileCodeObjects, scan_file
from rocm_audit.progress import SILENT, Progress
from rocm_audit.tree.archfiles import miopen_db_arch
from rocm_audit.tree.inventory import FileKind, FileRecord, Inventory
from rocm_audit.tree.targets import RequiredTarget, TargetSelection, arch_tokens, is_family_name

HOST_KINDS = (FileKind.SHARED_LIBRARY, FileKind.EXECUTABLE, FileKind.OTHER_ELF)

# Per-arch kernel databases (formats.md 2.10): (kind, directory suffix that roots the database).
_DATABASE_ROOTS = (
    ("tensile", ("rocblas", "library")),
    ("tensile", ("hipblaslt", "library")),
    ("tensile", ("hipsparselt", "library")),
    ("aotriton", ("aotriton.images",)),
    ("aotriton", ("aotriton", "kernels")),
)
# MIOpen find/perf databases are optional (MIOpen compiles or searches without them):
# listed, not judged.
_LISTED_ONLY_ROOTS = (("miopen-db", ("miopen", "db")),)
_DATABASE_DIRS = frozenset(suffix[0] for _, suffix in _DATABASE_ROOTS + _LISTED_ONLY_ROOTS)


def database_root(path: str) -> tuple[str, str, bool] | None:
    """(kind, root dir, judged) when ``path`` lies in a per-arch kernel database."""
    parts = path.split(os.sep)
    if _DATABASE_DIRS.isdisjoint(parts):
        return None  # most files: no component of any database root (this runs for every file)
    for table, judged in ((_DATABASE_ROOTS, True), (_LISTED_ONLY_ROOTS, False)):
        for kind, suffix in table:
            for index in range(len(parts) - len(suffix)):
                if tuple(parts[index : index + len(suffix)]) == suffix:
                    return kind, os.sep.join(parts[: index + len(suffix)]), judged
    return None


def database_arches(kind: str, rel_path: str) -> list[str]:
    if kind == "miopen-db":
        arch = miopen_db_arch(os.path.basename(rel_path))
        return [] if arch is None else [arch]
    if kind == "aotriton":
        # amd-gfx942 names a chip; a family folder (amd-gfx11xx, amd-gfx110x) names no processor:
        # what it holds is judged by the ELF headers of the code objects inside (formats/aks2.py).
        return [arch for arch in re.findall(r"amd-(gfx[0-9a-z]+)", rel_path) if not is_family_name(arch)]
    # a family name (aotriton/kernels/gfx11xx/) names no processor: only the content can tell
    return [arch for arch in arch_tokens(rel_path) if not is_family_name(arch.split(":")[0])]


def selection_for(required: list[RequiredTarget]) -> TargetSelection:
    """What a judgement against ``required`` needs the scan to read."""
    return TargetSelection(tuple(dict.fromkeys(t.agent for t in required)))


def scan_inventory(
    inventory: Inventory, selection: TargetSelection | None = None, progress: Progress = SILENT
) -> list[FileCodeObjects]:
    """Code objects of every file that can hold some, in path order; kernel-database files too.
    With a selection, only what judging its agents needs is read (``scan_file``)."""
    results = []
    by_path = {record.path: record for record in inventory.files}
    progress.phase("reading GPU code objects", len(inventory.files), "files")
    seen_bytes = 0
    for done, record in enumerate(sorted(inventory.files, key=lambda r: r.path), 1):
        seen_bytes += record.size
        progress.update(done, seen_bytes)
        database = database_root(record.path)
        if database is not None:
            kind, root, _judged = database
            rel = os.path.relpath(record.path, root)
            scanned = (
                code_objects_of(inventory, record, selection)
                if may_hold_code(record)
                else FileCodeObjects(record.path, record.sdk_tree, record.opened_kind.value)
            )
            arches = database_arches(kind, rel)
            if arches and not scanned.code_objects:
                # the cached fact stays as read; the database's arches go on a copy
                scanned = dataclasses.replace(scanned, containers=list(scanned.containers), code_objects=[])
                scanned.add_container(f"database:{kind}")
                for arch in arches:
                    scanned.code_objects.append(
                        CodeObject(
                            f"database:{kind}",
                            rel,
                            None,
                            record.size,
                            None,
                            None,
                            "device",
                            arch,
                            "file-name",
                            arch,
                        )
                    )
            if scanned.code_objects or scanned.findings:
                results.append(scanned)
            continue
        if may_hold_code(record):
            scanned = code_objects_of(inventory, record, selection)
            if scanned.code_objects and record.path.endswith(".hsaco"):
                metadata = by_path.get(record.path.removesuffix(".hsaco") + ".json")
                target = _triton_target(inventory, metadata) if metadata is not None else None
                if target is not None:  # the cached fact stays as read; the target goes on a copy
                    scanned = dataclasses.replace(
                        scanned, triton_target=target, triton_folder=_kernels_folder(record.path, record.root)
                    )
            if scanned.code_objects or scanned.findings:
                results.append(scanned)
    return results


def _kernels_folder(path: str, root: str) -> str:
    """The folder holding a Triton kernel's entry folder (``<cache>/<hash>/<name>.hsaco``, aiter's
    ``aot/<kernel>_M=..-N=..-K=../<name>.hsaco``), or the nearest inside the audited root."""
    for folder in (os.path.dirname(os.path.dirname(path)), os.path.dirname(path)):
        if folder == root or folder.startswith(root.rstrip(os.sep) + os.sep):
            return folder
    return path  # the root is the file itself


def _triton_target(inventory: Inventory, metadata: FileRecord) -> str | None:
    """The target Triton metadata names (formats/triton_metadata.py); None if it is not that or
    cannot be read (then the code object is judged as any standalone file)."""

    def read(view: ElfView) -> str | None:
        if metadata.size > triton_metadata.MAX_METADATA_BYTES:
            return None
        return triton_metadata.hip_target(os.pread(view.fd, triton_metadata.MAX_METADATA_BYTES + 1, 0))

    if metadata.kind is not FileKind.NOT_ELF:
        return None
    try:
        return inventory.facts.get(metadata, "triton-target", read)
    except OSError:
        return None


def may_hold_code(record: FileRecord) -> bool:
    """Whether a file can carry device code (host ELF, code object, or a container's magic)."""
    if record.kind in HOST_KINDS or record.kind is FileKind.CODE_OBJECT:
        return True
    return record.magic.startswith((b"__CLANG_OFFLOAD_BUNDLE__", b"CCOB", b"KPAK", b"AKS2", b"\x10\xff\x10\xad"))


def code_objects_of(
    inventory: Inventory, record: FileRecord, selection: TargetSelection | None = None
) -> FileCodeObjects:
    """The code-object fact of one inventory file, read once per run and selection (per path: the
    findings of a scan name the path it was read through)."""
    name = "code-objects" if selection is None else f"code-objects:{selection.key}"
    return inventory.facts.get(record, name, lambda view: scan_file(record, view.fd, selection), per_path=True)
