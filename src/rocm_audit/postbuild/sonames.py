"""Two builds of one library in one process (POST004, POST005; pytorch issue 186516).

glibc reuses a loaded library for a new request when the request equals a name it was loaded by or
its SONAME, or when the file opened is the same file (st_dev, st_ino); otherwise it maps a new copy
(formats.md 4; glibc elf/dl-load.c ``_dl_map_object``). Two different files with one SONAME are
therefore both mapped when

1. one is reached through DT_NEEDED and the other is opened by path (a request holding a ``/``
   never matches a SONAME): amdsmi's ``ctypes.CDLL(<its own dir>/libamd_smi.so)`` beside torch's
   DT_NEEDED ``libamd_smi.so.26`` (postbuild/pyloads.py reads the package's source); or
2. two DT_NEEDED requests by different names (``libfoo.so`` and ``libfoo.so.1``) lead to the two
   files, and the first one loaded was not requested by the other's name or SONAME. Two requests by
   the same name reuse the first file whatever their RUNPATHs say: one build, never both.

The second copy's globals and initialisers run beside the first's (the issue's
``torch.cuda.device_count()`` returns 0). Left alone: byte-identical copies (dedup's DUP rules),
pairs inside TheRock's own trees (core/devel copies and links, the per-family
``_rocm_sdk_libraries_<family>`` wheels that share SONAMEs while one family is loaded per process,
device wheels, the ``rocm-sdk init`` expansion), and several paths to one file (one inode).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from rocm_audit.errors import FormatError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.postbuild.pyloads import MAX_MODULE_BYTES, MAX_MODULES, PythonLoad, loads_in_source
from rocm_audit.tree.identical import CompareStats, KnownClasses, ReadFailure, same_bytes
from rocm_audit.tree.inventory import FileKind, FileRecord, Inventory
from rocm_audit.tree.loader import LoaderModel
from rocm_audit.tree.ownership import Distribution, owners, read_distributions, site_dir_of
from rocm_audit.tree.smallfile import read_small

MAX_CLOSURE = 2000  # objects one simulated process maps before the walk stops (torch maps some 300)

Identity = tuple[int, int]


@dataclass(frozen=True, slots=True)
class _Needed:
    consumer: str  # the file whose DT_NEEDED leads here
    name: str  # the DT_NEEDED entry


@dataclass(slots=True)
class _Build:
    """One file (inode) carrying the SONAME, and how a process reaches it."""

    record: FileRecord
    needed: list[_Needed] = field(default_factory=list)
    by_path: list[PythonLoad] = field(default_factory=list)
    owner: Distribution | None = None
    unknown_loads: list[PythonLoad] = field(default_factory=list)  # the owner's loads not told statically


def two_builds_findings(inventory: Inventory, loader: LoaderModel) -> list[Finding]:
    """POST004/POST005 over the shared libraries of the inventory."""
    groups = _candidate_groups(inventory)
    if not groups:
        return []
    roots = [r.path for r in inventory.roots]
    distributions = _Distributions(roots, inventory.sdk_trees)
    findings: list[Finding] = []
    for soname, members in sorted(groups.items()):
        builds = {m.identity: _Build(m) for m in members}
        _find_consumers(inventory, loader, soname, builds)
        for build in builds.values():
            build.owner = distributions.owner(build.record.path)
            if build.owner is not None:
                for load in distributions.loads(build.owner):
                    if load.kind == "path" and _opened(load.target, loader) == build.record.identity:
                        build.by_path.append(load)
                    elif load.kind == "unknown":
                        build.unknown_loads.append(load)
        findings.extend(_judge(soname, builds, loader))
    return findings


def _candidate_groups(inventory: Inventory) -> dict[str, list[FileRecord]]:
    """SONAME -> one record per inode, for SONAMEs carried by files of different bytes where not
    all of them sit in TheRock's own trees."""
    by_soname: dict[str, dict[Identity, FileRecord]] = {}
    for record in inventory.by_kind(FileKind.SHARED_LIBRARY):
        try:
            soname = inventory.dynamic(record).soname
        except (OSError, FormatError):
            continue  # POST001/POST002 report the unreadable file
        if soname:
            by_soname.setdefault(soname, {}).setdefault(record.identity, record)
    groups: dict[str, list[FileRecord]] = {}
    for soname, by_identity in by_soname.items():
        members = sorted(by_identity.values(), key=lambda r: r.path)
        if len(members) < 2 or all(m.sdk_tree is not None for m in members):
            continue
        distinct = _distinct_builds(members, inventory.identical)
        if len(distinct) >= 2 and not all(m.sdk_tree is not None for m in distinct):
            groups[soname] = distinct
    return groups


def _distinct_builds(members: list[FileRecord], known: KnownClasses | None = None) -> list[FileRecord]:
    """One record per content among these inodes: byte-identical copies are dedup's (DUP rules).
    What this run's byte comparison (dedup's plan) already decided is asked first, not read again."""
    kept: list[FileRecord] = []
    for record in members:
        same = False
        for other in kept:
            if other.size != record.size:
                continue
            decided = known.classes_among([other.identity, record.identity]) if known is not None else None
            if decided is not None:
                same = bool(decided)
                if same:
                    break
                continue
            try:
                same = same_bytes(other.path, record.path, record.size, CompareStats())
            except ReadFailure:
                same = False
            if same:
                break
        if not same:
            kept.append(record)
    return kept


def _identity(path: str) -> Identity | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _opened(target: str, loader: LoaderModel) -> Identity | None:
    """The file a path load opens, through the modelled file system (an absolute link in an image
    stays inside it): a path beside the module is a path of the audited tree already, an absolute
    constant (``/opt/rocm/lib/...``) is one of the audited system."""
    return loader.view.identity(target) or loader.view.identity(loader.in_root(target))


def _find_consumers(inventory: Inventory, loader: LoaderModel, soname: str, builds: dict[Identity, _Build]) -> None:
    """Every DT_NEEDED entry of an audited file that the loader model resolves to one of the builds.
    Only names that can lead there are resolved: the SONAME and the file names of the builds and of
    the links to them."""
    names = {soname} | {os.path.basename(b.record.path) for b in builds.values()}
    for link in inventory.links:
        real = inventory.resolved(link)
        if real is not None and _identity(real) in builds:
            names.add(os.path.basename(link.path))
    for record in inventory.by_kind(FileKind.SHARED_LIBRARY, FileKind.EXECUTABLE):
        try:
            dynamic = inventory.dynamic(record)
        except (OSError, FormatError):
            continue
        for name in dynamic.needed:
            if name not in names:
                continue
            resolution = loader.resolve(name, record.path, dynamic)
            identity = loader.view.identity(resolution.path) if resolution.path else None
            if identity in builds:
                builds[identity].needed.append(_Needed(record.path, name))


@dataclass(slots=True)
class _Mapped:
    path: str
    identity: Identity
    names: set[str]
    soname: str | None
    requester: str  # the file whose DT_NEEDED mapped it ("" for a root)


def simulate(roots: Iterable[str], loader: LoaderModel) -> list[_Mapped]:
    """The objects one process maps when it opens ``roots`` by path in this order, each with its
    DT_NEEDED closure breadth first, with glibc's reuse rules (formats.md 4): a request equal to a
    name an object was loaded by or to its SONAME reuses it; so does the same file."""
    mapped: list[_Mapped] = []
    by_identity: dict[Identity, _Mapped] = {}
    known_names: set[str] = set()  # every name and SONAME of the objects mapped so far

    def add(one: _Mapped) -> None:
        mapped.append(one)
        by_identity[one.identity] = one
        known_names.update(one.names)
        if one.soname:
            known_names.add(one.soname)

    for root in roots:
        identity = loader.view.identity(root)
        if identity is None or identity in by_identity:
            continue
        first = _Mapped(root, identity, {root}, _soname(loader, root), "")
        add(first)
        queue = [first]
        while queue and len(mapped) < MAX_CLOSURE:
            current = queue.pop(0)
            dynamic = loader.dynamic_of(current.path)
            if dynamic is None:
                continue
            for name in dynamic.needed:
                if name in known_names:
                    continue
                resolution = loader.resolve(name, current.path, dynamic)
                found = loader.view.identity(resolution.path) if resolution.path else None
                if resolution.path is None or found is None:
                    continue
                if found in by_identity:
                    by_identity[found].names.add(name)
                    known_names.add(name)
                    continue
                one = _Mapped(
                    resolution.path, found, {name, resolution.path}, _soname(loader, resolution.path), current.path
                )
                add(one)
                queue.append(one)
    return mapped


def _soname(loader: LoaderModel, path: str) -> str | None:
    dynamic = loader.dynamic_of(path)
    return dynamic.soname if dynamic is not None else None


def _judge(soname: str, builds: dict[Identity, _Build], loader: LoaderModel) -> list[Finding]:
    """One finding per pair of builds (at least one outside TheRock's trees) one process can map."""
    findings: list[Finding] = []
    ordered = sorted(builds.values(), key=lambda b: b.record.path)
    for index, first in enumerate(ordered):
        for second in ordered[index + 1 :]:
            if first.record.sdk_tree is not None and second.record.sdk_tree is not None:
                continue
            finding = _judge_pair(soname, first, second, loader)
            if finding is not None:
                findings.append(finding)
    return findings


def _judge_pair(soname: str, first: _Build, second: _Build, loader: LoaderModel) -> Finding | None:
    # By path beside DT_NEEDED, or by path twice: a path never matches by SONAME.
    for opened, other in ((first, second), (second, first)):
        if opened.by_path and (other.needed or other.by_path):
            how_other = _how(other, other.needed[0] if other.needed else None, other.by_path[:1])
            how_opened = _how(opened, None, opened.by_path[:1])
            how = f"{how_other}; {how_opened}"
            if other.needed:
                how += (
                    ". Loaded in the other order, the DT_NEEDED request reuses the build opened by path: one "
                    "copy, but not the build its user was linked against"
                )
            return _two_builds("POST004", soname, other, opened, how)
    # Two DT_NEEDED requests by different names: one process maps both when a closure does.
    if first.needed and second.needed:
        for a in first.needed:
            for b in second.needed:
                if a.name == b.name:
                    continue  # the second request reuses the first file by name: one build
                roots = [a.consumer] if a.consumer == b.consumer else [a.consumer, b.consumer]
                for order in (roots, roots[::-1]):
                    identities = {m.identity for m in simulate(order, loader)}
                    if first.record.identity in identities and second.record.identity in identities:
                        shared = _shared_root(a.consumer, b.consumer, loader)
                        how = f"{_how(first, a, [])}; {_how(second, b, [])}"
                        if shared is not None:
                            return _two_builds("POST004", soname, first, second, how, shared)
                        return _two_builds("POST005", soname, first, second, how)
    # A build no recognised load reaches, whose own package opens a library we cannot name.
    for silent, other in ((first, second), (second, first)):
        if not silent.needed and not silent.by_path and silent.unknown_loads and (other.needed or other.by_path):
            load = silent.unknown_loads[0]
            how = (
                f"{_how(other, other.needed[0] if other.needed else None, other.by_path[:1])}; "
                f"{_package(silent)} opens a library whose path cannot be read from its source "
                f"({_where(load)})"
            )
            return _two_builds("POST005", soname, other, silent, how)
    return None


def _shared_root(consumer_a: str, consumer_b: str, loader: LoaderModel) -> str | None:
    """A consumer whose own closure maps the other one (one process for certain), else None."""
    if consumer_a == consumer_b:
        return consumer_a
    for root, other in ((consumer_a, consumer_b), (consumer_b, consumer_a)):
        other_identity = loader.view.identity(other)
        if any(m.identity == other_identity for m in simulate([root], loader)):
            return root
    return None


def _short(path: str) -> str:
    """A path relative to its site directory (``torch/lib/libtorch_hip.so``)."""
    site = site_dir_of(os.path.dirname(path), {})
    return os.path.relpath(path, site) if site else path


def _package(build: _Build) -> str:
    return f"{build.owner.name} {build.owner.version}" if build.owner is not None else "a package"


def _where(load: PythonLoad) -> str:
    return f"{_short(load.module)}:{load.line}"


def _process_of(path: str) -> str:
    """``import torch`` for a file inside an importable package, else ``loading <file>``."""
    site = site_dir_of(os.path.dirname(path), {})
    if site is not None:
        top = os.path.relpath(path, site).split(os.sep)[0]
        if top.isidentifier() and os.path.isfile(os.path.join(site, top, "__init__.py")):
            return f"import {top}"
    return f"loading {_short(path)}"


def _module_name(module: str) -> str:
    site = site_dir_of(os.path.dirname(module), {})
    if site is None:
        return os.path.basename(module)
    parts = os.path.relpath(module, site)[: -len(".py")].split(os.sep)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _how(build: _Build, needed: _Needed | None, by_path: list[PythonLoad]) -> str:
    owner = f" (from {_package(build)})" if build.owner is not None else ""
    if needed is not None:
        return (
            f"{_process_of(needed.consumer)} maps {_short(build.record.path)}{owner} through the "
            f"DT_NEEDED {needed.name} of {_short(needed.consumer)}"
        )
    load = by_path[0]
    return f"import {_module_name(load.module)} opens {_short(build.record.path)}{owner} by path ({_where(load)})"


def _two_builds(rule: str, soname: str, first: _Build, second: _Build, how: str, root: str | None = None) -> Finding:
    other = _short(second.record.path)
    owner = f" from {_package(second)}" if second.owner is not None else ""
    if rule == "POST004":
        message = f"another build of {soname} ({other}{owner}) loads into the same process"
        process = f"loading {_short(root)} maps both: " if root is not None else ""
        detail = (
            f"{process}{how}. The loader reuses a loaded library only for a request by the same name "
            "or for the same file, and an open by path never matches by library name, so both builds "
            "are mapped and one's globals and set-up shadow the other's."
        )
    else:
        message = f"another build of {soname} ({other}{owner}) may load into the same process"
        detail = (
            f"{how}. Whether one process does both cannot be told from the files; if it does, both "
            "builds are mapped and one's globals and set-up shadow the other's."
        )
    return make_finding(
        rule,
        first.record.path,
        message,
        related=[second.record.path],
        detail=detail,
        data={
            "soname": soname,
            "other": second.record.path,
            "owners": [b.owner.name if b.owner is not None else None for b in (first, second)],
        },
    )


@dataclass(slots=True)
class _Distributions:
    """The distributions installed beside the audited files, and the ctypes loads of their source."""

    roots: list[str]
    sdk_trees: list[str]
    _owners: dict[str, dict[str, Distribution]] = field(default_factory=dict)
    _sites: dict[str, str | None] = field(default_factory=dict)
    _loads: dict[str, list[PythonLoad]] = field(default_factory=dict)

    def owner(self, path: str) -> Distribution | None:
        site = site_dir_of(os.path.dirname(path), self._sites)
        if site is None:
            return None
        if site not in self._owners:
            self._owners[site] = owners(read_distributions([site], []))
        return self._owners[site].get(os.path.normpath(path))

    def loads(self, distribution: Distribution) -> list[PythonLoad]:
        """The ctypes loads in the .py files its RECORD lists (bounded in count and size)."""
        if distribution.dist_info not in self._loads:
            found: list[PythonLoad] = []
            modules = sorted(p for p in distribution.files if p.endswith(".py"))[:MAX_MODULES]
            for module in modules:
                try:
                    source = read_small(module, MAX_MODULE_BYTES, follow_symlinks=False)
                except OSError:
                    continue
                if b"CDLL" in source or b"LoadLibrary" in source or b"PyDLL" in source:
                    found.extend(loads_in_source(source, module))
            self._loads[distribution.dist_info] = found
        return self._loads[distribution.dist_info]
