"""Post-build checks that real ROCm Dockerfiles need (peers.md 8, auditwheel-like):

* POST001: a symbol version a file needs (``GLIBC_2.39``, ``GLIBCXX_3.4.32``) that the library
  its loader would find does not define: glibc refuses to load it ("version ... not found");
* POST002: a DT_NEEDED entry no search path resolves (its own RPATH/RUNPATH, ld.so.conf, the
  default directories under the audited system root);
* POST003: a Python extension module whose ABI tag does not match the interpreter of the
  site-packages it sits in, or whose platform tag does not match its ELF machine.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from rocm_audit.elf.read import DynamicInfo
from rocm_audit.elf.versions import (
    VersionFacts,
    format_version,
    newest,
    read_versions,
    split_version,
    version_facts,
)
from rocm_audit.errors import FormatError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.postbuild.symbols import Resolver, is_extension
from rocm_audit.tree.inventory import FileKind, FileRecord, Inventory
from rocm_audit.tree.loader import LoaderModel

_EXTENSION = re.compile(r"\.cpython-(\d)(\d+)[a-z]*-([A-Za-z0-9_]+)-([A-Za-z0-9_]+)-([A-Za-z0-9_]+)\.so$")
_SITE_PYTHON = re.compile(r"/python(\d)\.(\d+)t?/(?:site|dist)-packages(?:/|$)")
# ELF e_machine of the platform tags a wheel can carry.
_MACHINE_OF_TAG = {"x86_64": 62, "aarch64": 183, "ppc64le": 21, "s390x": 22, "riscv64": 243, "i686": 3}


@dataclass(slots=True)
class _VersionCache:
    """Symbol versions by path: files of the inventory through its fact store (read once per run,
    whichever check asks), other providers (system libraries) read here once."""

    inventory: Inventory
    facts: dict[str, VersionFacts | None] = field(default_factory=dict)
    records: dict[str, FileRecord] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.records = {r.path: r for r in self.inventory.maybe_elf()}

    def get(self, path: str) -> VersionFacts | None:
        if path not in self.facts:
            record = self.records.get(path)
            try:
                self.facts[path] = versions_of(self.inventory, record) if record is not None else read_versions(path)
            except (OSError, FormatError):
                self.facts[path] = None
        return self.facts[path]


def versions_of(inventory: Inventory, record: FileRecord) -> VersionFacts:
    """The symbol-version fact of one inventory file. Raises FormatError or OSError."""
    return inventory.facts.get(record, "versions", version_facts)


def site_python(path: str) -> tuple[int, int] | None:
    """The interpreter version a site-packages path belongs to, from ``lib/python3.X/site-packages``."""
    match = _SITE_PYTHON.search(path)
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_extension_tag(record: FileRecord) -> Finding | None:
    match = _EXTENSION.search(os.path.basename(record.path))
    if match is None:
        return None
    major, minor, machine = int(match.group(1)), int(match.group(2)), match.group(3)
    expected = site_python(record.path)
    if expected is not None and (major, minor) != expected:
        return make_finding(
            "POST003",
            record.path,
            f"extension built for CPython {major}.{minor} sits in the site-packages of Python "
            f"{expected[0]}.{expected[1]}: `import` will not find it",
            data={"tag": f"cpython-{major}{minor}", "interpreter": f"{expected[0]}.{expected[1]}"},
        )
    wanted_machine = _MACHINE_OF_TAG.get(machine)
    if record.elf is not None and wanted_machine is not None and record.elf.e_machine != wanted_machine:
        return make_finding(
            "POST003",
            record.path,
            f"platform tag says {machine} but the ELF machine is {record.elf.e_machine}",
            data={"tag": machine, "e_machine": record.elf.e_machine},
        )
    return None


def post_build_findings(
    inventory: Inventory, loader: LoaderModel | None = None, resolver: Resolver | None = None
) -> list[Finding]:
    """POST001-POST003 over every host ELF file of the inventory. With ``resolver`` (the load
    scopes of the run), a library other libraries load is judged where they load it (POST002)."""
    loader = loader or LoaderModel()
    versions = _VersionCache(inventory)
    findings: list[Finding] = []
    unresolved: list[tuple[FileRecord, DynamicInfo, list[str]]] = []
    for record in inventory.by_kind(FileKind.SHARED_LIBRARY, FileKind.EXECUTABLE):
        tag_problem = check_extension_tag(record)
        if tag_problem is not None:
            findings.append(tag_problem)
        try:
            dynamic = inventory.dynamic(record)
        except (OSError, FormatError) as exc:
            offset = getattr(exc, "offset", 0)
            findings.append(
                make_finding("SCAN002", record.path, f"dynamic section unreadable: {exc}", data={"offset": offset})
            )
            continue
        if not dynamic.needed:
            continue
        providers, missing = _resolve_needed(record, dynamic, loader)
        if missing:
            unresolved.append((record, dynamic, missing))
        facts = versions.get(record.path)
        if facts is None:
            continue
        lacking: list[tuple[str, str, list[str], VersionFacts]] = []
        for needed_name, wanted in sorted(facts.needed.items()):
            provider = providers.get(needed_name)
            if provider is None:
                continue  # unresolved: POST002 already says so
            provided = versions.get(provider)
            if provided is None:
                continue
            missing = sorted(wanted - provided.defined)
            if missing:
                lacking.append((needed_name, provider, missing, provided))
        if lacking:
            findings.append(_version_finding(record.path, lacking))
    for record, dynamic, missing in unresolved:
        finding = _missing_library_finding(record, dynamic, missing, resolver)
        if finding is not None:
            findings.append(finding)
    return findings


def _resolve_needed(record: FileRecord, dynamic: DynamicInfo, loader: LoaderModel) -> tuple[dict[str, str], list[str]]:
    """Providers of the file's DT_NEEDED names, and the names nothing provides when the file is
    loaded by itself."""
    providers: dict[str, str] = {}
    missing: list[str] = []
    for name in dynamic.needed:
        resolution = loader.resolve(name, record.path, dynamic)
        if resolution.via == "not-extracted":
            continue  # the image holds it where glibc looks; its versions are not read
        if resolution.path is None:
            missing.append(name)
        else:
            providers[name] = resolution.path
    return providers, missing


def _missing_library_finding(
    record: FileRecord, dynamic: DynamicInfo, missing: list[str], resolver: Resolver | None
) -> Finding | None:
    """ONE POST002 for the names nothing provides (people read one line per library: a jax plugin
    without the SDK lacks 12 names), or None.

    A library the audited libraries load (their DT_NEEDED; not an extension module, which Python
    loads by itself) is judged where they load it: glibc also searches the DT_RPATH of its loaders
    then, so auditwheel's ``scipy.libs/libgfortran`` finds ``libquadmath`` through the RPATH of
    the extension that needs it. No finding when every such load finds the names; else the names
    the failing loads miss, and the detail names those loaders."""
    consumers = resolver.loaded_by(record) if resolver is not None and not is_extension(record.path) else {}
    failing = {consumer: names for consumer, names in consumers.items() if names}
    if consumers and not failing:
        return None
    where = "searched its own RPATH/RUNPATH, ld.so.conf and the default directories"
    if failing:
        missing = [name for name in missing if any(name in names for names in failing.values())] or missing
        shown = sorted(failing)
        more = f" and {len(shown) - 3} more" if len(shown) > 3 else ""
        where = (
            "searched its own RPATH/RUNPATH, ld.so.conf, the default directories and the DT_RPATH of "
            f"the libraries that load it; loading {', '.join(shown[:3])}{more} fails"
        )
    names = ", ".join(missing)
    stack = software_stack(missing)
    # Each message names its libraries (a CI annotation is about one file); one cause per stack, so
    # that every file missing ROCm's libraries is one entry of the text report, which counts them.
    cause = f"needs {stack} libraries that no search path finds" if stack else ""
    return make_finding(
        "POST002",
        record.path,
        f"{cause}: {names}" if cause else f"needs {names}, which no search path finds",
        detail=f"not found: {names} ({where})",
        # "needed" (the first name) is the schema-v1 field; "missing_sonames" holds them all.
        data={
            "needed": missing[0],
            "missing_sonames": missing,
            "rpath": list(dynamic.rpath),
            "runpath": list(dynamic.runpath),
            **({"cause": cause} if cause else {}),
        },
    )


# Library name stems (the SONAME before ".so") of the GPU software stacks whose absence explains
# most unresolved DT_NEEDED entries of a ROCm image: a whole stack is missing, not one file. ROCm's
# are the names TheRock's wheels and /opt/rocm install (HIP, the math libraries, HSA, SMI, tracer,
# sysdeps) as the DT_NEEDED entries of jax-rocm7, cupy-rocm-7-0 and onnxruntime-rocm name them;
# CUDA's and oneAPI's are those of bitsandbytes' other backends.
_STACKS = (
    ("ROCm", re.compile(r"lib(amdhip|hip|roc|rccl|hsa-|MIOpen|amd_smi|amd_comgr|rocm_|roctx|roctracer)")),
    ("CUDA", re.compile(r"lib(cuda|cublas|cufft|curand|cusolver|cusparse|cudnn|nccl|nvrtc|nvJitLink|nvToolsExt)")),
    ("Intel oneAPI", re.compile(r"lib(sycl|svml|irng|imf|intlc|mkl_|ur_loader|ze_loader)")),
    # glibc's libraries and GCC's runtime, as manylinux wheels name them: missing in an image
    # without a glibc base (scratch, Alpine's musl), where every extension misses them at once.
    (
        "C runtime",
        re.compile(
            r"(ld-linux[-.\w]*\.so|lib(c|m|dl|rt|pthread|util|resolv|anl|crypt|gcc_s|stdc\+\+|atomic|gomp)\.so)"
        ),
    ),
)


def software_stack(sonames: list[str]) -> str | None:
    """The software stacks all of ``sonames`` belong to (``ROCm``, ``C runtime and ROCm``), else
    None: a file missing only whole stacks is one entry of the text report with every such file."""
    stacks = {next((name for name, pattern in _STACKS if pattern.match(soname)), None) for soname in sonames}
    named = sorted(stack for stack in stacks if stack is not None)
    return " and ".join(named) if named and len(named) == len(stacks) else None


def _version_finding(path: str, lacking: list[tuple[str, str, list[str], VersionFacts]]) -> Finding:
    """One POST001 for a file, naming every provider that lacks a version it needs."""
    parts = []
    for needed_name, provider, missing, provided in lacking:
        families = sorted({pieces[0] for pieces in filter(None, map(split_version, missing))})
        offered = []
        for family in families:
            best = newest(provided.defined, family)
            offered.append(f"{family} up to {format_version(best)}" if best else f"no {family} versions")
        parts.append(
            f"needs {', '.join(missing)} from {needed_name}, but {provider} defines "
            f"{'; '.join(offered) if offered else 'none of them'}"
        )
    first_name, first_provider, first_missing, _ = lacking[0]
    return make_finding(
        "POST001",
        path,
        "; ".join(parts),
        related=[provider for _, provider, _, _ in lacking],
        # needed/missing/provider: the first provider (the schema-v1 fields); "providers": all of them.
        data={
            "needed": first_name,
            "missing": first_missing,
            "provider": first_provider,
            "providers": [
                {"needed": name, "provider": provider, "missing": missing} for name, provider, missing, _ in lacking
            ],
        },
    )
