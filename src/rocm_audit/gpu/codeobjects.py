"""Find every GPU code object in a file, whatever the container, reading headers only.

One entry point, ``scan_file(record)``, returns the file's translation units and code objects plus
findings for anything malformed (each naming the byte offset). Containers: ``.hip_fatbin`` holding
plain bundles and CCOB v1/v2/v3 (formats.md 2.2-2.5), ``.hipFatBinSegment`` wrappers (HIPF/HIPK),
kpack references and archives (1.7), ``.llvm.offloading`` (2.6), standalone files sniffed by magic
(2.1), and images embedded in data sections: offload bundles and CCOBs that programs load with
``hipModuleLoadData``, and raw AMDGPU ELFs. Reads are ``pread`` windows: memory does not
grow with section size, and a CCOB is inflated as a bounded stream.

This module dispatches on the file; the readers live beside it: bundles.py (plain bundles),
ccob_stream.py (CCOBs), fatbin.py (``.hip_fatbin`` and the forked helpers), embedded.py (raw ELFs
and images in data sections), kpack.py (kpack lookup), aks2.py (AOTriton archives), records.py (what they return), and
elf/codeobject.py (the ELF inside each code object).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from rocm_audit.elf import read as elfread
from rocm_audit.elf.codeobject import FileWindow, RecordingWindow
from rocm_audit.elf.relocations import file_place, loaded_pointers
from rocm_audit.elf.sections import Section, read_sections
from rocm_audit.errors import FormatError
from rocm_audit.findings import make_finding
from rocm_audit.formats import aks2, ccob, hip_fatbin, kpack, offload_binary, offload_bundle
from rocm_audit.gpu.aks2 import aks2_listing
from rocm_audit.gpu.bundles import bundle_objects
from rocm_audit.gpu.ccob_stream import ccob_objects
from rocm_audit.gpu.embedded import embedded_images, raw_elf_object
from rocm_audit.gpu.fatbin import Container, container_at, first_nonzero, read_containers, walk_fatbin
from rocm_audit.gpu.kpack import kpack_archive_listing, kpack_objects
from rocm_audit.gpu.records import CodeObject, FileCodeObjects, malformed
from rocm_audit.tree.inventory import FileKind, FileRecord
from rocm_audit.tree.targets import TargetSelection

__all__ = ["CodeObject", "FileCodeObjects", "scan_file"]


def scan_file(record: FileRecord, fd: int | None = None, selection: TargetSelection | None = None) -> FileCodeObjects:
    """Every code object in one file (read from fd when given: the caller keeps it open and closes
    it). Never raises for malformed content: those become findings.

    With a ``selection`` every code object is still listed, but only the entries the runtime would
    choose for its agents are read (the others keep what their bundle id or kpack key names), and
    findings come from what was read: a judgement. Without one, everything is read: ``scan``."""
    result = FileCodeObjects(record.path, record.sdk_tree, record.opened_kind.value)
    owned = fd is None
    if fd is None:
        try:
            fd = os.open(record.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            result.findings.append(make_finding("SCAN001", record.path, f"cannot open: {exc.strerror}"))
            return result
    try:
        fh = FileWindow(fd, os.fstat(fd).st_size)
        if record.kind is FileKind.CODE_OBJECT:
            result.add_container("raw-elf")
            result.tu_count = 1
            raw_elf_object(result, fh, 0, fh.size, "raw-elf", "file", 0)
        elif record.kind in (FileKind.SHARED_LIBRARY, FileKind.EXECUTABLE, FileKind.OTHER_ELF):
            if record.elf is not None and record.elf.is_64 and record.elf.little_endian:
                _scan_host_elf(result, fh, record.elf, selection)
        else:
            _scan_standalone(result, fh, record.magic, selection)
    except FormatError as exc:
        malformed(result, exc, "file")
    except OSError as exc:
        result.findings.append(make_finding("SCAN001", record.path, f"cannot read: {exc.strerror}"))
    finally:
        if owned:
            os.close(fd)
        # The window is reused across the bundles of this file; freed before the next file's
        # facts (llvm reads large string tables) so that the peaks do not add up.
        ccob.release_shared_decompressor()
    return result


def _scan_standalone(result: FileCodeObjects, fh: FileWindow, magic: bytes, selection: TargetSelection | None) -> None:
    if magic.startswith(offload_bundle.BUNDLE_MAGIC):
        result.add_container("offload-bundle")
        result.tu_count = 1
        result.bundles.append((0, bundle_objects(result, fh, 0, fh.size, 0, "file", selection), "offload-bundle"))
    elif magic.startswith(ccob.CCOB_MAGIC):
        result.tu_count = 1
        result.bundles.append((0, ccob_objects(result, fh, 0, fh.size, 0, "file", selection), "ccob"))
    elif magic.startswith(kpack.KPACK_MAGIC):
        kpack_archive_listing(result, fh)
    elif magic.startswith(aks2.MAGIC):
        aks2_listing(result, fh)
    elif magic.startswith(offload_binary.OFFLOAD_BINARY_MAGIC):
        result.add_container("offload-binary")
        _offload_binaries(result, fh, 0, fh.size, "file")


def _offload_binaries(result: FileCodeObjects, fh: FileWindow, start: int, size: int, place: str) -> None:
    limit = min(size, 64 << 20)  # the entry table and strings sit at the front; images are not read
    buf = fh.read(start, limit)
    try:
        binaries = (
            offload_binary.parse_section(buf, start)
            if size <= limit
            else [offload_binary.parse_offload_binary(buf, start)]
        )
    except FormatError as exc:
        malformed(result, exc, place)
        return
    for number, binary in enumerate(binaries):
        for image in binary.images:
            target = image.arch if image.arch and image.arch.startswith("gfx") else None
            result.code_objects.append(
                CodeObject(
                    "offload-binary",
                    f"{place} binary {number} ({image.image_kind})",
                    None,
                    image.image_size,
                    None,
                    image.triple,
                    "/".join(image.offload_kinds) or "device",
                    target,
                    "offload-binary" if target else "none",
                    target,
                )
            )


def _wrapped_containers(
    result: FileCodeObjects,
    fh: FileWindow,
    header: elfread.ElfHeader,
    sections: Sequence[Section],
    segment: Section,
    wrappers: list[hip_fatbin.FatbinWrapper],
) -> list[Container]:
    """The fat binaries HIPF wrappers point at, each once, in wrapper order: the address the loader
    writes into a wrapper's pointer (its RELA relocation; in a non-PIC executable the address the
    file holds), when a bundle or CCOB starts exactly there in a section the loader maps. Empty
    when none does. A wrapper that points at no fat binary while others do is ARCH004 naming it:
    the runtime would register whatever lies there."""
    slots = [segment.addr + wrapper.index * hip_fatbin.WRAPPER_SIZE + 8 for wrapper in wrappers]
    try:
        loaded = loaded_pointers(fh.fd, header, sections, fh.size, slots)
    except FormatError as exc:
        malformed(result, exc, "the relocations of .hipFatBinSegment")
        return []
    found: list[Container] = []
    at_offset: set[int] = set()
    unresolved: list[tuple[int, int]] = []  # (wrapper index, the address it points at)
    for wrapper, slot in zip(wrappers, slots, strict=True):
        if wrapper.magic != hip_fatbin.HIPF_MAGIC:
            continue
        address = loaded.get(slot)
        if address is None and header.e_type == elfread.ET_EXEC:
            address = wrapper.binary_ptr  # no relocation: the address is in the file
        where = file_place(sections, address) if address else None
        container = None
        if where is not None:
            section, offset = where
            if offset in at_offset:
                continue
            place = f"{section.name}+{offset - section.offset:#x}"
            end = section.offset + section.size
            try:
                container = container_at(fh, fh.read(offset, min(32, end - offset)), offset, end, len(found), place)
            except FormatError:
                container = None
        if container is None:
            unresolved.append((wrapper.index, address or 0))
            continue
        found.append(container)
        at_offset.add(container.pos)
    if found and unresolved:
        index, address = unresolved[0]
        result.findings.append(
            make_finding(
                "ARCH004",
                result.path,
                f"{len(unresolved)} of {len(wrappers)} HIPF wrappers point at no fat binary (wrapper {index} "
                f"at file offset {segment.offset + index * hip_fatbin.WRAPPER_SIZE:#x} points at {address:#x})",
                data={"offset": segment.offset + index * hip_fatbin.WRAPPER_SIZE, "format": hip_fatbin.FMT},
            )
        )
    return found


# Where hcc (ROCm 3.x and older, before hip-clang) put a library's fat binaries: bundles with
# hcc-amdgcn-amd-amdhsa--<gfx> ids, read by HCC's own runtime (libmcwamp). The HIP runtime registers
# .hip_fatbin through __hipRegisterFatBinary only, so on a current ROCm these kernels never load
# (tensorflow-rocm 1.15: 227 such bundles, code object V2).
HCC_KERNEL_SECTION = ".kernel"


def _hcc_kernels(result: FileCodeObjects, fh: FileWindow, section: Section) -> None:
    """List HCC's fat binaries (``scan --targets`` shows them) as units no HIP runtime registers:
    no translation unit, no carrier to judge; one ARCH010 names them."""
    listed = FileCodeObjects(result.path, result.sdk_tree, result.file_kind)
    count = walk_fatbin(listed, fh, section, None, label=HCC_KERNEL_SECTION)
    result.add_container("hcc-kernel")
    result.code_objects.extend(dataclasses.replace(obj, container="hcc-kernel", tu=None) for obj in listed.code_objects)
    result.findings.extend(listed.findings)
    targets = sorted({obj.bundle_target or obj.target or "?" for obj in listed.code_objects if obj.kind != "host"})
    result.findings.append(
        make_finding(
            "ARCH010",
            result.path,
            f"{count} HCC fat binar{'y' if count == 1 else 'ies'} in {HCC_KERNEL_SECTION} (file offset "
            f"{section.offset:#x}) with code for {', '.join(targets) or 'no GPU'}: only HCC's runtime (ROCm 3.x "
            "and older) loads them; the HIP runtime does not, so none of these kernels runs on a current ROCm",
            data={"offset": section.offset, "bundles": count, "targets": targets},
        )
    )


def host_reads(
    path: str, fd: int, size: int, header: elfread.ElfHeader
) -> tuple[list[tuple[int, int]], FileCodeObjects]:
    """What reading a host library for its code objects depends on: the file ranges it reads, its
    searches of data sections aside (whatever they find is read again, so noted), when it reads
    every entry (no target selection: the most it ever reads), and what it found. image/trim.py
    keeps these bytes of a large library. Raises FormatError."""
    window = RecordingWindow(fd, size)
    result = FileCodeObjects(path, None)
    _scan_host_elf(result, window, header, None)
    return window.reads, result


def _scan_host_elf(
    result: FileCodeObjects, fh: FileWindow, header: elfread.ElfHeader, selection: TargetSelection | None
) -> None:
    try:
        sections = read_sections(fh.fd, header, fh.size)
    except FormatError as exc:
        malformed(result, exc, "section headers")
        return
    by_name = {s.name: s for s in sections}
    segment = by_name.get(".hipFatBinSegment")
    wrappers = _read_wrappers(result, fh, segment)
    skip_images: frozenset[int] = frozenset()  # fat binaries the wrappers register outside .hip_fatbin
    fatbin = by_name.get(".hip_fatbin")
    kpackd = any(w.magic == hip_fatbin.HIPK_MAGIC for w in wrappers)
    ref_section = by_name.get(".rocm_kpack_ref")
    if kpackd or ref_section is not None:
        _kpack_units(result, fh, ref_section, wrappers, selection)
    elif fatbin is not None and fatbin.has_file_bytes:
        _fatbin_units(result, fh, fatbin, wrappers, selection)
    elif (
        wrappers
        and segment is not None
        and (registered := _wrapped_containers(result, fh, header, sections, segment, wrappers))
    ):
        # No .hip_fatbin, but the wrappers point at fat binaries elsewhere (rccl of ROCm 4.0: six
        # wrappers, one -fgpu-rdc bundle in .data): those are what the runtime registers.
        result.add_container("hip-fatbin")
        result.tu_count = read_containers(result, fh, registered, selection)
        skip_images = frozenset(container.pos for container in registered)
    elif wrappers:
        # HIPF wrappers register fat binaries that are not in the file: every TU fails to load.
        where = segment.offset if segment is not None else 0
        state = "has no file bytes" if fatbin is not None else "is missing"
        result.findings.append(
            make_finding(
                "ARCH004",
                result.path,
                f"{len(wrappers)} HIPF wrappers but .hip_fatbin {state} (wrapper table at file offset {where:#x})",
                data={"offset": where, "format": ".hipFatBinSegment"},
            )
        )
        result.add_container("hip-fatbin")
        result.tu_count = len(wrappers)
    hcc = by_name.get(HCC_KERNEL_SECTION)
    if hcc is not None and hcc.has_file_bytes:
        first = first_nonzero(fh, hcc.offset, hcc.offset + hcc.size)  # the bundle may follow padding
        if fh.read(first, len(offload_bundle.BUNDLE_MAGIC)) == offload_bundle.BUNDLE_MAGIC:
            _hcc_kernels(result, fh, hcc)
    offloading = by_name.get(".llvm.offloading")
    if offloading is not None and offloading.has_file_bytes:
        result.add_container("offload-binary")
        _offload_binaries(result, fh, offloading.offset, offloading.size, ".llvm.offloading")
    # Raw ELFs only when no fat binary serves as the TU list (a runtime's own embedded kernels);
    # bundles and CCOBs whatever the file has besides: tensorflow loads 1,149 of them from .rodata.
    embedded_images(result, fh, sections, selection, with_elfs=result.tu_count == 0, registered=skip_images)


def _read_wrappers(result: FileCodeObjects, fh: FileWindow, segment: Section | None) -> list[hip_fatbin.FatbinWrapper]:
    """The HIPF/HIPK wrappers of ``.hipFatBinSegment`` (none without one); sets ``wrappers``."""
    if segment is None or not segment.has_file_bytes:
        return []
    wrappers: list[hip_fatbin.FatbinWrapper] = []
    try:
        wrappers = hip_fatbin.parse_wrappers(
            fh.read(segment.offset, min(segment.size, hip_fatbin.WRAPPER_SIZE * hip_fatbin.MAX_WRAPPERS + 1)),
            segment.offset,
        )
    except FormatError as exc:
        malformed(result, exc, ".hipFatBinSegment")
    result.wrappers = len(wrappers)
    return wrappers


def _kpack_units(
    result: FileCodeObjects,
    fh: FileWindow,
    ref_section: Section | None,
    wrappers: list[hip_fatbin.FatbinWrapper],
    selection: TargetSelection | None,
) -> None:
    """A kpack'd library: HIPK wrappers, and the archives its ``.rocm_kpack_ref`` leads to."""
    result.kpack_ref = True
    if ref_section is None or not ref_section.has_file_bytes:
        result.findings.append(make_finding("ARCH005", result.path, "HIPK wrappers but no .rocm_kpack_ref section"))
        return
    try:
        ref = kpack.parse_kpack_ref(
            fh.read(ref_section.offset, min(ref_section.size, kpack.MAX_REF_BYTES)),
            ref_section.offset,
        )
    except FormatError as exc:
        malformed(result, exc, ".rocm_kpack_ref")
        return
    result.tu_count = max(len(wrappers), 1)
    kpack_objects(result, fh, result.path, ref, result.tu_count, selection)


def _fatbin_units(
    result: FileCodeObjects,
    fh: FileWindow,
    fatbin: Section,
    wrappers: list[hip_fatbin.FatbinWrapper],
    selection: TargetSelection | None,
) -> None:
    """``.hip_fatbin``: one unit per container; ARCH007 when the wrappers do not pair up."""
    result.add_container("hip-fatbin")
    bundles = walk_fatbin(result, fh, fatbin, selection)
    result.tu_count = bundles
    # -fgpu-rdc: every TU's wrapper registers the one device-linked bundle, so more wrappers
    # than bundles is normal there; fewer wrappers, or several bundles that do not pair
    # up, is not.
    if wrappers and (bundles > len(wrappers) or (bundles > 1 and bundles != len(wrappers))):
        result.findings.append(
            make_finding(
                "ARCH007",
                result.path,
                f"{len(wrappers)} .hipFatBinSegment wrappers but {bundles} bundles in .hip_fatbin",
                data={"wrappers": len(wrappers), "bundles": bundles},
            )
        )
