"""What the code-object scan returns, and the findings every container reader shares.

``CodeObject`` is one entry as ``scan --targets`` lists it and verify-arch judges it;
``FileCodeObjects`` is everything one file holds. ``device_record`` builds an entry from what its
container names and what its ELF header says; ``consistency_findings`` compares the two (ARCH003,
ARCH006); ``malformed`` turns a ``FormatError`` into ARCH004 naming the byte offset.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rocm_audit.elf.codeobject import CodeObjectFacts
from rocm_audit.errors import FormatError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.formats import amdgpu_elf
from rocm_audit.formats.amdgpu_elf import FEATURES
from rocm_audit.tree.targets import TargetId, parse_target_id

CO_HEAD_BYTES = 64 << 10  # bytes of each compressed entry kept to read its ELF header and notes
BUNDLE_WINDOW = 64 << 10  # bytes read first for a bundle's entry table
SCAN_CHUNK = 1 << 20  # bytes read at a time when searching a file for a magic


@dataclass(frozen=True, slots=True)
class CodeObject:
    """One code object (or host entry) as listed by ``scan --targets`` and judged by verify-arch."""

    container: str  # offload-bundle | ccob | kpack | offload-binary | raw-elf | embedded-elf
    location: str  # human-readable place, e.g. ".hip_fatbin+0x1000 entry 2"
    file_offset: int | None  # where its bytes start in the file (None inside compressed data)
    size: int
    tu: int | None  # translation unit (bundle) index; None for objects outside any TU
    entry_id: str | None  # bundle entry ID as written, or kpack TOC key
    kind: str  # host | hip | hipv4 | hcc | openmp | device
    target: str | None  # target ID used for matching (from e_flags when readable)
    target_source: str  # e_flags | bundle-id | kpack-toc | offload-binary | none
    bundle_target: str | None = None  # target ID the bundle/TOC names, when there is one
    code_object_version: int | None = None
    generic_version: int | None = None
    metadata_target: str | None = None  # amdhsa.target from NT_AMDGPU_METADATA, as an ID
    kernels: int | None = None


@dataclass(slots=True)
class FileCodeObjects:
    path: str
    sdk_tree: str | None
    file_kind: str = ""
    containers: list[str] = field(default_factory=list)
    code_objects: list[CodeObject] = field(default_factory=list)
    tu_count: int = 0  # translation units the HIP runtime registers (bundles or wrappers)
    wrappers: int | None = None
    kpack_ref: bool = False
    findings: list[Finding] = field(default_factory=list)
    # (file offset, size in the file, "offload-bundle" | "ccob") of each bundle, one per unit in
    # unit order (``bundles[tu]``, as prune's weights use it; a unit that failed to read keeps its
    # place, with the size its header claims, or 0).
    bundles: list[tuple[int, int, str]] = field(default_factory=list)
    # The target a Triton kernel's metadata (<name>.json beside <name>.hsaco) names, if it has one
    # (Triton launches the kernel only there), and the folder of kernel folders it belongs to.
    triton_target: str | None = None
    triton_folder: str | None = None
    # The place (".rodata+0x1000") of each unit that is an image embedded in a data section, by TU.
    unit_places: dict[int, str] = field(default_factory=dict)

    def add_container(self, name: str) -> None:
        if name not in self.containers:
            self.containers.append(name)


def device_record(
    *,
    container: str,
    location: str,
    file_offset: int | None,
    size: int,
    tu: int | None,
    entry_id: str | None,
    kind: str,
    bundle_target: str | None,
    facts: CodeObjectFacts | None,
    listed_source: str,
) -> CodeObject:
    """One entry as listed: the target its container names (``listed_source``), replaced by the
    ELF header's when ``facts`` were read, with the header's versions and kernel count."""
    target, source = bundle_target, (listed_source if bundle_target else "none")
    cov = generic = None
    metadata_target = None
    kernels = None
    if facts is not None:
        identity = facts.identity
        cov = identity.code_object_version
        generic = identity.generic_version if (cov or 0) >= 6 else None
        if identity.target_id is not None:
            target, source = identity.target_id, "e_flags"
        if facts.metadata is not None:
            kernels = facts.metadata.kernel_count
            if facts.metadata.target:
                metadata_target = amdgpu_elf.target_id_from_isa_name(facts.metadata.target)
    return CodeObject(
        container,
        location,
        file_offset,
        size,
        tu,
        entry_id,
        kind,
        target,
        source,
        bundle_target,
        cov,
        generic,
        metadata_target,
        kernels,
    )


def consistency_findings(path: str, obj: CodeObject, facts: CodeObjectFacts | None, offset: int) -> list[Finding]:
    """ARCH003/ARCH006: the bundle id, e_flags and amdhsa.target must name the same target."""
    found: list[Finding] = []
    if facts is not None and facts.identity.processor is None:
        identity = facts.identity
        if identity.mach == 0 and (identity.code_object_version or 2) <= 2:
            # Code object V1/V2 name their ISA in an NT_AMD_HSA_ISA_VERSION note (major.minor.stepping),
            # not in e_flags: ROCr's own blit and trap kernels in libhsa-runtime64's .data, for example.
            cause = "old code objects (V2 or older) name their GPU in a note, not in the ELF header; not judged"
            reason = "an old code object (V2 or older) names its GPU in a note, not in the ELF header; not judged"
        else:
            cause = ""
            reason = f"EF_AMDGPU_MACH {identity.mach:#x} in its ELF header is no GPU rocm-audit knows"
        data = {
            "offset": offset,
            "mach": identity.mach,
            "location": obj.location,
            **({"cause": cause} if cause else {}),
        }
        found.append(make_finding("ARCH006", path, f"{obj.location}: {reason}", data=data))
    if obj.target_source != "e_flags" or obj.target is None:
        return found
    if obj.bundle_target is not None and obj.bundle_target != obj.target:
        named = parse_target_id(obj.bundle_target)
        if named is None or named.processor != obj.target.split(":")[0] or not _features_agree(named, obj.target):
            found.append(
                make_finding(
                    "ARCH003",
                    path,
                    f"{obj.location}: bundle id names {obj.bundle_target} but the ELF header says {obj.target}",
                    data={
                        "offset": offset,
                        "bundle_target": obj.bundle_target,
                        "e_flags_target": obj.target,
                    },
                )
            )
    if obj.metadata_target is not None and obj.metadata_target != obj.target:
        found.append(
            make_finding(
                "ARCH003",
                path,
                f"{obj.location}: amdhsa.target names {obj.metadata_target} but the ELF header says {obj.target}",
                data={
                    "offset": offset,
                    "metadata_target": obj.metadata_target,
                    "e_flags_target": obj.target,
                },
            )
        )
    return found


def _features_agree(named: TargetId, header_target: str) -> bool:
    header = parse_target_id(header_target)
    if header is None:
        return False
    return all(named.feature(f) is None or named.feature(f) == header.feature(f) for f in FEATURES)


def malformed(result: FileCodeObjects, exc: FormatError, what: str) -> None:
    """Record ARCH004 for ``what`` (a place such as ``.hip_fatbin+0x1000 entry 2``), naming the
    format, the reason and the file offset the parser gave."""
    result.findings.append(
        make_finding(
            "ARCH004",
            result.path,
            f"{what}: {exc.fmt}: {exc.reason} (at file offset {exc.offset:#x})",
            data={"offset": exc.offset, "format": exc.fmt},
        )
    )
