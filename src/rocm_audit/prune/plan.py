"""What prune may remove for a set of kept targets, and why each thing it leaves is kept.

Two kinds of removal, both whole:

- a device distribution for an arch no kept target can use (TheRock ``rocm-sdk-device-gfxNNN``,
  PyTorch ``amd-*-device-gfxNNN``), uninstalled by its interpreter's pip, plus the devel links
  TheRock made for its files;
- a per-arch unit (tree/archfiles.py) that no distribution of that kind owns.

Nothing is removed that a kept target could load (its name or its code objects serve a kept
target: native, generic or SPIR-V, tree/targets.serves_kept), that another library names in
DT_NEEDED, that a link from outside the devel mirror points into, or that lies outside the
audited trees. Fat binaries inside host libraries are weighed (prune/weigh.py), never touched.

Code objects come from the caller (``device_code``): the scan lives in gpu/, which a capability
does not import; the audit layer passes gpu's fact reader in.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from rocm_audit.errors import FormatError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.formats.offload_bundle import DEVICE_KINDS
from rocm_audit.tree.archfiles import ArchUnit, PathUnits, device_distribution_arch, path_units
from rocm_audit.tree.discovery import AuditRoot, enclosing_sdk_tree
from rocm_audit.tree.inventory import FileKind, FileRecord, Inventory, LinkRecord
from rocm_audit.tree.ownership import Distribution, normalize, owners, read_distributions
from rocm_audit.tree.smallfile import read_small
from rocm_audit.tree.targets import TargetId, serves_kept

# A device wheel's .devel_links/<arch>.json lists one row per device file (some 1,000 in TheRock's).
MAX_DEVEL_LINKS_BYTES = 64 << 20


class DeviceEntry(Protocol):
    """One code object as gpu/codeobjects.py lists it (only what prune reads)."""

    @property
    def container(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def tu(self) -> int | None: ...
    @property
    def kind(self) -> str: ...
    @property
    def target(self) -> str | None: ...
    @property
    def code_object_version(self) -> int | None: ...
    @property
    def generic_version(self) -> int | None: ...


class DeviceCode(Protocol):
    """Every code object of one file, with the bundles they came from."""

    @property
    def code_objects(self) -> Sequence[DeviceEntry]: ...
    @property
    def bundles(self) -> Sequence[tuple[int, int, str]]: ...
    @property
    def containers(self) -> Sequence[str]: ...


# The code objects of a file (None when it can hold none); the caller's cached fact reader.
DeviceCodeOf = Callable[[FileRecord], DeviceCode | None]


@dataclass(frozen=True, slots=True)
class Kept:
    """A target to keep: as spelled, and as the pattern matched against code (tree/targets.kept_target)."""

    spelled: str
    pattern: TargetId


def serves_any(target: str | None, kept: Sequence[Kept], *, cov: int | None = None, gv: int | None = None) -> bool:
    """Whether some kept target could load code for ``target``: verify-arch's matching rule asked
    of every device a kept target names, plus prune's deliberate superset (tree/targets.serves_kept)."""
    if target is None:
        return True  # unknown target: never removed
    return any(serves_kept(target, k.pattern, code_object_version=cov, generic_version=gv) is not None for k in kept)


def device_entries(code: DeviceCode | None) -> list[DeviceEntry]:
    if code is None:
        return []
    return [obj for obj in code.code_objects if obj.kind in DEVICE_KINDS]


@dataclass(slots=True)
class Removal:
    """One planned removal: a per-arch unit, or a device distribution (``distribution`` set)."""

    kind: str  # a unit kind (tree/archfiles.py), or "device-distribution"
    path: str  # the unit's file or folder; the .dist-info of a distribution
    arches: tuple[str, ...]
    files: list[FileRecord] = field(default_factory=list)  # regular files removed (by hand or by pip)
    links: list[LinkRecord] = field(default_factory=list)  # symbolic links removed with them
    directories: list[str] = field(default_factory=list)  # folders left empty, removed after the files
    devel_links: list[FileRecord | LinkRecord] = field(default_factory=list)  # TheRock's devel mirror of the files
    shared: list[str] = field(default_factory=list)  # files a kept distribution owns too: put back after pip
    distribution: Distribution | None = None  # the device distribution to uninstall
    owners: dict[str, Distribution] = field(default_factory=dict)  # path -> distribution that installed it
    status: str = "planned"  # planned | removed | skipped | failed
    reason: str = ""

    @property
    def bytes_on_disk(self) -> int:
        """Bytes the removal frees: each inode once (devel hardlinks share their file's inode)."""
        seen: dict[tuple[int, int], int] = {}
        for record in [*self.files, *(d for d in self.devel_links if isinstance(d, FileRecord))]:
            seen[record.identity] = record.size
        return sum(seen.values())


@dataclass(slots=True)
class KeptUnit:
    """A per-arch unit or device distribution for a pruned arch that stays, and why (PRUNE002)."""

    path: str
    arches: tuple[str, ...]
    reason: str


@dataclass(slots=True)
class PrunePlan:
    # The audited roots and SDK trees (where the manifest goes, what the apply locks): the plan
    # keeps these, not the inventory, which its callers hold already.
    roots: list[AuditRoot]
    sdk_trees: list[str]
    kept: list[Kept]
    distributions: list[Distribution]
    owner_of: dict[str, Distribution]
    removals: list[Removal] = field(default_factory=list)
    kept_units: list[KeptUnit] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    unit_of_path: dict[str, ArchUnit] = field(default_factory=dict)  # every per-arch file, kept or not
    device_dist_of_path: dict[str, Distribution] = field(default_factory=dict)

    @property
    def removable_bytes(self) -> int:
        return sum(r.bytes_on_disk for r in self.removals)


def _is_devel(record_tree: str | None) -> bool:
    return bool(record_tree) and os.path.basename(str(record_tree)).startswith("_rocm_sdk_devel")


class _Context:
    """Indexes of the inventory that the safety checks ask."""

    def __init__(self, inventory: Inventory, device_code: DeviceCodeOf) -> None:
        self.inventory = inventory
        self.device_code = device_code
        self.by_path = {r.path: r for r in inventory.files}
        self.by_identity: dict[tuple[int, int], list[FileRecord]] = {}
        for record in inventory.files:
            self.by_identity.setdefault(record.identity, []).append(record)
        self.links_by_target: dict[str, list[LinkRecord]] = {}
        for link in inventory.links:
            resolved = inventory.resolved(link)
            if resolved is not None:
                self.links_by_target.setdefault(resolved, []).append(link)
        self._needed: dict[str, list[str]] | None = None

    def needed_by(self) -> dict[str, list[str]]:
        """DT_NEEDED name -> paths of the files that need it (read once, on first use)."""
        if self._needed is None:
            self._needed = {}
            for record in self.inventory.files:
                if record.kind not in (FileKind.SHARED_LIBRARY, FileKind.EXECUTABLE):
                    continue
                try:
                    needed = self.inventory.dynamic(record).needed
                except (OSError, FormatError):
                    continue
                for name in needed:
                    self._needed.setdefault(name, []).append(record.path)
        return self._needed

    def names_of(self, record: FileRecord) -> set[str]:
        names = {os.path.basename(record.path)}
        if record.kind is FileKind.SHARED_LIBRARY:
            try:
                soname = self.inventory.dynamic(record).soname
            except (OSError, FormatError):
                soname = None
            if soname:
                names.add(soname)
        return names


def _why_kept(
    ctx: _Context, files: list[FileRecord], kept: list[Kept], removed: set[str]
) -> tuple[str | None, list[LinkRecord], list[FileRecord]]:
    """The reason a set of files must stay, or None; plus the devel links that go with them
    (symbolic links and other hardlink names inside a devel tree)."""
    links: list[LinkRecord] = []
    names: list[FileRecord] = []
    for record in files:
        for obj in device_entries(ctx.device_code(record)):
            if serves_any(obj.target, kept, cov=obj.code_object_version, gv=obj.generic_version):
                return f"{record.path} holds code for {obj.target}, which a kept target loads", [], []
        if record.kind is FileKind.SHARED_LIBRARY:
            needers = [
                path for name in ctx.names_of(record) for path in ctx.needed_by().get(name, []) if path not in removed
            ]
            if needers:
                return f"{needers[0]} needs {os.path.basename(record.path)} (DT_NEEDED)", [], []
        for link in ctx.links_by_target.get(record.path, []):
            if link.path in removed:
                continue
            if not _is_devel(link.sdk_tree):
                return f"the link {link.path} points to {record.path}", [], []
            links.append(link)
        for other in ctx.by_identity.get(record.identity, []):
            if other.path == record.path or other.path in removed:
                continue
            if not _is_devel(other.sdk_tree):
                return f"{other.path} is a hardlink of {record.path}", [], []
            names.append(other)
    return None, links, names


def _content_arches(ctx: _Context, files: list[FileRecord]) -> tuple[str, ...]:
    """The processors the code objects in ``files`` name in their ELF headers (an AOTriton family
    folder, whose name names none); empty when one of them names none or none can be read."""
    found: set[str] = set()
    for record in files:
        for obj in device_entries(ctx.device_code(record)):
            if obj.target is None:
                return ()
            found.add(obj.target.split(":")[0])
    return tuple(sorted(found))


def _kept_arch(arches: tuple[str, ...], kept: list[Kept]) -> bool:
    return any(serves_any(arch, kept) for arch in arches)


def make_plan(inventory: Inventory, kept: list[Kept], device_code: DeviceCodeOf) -> PrunePlan:
    """The removals for ``kept``; every unit for a pruned arch that stays is a PRUNE002 finding."""
    distributions = read_distributions([r.path for r in inventory.roots if not r.single_file], inventory.sdk_trees)
    plan = PrunePlan(inventory.roots, inventory.sdk_trees, kept, distributions, owners(distributions))
    ctx = _Context(inventory, device_code)
    inside = set(ctx.by_path) | {link.path for link in inventory.links}

    device_dists = [(d, arch) for d in distributions if (arch := device_distribution_arch(d.name)) is not None]
    _tag_units(plan, inventory, device_code, distributions, device_dists)
    _plan_device_distributions(plan, ctx, inventory, kept, device_dists, inside)
    _plan_arch_units(plan, ctx, inventory, kept)
    return plan


def _tag_units(
    plan: PrunePlan,
    inventory: Inventory,
    device_code: DeviceCodeOf,
    distributions: list[Distribution],
    device_dists: list[tuple[Distribution, str]],
) -> None:
    """Which device distribution installed each path, and which per-arch unit each file belongs to."""
    device_names = {d.dist_info for d, _arch in device_dists}
    for distribution, _arch in device_dists:
        for path in distribution.files:
            # a file another kind of distribution installs too (_rocm_sdk_libraries/__init__.py) is not device content
            if not any(o.files.get(path) for o in distributions if o.dist_info not in device_names):
                plan.device_dist_of_path[path] = distribution
    # One pass over the paths: what each name says, asked below and by _code_object_folders.
    named = {record.path: path_units(record.path) for record in inventory.files}
    folders = _code_object_folders(inventory, device_code, named)
    for record in inventory.files:
        naming = named[record.path]
        unit = naming.named
        if unit is None and naming.folder is not None:
            unit = folders.get(naming.folder.path)
        if unit is None and record.kind is not FileKind.SHARED_LIBRARY and _is_code_object_file(record):
            candidate = naming.file
            code = device_entries(device_code(record))
            if candidate is not None and code and all(_same_processor(o.target, candidate.arches[0]) for o in code):
                unit = candidate
        if unit is not None:
            plan.unit_of_path[record.path] = unit


def _plan_device_distributions(
    plan: PrunePlan,
    ctx: _Context,
    inventory: Inventory,
    kept: list[Kept],
    device_dists: list[tuple[Distribution, str]],
    inside: set[str],
) -> None:
    """Removals of whole device distributions for arches no kept target loads (pip uninstall)."""
    distributions = plan.distributions
    for distribution, arch in device_dists:
        if _kept_arch((arch,), kept):
            continue
        present = [path for path in distribution.files if os.path.lexists(path)]
        # TheRock's device wheels list _rocm_sdk_libraries/__init__.py, which the libraries wheel owns.
        shared = sorted(
            p
            for p in present
            if any(o is not distribution and o.files.get(p) for o in distributions)
            and distribution.files.get(p) is not None
        )
        present = [p for p in present if p not in shared]
        outside = [path for path in present if path not in inside and not _in_dist_info(path, distribution)]
        files = [ctx.by_path[p] for p in present if p in ctx.by_path]
        links = [link for link in inventory.links if link.path in distribution.files]
        removal = Removal(
            "device-distribution",
            distribution.dist_info,
            (arch,),
            files=[f for f in files if not _in_dist_info(f.path, distribution)],
            links=links,
            distribution=distribution,
            shared=shared,
        )
        removal.owners = {p: next(o for o in distributions if o is not distribution and o.files.get(p)) for p in shared}
        if outside:
            _keep(plan, removal, f"{distribution.name} owns {outside[0]}, outside the audited trees")
            continue
        removed = set(distribution.files)
        reason, devel_symlinks, devel_names = _why_kept(ctx, removal.files, kept, removed)
        if reason is not None:
            _keep(plan, removal, reason)
            continue
        removal.devel_links = _devel_mirror(ctx, distribution, removal.files, devel_symlinks, devel_names)
        plan.removals.append(removal)


def _plan_arch_units(plan: PrunePlan, ctx: _Context, inventory: Inventory, kept: list[Kept]) -> None:
    """Removals of per-arch units (files and folders) that no device distribution owns."""
    units: dict[str, tuple[ArchUnit, list[FileRecord]]] = {}
    device_relpaths = _device_relpaths(plan)
    for record in inventory.files:
        unit = plan.unit_of_path.get(record.path)
        if unit is None or record.path in plan.device_dist_of_path:
            continue
        if _is_devel(record.sdk_tree) and _mirrors_device_file(ctx, device_relpaths, record):
            continue  # a devel link of a device distribution's file: goes (or stays) with it
        units.setdefault(unit.path, (unit, []))[1].append(record)
    for unit_path in sorted(units):
        unit, files = units[unit_path]
        arches = unit.arches or _content_arches(ctx, files)
        if not arches:
            continue  # an AOTriton family folder none of whose code objects can be read: never removed
        if _kept_arch(arches, kept):
            continue
        removal = Removal(unit.kind, unit.path, arches, files=files)
        if unit.is_dir:
            foreign = [p for p in plan.device_dist_of_path if p.startswith(unit.path + os.sep) and os.path.lexists(p)]
            if foreign:
                _keep(plan, removal, f"{foreign[0]} belongs to a device distribution")
                continue
            removal.links = [link for link in inventory.links if link.path.startswith(unit.path + os.sep)]
            removal.directories = _directories_under(unit.path)
        removed = {r.path for r in files} | {link.path for link in removal.links}
        reason, devel_symlinks, devel_names = _why_kept(ctx, files, kept, removed)
        if reason is not None:
            _keep(plan, removal, reason)
            continue
        removal.devel_links = [*devel_names, *devel_symlinks]
        removal.owners = {r.path: plan.owner_of[r.path] for r in files if r.path in plan.owner_of}
        plan.removals.append(removal)


def distribution_matches(name: str, patterns: Sequence[tuple[str, str]]) -> str | None:
    """Where the first of ``patterns`` ((PEP 503 name or glob, where it came from)) that names the
    distribution ``name`` came from, or None."""
    normalized = normalize(name)
    for pattern, source in patterns:
        if fnmatch.fnmatchcase(normalized, normalize(pattern)):
            return source
    return None


def keep_distributions(plan: PrunePlan, patterns: Sequence[tuple[str, str]]) -> None:
    """Leave whole every distribution ``patterns`` names: a removal that would uninstall it or
    take a file it installed stays (PRUNE002, with where the name came from)."""
    if not patterns:
        return
    remaining = []
    for removal in plan.removals:
        named = [removal.distribution] if removal.distribution is not None else []
        named += list(removal.owners.values())
        matched = [(d, source) for d in named if (source := distribution_matches(d.name, patterns)) is not None]
        if not matched:
            remaining.append(removal)
            continue
        owner, source = matched[0]
        _keep(plan, removal, f"{owner.name} is kept whole ({source})")
    plan.removals = remaining


def _keep(plan: PrunePlan, removal: Removal, reason: str) -> None:
    plan.kept_units.append(KeptUnit(removal.path, removal.arches, reason))
    plan.findings.append(
        make_finding(
            "PRUNE002",
            removal.path,
            f"kept although it is for {', '.join(removal.arches)}: {reason}",
            data={"arches": list(removal.arches), "reason": reason},
        )
    )


def _in_dist_info(path: str, distribution: Distribution) -> bool:
    return path == distribution.dist_info or path.startswith(distribution.dist_info + os.sep)


def _code_object_folders(
    inventory: Inventory, device_code: DeviceCodeOf, named: dict[str, PathUnits]
) -> dict[str, ArchUnit]:
    """Arch folders (aiter's ``hsa/gfx942/``) that are whole per-arch units: every code object in
    one is a standalone file of code for its arch, and nothing else in it is loaded as is (no host
    ELF, no regular Python package) or belongs to a unit of its own (a Tensile ``library/``).

    Scripts go with their folder: aiter's ``hsa/<arch>/<op>/codegen.py`` are run from the device's
    own folder only (aiter/jit/core.py: ``AITER_ASM_DIR = f"{AITER_META_DIR}/hsa/{gfx}/"``, the
    ``blob_gen_cmd`` of optCompilerConfig.json), like the ``.csv`` tables beside them. A folder
    with an ``__init__.py`` is a package other code may import by name: it stays."""
    candidates: dict[str, ArchUnit] = {}
    spoiled: set[str] = set()
    for record in inventory.files:
        naming = named[record.path]
        if naming.named is not None:
            if naming.folder is not None:
                spoiled.add(naming.folder.path)
            continue
        unit = naming.folder
        if unit is None:
            continue
        if record.kind in (FileKind.SHARED_LIBRARY, FileKind.EXECUTABLE, FileKind.OTHER_ELF) or (
            os.path.basename(record.path) == "__init__.py" or record.path.endswith(".so")
        ):
            spoiled.add(unit.path)
        elif _is_code_object_file(record):
            code = device_entries(device_code(record))
            if code and all(_same_processor(o.target, unit.arches[0]) for o in code):
                candidates.setdefault(unit.path, unit)
            else:
                spoiled.add(unit.path)
    return {path: unit for path, unit in candidates.items() if path not in spoiled}


def _is_code_object_file(record: FileRecord) -> bool:
    if record.kind is FileKind.CODE_OBJECT:
        return True
    return record.kind is FileKind.NOT_ELF and record.magic.startswith((b"__CLANG_OFFLOAD_BUNDLE__", b"CCOB"))


def _same_processor(target: str | None, arch: str) -> bool:
    return target is not None and target.split(":")[0] == arch.split(":")[0]


def _directories_under(folder: str) -> list[str]:
    """Every folder under ``folder`` and itself, deepest first (removed once they are empty)."""
    found = []
    for directory, dirnames, _files in os.walk(folder):
        found.append(directory)
        dirnames.sort()
    return sorted(found, key=lambda d: (-d.count(os.sep), d))


def _devel_trees(inventory: Inventory) -> list[str]:
    return [tree for tree in inventory.sdk_trees if _is_devel(tree)]


def _devel_mirror(
    ctx: _Context,
    distribution: Distribution,
    files: list[FileRecord],
    devel_symlinks: list[LinkRecord],
    devel_names: list[FileRecord],
) -> list[FileRecord | LinkRecord]:
    """TheRock's devel links for a device distribution's files (``.devel_links/<arch>.json``):
    hardlinks, symlinks and split copies of the same bytes in ``_rocm_sdk_devel*``."""
    mirror: dict[str, FileRecord | LinkRecord] = {r.path: r for r in devel_names}
    mirror.update({link.path: link for link in devel_symlinks})
    sizes = {r.path: r for r in files}
    for manifest in [p for p in distribution.files if os.path.basename(os.path.dirname(p)) == ".devel_links"]:
        try:
            links = json.loads(read_small(manifest, MAX_DEVEL_LINKS_BYTES)).get("links", [])
        except (OSError, ValueError, AttributeError, RecursionError):  # RecursionError: nested too deeply
            continue
        libraries_root = os.path.dirname(os.path.dirname(manifest))
        for link in links if isinstance(links, list) else []:
            relpath = link.get("relpath") if isinstance(link, dict) else None
            if not isinstance(relpath, str) or relpath.startswith("/") or ".." in relpath.split("/"):
                continue
            source = sizes.get(os.path.normpath(os.path.join(libraries_root, relpath)))
            for tree in _devel_trees(ctx.inventory):
                path = os.path.normpath(os.path.join(tree, relpath))
                if path in mirror:
                    continue
                record = ctx.by_path.get(path)
                # A split copy (cp -r, one COPY --from per tree) is a devel link too when it holds the
                # same bytes; the apply compares their sha256 before removing it.
                if record is not None and source is not None and record.size == source.size:
                    mirror[path] = record
    return [mirror[p] for p in sorted(mirror)]


def _device_relpaths(plan: PrunePlan) -> dict[str, str]:
    """Relpath inside its SDK tree -> path, of every file a device distribution installed outside devel."""
    found: dict[str, str] = {}
    for path in plan.device_dist_of_path:
        tree = enclosing_sdk_tree(path)
        if tree is not None and not _is_devel(tree):
            found.setdefault(os.path.relpath(path, tree), path)
    return found


def _mirrors_device_file(ctx: _Context, device_relpaths: dict[str, str], record: FileRecord) -> bool:
    """Whether a devel file is the devel link (or a split copy of one) of a device distribution's file."""
    path = device_relpaths.get(os.path.relpath(record.path, record.sdk_tree or "/"))
    if path is None:
        return False
    other = ctx.by_path.get(path)
    return other is None or other.identity == record.identity or other.size == record.size
