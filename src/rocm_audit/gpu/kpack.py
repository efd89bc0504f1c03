"""kpack (formats.md 1.7): the archives a library's ``.rocm_kpack_ref`` leads to, the TOC keys that
are this library's kernels, which of them some device's runtime selects, and standalone archives.

Lookup follows the kpack runtime [rocm-systems: shared/kpack/runtime/src/loader.cpp] and its older
flow (a ``.kpm`` manifest naming one archive per arch and the build prefix of the TOC keys).
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

from rocm_audit.elf.codeobject import CodeObjectFacts, FileWindow, buffer_reader, inspect_code_object
from rocm_audit.errors import FormatError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.formats import kpack
from rocm_audit.formats.amdgpu_elf import FEATURES, supported_features
from rocm_audit.gpu.records import CO_HEAD_BYTES, FileCodeObjects, consistency_findings, device_record
from rocm_audit.tree.smallfile import open_regular, read_head
from rocm_audit.tree.targets import GENERIC_OF, KNOWN_PROCESSORS, TargetSelection, parse_target_id

_CO_INDEX = re.compile(r"#(\d+)$")


class _LoadedArchive:
    """A parsed .kpack TOC, indexed by key stem, with the zstd frame table read on first use."""

    def __init__(self, path: str, toc: kpack.KpackToc, toc_offset: int = 0) -> None:
        self.path = path
        self.toc = toc
        self.toc_offset = toc_offset
        self._frames: list[tuple[int, int]] | None = None
        # "<relpath>#<co_index>" and "<prefix>/<relpath>" keys, by stem: (co_index or None, kernel).
        self.by_stem: dict[str, list[tuple[int | None, kpack.KpackKernel]]] = {}
        for kernel in toc.kernels:
            match = _CO_INDEX.search(kernel.key)
            stem = (kernel.key[: match.start()] if match else kernel.key).lstrip("/")
            index = int(match.group(1)) if match else None
            self.by_stem.setdefault(stem, []).append((index, kernel))

    def selectable(self, kernel: kpack.KpackKernel) -> bool:
        """Whether the kpack runtime can select this kernel: it indexes an archive by its
        ``gfx_arches`` and looks a kernel up only under an arch found there, so a per-key arch
        the list lacks is never loaded [kpack-old: runtime/src/loader.cpp, toc_parser.cpp;
        rocm-systems: shared/kpack/runtime/src/loader.cpp]."""
        return kernel.arch in self.toc.arches

    def unselectable_finding(self) -> Finding | None:
        hidden = sorted({f"{k.key}@{k.arch}" for k in self.toc.kernels if not self.selectable(k)})
        if not hidden:
            return None
        return make_finding(
            "ARCH004",
            self.path,
            f"kpack TOC: {len(hidden)} kernel(s) under an arch its gfx_arches {list(self.toc.arches)} lacks, "
            f"which the kpack runtime never selects: {', '.join(hidden[:4])}{' ...' if len(hidden) > 4 else ''} "
            f"(at file offset {self.toc_offset:#x})",
            data={"offset": self.toc_offset, "format": "kpack TOC", "unselectable": hidden},
        )

    def frames(self, fh: FileWindow) -> list[tuple[int, int]]:
        if self._frames is None:
            assert self.toc.zstd_blob is not None
            blob_offset, blob_size = self.toc.zstd_blob
            self._frames = kpack.zstd_frame_offsets(fh.reader(blob_offset, blob_size), blob_size, blob_offset)
        return self._frames


# Many libraries share one per-arch archive (blas_lib_gfx942.kpack): parse each TOC once per run.
_ARCHIVES: dict[tuple[str, int, int, int, int], _LoadedArchive | None] = {}
_MAX_CACHED_ARCHIVES = 256


def _load_archive(path: str, result: FileCodeObjects) -> _LoadedArchive | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        result.findings.append(
            make_finding("ARCH005", result.path, f"cannot open kpack archive {path}: {exc.strerror}")
        )
        return None
    try:
        st = os.fstat(fd)
        key = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key in _ARCHIVES:
            return _ARCHIVES[key]  # a broken archive was reported when it was first read
        if len(_ARCHIVES) >= _MAX_CACHED_ARCHIVES:
            _ARCHIVES.clear()
        loaded: _LoadedArchive | None = None
        try:
            header = kpack.parse_kpack_header(os.pread(fd, 16, 0), st.st_size)
            toc_bytes = os.pread(fd, st.st_size - header.toc_offset, header.toc_offset)
            toc = kpack.parse_kpack_toc(toc_bytes, header.toc_offset, st.st_size)
            loaded = _LoadedArchive(path, toc, header.toc_offset)
        except FormatError as exc:
            result.findings.append(
                make_finding(
                    "ARCH004",
                    path,
                    f"{exc.fmt}: {exc.reason} (at file offset {exc.offset:#x})",
                    data={"offset": exc.offset, "format": exc.fmt},
                )
            )
        _ARCHIVES[key] = loaded
        return loaded
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class _KpackSource:
    """One archive a kpack reference leads to. ``build_dir``: for an archive listed by an older-flow
    ``.kpm``, the TOC key directory that holds this library's build path
    (``<kpm prefix>/<library dir relative to the prefix root>``), else None; ``rel_dir``: that
    library dir relative to the prefix root alone."""

    path: str
    build_dir: str | None = None
    rel_dir: str | None = None
    file_arch: str | None = None  # what @GFXARCH@ stands for in this archive's name


def _kpack_archive_paths(library: str, ref: kpack.KpackRef, result: FileCodeObjects) -> list[_KpackSource]:
    """The archives the kpack runtime would open: search paths relative to the library's
    directory (the path it was loaded through); ``@GFXARCH@`` matches every arch present (which of
    their kernels a device selects: ``opened_for_its_arch``); a
    ``.kpm`` (older flow) lists one archive per arch and names the build prefix of the TOC keys."""
    base_dir = os.path.dirname(library)
    sources: list[_KpackSource] = []
    for pattern in ref.search_paths:
        full = os.path.normpath(os.path.join(base_dir, pattern))
        candidates = (
            sorted(glob.glob(glob.escape(full).replace(glob.escape("@GFXARCH@"), "*")))
            if "@GFXARCH@" in full
            else ([full] if os.path.exists(full) else [])
        )
        named = None
        if "@GFXARCH@" in full:
            head, _, tail = full.partition("@GFXARCH@")
            named = re.compile(re.escape(head) + "(.+)" + re.escape(tail).replace(re.escape("@GFXARCH@"), ".+"))
        for candidate in candidates:
            if candidate.endswith(".kpm"):
                try:
                    manifest = kpack.parse_kpm(read_head(candidate, kpack.MAX_REF_BYTES * 16), 0)
                except FormatError as exc:
                    result.findings.append(
                        make_finding(
                            "ARCH004",
                            candidate,
                            f"{exc.fmt}: {exc.reason} (at file offset {exc.offset:#x})",
                            data={"offset": exc.offset, "format": exc.fmt},
                        )
                    )
                    continue
                except OSError as exc:
                    result.findings.append(
                        make_finding("ARCH005", result.path, f"cannot read {candidate}: {exc.strerror}")
                    )
                    continue
                # The .kpm sits in <prefix root>/.kpack/; the splitter keyed each binary by
                # "<prefix>/<its path under the prefix root>" at build time.
                prefix_root = os.path.dirname(os.path.dirname(candidate))
                rel_dir = os.path.relpath(base_dir, prefix_root).replace(os.sep, "/")
                build_dir = "/".join(p for p in (manifest.prefix.strip("/"), rel_dir) if p and p != ".")
                for arch in sorted(manifest.files_by_arch):
                    # The kpack runtime opens only the archive of the device's arch: one that is not
                    # installed (its device wheel was not, or was pruned) is no error here; a target
                    # left without code is judged missing like any other.
                    listed = os.path.join(os.path.dirname(candidate), manifest.files_by_arch[arch])
                    if os.path.exists(listed):
                        inside = not rel_dir.startswith("..")
                        sources.append(_KpackSource(listed, build_dir if inside else None, rel_dir if inside else None))
            else:
                match = named.fullmatch(candidate) if named is not None else None
                sources.append(_KpackSource(candidate, file_arch=match.group(1) if match else None))
    if not sources:
        result.findings.append(
            make_finding(
                "ARCH005",
                result.path,
                f"no kpack archive found for search paths {list(ref.search_paths)}",
                data={"search_paths": list(ref.search_paths)},
            )
        )
    return list(dict.fromkeys(sources))


_VERSION_SUFFIX = re.compile(r"^(?:\.[0-9]+)+$")


def _is_build_name(key_name: str, installed_name: str) -> bool:
    """Whether a TOC key's file name is the build file of a library installed as ``installed_name``:
    the same name, or the versioned real file whose SONAME the wheel materialised
    (``librocblas.so.5.0.0`` installed as ``librocblas.so.5``)."""
    if key_name == installed_name:
        return True
    return key_name.startswith(installed_name + ".") and bool(_VERSION_SUFFIX.match(key_name[len(installed_name) :]))


def _other_prefix_stems(archive: _LoadedArchive, rel_dir: str, installed: str) -> list[str]:
    """Keys of this library's build file under one other build prefix: rocm-kpack's splitter keys
    every prefix of an artifact by its own prefix but writes one ``.kpack/<component>.kpm`` per
    prefix, and the wheel's flat tree keeps only one of them (observed: blas_lib with the rocBLAS
    and hipBLAS stage dirs). Several prefixes holding the name are not guessed between."""
    suffix = "" if rel_dir in ("", ".") else "/" + rel_dir
    by_dir: dict[str, list[str]] = {}
    for stem in archive.by_stem:
        directory, _, name = stem.rpartition("/")
        if directory.endswith(suffix) and _is_build_name(name, installed):
            by_dir.setdefault(directory, []).append(stem)
    return next(iter(by_dir.values())) if len(by_dir) == 1 else []


def _kernels_for(
    archive: _LoadedArchive,
    library: str,
    kernel_name: str,
    tu_count: int,
    build_dir: str | None = None,
    rel_dir: str | None = None,
    indexed_only: bool = False,
) -> list[tuple[int, kpack.KpackKernel]]:
    """(TU, kernel) pairs of one library, found by the key its reference holds: ``<kernel_name>#<i>``
    or ``<kernel_name>`` (newer flow; whatever name the library is installed under). Older flow
    (the reference names a component, the TOC keys build paths): keys in ``build_dir`` whose file
    name is the library's build name, or keys whose stem is a path suffix of the library."""
    parts = library.replace(os.sep, "/").split("/")
    stems = [kernel_name.lstrip("/")] + ["/".join(parts[i:]) for i in range(len(parts))]
    if build_dir is not None:
        installed = parts[-1]
        in_prefix = [
            stem
            for stem in archive.by_stem
            if stem.rpartition("/")[0] == build_dir and _is_build_name(stem.rpartition("/")[2], installed)
        ]
        if not in_prefix and rel_dir is not None and not any(stem in archive.by_stem for stem in stems):
            in_prefix = _other_prefix_stems(archive, rel_dir, installed)
        stems += in_prefix
    found: list[tuple[int, kpack.KpackKernel]] = []
    for stem in dict.fromkeys(stems):
        for index, kernel in archive.by_stem.get(stem, []):
            if index is None:
                # a key without "#i" can only name a single-TU library, and only for the older
                # runtime: the one that expands @GFXARCH@ always looks up "<kernel_name>#<co_index>"
                # [rocm-systems: shared/kpack/runtime/src/loader.cpp]
                if tu_count == 1 and not indexed_only:
                    found.append((0, kernel))
            elif index < tu_count:
                found.append((index, kernel))
    return found


def opened_for_its_arch(file_arch: str, kernel_arch: str) -> bool:
    """Whether some device opens an archive whose name put ``file_arch`` for ``@GFXARCH@`` and
    then selects a kernel listed under ``kernel_arch`` in it. The runtime puts each arch of the
    device's list (its ISA, then its generic family) and every feature subset of it in the
    pattern, and selects kernels under those same names [rocm-systems:
    shared/kpack/runtime/src/loader.cpp; CLR hip_code_object.cpp]: both must name one device, with
    no feature set both ways."""
    named, listed = parse_target_id(file_arch), parse_target_id(kernel_arch)
    if named is None or listed is None:
        return False  # a family name (gfx94X) or other text is never what @GFXARCH@ becomes
    if any(
        named.feature(f) is not None and listed.feature(f) is not None and named.feature(f) != listed.feature(f)
        for f in FEATURES
    ):
        return False
    wanted = {named.processor, listed.processor}
    spelled = {f for f in FEATURES if named.feature(f) is not None or listed.feature(f) is not None}
    # the device's ISA name spells only the features its processor has
    return any(wanted <= {p, GENERIC_OF.get(p)} and spelled <= set(supported_features(p)) for p in KNOWN_PROCESSORS)


def kpack_objects(
    result: FileCodeObjects,
    fh: FileWindow,
    library: str,
    ref: kpack.KpackRef,
    tu_count: int,
    selection: TargetSelection | None,
) -> None:
    result.add_container("kpack")
    listed: list[tuple[_LoadedArchive, int, kpack.KpackKernel]] = []
    searched: list[str] = []
    for source in _kpack_archive_paths(library, ref, result):
        archive = _load_archive(source.path, result)
        if archive is None:
            continue
        searched.append(source.path)
        found = _kernels_for(
            archive,
            library,
            ref.kernel_name,
            tu_count,
            source.build_dir,
            source.rel_dir,
            indexed_only=source.file_arch is not None,
        )
        if source.file_arch is not None:
            stray = [k for _, k in found if not opened_for_its_arch(source.file_arch, k.arch)]
            if stray:
                result.findings.append(
                    make_finding(
                        "ARCH004",
                        archive.path,
                        f"kpack TOC: kernel(s) {', '.join(sorted({f'{k.key}@{k.arch}' for k in stray})[:4])} sit in an "
                        f"archive the runtime opens only for {source.file_arch} (the name it gives @GFXARCH@), "
                        f"so no device selects them (at file offset {archive.toc_offset:#x})",
                        data={"offset": archive.toc_offset, "format": "kpack TOC", "file_arch": source.file_arch},
                    )
                )
                found = [(tu, k) for tu, k in found if opened_for_its_arch(source.file_arch, k.arch)]
        if any(not archive.selectable(kernel) for _, kernel in found):
            hidden = archive.unselectable_finding()
            if hidden is not None:
                result.findings.append(hidden)
        listed.extend((archive, tu, kernel) for tu, kernel in found if archive.selectable(kernel))
    if searched and not listed:
        result.findings.append(
            make_finding(
                "ARCH005",
                result.path,
                f"kpack reference names kernel {ref.kernel_name!r}, but no archive it leads to "
                f"({', '.join(searched)}) holds a key for this library",
                data={"kernel_name": ref.kernel_name, "archives": searched},
            )
        )
    wanted: set[int] | None = None
    if selection is not None:
        wanted = set()
        for tu in range(tu_count):
            members = [i for i, (_, at, _) in enumerate(listed) if at == tu]
            chosen = selection.wanted([listed[i][2].arch for i in members])
            wanted.update(members[i] for i in chosen)
    for number, (archive, tu, kernel) in enumerate(listed):
        facts = _kpack_kernel_facts(archive, kernel, result) if wanted is None or number in wanted else None
        obj = device_record(
            container="kpack",
            location=f"{archive.path}:{kernel.key}@{kernel.arch}",
            file_offset=None,
            size=kernel.original_size,
            tu=tu,
            entry_id=kernel.key,
            kind="device",
            bundle_target=kernel.arch,
            facts=facts,
            listed_source="kpack-toc",
        )
        result.code_objects.append(obj)
        result.findings.extend(consistency_findings(result.path, obj, facts, 0))


def _kpack_kernel_facts(
    archive: _LoadedArchive, kernel: kpack.KpackKernel, result: FileCodeObjects
) -> CodeObjectFacts | None:
    """ELF facts of one archived kernel: a pread of its blob, or its zstd frame's first bytes."""
    try:
        with os.fdopen(open_regular(archive.path), "rb", buffering=0) as handle:
            fh = FileWindow(handle.fileno(), os.fstat(handle.fileno()).st_size)
            if kernel.blob is not None:
                offset, size = kernel.blob
                return inspect_code_object(fh.reader(offset, size), size, offset)
            if archive.toc.zstd_blob is None:
                return None
            blob_offset, _blob_size = archive.toc.zstd_blob
            frames = archive.frames(fh)
            if kernel.ordinal >= len(frames):
                raise FormatError("kpack", blob_offset, f"kernel ordinal {kernel.ordinal} has no zstd frame")
            frame_offset, frame_size = frames[kernel.ordinal]
            import zstandard  # noqa: PLC0415 - heavy module, loaded on first use (style.md 3)

            frame = fh.read(blob_offset + frame_offset, frame_size)
            try:
                reader = zstandard.ZstdDecompressor().stream_reader(frame)
                head = reader.read(min(CO_HEAD_BYTES, max(kernel.original_size, 64)))
            except zstandard.ZstdError as exc:
                raise FormatError("kpack", blob_offset + frame_offset, f"zstd frame is corrupt: {exc}") from None
            return inspect_code_object(
                buffer_reader(head), kernel.original_size or len(head), blob_offset + frame_offset
            )
    except FormatError as exc:
        result.findings.append(
            make_finding(
                "ARCH004",
                archive.path,
                f"{exc.fmt}: {exc.reason} (at file offset {exc.offset:#x})",
                data={"offset": exc.offset, "format": exc.fmt},
            )
        )
    except OSError as exc:
        result.findings.append(make_finding("ARCH005", result.path, f"cannot read {archive.path}: {exc.strerror}"))
    return None


def kpack_archive_listing(result: FileCodeObjects, fh: FileWindow) -> None:
    """A standalone .kpack archive: list its kernels (it is per-arch content, not a carrier)."""
    result.add_container("kpack-archive")
    archive = _load_archive(result.path, result)
    if archive is None:
        return
    hidden = archive.unselectable_finding()
    if hidden is not None:
        result.findings.append(hidden)
    for kernel in archive.toc.kernels:
        facts = _kpack_kernel_facts(archive, kernel, result)
        result.code_objects.append(
            device_record(
                container="kpack",
                location=f"{kernel.key}@{kernel.arch}",
                file_offset=kernel.blob[0] if kernel.blob else None,
                size=kernel.original_size,
                tu=None,
                entry_id=kernel.key,
                kind="device",
                bundle_target=kernel.arch,
                facts=facts,
                listed_source="kpack-toc",
            )
        )
