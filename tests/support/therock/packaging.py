"""Populate TheRock's wheel packages from an ArtifactTree and write real wheels (own code, upstream behaviour).

Mirrors build_tools/_therock_utils/py_packaging.py (``PopulatedDistPackage``) and build_tools/
build_python_packages.py (``_run_kpack_split``, ``_run_legacy``): see BEHAVIOURS in ``support.therock``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from support.therock.artifacts import Artifact, ArtifactTree

TEMPLATE_DIR = Path(__file__).parent / "template"
# build_python_packages.py core_artifact_filter (comgr is part of amd-llvm, the kpack runtime is core-kpack).
CORE_ARTIFACTS = frozenset({"core-hip", "core-kpack", "sysdeps", "host-blas", "amd-llvm", "base"})
LIBRARIES_ARTIFACTS = frozenset({"blas", "miopen"})
# Legacy per-family releases: family -> the arches whose device files its libraries wheel embeds.
# build_python_packages.py run: the kpack split (THEROCK manifest flag KPACK_SPLIT_ARTIFACTS) or the legacy flow.
FLOWS = ("kpack-split", "legacy")
LEGACY_FAMILY_ARCHES = {"gfx94X-dcgpu": ("gfx942",), "gfx90X-dcgpu": ("gfx90a",), "gfx950-dcgpu": ("gfx950",)}
# build_python_packages.py: core.rpath_dep(core, ...); libraries and device rpath_dep(core, ...).
CORE_RPATHS = ("lib/llvm/lib", "lib/rocm_sysdeps/lib")
LIBRARIES_RPATHS = ("lib", "lib/rocm_sysdeps/lib", "lib/host-math/lib", "lib/llvm/lib")
DEVICE_RPATHS = ("lib", "lib/rocm_sysdeps/lib")


def file_type(path: Path) -> str:
    """py_packaging.get_file_type, with the ELF header read directly instead of python-magic.

    ``.hsaco``/``.co`` are "hsaco" by suffix (they read as shared objects); an ET_DYN with PT_INTERP is a PIE
    executable ("exe"), without it a shared library ("so").
    """
    if path.is_symlink():
        return "symlink"
    if path.is_dir():
        return "dir"
    if path.suffix in (".txt", ".h", ".hpp"):
        return "text"
    if path.suffix in (".hsaco", ".co"):
        return "hsaco"
    with open(path, "rb") as handle:
        header = handle.read(64)
        if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2:
            return "other"
        e_type = struct.unpack_from("<H", header, 16)[0]
        (e_phoff,) = struct.unpack_from("<Q", header, 32)
        e_phentsize, e_phnum = struct.unpack_from("<HH", header, 54)
        has_interp = False
        for index in range(e_phnum):
            handle.seek(e_phoff + index * e_phentsize)
            has_interp |= struct.unpack("<I", handle.read(4))[0] == 3  # PT_INTERP
    if e_type == 2 or (e_type == 3 and has_interp):
        return "exe"
    return "so" if e_type == 3 else "other"


def get_soname(path: Path) -> str:
    return subprocess.run(
        ["patchelf", "--print-soname", str(path)], check=True, capture_output=True, text=True
    ).stdout.strip()


def exec_stub(dest: Path, relative_target: str) -> None:
    """exe_stub_gen.generate_exe_link_stub: a PIE that execs ``relative_target`` next to itself (dladdr)."""
    source = dest.parent / f".{dest.name}.stub.c"
    source.write_text(
        "#define _GNU_SOURCE\n#include <dlfcn.h>\n#include <libgen.h>\n#include <limits.h>\n#include <stdio.h>\n"
        "#include <stdlib.h>\n#include <string.h>\n#include <unistd.h>\n"
        "int main(int argc, char **argv) { Dl_info info; char self[PATH_MAX], target[PATH_MAX];\n"
        "  (void)argc; if (!dladdr((void *)main, &info) || !realpath(info.dli_fname, self)) return 127;\n"
        f'  snprintf(target, sizeof target, "%s/%s", dirname(self), "{relative_target}");\n'
        "  argv[0] = target; execv(target, argv); perror(target); return 127; }\n"
    )
    subprocess.run(["gcc", "-fPIE", "-pie", "-o", str(dest), str(source), "-ldl"], check=True, capture_output=True)
    source.unlink()


@dataclass
class Package:
    """One dist package being populated: a pure package dir and a platform dir (``_<dist>`` + nonce)."""

    dist_name: str
    pure_name: str
    platform_name: str | None
    staging: Path
    target_family: str | None = None
    rpath_relpaths: tuple[str, ...] = ()
    core_platform_name: str = ""
    materialized: dict[str, Path] = field(default_factory=dict)
    soname_aliases: dict[str, str] = field(default_factory=dict)
    requires: list[str] = field(default_factory=list)
    extras: dict[str, list[str]] = field(default_factory=dict)
    entry_points: str = ""

    @property
    def pure_dir(self) -> Path:
        return self.staging / self.pure_name

    @property
    def platform_dir(self) -> Path:
        # Upstream's platform_dir property creates the dir and its __init__.py marker on access.
        assert self.platform_name is not None
        directory = self.staging / self.platform_name
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "__init__.py").touch()
        return directory

    def _patch_rpath(self, dest: Path) -> None:
        for rpath in self.rpath_relpaths:
            up = os.path.relpath(self.staging, dest.parent)
            subprocess.run(
                ["patchelf", "--add-rpath", f"$ORIGIN/{up}/{self.core_platform_name}/{rpath}", str(dest)],
                check=True,
                capture_output=True,
            )
        existing = subprocess.run(
            ["patchelf", "--print-rpath", str(dest)], check=True, capture_output=True, text=True
        ).stdout.strip()
        if existing:
            # --force-rpath: DT_RPATH, not RUNPATH, so LD_LIBRARY_PATH cannot interfere (upstream comment).
            subprocess.run(
                ["patchelf", "--set-rpath", existing, "--force-rpath", str(dest)], check=True, capture_output=True
            )

    def materialize(self, relpath: str, source: Path) -> None:
        dest = self.platform_dir / relpath
        dest.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            dest.mkdir(exist_ok=True)
            return
        if dest.exists():
            dest.unlink()
        shutil.copy2(source.resolve(), dest)
        os.chmod(dest, os.stat(dest).st_mode | stat.S_IWUSR)
        self.materialized.setdefault(relpath, dest)
        if file_type(dest) in ("exe", "so"):
            self._patch_rpath(dest)


def artifact_entries(artifacts: list[Artifact]) -> Iterator[tuple[str, Path]]:
    """(relpath, path) of every entry, artifacts in order, each walked sorted (symlinks not followed)."""
    for artifact in artifacts:
        for directory, dirnames, filenames in os.walk(artifact.root):
            dirnames.sort()
            for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(directory, d))]:
                path = Path(directory) / name
                yield path.relative_to(artifact.root).as_posix(), path


def populate_runtime(package: Package, artifacts: list[Artifact], *, exclude_cmake: bool = False) -> None:
    """populate_runtime_files + _populate_runtime_symlink: no symlinks in a runtime tree.

    ``exclude_cmake``: core's ``excludes=["**/cmake/**"]`` (build_python_packages.py run).
    """
    _ = package.platform_dir  # created (with its __init__.py) even if nothing lands in it
    for relpath, entry in artifact_entries(artifacts):
        if relpath in package.materialized:
            continue
        if exclude_cmake and "cmake" in Path(relpath).parts[:-1]:
            continue
        if entry.is_symlink():
            target = entry.resolve()
            if target.is_dir() or not target.exists():
                continue  # dangling and directory symlinks are dropped
            kind = file_type(target)
            if kind == "so" and (soname := get_soname(target)):
                if soname == entry.name:
                    package.materialize(relpath, entry)
                else:
                    package.soname_aliases[relpath] = soname
            elif kind == "exe":
                dest = package.platform_dir / relpath
                dest.parent.mkdir(parents=True, exist_ok=True)
                exec_stub(dest, os.readlink(entry))
                package.materialized[relpath] = dest
            else:
                package.materialize(relpath, entry)
            continue
        if file_type(entry) == "so" and (soname := get_soname(entry)):
            if soname == entry.name:
                package.materialize(relpath, entry)
            else:
                package.soname_aliases[relpath] = soname
            continue
        package.materialize(relpath, entry)


def populate_device(package: Package, artifacts: list[Artifact], version: str, libraries_platform_name: str) -> None:
    """populate_device_files + _emit_devel_links_manifest: copy every file, list each as a devel link."""
    links = []
    for relpath, entry in artifact_entries(artifacts):
        if relpath in package.materialized:
            continue
        package.materialize(relpath, entry)
        if not entry.is_dir():
            target = "/".join([".."] * len(Path(relpath).parts) + [libraries_platform_name, relpath])
            links.append({"relpath": relpath, "target": target})
    manifest = package.platform_dir / ".devel_links" / f"{package.target_family}.json"
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"version": version, "links": links}, indent=2))


def populate_devel(
    devel: Package, artifacts: list[Artifact], runtime: list[Package], *, member_order: str, compress: bool
) -> None:
    """populate_devel_files + _populate_devel_file, then the ``_devel.tar`` of the platform tree."""
    root = devel.platform_dir
    for relpath, entry in artifact_entries(artifacts):
        dest = root / relpath
        if entry.is_dir() and not entry.is_symlink():
            dest.mkdir(parents=True, exist_ok=True)
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.is_symlink() or dest.exists():
            dest.unlink()
        alias = next((p.soname_aliases[relpath] for p in runtime if relpath in p.soname_aliases), None)
        owner = next((p for p in runtime if relpath in p.materialized), None)
        if alias is not None:
            dest.symlink_to(alias)  # an alias of the SONAME file, relative in its own dir
        elif owner is not None:
            assert owner.platform_name is not None
            dest.symlink_to("/".join([".."] * len(Path(relpath).parts) + [owner.platform_name, relpath]))
        elif entry.is_symlink():
            dest.symlink_to(os.readlink(entry))
        else:
            shutil.copy2(entry, dest)
    tar_path = devel.pure_dir / ("_devel.tar.xz" if compress else "_devel.tar")
    devel.pure_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar_path, "w:xz" if compress else "w") as archive:
        # Upstream adds members in os.walk order, unsorted (files, then subdir entries, per dir:
        # populate_devel_files); "walk" keeps that order (the file system's), "sorted"/"reverse" fix one.
        for directory, dirnames, filenames in os.walk(root):
            if member_order != "walk":
                dirnames.sort(reverse=member_order == "reverse")
                filenames = sorted(filenames, reverse=member_order == "reverse")
            for name in filenames + dirnames:
                path = Path(directory) / name
                archive.add(path, arcname=path.relative_to(root.parent).as_posix(), recursive=False)
    shutil.rmtree(root)


def dist_info_source(
    version: str,
    nonce: str,
    families: list[str],
    *,
    kpack_split: bool,
    logical_name: str,
    target_family: str | None,
    restrict: bool = False,
) -> str:
    """The generated _dist_info.py: template + the lines py_packaging.Parameters appends.

    ``restrict`` (a legacy multi-family build's meta, ``restrict_families``): its own family is the only one.
    """
    lines = [f"__version__ = {version!r}", f"PY_PACKAGE_SUFFIX_NONCE = {nonce!r}"]
    if kpack_split:
        lines.append('ALL_PACKAGES["libraries"].dist_package_template = "rocm-sdk-libraries"')
    if restrict and target_family is not None:
        families = [target_family]
    lines.append(f"DEFAULT_TARGET_FAMILY = {sorted(families)[0]!r}")
    lines += [f"AVAILABLE_TARGET_FAMILIES.append({family!r})" for family in families]
    lines += [f"THIS_TARGET_FAMILY = {target_family!r}", f"THIS_PACKAGE_ENTRY = ALL_PACKAGES[{logical_name!r}]"]
    return (TEMPLATE_DIR / "rocm_sdk" / "_dist_info.py").read_text() + "\n".join(lines) + "\n"


def record_hash(data: bytes) -> str:
    """A RECORD row's hash column (PEP 376/427: urlsafe base64 sha256, no padding)."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(package: Package, version: str, index_dir: Path) -> Path:
    """A real wheel: zip of the staging tree + dist-info (METADATA, WHEEL, RECORD with sha256 rows)."""
    safe_name = re.sub(r"[-_.]+", "_", package.dist_name)
    platform = package.platform_name is not None or package.pure_name == "rocm_sdk_devel"
    tag = "py3-none-linux_x86_64" if platform else "py3-none-any"
    wheel_path = index_dir / f"{safe_name}-{version}-{tag}.whl"
    dist_info = f"{safe_name}-{version}.dist-info"
    metadata = ["Metadata-Version: 2.1", f"Name: {package.dist_name}", f"Version: {version}"]
    metadata += [f"Requires-Dist: {req}" for req in package.requires]
    for extra, requirements in package.extras.items():
        metadata.append(f"Provides-Extra: {extra}")
        metadata += [f'Requires-Dist: {req}; extra == "{extra}"' for req in requirements]
    meta_files = {
        "METADATA": "\n".join(metadata) + "\n\n",
        "WHEEL": f"Wheel-Version: 1.0\nGenerator: rocm-audit-therock-fixture\nRoot-Is-Purelib: "
        f"{'false' if platform else 'true'}\nTag: {tag}\n",
    }
    if package.entry_points:
        meta_files["entry_points.txt"] = package.entry_points
    records = []
    with zipfile.ZipFile(wheel_path, "w", zipfile.ZIP_STORED) as archive:
        for path in sorted(p for p in package.staging.rglob("*") if p.is_file() or p.is_symlink()):
            assert not path.is_symlink(), f"wheels hold no symlinks: {path}"
            arcname = path.relative_to(package.staging).as_posix()
            data = path.read_bytes()
            info = zipfile.ZipInfo(arcname, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (stat.S_IFREG | (path.stat().st_mode & 0o777)) << 16
            archive.writestr(info, data)
            records.append(f"{arcname},{record_hash(data)},{len(data)}")
        for name, text in meta_files.items():
            data = text.encode()
            archive.writestr(f"{dist_info}/{name}", data)
            records.append(f"{dist_info}/{name},{record_hash(data)},{len(data)}")
        records.append(f"{dist_info}/RECORD,,")
        archive.writestr(f"{dist_info}/RECORD", "\n".join(records) + "\n")
    return wheel_path


@dataclass
class BuiltIndex:
    """What ``build_index`` produced: the wheel directory and the names the install needs."""

    index_dir: Path
    version: str
    nonce: str
    arches: tuple[str, ...]
    legacy_families: tuple[str, ...]
    wheels: dict[str, Path]
    flow: str = "kpack-split"


def build_index(
    tree: ArtifactTree,
    work_dir: Path,
    *,
    version: str = "7.13.0",
    nonce: str = "",
    legacy_families: tuple[str, ...] = (),
    member_order: str = "sorted",
    compress_devel: bool = False,
    flow: str = "kpack-split",
) -> BuiltIndex:
    """Package ``tree`` the way build_python_packages.py does.

    ``flow="kpack-split"`` (``_run_kpack_split``): neutral libraries, one device wheel per arch, one devel, one
    meta; ``legacy_families`` adds per-family libraries wheels beside them (two releases' wheels co-installed).
    ``flow="legacy"`` (``_run_legacy``, no device wheels): per ``legacy_families`` family a libraries wheel
    embedding its arches' device files, and a devel and a meta of its own in ``index/<family>/`` (upstream's
    ``dist/<family>/``), the devel linking into that family's tree only.
    """
    if flow not in FLOWS:
        raise ValueError(f"unknown flow {flow!r} (one of {FLOWS})")
    legacy_flow = flow == "legacy"
    if legacy_flow and not legacy_families:
        raise ValueError("the legacy flow packages per family: name at least one in legacy_families")
    if work_dir.exists():
        shutil.rmtree(work_dir)
    index_dir = work_dir / "index"
    index_dir.mkdir(parents=True)
    arches = tree.arches
    families = list(legacy_families) if legacy_flow else list(arches)
    core_platform = f"_rocm_sdk_core{nonce}"
    libraries_platform = f"_rocm_sdk_libraries{nonce}"

    def dist_info(logical: str, family: str | None = None) -> str:
        return dist_info_source(
            version, nonce, families, kpack_split=not legacy_flow, logical_name=logical, target_family=family
        )

    def select(names: frozenset[str], family: str = "generic", *, dev: bool = False) -> list[Artifact]:
        return [
            a for a in tree.artifacts if a.name in names and a.target_family == family and (a.component == "dev") == dev
        ]

    def stage(package: Package, logical: str, family: str | None = None) -> Package:
        package.pure_dir.mkdir(parents=True, exist_ok=True)
        (package.pure_dir / "__init__.py").touch()
        (package.pure_dir / "_dist_info.py").write_text(dist_info(logical, family))
        return package

    core = stage(
        Package(
            "rocm-sdk-core",
            "rocm_sdk_core",
            core_platform,
            work_dir / "rocm-sdk-core",
            rpath_relpaths=CORE_RPATHS,
            core_platform_name=core_platform,
        ),
        "core",
    )
    # core_artifact_filter also takes core-hip's dev component (hiprtc finds HIP headers in its own tree).
    populate_runtime(core, select(CORE_ARTIFACTS) + select(frozenset({"core-hip"}), dev=True), exclude_cmake=True)
    wheels = {"rocm-sdk-core": write_wheel(core, version, index_dir)}
    # populate_devel_files: the artifacts runtime packages were made from (profiler's excluded), minus "test";
    # generic ones, plus the family's own for a per-family devel.
    runtime_names = CORE_ARTIFACTS | LIBRARIES_ARTIFACTS

    def devel_artifacts(arch_families: tuple[str, ...] = ()) -> list[Artifact]:
        return [
            a
            for a in tree.artifacts
            if a.name in runtime_names and a.target_family in ("generic", *arch_families) and a.component != "test"
        ]

    def build_devel(runtime: list[Package], artifacts: list[Artifact], family: str | None, out_dir: Path) -> None:
        devel = stage(
            Package(
                "rocm-sdk-devel",
                "rocm_sdk_devel",
                f"_rocm_sdk_devel{nonce}",
                work_dir / ("rocm-sdk-devel" + (f"-{family}" if family else "")),
                target_family=family,
                requires=[f"rocm-sdk-core=={version}"],
            ),
            "devel",
            family,
        )
        populate_devel(devel, artifacts, runtime, member_order=member_order, compress=compress_devel)
        out_dir.mkdir(parents=True, exist_ok=True)
        wheels["rocm-sdk-devel" + (f"[{family}]" if family else "")] = write_wheel(devel, version, out_dir)

    def build_meta(family: str | None, libraries_dist: str, out_dir: Path) -> None:
        meta = Package(
            "rocm",
            "rocm_sdk",
            None,
            work_dir / ("rocm" + (f"-{family}" if family else "")),
            requires=[f"rocm-sdk-core=={version}"],
            entry_points="[console_scripts]\nrocm-sdk = rocm_sdk.__main__:main\n",
        )
        shutil.copytree(TEMPLATE_DIR / "rocm_sdk", meta.pure_dir, ignore=shutil.ignore_patterns("__pycache__"))
        (meta.pure_dir / "_dist_info.py").write_text(
            dist_info_source(
                version,
                nonce,
                families,
                kpack_split=not legacy_flow,
                logical_name="meta",
                target_family=family,
                restrict=family is not None,
            )
        )
        # The rocm setup.py's extras (EXTRAS_REQUIRE + build_per_target_extras), resolved statically into a wheel.
        meta.extras = {"libraries": [f"{libraries_dist}=={version}"], "devel": [f"rocm-sdk-devel=={version}"]}
        if not legacy_flow:
            # "device": the family rocm's setup.py detects when the sdist is built (offload-arch, or
            # ROCM_SDK_TARGET_FAMILY); on a GPU-less host that is DEFAULT_TARGET_FAMILY, the first sorted target.
            meta.extras["device"] = [f"rocm-sdk-device-{sorted(arches)[0]}=={version}"]
            meta.extras.update({f"device-{arch}": [f"rocm-sdk-device-{arch}=={version}"] for arch in arches})
            meta.extras["device-all"] = [f"rocm-sdk-device-{arch}=={version}" for arch in arches]
        out_dir.mkdir(parents=True, exist_ok=True)
        wheels["rocm" + (f"[{family}]" if family else "")] = write_wheel(meta, version, out_dir)

    neutral: list[Package] = []
    if not legacy_flow:
        libraries = stage(
            Package(
                "rocm-sdk-libraries",
                "rocm_sdk_libraries",
                libraries_platform,
                work_dir / "rocm-sdk-libraries",
                rpath_relpaths=LIBRARIES_RPATHS,
                core_platform_name=core_platform,
                requires=[f"rocm-sdk-core=={version}"],
            ),
            "libraries",
        )
        populate_runtime(libraries, select(LIBRARIES_ARTIFACTS))
        wheels["rocm-sdk-libraries"] = write_wheel(libraries, version, index_dir)
        neutral.append(libraries)
        for arch in arches:
            # The device wheel's only package is the libraries platform package (templates/rocm-sdk-device/
            # setup.py), so its RECORD also lists _rocm_sdk_libraries/__init__.py.
            device = Package(
                f"rocm-sdk-device-{arch}",
                "",
                libraries_platform,
                work_dir / f"rocm-sdk-device-{arch}",
                target_family=arch,
                rpath_relpaths=DEVICE_RPATHS,
                core_platform_name=core_platform,
                requires=[f"rocm-sdk-libraries=={version}"],
            )
            populate_device(device, select(LIBRARIES_ARTIFACTS, arch), version, libraries_platform)
            wheels[device.dist_name] = write_wheel(device, version, index_dir)
    per_family: dict[str, Package] = {}
    for family in legacy_families:
        # templates/rocm-sdk-libraries/setup.py: the pure package is rocm_sdk_libraries_<THIS_TARGET_FAMILY>,
        # the family spelled verbatim; the platform dir is get_py_package_name ('-' -> '_').
        legacy = stage(
            Package(
                f"rocm-sdk-libraries-{family}",
                f"rocm_sdk_libraries_{family}",
                f"_rocm_sdk_libraries_{family.replace('-', '_')}{nonce}",
                work_dir / f"rocm-sdk-libraries-{family}",
                target_family=family,
                rpath_relpaths=LIBRARIES_RPATHS,
                core_platform_name=core_platform,
                requires=[f"rocm-sdk-core=={version}"],
            ),
            "libraries",
            family,
        )
        embedded = [a for arch in LEGACY_FAMILY_ARCHES[family] for a in select(LIBRARIES_ARTIFACTS, arch)]
        populate_runtime(legacy, select(LIBRARIES_ARTIFACTS) + embedded)
        wheels[legacy.dist_name] = write_wheel(legacy, version, index_dir)
        per_family[family] = legacy

    if legacy_flow:
        # _run_legacy: a devel and a meta per family, in dist/<family>/ (the same wheel names). The devel finds
        # materialised files in core and its own family's tree only (py_packaging.py _find_populated skips a
        # package of another family) and takes its family's device artifacts too.
        for family in legacy_families:
            out_dir = index_dir / family
            build_devel([core, per_family[family]], devel_artifacts(LEGACY_FAMILY_ARCHES[family]), family, out_dir)
            build_meta(family, f"rocm-sdk-libraries-{family}", out_dir)
    else:
        build_devel([core, *neutral], devel_artifacts(), None, index_dir)
        build_meta(None, "rocm-sdk-libraries", index_dir)
    return BuiltIndex(index_dir, version, nonce, arches, legacy_families, wheels, flow)
