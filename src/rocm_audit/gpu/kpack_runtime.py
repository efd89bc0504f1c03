"""kpack archives as the kpack runtime opens them: shadowing, unresolved search paths, empty archives.

Facts, read from the kpack runtime's source (nothing of it copied) [rocm-systems:
shared/kpack/runtime/src/loader.cpp ``kpack_load_code_object`` at commit 1ddbe7e9 (PR 9953 merged);
shared/kpack/runtime/src/isa_target_match.h ``for_each_compatible_target``; its ancestor
stellaraccident/rocm-kpack ae4f1c2e runtime/src/loader.cpp]:

- CLR calls the loader once per device with an arch list: the device's full ISA name (features
  spelled, ``gfx90a:sramecc+:xnack-``), then its generic family [rocm-systems PR 9167,
  projects/clr/hipamd/src/hip_fatbin.cpp]. The kernel asked for is ``<kernel_name>#<co_index>``,
  ``kernel_name`` from ``.rocm_kpack_ref`` and ``co_index`` the wrapper's index (its
  ``reserved1`` after the transform).
- Archive paths, in order: ``ROCM_KPACK_PATH`` alone if set; else ``ROCM_KPACK_PATH_PREFIX``
  entries, then each embedded search path resolved against the library's directory. A path
  holding ``@GFXARCH@`` is expanded, for each arch of the list in turn, with each compatible
  target, most specific first: every subset of the features, by descending bit mask over the
  features as spelled (``gfx942:sramecc+:xnack-``, ``gfx942:sramecc+``, ``gfx942:xnack-``,
  ``gfx942``); a name with no features expands to itself only. Paths that do not exist, or that do
  not open as a KPAK archive, are skipped; if none is left the load fails (archive not found).
- An archive serves a target when the target is in its TOC's ``gfx_arches`` (not its file name);
  the kernel is looked up under that matched target.
- Before PR 9953 (the loader of the ROCm 7.14 wheels, TheRock issues 7081 and 7620): for an arch,
  the loader takes the first (target, archive) pair that matches, most specific target first,
  archives in path order, and commits to it: when that archive lacks the kernel it returns
  "kernel not found" at once, and the device gets "device kernel image is invalid". The older
  ae4f1c2e loader also stopped at the first matching archive. (The pre-fix source itself is not
  in the corpus these facts come from; its behaviour is as PR 9953 and the closed PR 9874 describe
  it, and matches the ancestor's first-match loop.)
- After PR 9953 (rocm-systems 1ddbe7e9): every matching (target, archive) pair is collected in
  the same order and tried in turn; a miss falls through to the next, then to the next arch of the
  list. An ``xnack+`` archive is never opened for an ``xnack-`` device, by either revision.
- Which runtime a tree holds: the fixed loader's library holds the debug text "trying next
  candidate" (its fall-through message); both hold "kernel not found in this archive". Where no
  kpack runtime library is found (``_rocm_sdk_core/lib/librocm_kpack.so.0``), the version of
  ``rocm-sdk-core`` tells a release of 7.14 or older (and its pre-releases: nightlies were on
  7.15.0a by July 2026, TheRock issue 6869) or a nightly dated before 2026-08-10, the day PR 9953
  was opened: those carry the loader before the fix. Which release first carries 1ddbe7e9 is not
  recorded in anything read here (no release note or cherry-pick found), so a later version is
  judged "unknown" and shadowing under it is a warning.

What is judged: each library with a ``.rocm_kpack_ref`` whose search paths are archive paths (the
older flow's ``.kpm`` manifests are left to codeobjects.py), for every setting each required GPU
may run with; an archive without kernels is named when some library opens it. ROCM_KPACK_PATH and
ROCM_KPACK_PATH_PREFIX belong to a run, not to the files, and are not modelled.
"""

from __future__ import annotations

import enum
import mmap
import os
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from email.parser import HeaderParser
from typing import Protocol

from rocm_audit.elf import read as elfread
from rocm_audit.elf.sections import read_sections
from rocm_audit.errors import FormatError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.formats import hip_fatbin, kpack
from rocm_audit.formats.amdgpu_elf import FEATURES, supported_features
from rocm_audit.severity import Severity
from rocm_audit.tree.inventory import Inventory
from rocm_audit.tree.smallfile import open_regular, read_small
from rocm_audit.tree.targets import GENERIC_OF, RequiredTarget, TargetId, parse_target_id

GFXARCH = "@GFXARCH@"
FIXED_MARKER = b"trying next candidate"  # only the fixed loader logs this (loader.cpp, after PR 9953)
LOADER_MARKER = b"kernel not found in this archive"  # every loader with the arch-first search logs this
_RUNTIME_NAMES = re.compile(r"^(librocm_kpack|libamdhip64)[^/]*\.so(\.[0-9.]+)?$")
_MAX_RUNTIME_BYTES = 1 << 30


class Revision(enum.Enum):
    COMMITS = "commits"  # before rocm-systems PR 9953: the first matching archive decides
    FALLS_THROUGH = "falls-through"  # PR 9953 and later
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class RuntimeVersion:
    revision: Revision
    evidence: str  # for people: what told it, or why it cannot be told


def _holds(path: str, needles: Sequence[bytes]) -> list[bool] | None:
    try:
        fd = open_regular(path)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size == 0 or size > _MAX_RUNTIME_BYTES:
            return None
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as view:
            return [view.find(needle) >= 0 for needle in needles]
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


# rocm-systems PR 9953 was opened on 2026-08-10: no build from before that day holds the fix.
FIX_NOT_BEFORE = 20260810


def predates_fix(version: str) -> bool:
    """Whether a rocm-sdk-core version surely carries the loader before the fix: 7.14 or older (its
    pre-releases too), or a nightly (``7.15.0a20260723``) built before the fix was proposed."""
    match = re.match(r"^([0-9]+)\.([0-9]+)(?:\.[0-9]+)*(?:(?:a|rc|dev)([0-9]+))?", version)
    if match is None:
        return False
    if (int(match.group(1)), int(match.group(2))) <= (7, 14):
        return True
    stamp = match.group(3)
    return stamp is not None and len(stamp) == 8 and int(stamp) < FIX_NOT_BEFORE


def runtime_version(files: Iterable[str], distributions: Iterable[tuple[str, str]] = ()) -> RuntimeVersion:
    """Which kpack loader the audited tree holds. ``files``: paths that may be the kpack runtime
    (``librocm_kpack*.so*``, ``libamdhip64*.so*``; others are ignored); ``distributions``:
    (normalized name, version) of the installed distributions."""
    told: list[tuple[str, bool]] = []
    for path in sorted(set(files)):
        if not _RUNTIME_NAMES.match(os.path.basename(path)):
            continue
        held = _holds(path, (LOADER_MARKER, FIXED_MARKER))
        if held is not None and held[0]:
            told.append((path, held[1]))
    if told:
        fixed = [p for p, f in told if f]
        if len(fixed) == len(told):
            return RuntimeVersion(
                Revision.FALLS_THROUGH, f"{told[0][0]} tries the next archive when one lacks a kernel"
            )
        if not fixed:
            return RuntimeVersion(Revision.COMMITS, f"{told[0][0]} stops at the first archive that serves the device")
        return RuntimeVersion(Revision.UNKNOWN, "the tree holds kpack runtimes of both kinds")
    for name, version in distributions:
        if name in ("rocm-sdk-core", "rocm"):
            if predates_fix(version):
                return RuntimeVersion(
                    Revision.COMMITS, f"{name} {version} carries the kpack loader from before the fix"
                )
            return RuntimeVersion(Revision.UNKNOWN, f"{name} {version}: which kpack loader it carries is not known")
    return RuntimeVersion(Revision.UNKNOWN, "no kpack runtime library or rocm-sdk-core version found")


# ---------------------------------------------------------------------------------------------
# Targets


def compatible_targets(isa: str) -> list[str]:
    """The targets the loader tries for one arch of the list, most specific first (descending bit
    mask over the features as spelled; ``isa_target_match.h``)."""
    processor, *features = isa.split(":")
    if not features:
        return [processor]
    count = len(features)
    found = []
    for mask in range((1 << count) - 1, -1, -1):
        found.append(":".join([processor] + [f for i, f in enumerate(features) if mask & (1 << (count - 1 - i))]))
    return found


def device_configurations(agent: TargetId) -> list[TargetId]:
    """Every ISA name a device of this target may report: a feature its processor supports and the
    target leaves open (xnack by HSA_XNACK, sramecc by the board) is taken both ways."""
    configurations = [agent]
    for name in FEATURES:
        if name not in supported_features(agent.processor):
            configurations = [_with(c, name, None) for c in configurations]
            continue
        if agent.feature(name) is None:
            configurations = [_with(c, name, value) for c in configurations for value in (True, False)]
    return list(dict.fromkeys(configurations))


def _with(target: TargetId, name: str, value: bool | None) -> TargetId:
    if name == "sramecc":
        return TargetId(target.processor, value, target.xnack)
    return TargetId(target.processor, target.sramecc, value)


def arch_list(device: TargetId) -> list[str]:
    """What CLR passes for a device: its ISA name, then its generic family (same features)."""
    isa = str(device)
    generic = GENERIC_OF.get(device.processor)
    return [isa] if generic is None else [isa, isa.replace(device.processor, generic, 1)]


# ---------------------------------------------------------------------------------------------
# Libraries and archives


@dataclass(frozen=True, slots=True)
class KpackLibrary:
    path: str
    ref: kpack.KpackRef
    co_indexes: tuple[int, ...]  # one per HIPK wrapper

    @property
    def keys(self) -> list[str]:
        return [f"{self.ref.kernel_name}#{index}" for index in self.co_indexes]


def read_library(path: str) -> KpackLibrary | None:
    """The kpack reference and wrapper indexes of a kpack'd host library, or None (not an ELF, no
    ``.rocm_kpack_ref``, or one that does not read: verify-arch's scan reports those)."""
    try:
        fd = open_regular(path)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        header = elfread.parse_header(os.pread(fd, 64, 0))
        by_name = {s.name: s for s in read_sections(fd, header, size)}
        ref_section, segment = by_name.get(".rocm_kpack_ref"), by_name.get(".hipFatBinSegment")
        if ref_section is None or not ref_section.has_file_bytes:
            return None
        ref = kpack.parse_kpack_ref(
            os.pread(fd, min(ref_section.size, kpack.MAX_REF_BYTES), ref_section.offset), ref_section.offset
        )
        wrappers: list[hip_fatbin.FatbinWrapper] = []
        if segment is not None and segment.has_file_bytes:
            limit = min(segment.size, hip_fatbin.WRAPPER_SIZE * hip_fatbin.MAX_WRAPPERS)
            wrappers = hip_fatbin.parse_wrappers(os.pread(fd, limit, segment.offset), segment.offset)
    except (OSError, FormatError):
        return None
    finally:
        os.close(fd)
    indexes = tuple(w.reserved for w in wrappers if w.magic == hip_fatbin.HIPK_MAGIC) or (0,)
    return KpackLibrary(path, ref, indexes)


@dataclass(frozen=True, slots=True)
class Archive:
    path: str
    size: int
    arches: frozenset[str]
    entries: frozenset[tuple[str, str]]  # (key, arch) the TOC lists

    def serves(self, target: str) -> bool:
        return target in self.arches

    def holds(self, key: str, target: str) -> bool:
        return (key, target) in self.entries


@dataclass(slots=True)
class ArchiveCache:
    """Archives read once per run by real path; None: the runtime's open would fail (skipped)."""

    opened: dict[str, Archive | None] = field(default_factory=dict)

    def get(self, path: str) -> Archive | None:
        real = os.path.realpath(path)
        if real not in self.opened:
            self.opened[real] = _read_archive(real)
        return self.opened[real]


def _read_archive(path: str) -> Archive | None:
    try:
        fd = open_regular(path)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        header = kpack.parse_kpack_header(os.pread(fd, kpack.KPACK_HEADER.size, 0), size)
        toc = kpack.parse_kpack_toc(os.pread(fd, size - header.toc_offset, header.toc_offset), header.toc_offset, size)
    except (OSError, FormatError):
        return None
    finally:
        os.close(fd)
    return Archive(path, size, frozenset(toc.arches), frozenset((k.key, k.arch) for k in toc.kernels))


def archive_paths(library: str, ref: kpack.KpackRef, arches: Sequence[str]) -> list[str]:
    """The archive paths the loader builds, in order, before it checks which exist (no
    ROCM_KPACK_PATH / ROCM_KPACK_PATH_PREFIX: the audit sees the files, not a run's environment)."""
    base = os.path.dirname(library)
    paths: list[str] = []
    for pattern in ref.search_paths:
        resolved = os.path.normpath(os.path.join(base, pattern))
        if GFXARCH not in resolved:
            paths.append(resolved)
            continue
        for arch in arches:
            for target in compatible_targets(arch):
                paths.append(resolved.replace(GFXARCH, target, 1))
    return list(dict.fromkeys(paths))


@dataclass(frozen=True, slots=True)
class Lookup:
    """Where each revision of the loader finds one kernel for one device."""

    key: str
    first: Archive | None  # the archive the pre-fix loader commits to
    first_holds: bool
    found_in: Archive | None  # where the fixed loader finds it


@dataclass(frozen=True, slots=True)
class DeviceView:
    device: str
    tried: list[str]  # every path the loader builds
    opened: list[Archive]  # the ones that exist and open, in order
    lookups: list[Lookup]


def resolve(library: KpackLibrary, device: TargetId, cache: ArchiveCache) -> DeviceView:
    arches = arch_list(device)
    tried = archive_paths(library.path, library.ref, arches)
    opened: list[Archive] = []
    for path in tried:
        if os.path.isfile(path):
            archive = cache.get(path)
            if archive is not None and archive not in opened:
                opened.append(archive)
    lookups = []
    for key in library.keys:
        first: Archive | None = None
        first_holds = False
        found_in: Archive | None = None
        committed = False
        for arch in arches:
            candidates = [(a, t) for t in compatible_targets(arch) for a in opened if a.serves(t)]
            if candidates and not committed:
                first, target = candidates[0]
                first_holds, committed = first.holds(key, target), True
            found_in = next((a for a, t in candidates if a.holds(key, t)), None)
            if found_in is not None:
                break
        lookups.append(Lookup(key, first, first_holds, found_in))
    return DeviceView(str(device), tried, opened, lookups)


# ---------------------------------------------------------------------------------------------
# Findings


def _name(path: str) -> str:
    return os.path.basename(path)


def common_setting(devices: Sequence[str]) -> str:
    """Device ISA names spelled short: every setting of an open feature is one target
    (``gfx90a:sramecc+:xnack-`` and ``gfx90a:sramecc-:xnack-`` are ``gfx90a:xnack-``); others are listed."""
    groups: dict[str, list[TargetId]] = {}
    spelled: list[str] = []
    for device in devices:
        target = parse_target_id(device)
        if target is None:
            spelled.append(device)
        else:
            groups.setdefault(target.processor, []).append(target)
    for processor, parsed in groups.items():
        shared = {name: parsed[0].feature(name) for name in FEATURES}
        for target in parsed[1:]:
            for name in FEATURES:
                if target.feature(name) != shared[name]:
                    shared[name] = None
        merged = TargetId(processor, shared["sramecc"], shared["xnack"])
        if set(device_configurations(merged)) == set(parsed):
            spelled.append(str(merged))
        else:
            spelled.extend(str(t) for t in parsed)
    return ", ".join(spelled)


def kpack_findings(
    libraries: Iterable[KpackLibrary],
    devices: Sequence[TargetId],
    version: RuntimeVersion,
    cache: ArchiveCache | None = None,
    *,
    names: Sequence[str] = (),
    reported_missing: Mapping[str, Collection[str]] | None = None,
) -> list[Finding]:
    """KPACK001 (shadowing), KPACK002 (no archive for a device), KPACK003 (archive without kernels)
    for kpack'd libraries judged against every configuration of the required devices.

    ``names``: how each device was required (``gfx942``), in order; ``reported_missing``: library
    path -> the required names it was already reported to lack (ARCH001): no archive at all for
    such a device is that same fact, so KPACK002 names only the settings it alone finds (an
    ``xnack+`` setting with an ``xnack-`` archive only)."""
    cache = cache or ArchiveCache()
    findings: list[Finding] = []
    empty: dict[str, list[str]] = {}
    named = list(names) or [str(d) for d in devices]
    per_name = [(name, c) for name, d in zip(named, devices, strict=True) for c in device_configurations(d)]
    for library in libraries:
        if all(p.endswith(".kpm") for p in library.ref.search_paths):
            continue  # older flow (a manifest names the archives): codeobjects.py judges it
        already = set((reported_missing or {}).get(library.path, ()))
        unresolved: list[str] = []
        shadowed: dict[tuple[str, str], dict[str, int]] = {}
        for name, device in dict.fromkeys(per_name):
            view = resolve(library, device, cache)
            for archive in view.opened:
                if not archive.entries:
                    empty.setdefault(archive.path, []).append(library.path)
            if not view.opened:
                if name not in already and view.device not in unresolved:
                    unresolved.append(view.device)
                continue
            for lookup in view.lookups:
                if lookup.first is None or lookup.first_holds or lookup.found_in is None:
                    continue  # served by the first archive, or by none (ARCH001 judges coverage)
                pair = (lookup.first.path, lookup.found_in.path)
                per_device = shadowed.setdefault(pair, {})
                per_device[view.device] = per_device.get(view.device, 0) + 1
        if unresolved:
            findings.append(_unresolved(library, unresolved))
        if version.revision is not Revision.FALLS_THROUGH:
            findings.extend(_shadowing(library, pair, per_device, version) for pair, per_device in shadowed.items())
    for path, users in sorted(empty.items()):
        findings.append(
            make_finding(
                "KPACK003",
                path,
                "kpack archive with no kernels in it",
                related=sorted(set(users)),
                data={"archive": path, "libraries": sorted(set(users))},
                detail=f"Its table of contents lists no kernel. The kpack runtime still opens it for "
                f"{_name(sorted(set(users))[0])} and the other libraries named here.",
            )
        )
    return findings


def _shadowing(
    library: KpackLibrary, pair: tuple[str, str], per_device: dict[str, int], version: RuntimeVersion
) -> Finding:
    first, holder = pair
    devices = sorted(per_device)
    kernels = max(per_device.values())
    severity_note = (
        "fails to load"
        if version.revision is Revision.COMMITS
        else "fails to load if the installed kpack runtime predates the fix"
    )
    return make_finding(
        "KPACK001",
        library.path,
        f"on {common_setting(devices)} the kpack runtime opens {_name(first)} first, which lacks "
        f"{kernels} kernel(s) of this library that {_name(holder)} holds",
        related=[first, holder],
        severity=None if version.revision is Revision.COMMITS else Severity.WARNING,
        data={
            "library": library.path,
            "first_archive": first,
            "holding_archive": holder,
            "devices": devices,
            "kernels_missing_first": kernels,
            "runtime": version.revision.value,
            "runtime_evidence": version.evidence,
        },
        detail=f"For {', '.join(devices)} the kpack runtime opens {first} before {holder}. The kpack "
        f"runtime of ROCm 7.14 and older stops at the first archive that serves the device and does "
        f'not look further, so {_name(library.path)} {severity_note} ("device kernel image is '
        f'invalid"). Runtime found: {version.evidence}.',
    )


def _unresolved(library: KpackLibrary, devices: list[str]) -> Finding:
    base = os.path.dirname(library.path)
    patterns = [os.path.normpath(os.path.join(base, p)) for p in library.ref.search_paths]
    return make_finding(
        "KPACK002",
        library.path,
        f"no kpack archive for {common_setting(devices)} at its search paths {', '.join(library.ref.search_paths)}",
        data={"library": library.path, "devices": devices, "search_paths": list(library.ref.search_paths)},
        detail=f"Its search paths ({', '.join(patterns)}) lead to no archive that exists for "
        f'{", ".join(devices)}: the first kernel launch fails with "invalid kernel file".',
    )


# ---------------------------------------------------------------------------------------------
# Device wheels [rocm-systems: shared/kpack/python/rocm_kpack/wheel_splitter.py; rocm-systems PR
# 10685, pytorch issue 194498]: a per-target device wheel (amd-torch-device-gfx1100) carries that
# target's kernels and Requires-Dist its family wheel (amd-torch-device-gfx11, which holds e.g. the
# AOTriton gfx11xx images) and rocm-sdk-device-<arch>; pip installs them, but a wheel installed
# with --no-deps, or a requirement removed afterwards, leaves the device without those kernels.

_DEVICE_WHEEL = re.compile(r"^[a-z0-9-]+-device-[a-z0-9-]+$")
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*\(?([^;()]*)\)?\s*(?:;(.*))?$")
_COMPARISON = re.compile(r"""^\s*([a-z_]+)\s*(==|!=|<=|>=|<|>)\s*["']([^"']*)["']\s*$""")
_MAX_METADATA = 1 << 20
# What a marker is evaluated against: the audited trees are Linux x86-64 site-packages (rocm-audit
# audits ROCm wheels for Linux); python_version comes from the site directory's path when it
# names one (lib/python3.12/site-packages), else markers that use it are skipped.
_LINUX = {
    "sys_platform": "linux",
    "platform_system": "Linux",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}


@dataclass(frozen=True, slots=True)
class Requirement:
    name: str  # normalized
    spelled: str
    pinned: str | None  # the version of an ``==`` pin, else None
    marker: str


def parse_requirement(text: str) -> Requirement | None:
    match = _REQUIREMENT.match(text)
    if match is None:
        return None
    name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
    specifier = match.group(3).strip()
    pin = re.fullmatch(r"==\s*([^,\s*]+)", specifier)
    return Requirement(name, text.strip(), pin.group(1) if pin else None, (match.group(4) or "").strip())


def marker_applies(marker: str, python_version: str | None) -> bool | None:
    """A PEP 508 marker of ``and``/``or``-joined comparisons (no parentheses), evaluated for Linux
    x86-64; None when it cannot be told here (``extra``, an unknown variable, parentheses, or
    ``python_version`` with the interpreter's version unknown)."""
    if not marker:
        return True
    if "(" in marker:
        return None
    values = dict(_LINUX)
    if python_version is not None:
        values["python_version"] = python_version
    any_true = False
    for alternative in re.split(r"\s+or\s+", marker):
        all_true = True
        for part in re.split(r"\s+and\s+", alternative):
            comparison = _COMPARISON.match(part)
            if comparison is None or comparison.group(1) not in values:
                return None
            left, op, right = values[comparison.group(1)], comparison.group(2), comparison.group(3)
            if comparison.group(1) == "python_version":
                a = tuple(int(x) for x in left.split(".") if x.isdigit())
                b = tuple(int(x) for x in right.split(".") if x.isdigit())
                outcome = {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
            elif op in ("==", "!="):
                outcome = (left == right) == (op == "==")
            else:
                return None
            all_true = all_true and outcome
        any_true = any_true or all_true
    return any_true


def _python_version(site_dir: str) -> str | None:
    match = re.search(r"/python([0-9]+\.[0-9]+)t?/(?:site|dist)-packages/?$", site_dir)
    return match.group(1) if match else None


def requires_dist(dist_info: str) -> list[str]:
    try:
        text = read_small(os.path.join(dist_info, "METADATA"), _MAX_METADATA, follow_symlinks=False)
    except OSError:
        return []
    headers = HeaderParser().parsestr(text.decode("utf-8", "surrogateescape"), headersonly=True)
    return [str(v) for v in headers.get_all("Requires-Dist") or []]


@dataclass(frozen=True, slots=True)
class InstalledDistribution:
    name: str  # normalized
    version: str
    dist_info: str
    site_dir: str


def device_wheel_findings(installed: Sequence[InstalledDistribution]) -> list[Finding]:
    """KPACK004: a device wheel one of whose ``Requires-Dist`` is not installed in its site
    directory (or is installed at another version than its ``==`` pin). Requirements behind an
    ``extra`` marker, or a marker this reader cannot evaluate, are skipped and counted."""
    by_site: dict[str, dict[str, InstalledDistribution]] = {}
    for dist in installed:
        by_site.setdefault(dist.site_dir, {})[dist.name] = dist
    findings: list[Finding] = []
    for dist in sorted(installed, key=lambda d: (d.site_dir, d.name)):
        if not _DEVICE_WHEEL.match(dist.name):
            continue
        present = by_site[dist.site_dir]
        missing: list[str] = []
        skipped: list[str] = []
        for line in requires_dist(dist.dist_info):
            requirement = parse_requirement(line)
            if requirement is None:
                skipped.append(line)
                continue
            applies = marker_applies(requirement.marker, _python_version(dist.site_dir))
            if applies is None:
                skipped.append(requirement.spelled)
                continue
            if not applies:
                continue
            other = present.get(requirement.name)
            if other is None:
                missing.append(requirement.spelled)
            elif requirement.pinned is not None and other.version != requirement.pinned:
                missing.append(f"{requirement.spelled} (installed: {other.version})")
        if not missing:
            continue
        findings.append(
            make_finding(
                "KPACK004",
                dist.dist_info,
                f"device wheel {dist.name} {dist.version} needs {missing[0]}"
                f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}, which is not installed",
                data={"distribution": dist.name, "version": dist.version, "missing": missing, "skipped": skipped},
                detail=f"{dist.name} lists {', '.join(missing)} under Requires-Dist. A device wheel "
                f"carries only its own GPU's kernels; the wheels it requires carry the rest (a family "
                f"wheel holds the kernels shared by its GPUs), so the kernels they hold are missing."
                + (f" Not evaluated here: {', '.join(skipped)}." if skipped else ""),
            )
        )
    return findings


# ---------------------------------------------------------------------------------------------
# One audited tree


def installed_distributions(site_dirs: Iterable[str]) -> list[InstalledDistribution]:
    """Name and version of every ``*.dist-info`` in the site directories (METADATA headers only)."""
    found: list[InstalledDistribution] = []
    for site_dir in dict.fromkeys(site_dirs):
        try:
            names = sorted(n for n in os.listdir(site_dir) if n.endswith(".dist-info"))
        except OSError:
            continue
        for name in names:
            dist_info = os.path.join(site_dir, name)
            try:
                text = read_small(os.path.join(dist_info, "METADATA"), _MAX_METADATA, follow_symlinks=False)
            except OSError:
                continue
            headers = HeaderParser().parsestr(text.decode("utf-8", "surrogateescape"), headersonly=True)
            dist_name, version = headers.get("Name"), headers.get("Version")
            if dist_name and version:
                normalized = re.sub(r"[-_.]+", "-", str(dist_name)).lower()
                found.append(InstalledDistribution(normalized, str(version), dist_info, site_dir))
    return found


def audit_tree(
    roots: Sequence[str],
    sdk_trees: Sequence[str],
    files: Iterable[str],
    kpackd: Iterable[str],
    devices: Sequence[TargetId],
    *,
    names: Sequence[str] = (),
    reported_missing: Mapping[str, Collection[str]] | None = None,
) -> list[Finding]:
    """Every KPACK finding of one audited tree. ``files``: every file path the walk found (the
    kpack runtime library is looked for among them); ``kpackd``: the libraries that carry a kpack
    reference; ``devices``: the required targets (empty: only KPACK004 is judged)."""
    site_dirs = [*roots, *(os.path.dirname(tree) for tree in sdk_trees)]
    installed = installed_distributions(d for d in site_dirs if os.path.isdir(d))
    findings = device_wheel_findings(installed)
    libraries = [lib for lib in (read_library(path) for path in sorted(set(kpackd))) if lib is not None]
    if libraries and devices:
        version = runtime_version(files, [(d.name, d.version) for d in installed])
        findings.extend(kpack_findings(libraries, devices, version, names=names, reported_missing=reported_missing))
    return findings


class _Scanned(Protocol):
    path: str
    kpack_ref: bool


def inventory_findings(
    inventory: Inventory, scans: Sequence[_Scanned], required: Sequence[RequiredTarget], judged: Sequence[Finding]
) -> list[Finding]:
    """:func:`audit_tree` for verify-arch and check: ``scans`` are the files' code-object scans
    (those with a kpack reference are judged), ``judged`` the carrier judgement's findings, whose
    ARCH001 already names a library's missing targets."""
    missing: dict[str, set[str]] = {}
    for finding in judged:
        if finding.rule == "ARCH001":
            missing.setdefault(finding.path, set()).update(finding.data.get("missing", []))
    return audit_tree(
        [r.path for r in inventory.roots],
        inventory.sdk_trees,
        (r.path for r in inventory.files),
        [s.path for s in scans if s.kpack_ref],
        # every setting the GPU may run with: features the user did not spell are open
        [parse_target_id(t.spelled) or t.agent for t in required],
        names=[t.spelled for t in required],
        reported_missing=missing,
    )
