"""Carriers: the units the runtime loads device code from (a host library, a code-object file, a
set of per-arch files or folders, Triton's kernels, a kernel database), built from scanned files.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from rocm_audit.formats.offload_bundle import DEVICE_KINDS
from rocm_audit.gpu.codeobjects import CodeObject, FileCodeObjects
from rocm_audit.gpu.scanning import database_root
from rocm_audit.report_types import CarrierMatch
from rocm_audit.tree.archfiles import arch_folder_of
from rocm_audit.tree.inventory import FileKind
from rocm_audit.tree.ownership import this_target_family
from rocm_audit.tree.targets import arch_tokens, parse_target_id, processor_sort_key

# Containers only a host binary has (gpu/codeobjects.py): its units are TUs and embedded images.
HOST_CONTAINERS = ("hip-fatbin", "kpack", "embedded-elf", "embedded-offload-bundle", "embedded-ccob")


@dataclass(slots=True)
class Carrier:
    path: str
    package: str | None
    kind: str  # library | code-object-file | per-arch-files | per-arch-folders | triton-kernels | kernel-database:*
    containers: list[str]
    tus: list[list[CodeObject]]  # device code objects per translation unit
    members: list[str] = field(default_factory=list)
    matches: list[CarrierMatch] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    # TU index -> place (".rodata+0x1000") of the units that are images embedded in data sections
    unit_places: dict[int, str] = field(default_factory=dict)
    family: str | None = None  # the GPU family its per-family TheRock tree serves (tree_family)

    @property
    def code_objects(self) -> list[CodeObject]:
        return [obj for tu in self.tus for obj in tu]

    def targets(self) -> list[str]:
        """What the entries offer, by the name the runtime selects them by (ELF header otherwise):
        the same whether or not an entry was read; gfx90a before gfx942 before gfx1100."""
        names = {name for obj in self.code_objects if (name := named_target(obj) or obj.target)}
        return sorted(names, key=processor_sort_key)


def package_of(sdk_tree: str | None) -> str | None:
    return os.path.basename(sdk_tree) if sdk_tree else None


def _device_objects(scanned: FileCodeObjects) -> list[CodeObject]:
    return [obj for obj in scanned.code_objects if obj.kind in DEVICE_KINDS]


def build_carriers(scans: list[FileCodeObjects]) -> list[Carrier]:
    """Group scanned files into the units the runtime loads; a per-arch file joins its siblings."""
    carriers: list[Carrier] = []
    groups: dict[str, Carrier] = {}
    families: dict[str | None, str | None] = {None: None}

    def family_of(sdk_tree: str | None) -> str | None:
        if sdk_tree not in families:
            families[sdk_tree] = tree_family(sdk_tree)
        return families[sdk_tree]

    for scanned in scans:
        database = database_root(scanned.path)
        if database is not None:
            kind, root, judged = database
            if not judged:
                continue
            carrier = groups.get(root)
            if carrier is None:
                carrier = Carrier(
                    root,
                    package_of(scanned.sdk_tree),
                    f"kernel-database:{kind}",
                    [],
                    [[]],
                    family=family_of(scanned.sdk_tree),
                )
                groups[root] = carrier
                carriers.append(carrier)
            carrier.members.append(scanned.path)
            carrier.tus[0].extend(_device_objects(scanned))
            for name in scanned.containers:
                if name not in carrier.containers:
                    carrier.containers.append(name)
            continue
        if scanned.file_kind == FileKind.OTHER_ELF.value:
            continue  # relocatable objects are linked into a carrier; the runtime never loads them
        if scanned.tu_count == 0:
            # Host-only code, a file with the magic string but no fat binary, a stray
            # .llvm.offloading, or a .kpack archive (judged through the libraries that use it).
            continue
        tus: list[list[CodeObject]] = [[] for _ in range(scanned.tu_count)]
        for obj in _device_objects(scanned):
            if obj.tu is not None and obj.tu < len(tus):
                tus[obj.tu].append(obj)
        in_host = any(c in scanned.containers for c in HOST_CONTAINERS)
        objects = [obj for tu in tus for obj in tu]
        unit = None if in_host else _triton_unit(scanned, objects)
        if unit is None:
            unit = _per_arch_unit(scanned.path, objects, in_host)
        if unit is not None:
            path, kind = unit
            carrier = groups.get(path)
            if carrier is None:
                tus = [] if kind == "triton-kernels" else [[]]
                carrier = Carrier(path, package_of(scanned.sdk_tree), kind, [], tus, family=family_of(scanned.sdk_tree))
                groups[path] = carrier
                carriers.append(carrier)
            carrier.members.append(scanned.path)
            if kind == "triton-kernels":
                carrier.tus.append(objects)  # each kernel is looked up on its own
            else:
                carrier.tus[0].extend(objects)
            for container in scanned.containers:
                if container not in carrier.containers:
                    carrier.containers.append(container)
            continue
        kind = "library" if in_host else "code-object-file"
        carrier = Carrier(
            scanned.path,
            package_of(scanned.sdk_tree),
            kind,
            list(scanned.containers),
            tus,
            family=family_of(scanned.sdk_tree),
        )
        carrier.unit_places = dict(scanned.unit_places)
        carriers.append(carrier)
    return sorted(carriers, key=lambda c: c.path)


def _triton_unit(scanned: FileCodeObjects, objects: list[CodeObject]) -> tuple[str, str] | None:
    """Triton kernels (``<cache>/<entry>/<name>.hsaco`` with the metadata Triton wrote) whose code is
    for the target the metadata names: the folder of their entry folders is the unit."""
    target = scanned.triton_target
    if target is None or not objects:
        return None
    processor = target.split(":")[0]
    if any(obj.target is None or obj.target.split(":")[0] != processor for obj in objects):
        return None  # the metadata says one GPU, the code another: judged as the file it is
    return scanned.triton_folder or os.path.dirname(scanned.path), "triton-kernels"


def _per_arch_unit(path: str, objects: list[CodeObject], in_host: bool) -> tuple[str, str] | None:
    """(unit path, kind) of the per-arch set a file belongs to, ``gfx*`` where its arch is; None
    for none.

    libMIOpenCK<x>_gfx942.so, Kernels_gfx950.hsaco: one file per arch, named for it
    (``per-arch-files``). A standalone code-object file may instead sit below a folder named for its
    arch (``aiter_meta/hsa/gfx942/fmoe/x.co``): the loader builds the path from the device's arch
    and chooses among the kernels that folder has (aiter reads the kernel tables beside them,
    ``hsa/gfx942/fmoe/*.csv``), so the folders are the unit (``per-arch-folders``, like Tensile's
    ``library/gfx942/``), and a kernel that exists for one arch only (an FP4 kernel, gfx950) is
    by design. Host libraries are left out of the folder rule: a library under a folder named for
    an arch is still loaded as is.
    """
    directory, name = os.path.split(path)
    if _is_per_arch_file(name, objects):
        return os.path.join(directory, re.sub(r"gfx[0-9a-z]+(?:-[0-9a-z]+)*", "gfx*", name)), "per-arch-files"
    found = None if in_host else arch_folder_of(path)
    if found is None:
        return None
    folder, arch = found
    processor = arch.split(":")[0]
    if not objects or any(obj.target is None or obj.target.split(":")[0] != processor for obj in objects):
        return None
    return os.path.join(os.path.dirname(folder), "gfx*"), "per-arch-folders"


def _is_per_arch_file(name: str, objects: list[CodeObject]) -> bool:
    """One arch in the file name, and the file holds code for that arch only (X_gfx942.hsaco)."""
    tokens = arch_tokens(name)
    if len(tokens) != 1:
        return False
    processor = tokens[0].split(":")[0]
    return bool(objects) and all(obj.target is not None and obj.target.split(":")[0] == processor for obj in objects)


def named_target(obj: CodeObject) -> str | None:
    """The target an entry's bundle id or kpack key names: what the runtime selects it by."""
    if obj.target_source == "file-name" or obj.bundle_target is None:
        return None
    return obj.bundle_target if parse_target_id(obj.bundle_target) is not None else None


# A legacy per-family libraries tree (_rocm_sdk_libraries_gfx94X_dcgpu, _rocm_sdk_libraries_gfx1151):
# rocm_sdk loads the family tree of the GPU it runs on, so a family's carriers serve its family only.
_FAMILY_TREE = re.compile(r"^_rocm_sdk_libraries_(gfx[0-9]+[xX]?)(?:_|$)")
# A devel tree, and the pure package whose _dist_info.py names the family it was built for.
_DEVEL_TREE_PREFIX, _DEVEL_PACKAGE = "_rocm_sdk_devel", "rocm_sdk_devel"


def tree_family(sdk_tree: str | None) -> str | None:
    """The GPU family a per-family TheRock tree serves: a legacy libraries tree by its name, and a
    legacy devel tree by the family its rocm-sdk-devel names (``THIS_TARGET_FAMILY``). The legacy
    flow builds one devel per family, holding that family's device files only and linked into its
    family's tree (build_python_packages.py ``_run_legacy``): beside other families' trees it is its
    family's. A kpack-split devel names no family (None)."""
    name = os.path.basename(sdk_tree or "")
    match = _FAMILY_TREE.match(name)
    if match:
        return match.group(1)
    if sdk_tree and name.startswith(_DEVEL_TREE_PREFIX):
        return this_target_family(os.path.dirname(sdk_tree), _DEVEL_PACKAGE)
    return None
