"""`verify-arch` and `scan --targets`: which GPU targets every device-code carrier serves.

A carrier is something the runtime loads device code from as one unit: a host library or executable
with a fat binary (judged per translation unit, formats.md 2.9), a standalone code-object file, a
set of per-arch files that differ only by the arch in their name (``libMIOpenCK*_gfx942.so``), the
folders of code objects named for their arch (aiter's ``hsa/gfx942/``), a per-arch kernel database
(Tensile ``library/``, AOTriton ``aotriton.images``), or Triton's compiled kernels (a kernel cache or
an AOT folder: each kernel is launched only on the GPU its metadata names, and compiled at first
use on another). Library code: returns a ``CommandOutcome`` and never prints.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rocm_audit.elf.view import ElfView
from rocm_audit.errors import UsageError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.formats import triton_metadata
from rocm_audit.formats.offload_bundle import DEVICE_KINDS, comgr_selectable, parse_entry_id
from rocm_audit.gpu.codeobjects import CodeObject, FileCodeObjects, scan_file
from rocm_audit.outcome import CommandOutcome
from rocm_audit.progress import SILENT, Progress
from rocm_audit.report_types import CarrierMatch, CarrierRecord, CodeObjectFileRecord, CodeObjectRecord, TargetsOrigin
from rocm_audit.tree.archfiles import arch_folder_of, miopen_db_arch
from rocm_audit.tree.discovery import enclosing_sdk_tree, is_tree_of, resolve_roots
from rocm_audit.tree.inventory import FileKind, FileRecord, Inventory, build_inventory
from rocm_audit.tree.ownership import this_target_family
from rocm_audit.tree.smallfile import read_small
from rocm_audit.tree.targets import (
    SPIRV_PROCESSOR,
    MatchKind,
    RequiredTarget,
    TargetId,
    TargetSelection,
    arch_tokens,
    best_match,
    choose_entry,
    is_family_name,
    match_code_object,
    parse_target_id,
    resolve_required,
    split_target_args,
)

CORE_TREE = "_rocm_sdk_core"
DIST_INFO_IN_TREE = os.path.join("share", "therock", "dist_info.json")
MAX_DIST_INFO_BYTES = 1 << 20  # TheRock writes a few hundred bytes
DIST_INFO = os.path.join(CORE_TREE, DIST_INFO_IN_TREE)
HOST_KINDS = (FileKind.SHARED_LIBRARY, FileKind.EXECUTABLE, FileKind.OTHER_ELF)
# Containers only a host binary has (gpu/codeobjects.py): its units are TUs and embedded images.
HOST_CONTAINERS = ("hip-fatbin", "kpack", "embedded-elf", "embedded-offload-bundle", "embedded-ccob")

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


# ---------------------------------------------------------------------------------------------
# Requested targets


@dataclass(frozen=True, slots=True)
class TargetCandidate:
    """A target list found outside the command line, environment and rules file (an image's Env or
    build history), with a label for people (``source``) and one for programs (``origin``)."""

    value: str
    source: str
    origin: TargetsOrigin


@dataclass(frozen=True, slots=True)
class TargetChoice:
    targets: list[RequiredTarget]
    source: str  # for people: "command line", "$GPU_ARCH", a dist_info.json path ...
    origin: TargetsOrigin  # the JSON ``targets_origin``: kind, and variable / path / history_index


def requested_targets(
    args: list[str], roots: Iterable[str], environ: dict[str, str]
) -> tuple[list[RequiredTarget], str]:
    """(targets, source) of :func:`choose_targets` for prune (never narrowed to the installed
    device wheels). Raises UsageError."""
    choice = choose_targets(args, roots, environ, narrow_to_device_wheels=False, command="prune")
    return choice.targets, choice.source


def choose_targets(
    args: list[str],
    roots: Iterable[str],
    environ: Mapping[str, str],
    recorded: Sequence[TargetCandidate] = (),
    environ_label: str = "$GPU_ARCH",
    *,
    narrow_to_device_wheels: bool = True,
    command: str = "verify-arch",
) -> TargetChoice:
    """The first of: arguments; $GPU_ARCH; the policy's ``targets``; ``recorded`` (what an image
    says, in order); ``dist_amdgpu_targets`` of dist_info.json; plus the policy's
    ``extra_targets`` (``--rules``). Raises UsageError when none gives a target.

    dist_info.json lists every target of the build, while a kpack-split install holds the device
    wheels its user chose (``rocm[libraries,device-gfx942]``, as TheRock's docs advise): with
    ``narrow_to_device_wheels`` and at least one ``rocm-sdk-device-<gfx>`` installed beside the core
    tree, only the listed targets with an installed device wheel are judged. With none installed
    every listed target is (the libraries then have no kernels at all). prune passes False: what
    it keeps is never narrower than the build. ``command`` is named in the error when no target
    is given, as an example of passing them."""
    from rocm_audit.rulebook.policy import policy

    settings = policy("verify-arch")
    names = split_target_args(args)
    source = "command line"
    origin: TargetsOrigin = {"kind": "command-line"}
    if not names and environ.get("GPU_ARCH", "").strip():
        names = split_target_args([environ["GPU_ARCH"]])
        source, origin = environ_label, {"kind": "environment", "variable": "GPU_ARCH"}
    if not names and settings.get("targets"):
        names = split_target_args(list(settings["targets"]))
        source, origin = "rules file (policy.verify-arch.targets)", {"kind": "rules-file"}
    for candidate in recorded:
        if names:
            break
        names = split_target_args([candidate.value])
        source, origin = candidate.source, candidate.origin.copy()
    if not names:
        for path in dist_info_candidates(roots):
            names = _targets_from_dist_info(path)
            if names:
                source, origin = path, {"kind": "dist-info", "path": path}
                if narrow_to_device_wheels:
                    names, source = _narrowed_to_device_wheels(names, path, source, origin)
                break
    extra = [n for n in split_target_args(list(settings.get("extra_targets", []))) if n not in names]
    if extra:
        names = names + extra
        source += " + rules file (policy.verify-arch.extra_targets)"
        origin["extra_targets"] = extra
    if not names:
        raise UsageError(
            f'no GPU target given: name them (rocm-audit {command} gfx942 gfx950, or "gfx942;gfx950"), '
            f"set GPU_ARCH, or audit a tree with {DIST_INFO}"
        )
    origin["value"] = ";".join(names)
    required: list[RequiredTarget] = []
    for name in names:  # MI300X and gfx942 are one target
        target = resolve_required(name)
        if all(target.spelled != seen.spelled for seen in required):
            required.append(target)
    return TargetChoice(required, source, origin)


def dist_info_candidates(roots: Iterable[str]) -> list[str]:
    """dist_info.json of every ``_rocm_sdk_core`` tree beside or above the roots; TheRock's version
    nonce renames the tree (``_rocm_sdk_core17154321``, ``_rocm_sdk_core_r7130``; formats.md 1.2), so
    every spelling counts (tree/discovery.py is_tree_of)."""
    found = []
    for root in roots:
        tree = enclosing_sdk_tree(root)
        base = os.path.dirname(tree) if tree else root
        try:
            names = sorted(os.listdir(base))
        except OSError:
            continue
        for name in names:
            if is_tree_of(name, "core"):
                candidate = os.path.join(base, name, DIST_INFO_IN_TREE)
                if os.path.isfile(candidate) and candidate not in found:
                    found.append(candidate)
    return found


# The dist-info dir pip writes for TheRock's rocm-sdk-device-<gfx> wheel (build_python_packages.py
# _run_kpack_split; xnack variants share one wheel per base target).
_DEVICE_WHEEL_DIST_INFO = re.compile(r"^rocm_sdk_device_(gfx[0-9a-z]+)-[^/]*\.dist-info$")


def installed_device_wheel_targets(site_dir: str) -> list[str]:
    """Base targets of the ``rocm-sdk-device-<gfx>`` distributions installed in ``site_dir``."""
    try:
        names = os.listdir(site_dir)
    except OSError:
        return []
    return sorted({m.group(1) for name in names if (m := _DEVICE_WHEEL_DIST_INFO.match(name))})


# The dist-info dir pip writes for a legacy per-family libraries wheel (build_python_packages.py
# _run_legacy: rocm-sdk-libraries-gfx94X-dcgpu, rocm-sdk-libraries-gfx1151, ...). A family name
# ending in X stands for every processor of that prefix (cmake/therock_amdgpu_targets.cmake:
# gfx94X-dcgpu = gfx942, gfx90X-dcgpu = gfx908 + gfx90a, gfx110X-all = gfx1100..gfx1103).
_FAMILY_WHEEL_DIST_INFO = re.compile(r"^rocm_sdk_libraries_(gfx[0-9a-z]+(?:_[a-z]+)*)-[^/]*\.dist-info$", re.IGNORECASE)


def installed_library_families(site_dir: str) -> list[str]:
    """Families (``gfx94X-dcgpu``, ``gfx1151``) of the legacy per-family libraries wheels in ``site_dir``."""
    try:
        names = os.listdir(site_dir)
    except OSError:
        return []
    return sorted({m.group(1).replace("_", "-") for name in names if (m := _FAMILY_WHEEL_DIST_INFO.match(name))})


def _in_family(target: str, family: str) -> bool:
    family = family.split("-")[0].lower()
    if family.endswith("x"):
        return len(target) == len(family) and target.startswith(family[:-1])
    return target == family


def _narrowed_to_device_wheels(
    names: list[str], dist_info_path: str, source: str, origin: TargetsOrigin
) -> tuple[list[str], str]:
    """dist_info.json lists the build's targets; an install holds the device code its user chose:
    the rocm-sdk-device-<gfx> wheels of a kpack split, or the per-family libraries wheels of the
    legacy flow. Only the listed targets that some installed wheel is for are judged."""
    # <site>/_rocm_sdk_core*/share/therock/dist_info.json
    site_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(dist_info_path))))
    installed = installed_device_wheel_targets(site_dir)
    if installed:
        kept = [n for n in names if n.split(":")[0] in installed]
        if not kept or kept == names:
            return names, source
        origin["device_wheels"] = installed
        wheels = ", ".join(f"rocm-sdk-device-{t}" for t in installed)
        return kept, f"{source}, narrowed to the installed device wheels ({wheels})"
    families = installed_library_families(site_dir)
    kept = [n for n in names if any(_in_family(n.split(":")[0], f) for f in families)]
    if not kept or kept == names:
        return names, source
    origin["library_families"] = families
    wheels = ", ".join(f"rocm-sdk-libraries-{f}" for f in families)
    return kept, f"{source}, narrowed to the installed per-family libraries ({wheels})"


def _targets_from_dist_info(path: str) -> list[str]:

    import json  # noqa: PLC0415 - only when dist_info.json is read

    try:
        document = json.loads(read_small(path, MAX_DIST_INFO_BYTES))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    value = document.get("dist_amdgpu_targets") if isinstance(document, dict) else None
    if isinstance(value, str):
        return split_target_args([value])
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return split_target_args(value)
    return []


# ---------------------------------------------------------------------------------------------
# Scanning every file


def _database_root(path: str) -> tuple[str, str, bool] | None:
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


def _database_arches(kind: str, rel_path: str) -> list[str]:
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
        database = _database_root(record.path)
        if database is not None:
            kind, root, _judged = database
            rel = os.path.relpath(record.path, root)
            scanned = (
                code_objects_of(inventory, record, selection)
                if may_hold_code(record)
                else FileCodeObjects(record.path, record.sdk_tree, record.opened_kind.value)
            )
            arches = _database_arches(kind, rel)
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


# ---------------------------------------------------------------------------------------------
# Carriers and judgement


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
        the same whether or not an entry was read."""
        return sorted({name for obj in self.code_objects if (name := _named_target(obj) or obj.target)})


def _package(sdk_tree: str | None) -> str | None:
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
        database = _database_root(scanned.path)
        if database is not None:
            kind, root, judged = database
            if not judged:
                continue
            carrier = groups.get(root)
            if carrier is None:
                carrier = Carrier(
                    root,
                    _package(scanned.sdk_tree),
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
                carrier = Carrier(path, _package(scanned.sdk_tree), kind, [], tus, family=family_of(scanned.sdk_tree))
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
            _package(scanned.sdk_tree),
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


def _entry_match(obj: CodeObject, agent: TargetId) -> MatchKind | None:
    if obj.target is None:
        return None
    if obj.target_source == "e_flags" and obj.code_object_version is None:
        # The header was read and its OS ABI is not HSA (PAL, Mesa3D): CLR takes an ELF image only
        # with ELFOSABI_AMDGPU_HSA (hip_fatbin.cpp IsCodeObjectElf), and so does ROCr's loader.
        return None
    code = parse_target_id(obj.target)
    if code is None:
        return None
    return match_code_object(
        code,
        agent,
        code_object_version=obj.code_object_version,
        generic_version=obj.generic_version,
    )


def unselectable(obj: CodeObject) -> bool:
    """An entry of an uncompressed bundle whose id the HIP runtime's lookup (comgr) never matches,
    whatever the device (``offload_bundle.comgr_selectable``): ROCm 4.0's 3-field
    ``hip-amdgcn-amd-amdhsa-gfxN``. CCOB entries are unbundled by comgr's bundler instead."""
    if obj.container != "offload-bundle" or obj.entry_id is None or obj.kind == "host":
        return False
    return _unmatched_id(obj.entry_id)


@functools.lru_cache(maxsize=4096)
def _unmatched_id(entry_id: str) -> bool:
    """Parsed once per id: tu_match asks for every entry, once per target."""
    return not comgr_selectable(parse_entry_id(entry_id))


def _named_target(obj: CodeObject) -> str | None:
    """The target an entry's bundle id or kpack key names: what the runtime selects it by."""
    if obj.target_source == "file-name" or obj.bundle_target is None:
        return None
    return obj.bundle_target if parse_target_id(obj.bundle_target) is not None else None


def tu_match(objects: list[CodeObject], agent: TargetId) -> MatchKind | None:
    """How one translation unit serves ``agent``, as the runtime decides: it selects an entry by
    the target its id names (``choose_entry``); the loader then takes it only if the code object's
    own ELF header, when read, agrees (features, code-object version of generic entries). Entries
    whose id names no target (raw ELFs, database files) count by what their header or name says;
    an entry comgr's lookup never selects (a 3-field bundle id) does not count at all."""
    objects = [obj for obj in objects if not unselectable(obj)]
    named = [_named_target(obj) for obj in objects]
    kinds = [_entry_match(obj, agent) for obj, name in zip(objects, named, strict=True) if name is None]
    # CLR asks kpack for the device's own name and its generic only (hip_fatbin.cpp
    # ExtractKpackBinary): a SPIR-V kernel in an archive is never looked up.
    from_kpack = [obj.container == "kpack" for obj in objects]
    named = [None if kpack and name == SPIRV_PROCESSOR else name for name, kpack in zip(named, from_kpack, strict=True)]
    chosen = choose_entry(named, agent)
    if chosen is not None:
        index, kind = chosen
        obj = objects[index]
        if obj.target_source != "e_flags" or _entry_match(obj, agent) is not None:
            kinds.append(kind)
    return best_match(kinds)


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


def judge_all(carriers: list[Carrier], required: list[RequiredTarget]) -> list[Finding]:
    """Judge every carrier. Co-installed per-family trees: a target that some installed family
    covers is asked only of that family's carriers; a target no family covers is asked of all of
    them (nothing would serve it: each carrier says so)."""
    families = {c.family for c in carriers if c.family}
    covered = {t.spelled for t in required if any(_in_family(t.agent.processor, f) for f in families)}
    findings: list[Finding] = []
    for carrier in carriers:
        family = carrier.family
        asked = required
        if family is not None:
            asked = [t for t in required if t.spelled not in covered or _in_family(t.agent.processor, family)]
        findings.extend(judge(carrier, asked))
    return findings


def judge(carrier: Carrier, required: list[RequiredTarget]) -> list[Finding]:
    """Fill ``matches``/``missing``; return ARCH001/ARCH002/ARCH008/ARCH009 findings."""
    findings: list[Finding] = []
    spirv_only: list[str] = []
    compiled: list[tuple[str, int]] = []  # Triton kernels compiled at first use: (target, how many)
    for target in required:
        per_tu = [tu_match(tu, target.agent) for tu in carrier.tus]
        tus_without = [index for index, how in enumerate(per_tu) if how is None]
        order = [MatchKind.NATIVE, MatchKind.GENERIC, MatchKind.SPIRV]
        how = None if tus_without else max(per_tu, key=lambda k: order.index(k) if k else -1)
        jit = how is None and carrier.kind == "triton-kernels"
        carrier.matches.append(
            {
                "target": target.spelled,
                "agent": str(target.agent),
                "how": "jit" if jit else how.value if how else None,
                "tus_without": tus_without,
            }
        )
        if jit:
            compiled.append((target.spelled, len(tus_without)))
        elif how is None:
            carrier.missing.append(target.spelled)
        elif how is MatchKind.SPIRV:
            spirv_only.append(target.spelled)
    if spirv_only:  # one finding per carrier; "target" (the first) is the schema-v1 field
        findings.append(
            make_finding(
                "ARCH002",
                carrier.path,
                f"{', '.join(spirv_only)} {'is' if len(spirv_only) == 1 else 'are'} served only by SPIR-V "
                "(JIT-compiled at load time)",
                data={"target": spirv_only[0], "targets": spirv_only},
            )
        )
    if compiled:
        counts = "; ".join(f"{target}: {count} of {len(carrier.tus)}" for target, count in compiled)
        findings.append(
            make_finding(
                "ARCH009",
                carrier.path,
                f"Triton kernels built for other GPUs only, compiled at first use there ({counts}); "
                f"found: {', '.join(carrier.targets()) or 'none'}",
                data={"targets": [t for t, _ in compiled], "kernels": dict(compiled), "of": len(carrier.tus)},
            )
        )
    if carrier.missing:
        rule = (
            "ARCH008"
            if carrier.kind.startswith("kernel-database") or carrier.kind in ("per-arch-files", "per-arch-folders")
            else "ARCH001"
        )
        lacking = sorted({i for m in carrier.matches if m["how"] is None for i in m["tus_without"]})
        detail, data = _lacking_units(carrier, lacking)
        found = ", ".join(carrier.targets()) or "none"
        if any(unselectable(obj) for obj in carrier.code_objects):
            found += (
                " (uncompressed bundle ids the HIP runtime's lookup never matches, such as the 3-field"
                " hip-amdgcn-amd-amdhsa-<gfx> of ROCm 4.0's clang: those entries load on no device)"
            )
            data["unmatched_ids"] = sorted(
                {obj.entry_id.rstrip("\0") for obj in carrier.code_objects if obj.entry_id and unselectable(obj)}
            )
        findings.append(
            make_finding(
                rule,
                carrier.path,
                f"no code object for {', '.join(carrier.missing)}{detail}; found: {found}",
                data={"missing": list(carrier.missing), "targets": carrier.targets(), **data},
            )
        )
    return findings


def _lacking_units(carrier: Carrier, lacking: list[int]) -> tuple[str, dict[str, Any]]:
    """The text and data that say which units lack a target: translation units by number, images
    embedded in data sections by their place, so that one of tensorflow's 1,149 can be found. One
    finding per carrier, however many units lack it (as for TUs)."""
    images = carrier.unit_places
    tus = [i for i in lacking if i not in images]
    places = [images[i] for i in lacking if i in images]
    tu_total = len(carrier.tus) - len(images)
    parts = []
    if tus and (tu_total > 1 or images):
        parts.append(f"translation units without it: {_compact(tus)} of {tu_total}")
    if places:
        parts.append(f"embedded images without it: {_compact(places)} of {len(images)}")
    detail = f" ({'; '.join(parts)})" if parts else ""
    return detail, ({"images_without": places} if images else {})


def _compact(numbers: Sequence[int | str], limit: int = 12) -> str:
    text = ", ".join(str(n) for n in numbers[:limit])
    return text + (f", ... ({len(numbers)} in all)" if len(numbers) > limit else "")


# ---------------------------------------------------------------------------------------------
# Commands


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
        "missing": sorted(carrier.missing),
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


def verify_arch(
    paths: list[str] | None,
    target_args: list[str],
    *,
    environ: dict[str, str] | None = None,
    progress: Progress = SILENT,
) -> CommandOutcome:
    """Judge every carrier under ``paths`` against the requested targets. Raises UsageError."""
    roots, looked = resolve_roots(paths)
    choice = choose_targets(target_args, [r.path for r in roots], dict(os.environ) if environ is None else environ)
    required = choice.targets
    inventory = build_inventory(roots, progress)
    scans = scan_inventory(inventory, selection_for(required), progress)
    progress.phase(f"judging GPU code against {len(required)} target(s)")
    carriers = build_carriers(scans)
    findings = list(inventory.findings) + scan_findings(scans)
    findings.extend(judge_all(carriers, required))
    failing = sum(1 for c in carriers if c.missing)
    outcome = CommandOutcome(
        command="verify-arch",
        findings=findings,
        inputs=looked,
        sections={
            "targets": [{"target": t.spelled, "agent": str(t.agent)} for t in required],
            "targets_source": choice.source,
            "targets_origin": choice.origin,
            "carriers": [carrier_to_dict(c) for c in carriers],
        },
        summary=f"verify-arch: {len(carriers)} carrier(s), {failing} missing a target of "
        f"{', '.join(t.spelled for t in required)}",
    )
    return outcome


def list_targets(paths: list[str] | None, *, progress: Progress = SILENT) -> CommandOutcome:
    """Every code object in every file under ``paths`` (``scan --targets``)."""
    roots, looked = resolve_roots(paths)
    inventory = build_inventory(roots, progress)
    scans = scan_inventory(inventory, progress=progress)
    objects = [code_object_to_dict(s.path, obj) for s in scans for obj in s.code_objects]
    files: list[CodeObjectFileRecord] = [
        {
            "path": s.path,
            "package": _package(s.sdk_tree),
            "containers": sorted(s.containers),
            "tu_count": s.tu_count,
            "wrappers": s.wrappers,
            "kpack": s.kpack_ref,
            "code_objects": len(s.code_objects),
        }
        for s in scans
    ]
    return CommandOutcome(
        command="scan",
        findings=list(inventory.findings) + scan_findings(scans),
        inputs=looked,
        sections={"code_object_files": files, "code_objects": objects},
        summary=f"scan: {len(objects)} code object(s) in {len(files)} file(s)",
    )


def inventory_summary(paths: list[str] | None, *, progress: Progress = SILENT) -> CommandOutcome:
    """Plain ``scan``: how many files of each kind, and the SDK trees, under ``paths``."""
    roots, looked = resolve_roots(paths)
    inventory = build_inventory(roots, progress)
    counts = {kind.value: 0 for kind in FileKind}
    for record in inventory.files:
        counts[record.opened_kind.value] += 1

    return CommandOutcome(
        command="scan",
        findings=list(inventory.findings),
        inputs=looked,
        sections={"sdk_trees": inventory.sdk_trees, "file_kinds": counts},
        summary=f"scan: {len(inventory.files)} file(s)",
    )
