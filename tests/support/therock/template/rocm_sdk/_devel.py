"""Expansion of rocm-sdk-devel, reproducing TheRock rocm_sdk/_devel.py's observable behaviour.

- ``rocm_sdk_devel/_devel.tar[.xz]`` is extracted into site-packages under ``fcntl.lockf`` on the devel RECORD;
  every extracted member is appended to RECORD as ``path,,``; a parent dir is rmtree'd on first touch.
- A member symlink whose target is already an extracted *file* becomes a hardlink to it (``os.link`` follows
  symlinks); the seven ``bin/amd*`` LLVM wrappers stay symlinks; any other symlink (a directory, or a target not
  extracted yet because of member order) is extracted as a symlink.
- The tarball is unlinked last: done = ``_rocm_sdk_devel/__init__.py`` exists and the tarball is gone.
- Every call reconciles device links (``.devel_links/*.json`` of version-matching ``rocm-sdk-device-*``
  wheels): hardlink ``_rocm_sdk_libraries/<relpath>`` to ``_rocm_sdk_devel/<relpath>`` unless it already is the
  same inode and not a symlink, record it in the device wheel's RECORD, under ``.devel_reconcile.lock``.
"""

from __future__ import annotations

import fcntl
import importlib
import importlib.metadata as md
import json
import os
import re
import shutil
import sys
import tarfile
from pathlib import Path

from . import _dist_info as di

# Kept as symlinks on Linux: the LLVM wrapper entry points in the devel bin/ (TheRock PR 6073).
PRESERVED_SYMLINKS = ("amdclang", "amdclang++", "amdclang-cl", "amdclang-cpp", "amdflang", "amdlld", "amdllvm")


def get_devel_root() -> Path:
    try:
        import rocm_sdk_devel
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError("rocm_sdk_devel is not installed: install rocm[devel]") from error
    pure_path = Path(rocm_sdk_devel.__file__).parent
    site_lib_path = pure_path.parent
    devel_path = site_lib_path / di.ALL_PACKAGES["devel"].get_py_package_name()
    tarball, _ = _find_tarfile(pure_path)
    if not ((devel_path / "__init__.py").exists() and tarball is None):
        _expand_devel_contents(pure_path, site_lib_path)
        if not (devel_path / "__init__.py").exists():
            raise ImportError(f"Expanding {devel_path.name} did not produce a valid Python package")
    _reconcile_device_links(site_lib_path, devel_path, di.__version__)
    return devel_path


def _find_tarfile(pure_path: Path) -> tuple[Path | None, str]:
    for name, mode in (("_devel.tar.xz", "r:xz"), ("_devel.tar", "r")):
        if (pure_path / name).exists():
            return pure_path / name, mode
    return None, ""


def _devel_record() -> tuple[Path, set[str]]:
    for dist_name in dict.fromkeys(md.packages_distributions().get("rocm_sdk_devel", [])):
        files = md.files(dist_name) or []
        for file in files:
            if file.name == "RECORD" and file.parent.name.endswith(".dist-info"):
                return Path(file.locate()), {str(f) for f in files}
    raise ImportError("No distribution RECORD found for rocm_sdk_devel")


def _expand_devel_contents(pure_path: Path, site_lib_path: Path) -> None:
    record_path, recorded = _devel_record()
    tarball, mode = _find_tarfile(pure_path)
    if tarball is None:
        raise ImportError(f"Expected to find _devel.tar or _devel.tar.xz in {pure_path}")
    cleaned: set[Path] = set()

    def clean(directory: Path) -> None:
        # Upstream: recover a half-removed tree (dangling symlinks pip left behind) on first touch.
        cleaned.add(directory)
        if directory.exists():
            shutil.rmtree(directory)

    with open(record_path, "a") as record:
        fcntl.lockf(record, fcntl.LOCK_EX)
        try:
            with tarfile.open(tarball, mode) as archive:
                while member := archive.next():
                    dest = site_lib_path / member.name
                    if member.isdir():
                        if dest not in cleaned:
                            clean(dest)
                        archive.extract(member, path=site_lib_path)
                        continue
                    if not (member.isfile() or member.issym()):
                        continue
                    if dest.parent not in cleaned:
                        clean(dest.parent)
                    if member.name not in recorded:
                        record.write(f"{member.name},,\n")
                    if not member.issym():
                        archive.extract(member, path=site_lib_path)
                        continue
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    target = _link_target(dest.parent, member.linkname)
                    in_devel_bin = dest.parent.name == "bin" and dest.parent.parent.name.startswith("_rocm_sdk_devel")
                    if in_devel_bin and dest.name in PRESERVED_SYMLINKS:
                        dest.symlink_to(member.linkname)
                    elif target.is_file():
                        dest.hardlink_to(target)
                    else:
                        # A directory symlink, or an alias whose target comes later in the tarball.
                        archive.extract(member, path=site_lib_path)
            tarball.unlink()
        finally:
            fcntl.lockf(record, fcntl.LOCK_UN)


def _without_post_release(version: str) -> str:
    return re.sub(r"\.post\d+", "", version, count=1)


def _link_target(parent: Path, target: str) -> Path:
    """The file a relative link target names: the parent's real path joined with it, its '..' collapsed
    (TheRock 29d0b362c, "fixes #7537", PR 7541, not yet on main at 89553ce, which joins ``dest.parent / target``:
    Windows applies MAX_PATH before collapsing). On Linux both name what the kernel reaches by walking
    ``parent/target``, since the real parent has no symlink a '..' could skip."""
    return Path(os.path.normpath(os.path.join(os.path.realpath(parent), target)))


def _devel_link_ok(dest: Path, target: str) -> bool:
    """Only a hardlink (same inode, not a symlink) counts: a symlink is replaced by a hardlink."""
    if dest.is_symlink() or not dest.is_file():
        return False
    try:
        return dest.samefile(_link_target(dest.parent, target))
    except OSError:
        return False


def _device_link_plans(site_lib_path: Path, version: str) -> list[tuple[Path, list[dict[str, str]]]]:
    importlib.invalidate_caches()
    plans = []
    for dist in md.distributions(path=[str(site_lib_path)]):
        name = dist.metadata["Name"] or ""
        if not name.startswith("rocm-sdk-device"):
            continue
        if _without_post_release(dist.version) != _without_post_release(version):
            print(f"WARNING: skipping {name} {dist.version}: does not match rocm-sdk {version}", file=sys.stderr)
            continue
        record = manifest = None
        for file in dist.files or []:
            if file.name == "RECORD" and file.parent.name.endswith(".dist-info"):
                record = Path(file.locate())
            elif file.suffix == ".json" and file.parent.name == ".devel_links":
                manifest = Path(file.locate())
        if record is None or manifest is None or not manifest.is_file():
            continue
        links = json.loads(manifest.read_text()).get("links", [])
        if links:
            plans.append((record, links))
    return plans


def _record_names(record_path: Path) -> list[str]:
    return [line.split(",", 1)[0] for line in record_path.read_text().splitlines() if line.strip()]


def _ensure_record_entries(record_path: Path, names: list[str]) -> None:
    lines, seen = [], set()
    for line in record_path.read_text().splitlines():
        first = line.split(",", 1)[0]
        if line.strip() and first not in seen:
            seen.add(first)
            lines.append(line)
    additions = [f"{name},," for name in names if name not in seen]
    if additions or len(lines) != len(_record_names(record_path)):
        record_path.write_text("\n".join(lines + additions) + "\n")


def _reconcile_device_links(site_lib_path: Path, devel_path: Path, version: str) -> int:
    plans = _device_link_plans(site_lib_path, version)
    if not plans:
        return 0

    def record_name(relpath: str) -> str:
        return (devel_path / relpath).relative_to(site_lib_path).as_posix()

    all_linked = all(_devel_link_ok(devel_path / link["relpath"], link["target"]) for _, ls in plans for link in ls)
    all_recorded = all(
        len(set(names := _record_names(record))) == len(names) and {record_name(x["relpath"]) for x in ls} <= set(names)
        for record, ls in plans
    )
    if all_linked and all_recorded:
        return 0
    created = 0
    with open(devel_path / ".devel_reconcile.lock", "a") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX)
        try:
            for record, links in plans:
                for link in links:
                    dest = devel_path / link["relpath"]
                    if _devel_link_ok(dest, link["target"]):
                        continue
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    target = _link_target(dest.parent, link["target"])
                    if not target.is_file():
                        continue
                    if dest.exists() or dest.is_symlink():
                        dest.unlink()
                    dest.hardlink_to(target)
                    created += 1
                _ensure_record_entries(record, [record_name(link["relpath"]) for link in links])
        finally:
            fcntl.lockf(lock, fcntl.LOCK_UN)
    return created
