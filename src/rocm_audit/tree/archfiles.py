"""Per-arch units: files and folders a runtime opens only on a device of the arch they are named for.

Recognised by path alone (formats.md 1.3, 1.7, 2.10; kpack's database_handlers.py classification):

- kpack archives ``.kpack/<name>_gfxNNN.kpack`` and ``<name>_gfx942:xnack+.kpack`` (the kpack
  runtime opens the archive of the device's arch);
- Tensile / hipBLASLt / hipSPARSELt ``library/`` files named for one arch (``.co``, ``.hsaco``,
  ``.dat``: ``TensileLibrary_lazy_gfx942.dat``, ``Kernels.so-000-gfx942.hsaco``) and per-arch
  folders ``library/gfx942/``; arch-less files (``TensileLibrary_lazy_fallback.dat``) are shared;
- MIOpen databases ``share/miopen/db/gfx942130.kdb`` (arch + CU count), and the per-arch CK
  plugins ``libMIOpenCK<name>_gfx942.so`` MIOpen dlopens for the device's arch;
- AOTriton image folders ``aotriton.images/amd-gfx942/``, and ``aotriton/kernels/gfx942/``; a
  family folder (``amd-gfx11xx``, ``amd-gfx110x``) is a unit too, but its name is no pattern: it
  names no processor (``arches`` is empty) and the caller takes them from the ELF headers of the
  code objects in its ``.aks2`` archives (hipengine 0.8.3's ``amd-gfx11xx`` holds gfx1100-1103 and
  gfx1150-1153, not gfx1170). TheRock's family names (``gfx94X-dcgpu`` device distributions, a
  tree's ``THIS_TARGET_FAMILY``) keep the meaning TheRock's metadata gives them;
- standalone code-object files named for one arch (``Kernels_gfx950.hsaco``), and folders named for
  one arch that hold standalone code objects (aiter's ``aiter_meta/hsa/gfx942/``), the per-arch
  units verify-arch judges: only when their content is for that arch too (the caller checks).

A unit is removed whole or not at all; what the caller checks before that is in prune/.
Device distributions (TheRock ``rocm-sdk-device-gfx942``, PyTorch ``amd-torch-device-gfx942``)
are recognised by name here too.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

from rocm_audit.tree.targets import arch_tokens, is_family_name

# rocm-kpack's splitter names an archive for the full target id it unbundled, features and all
# (blas_lib_gfx942:xnack+.kpack) [kpack-old: artifact_utils.py extract_architecture_from_target].
_KPACK = re.compile(r"^(?P<name>.+)_(?P<arch>gfx[0-9a-z]+(?:-[0-9a-z]+)*(?::(?:sramecc|xnack)[+-])*)\.kpack$")
_TENSILE_ROOTS = (("rocblas", "library"), ("hipblaslt", "library"), ("hipsparselt", "library"))
_TENSILE_SUFFIXES = (".co", ".hsaco", ".dat")
_MIOPEN_DB = ("miopen", "db")
# The CU count follows the arch without a separator (gfx942130), so only known arch names are cut off.
# gfx1250-strict (A0 silicon) is a target of its own, as the runtime names the device.
_MIOPEN_ARCH = re.compile(
    r"^(gfx(?:90a|900|906|908|940|941|942|950|1010|1030|1100|1101|1102|1150|1151|1200|1201|1250)(?:-strict)?)(?=[0-9_.])"
)
_MIOPEN_CK = re.compile(r"^libMIOpenCK.*_(gfx[0-9a-z]+)\.so(?:\.[0-9]+)*$")
_AOTRITON_IMAGES = re.compile(r"^amd-(gfx[0-9a-zA-Z]+)$")
_AOTRITON_KERNELS = ("aotriton", "kernels")
_ARCH_DIR = re.compile(r"^gfx[0-9a-z]+(?:-[0-9a-z]+)*$")
_DEVICE_DIST = re.compile(r"^(?:rocm-sdk-device|amd-[a-z0-9-]+-device)-(gfx[0-9a-z]+(?:-[a-z]+)?)$")
_FAMILY_SUFFIX = re.compile(r"-(?:all|dgpu|igpu|dcgpu)$")


def miopen_db_arch(name: str) -> str | None:
    """The arch a MIOpen database file name starts with (``gfx942130.kdb`` -> gfx942)."""
    match = _MIOPEN_ARCH.match(name)
    return None if match is None else match.group(1)


@dataclass(frozen=True, slots=True)
class ArchUnit:
    """One per-arch unit: ``path`` is a file, or a folder when ``is_dir`` (every file under it)."""

    # kpack-archive | tensile | tensile-dir | miopen-db | miopen-ck | aotriton | code-object-file
    # | code-object-dir
    kind: str
    path: str
    is_dir: bool
    # as named: gfx942, gfx90a:xnack+; empty for an AOTriton family folder (read its content)
    arches: tuple[str, ...]


def _find(parts: list[str], suffix: tuple[str, ...]) -> int | None:
    """Index just past the last occurrence of ``suffix`` among the directory parts, or None."""
    for index in range(len(parts) - len(suffix), -1, -1):
        if tuple(parts[index : index + len(suffix)]) == suffix:
            return index + len(suffix)
    return None


@dataclass(frozen=True, slots=True)
class _Place:
    """What a directory alone says for arch_unit_of (worked out once per directory: a tree of
    300,000 files in a few hundred directories took 15 s of matching each file's every part)."""

    folder_unit: ArchUnit | None  # an AOTriton folder unit above or at the directory
    tensile: ArchUnit | None  # a Tensile per-arch folder unit
    tensile_files: bool  # the directory is a Tensile ``library/`` itself: files named for one arch
    tensile_root: bool  # under a Tensile root: nothing else is a unit here
    miopen_db: bool  # the directory is MIOpen's ``db/``


@functools.lru_cache(maxsize=1 << 14)
def _place(directory: str) -> _Place:
    parts = directory.split(os.sep)
    end = _find(parts, ("aotriton.images",))
    if end is not None and end < len(parts):
        folder = _AOTRITON_IMAGES.match(parts[end])
        if folder is not None:
            arch = folder.group(1)
            named = () if is_family_name(arch) else (arch,)
            return _Place(ArchUnit("aotriton", os.sep.join(parts[: end + 1]), True, named), None, False, False, False)
    end = _find(parts, _AOTRITON_KERNELS)
    if end is not None and end < len(parts) and _ARCH_DIR.match(parts[end]):
        named = () if is_family_name(parts[end]) else (parts[end],)
        return _Place(ArchUnit("aotriton", os.sep.join(parts[: end + 1]), True, named), None, False, False, False)
    for root in _TENSILE_ROOTS:
        end = _find(parts, root)
        if end is None:
            continue
        if end < len(parts) and _ARCH_DIR.match(parts[end]):
            unit = ArchUnit("tensile-dir", os.sep.join(parts[: end + 1]), True, (parts[end],))
            return _Place(None, unit, False, True, False)
        return _Place(None, None, end == len(parts), True, False)
    return _Place(None, None, False, False, _find(parts, _MIOPEN_DB) == len(parts))


def arch_unit_of(path: str) -> ArchUnit | None:
    """The per-arch unit ``path`` (a regular file) belongs to by its name, or None."""
    directory, name = os.path.split(path)
    match = _KPACK.match(name)
    if match is not None:
        tokens = arch_tokens(match.group("arch"))
        if tokens:
            return ArchUnit("kpack-archive", path, False, tuple(tokens))
    place = _place(directory)
    if place.folder_unit is not None:
        return place.folder_unit
    if place.tensile_root:
        if place.tensile is not None:
            return place.tensile
        if place.tensile_files and name.endswith(_TENSILE_SUFFIXES):
            tokens = arch_tokens(name)
            if len(tokens) == 1:
                return ArchUnit("tensile", path, False, tuple(tokens))
        return None
    if place.miopen_db:
        arch = miopen_db_arch(name)
        return None if arch is None else ArchUnit("miopen-db", path, False, (arch,))
    match = _MIOPEN_CK.match(name)
    if match is not None:
        return ArchUnit("miopen-ck", path, False, (match.group(1),))
    return None


def arch_folder_of(path: str) -> tuple[str, str] | None:
    """(folder, arch) when exactly one folder above ``path`` is named for an arch and nothing else
    (``hsa/gfx942``, ``gfx90a-xnack+``; not ``amd-gfx942``): what a loader that builds the path from
    the device's arch opens (aiter's ``aiter_meta/hsa/gfx942/fmoe/x.co``). The caller checks that
    what is inside is code for that arch."""
    return _arch_folder(os.path.dirname(path))


@functools.lru_cache(maxsize=1 << 14)
def _arch_folder(directory: str) -> tuple[str, str] | None:
    parts = directory.split(os.sep)
    named = [(i, arch) for i, part in enumerate(parts) if arch_tokens(part) == [arch := _as_target(part)]]
    if len(named) != 1:
        return None
    index, arch = named[0]
    return os.sep.join(parts[: index + 1]), arch


def _as_target(folder_name: str) -> str:
    """``gfx90a-xnack+`` -> ``gfx90a:xnack+``: a folder name spelled as the target it names."""
    return re.sub(r"[-_](xnack|sramecc)", r":\1", folder_name)


def code_object_folder_unit(path: str) -> ArchUnit | None:
    """The arch folder (``hsa/gfx942/``) a standalone code-object file lies in, or None."""
    found = arch_folder_of(path)
    if found is None:
        return None
    folder, arch = found
    return ArchUnit("code-object-dir", folder, True, (arch,))


def code_object_file_unit(path: str) -> ArchUnit | None:
    """A standalone code-object file named for exactly one arch (``Kernels_gfx950.hsaco``)."""
    tokens = arch_tokens(os.path.basename(path))
    if len(tokens) != 1:
        return None
    return ArchUnit("code-object-file", path, False, tuple(tokens))


@dataclass(frozen=True, slots=True)
class PathUnits:
    """What a file's path alone says about the per-arch units it may belong to: worked out once
    per file and walk (prune/plan.py asks each of them several times)."""

    named: ArchUnit | None  # arch_unit_of: a unit by its name and place
    folder: ArchUnit | None  # code_object_folder_unit: the one arch folder above it
    file: ArchUnit | None  # code_object_file_unit: a file name naming one arch


def path_units(path: str) -> PathUnits:
    """Every unit :func:`arch_unit_of`, :func:`code_object_folder_unit` and
    :func:`code_object_file_unit` find for ``path`` (the caller checks the content)."""
    return PathUnits(arch_unit_of(path), code_object_folder_unit(path), code_object_file_unit(path))


def device_distribution_arch(name: str) -> str | None:
    """The arch (or family) a device distribution is for: ``rocm-sdk-device-gfx942`` -> gfx942,
    ``amd-torch-device-gfx950`` -> gfx950, ``rocm-sdk-device-gfx94X-dcgpu`` -> gfx94X; else None.
    ``name`` is normalised (PEP 503: lower case, runs of ``-_.`` as ``-``) except an X of a family."""
    normalised = re.sub(r"[-_.]+", "-", name)
    match = _DEVICE_DIST.match(normalised.lower())
    if match is None:
        return None
    arch = normalised[match.start(1) : match.end(1)]  # keep the family's capital X as written
    arch = _FAMILY_SUFFIX.sub("", arch)
    return arch if is_family_name(arch) else arch.lower()
