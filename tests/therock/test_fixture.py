"""The TheRock fixture is faithful: a fresh install passes `rocm-sdk test`; each split breaks what it should."""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import msgpack
import pytest

from support.therock import SPLIT_KINDS, TheRockInstall, build_therock_install, cached_index

pytestmark = pytest.mark.toolchain  # venvs made and installed by pip from a local index


@pytest.fixture()
def install(tmp_path: Path) -> TheRockInstall:
    return build_therock_install(tmp_path, init=True)


def _section(path: Path, name: str) -> bytes:
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as handle:
        section = ELFFile(handle).get_section_by_name(name)
        assert section is not None, f"{path} has no {name}"
        return b"" if section["sh_type"] == "SHT_NOBITS" else section.data()


def test_fresh_install_passes_rocm_sdk_test(install: TheRockInstall) -> None:
    result = install.run_rocm_sdk("test")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "testLibrariesMirroredIntoDevel" in result.stdout + result.stderr
    assert install.run_rocm_sdk("targets").stdout.strip() == "gfx90a;gfx942"
    clean = install.preload_after_devel_hip()
    assert clean.returncode == 0 and "loaded" in clean.stdout, clean.stderr


def test_devel_aliases_are_one_inode_and_member_order_decides_symlinks(install: TheRockInstall) -> None:
    core_comgr = install.core / "lib/libamd_comgr.so.3"
    names = ("libamd_comgr.so", "libamd_comgr.so.3", "libamd_comgr.so.3.0.0")
    inodes = {os.stat(install.devel / "lib" / name).st_ino for name in names}
    assert inodes == {core_comgr.stat().st_ino}
    # Sorted members: `libamd_comgr.so` comes before its target and stays a symlink; the others are hardlinks.
    assert (install.devel / "lib/libamd_comgr.so").is_symlink()
    assert not (install.devel / "lib/libamd_comgr.so.3.0.0").is_symlink()
    assert core_comgr.stat().st_nlink == 3
    # Runtime wheels hold only the SONAME file.
    assert sorted(p.name for p in (install.core / "lib").glob("libamd_comgr*")) == ["libamd_comgr.so.3"]
    assert not any(p.is_symlink() for p in install.core.rglob("*"))
    # The seven LLVM wrappers stay symlinks; the tarball is gone; devel RECORD rows are `path,,`.
    assert all((install.devel / "bin" / w).is_symlink() for w in ("amdclang", "amdclang++", "amdllvm"))
    assert (install.devel / "llvm").is_symlink() and (install.devel / "llvm/bin/clang++").is_file()
    assert not list((install.site_packages / "rocm_sdk_devel").glob("_devel.tar*"))
    record = next(install.site_packages.glob("rocm_sdk_devel-*.dist-info")).joinpath("RECORD").read_text()
    assert "_rocm_sdk_devel/lib/libamd_comgr.so.3,," in record.splitlines()


def test_reverse_member_order_keeps_the_other_alias_a_symlink(tmp_path: Path) -> None:
    install = build_therock_install(tmp_path, member_order="reverse", init=True)
    assert (install.devel / "lib/libamd_comgr.so.3.0.0").is_symlink()
    assert not (install.devel / "lib/libamd_comgr.so").is_symlink()
    assert (install.core / "lib/libamd_comgr.so.3").stat().st_nlink == 3


def test_wheels_are_real_and_hold_no_symlinks() -> None:
    index = cached_index()
    for name, wheel in index.wheels.items():
        with zipfile.ZipFile(wheel) as archive:
            records = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
            rows = archive.read(records).decode().splitlines()
            for member in archive.infolist():
                assert (member.external_attr >> 16) & 0o170000 in (0, 0o100000), f"{name}: {member.filename}"
            assert all(",sha256=" in row for row in rows if not row.endswith("RECORD,,")), name


def test_rpaths_kpack_split_and_dist_info(install: TheRockInstall) -> None:
    rocblas = install.libraries / "lib/librocblas.so.5"
    dynamic = subprocess.run(["readelf", "-dW", str(rocblas)], capture_output=True, text=True, check=True).stdout
    assert "(RPATH)" in dynamic and "(RUNPATH)" not in dynamic
    assert "$ORIGIN/../../_rocm_sdk_core/lib:" in dynamic
    assert _section(rocblas, ".hipFatBinSegment")[:4] == b"HIPK"
    assert _section(rocblas, ".hip_fatbin") == b""
    ref = msgpack.unpackb(_section(rocblas, ".rocm_kpack_ref"))
    assert ref == {"kpack_search_paths": ["../.kpack/blas_lib.kpm"], "kernel_name": "blas_lib"}
    kpack = (install.libraries / ".kpack/blas_lib_gfx942.kpack").read_bytes()
    toc = msgpack.unpackb(kpack[int.from_bytes(kpack[8:16], "little") :])
    assert list(toc["toc"]) == ["math-libs/BLAS/rocBLAS/stage/lib/librocblas.so.5.0.0"]
    links = json.loads((install.libraries / ".devel_links/gfx90a.json").read_text())
    assert {
        "relpath": ".kpack/blas_lib_gfx90a.kpack",
        "target": "../../_rocm_sdk_libraries/.kpack/blas_lib_gfx90a.kpack",
    } in links["links"]
    record = next(install.site_packages.glob("rocm_sdk_device_gfx942-*.dist-info")).joinpath("RECORD").read_text()
    assert "_rocm_sdk_libraries/__init__.py," in record
    assert "_rocm_sdk_devel/.kpack/blas_lib_gfx942.kpack,," in record.splitlines()


def test_reconcile_rehardlinks_a_symlinked_device_file(install: TheRockInstall) -> None:
    relpath = "lib/rocblas/library/TensileLibrary_gfx942.co"
    devel_file = install.devel / relpath
    devel_file.unlink()
    devel_file.symlink_to(os.path.relpath(install.libraries / relpath, devel_file.parent))
    assert install.run_rocm_sdk("path", "--root").returncode == 0
    assert not devel_file.is_symlink()
    assert devel_file.samefile(install.libraries / relpath)


# What each split breaks: (testLibrariesMirroredIntoDevel fails, devel-hip-then-preload aborts).
SPLIT_EFFECTS = {
    "cp-r": (True, True),
    "devel-copy": (True, True),
    "per-tree": (True, True),
    "tar-hard-dereference": (True, True),
    "reinstall-core": (False, True),
    "reinstall-libraries": (True, False),
}


@pytest.mark.parametrize("kind", SPLIT_KINDS)
def test_split_breaks_mirroring_and_loads(install: TheRockInstall, kind: str) -> None:
    mirrored_fails, aborts = SPLIT_EFFECTS[kind]
    install.split(kind)
    result = install.run_rocm_sdk("test")
    output = result.stdout + result.stderr
    assert (
        "testLibrariesMirroredIntoDevel" in output and "FAIL: testLibrariesMirroredIntoDevel" in output
    ) == mirrored_fails, output
    if mirrored_fails:
        assert "not hardlinked" in output and ".kpack/blas_lib.kpm" in output
    load = install.preload_after_devel_hip()
    if aborts:
        assert load.returncode == -6, load.stdout + load.stderr
        assert "Option 'spirv-expand-step' registered more than once!" in load.stderr
        assert "inconsistency in registered CommandLine options" in load.stderr
    else:
        assert load.returncode == 0, load.stderr


def test_nonce_renames_every_tree(tmp_path: Path) -> None:
    install = build_therock_install(tmp_path, nonce="_r7130", init=True)
    names = sorted(p.name for p in install.site_packages.glob("_rocm_sdk_*"))
    assert names == ["_rocm_sdk_core_r7130", "_rocm_sdk_devel_r7130", "_rocm_sdk_libraries_r7130"]
    assert install.run_rocm_sdk("targets").stdout.strip() == "gfx90a;gfx942"
    dynamic = subprocess.run(
        ["readelf", "-dW", str(install.libraries / "lib/libhipblas.so.3")], capture_output=True, text=True, check=True
    ).stdout
    assert "_rocm_sdk_core_r7130/lib" in dynamic
    result = install.run_rocm_sdk("test")
    assert result.returncode == 0, result.stdout + result.stderr


def test_legacy_families_co_install_with_identical_host_libraries(tmp_path: Path) -> None:
    install = build_therock_install(tmp_path, legacy_families=("gfx94X-dcgpu", "gfx90X-dcgpu"), extras=("devel",))
    first = install.site_packages / "_rocm_sdk_libraries_gfx94X_dcgpu/lib/libhipblas.so.3"
    second = install.site_packages / "_rocm_sdk_libraries_gfx90X_dcgpu/lib/libhipblas.so.3"
    assert first.read_bytes() == second.read_bytes() and not first.samefile(second)
    assert (first.parent / "libMIOpenCKGroupedConv_gfx942.so").is_file()
    assert (second.parent / "libMIOpenCKGroupedConv_gfx90a.so").is_file()
    for family in ("gfx94X_dcgpu", "gfx90X_dcgpu"):
        record = next(install.site_packages.glob(f"rocm_sdk_libraries_{family}-*.dist-info")) / "RECORD"
        assert f"_rocm_sdk_libraries_{family}/lib/libhipblas.so.3,sha256=" in record.read_text()


def test_the_legacy_flow_builds_a_devel_and_a_meta_per_family_linked_into_its_own_family() -> None:
    """build_python_packages.py ``_run_legacy``: per family a devel and a meta in ``dist/<family>/``; the
    devel's tarball links to core and its own family's tree only (py_packaging.py ``_find_populated``
    skips another family's package), takes the family's device artifacts, and its ``_dist_info.py``
    names the family; the meta is restricted to it (``restrict_families``); there are no device wheels."""
    import tarfile

    index = cached_index(kpack=False, flow="legacy", legacy_families=("gfx94X-dcgpu", "gfx90X-dcgpu"))
    assert not [name for name in index.wheels if name.startswith("rocm-sdk-device-")]
    for family, other in (("gfx94X-dcgpu", "gfx90X_dcgpu"), ("gfx90X-dcgpu", "gfx94X_dcgpu")):
        devel = index.wheels[f"rocm-sdk-devel[{family}]"]
        assert devel.parent == index.index_dir / family
        with zipfile.ZipFile(devel) as archive:
            dist_info = archive.read("rocm_sdk_devel/_dist_info.py").decode()
            with archive.open("rocm_sdk_devel/_devel.tar") as member, tarfile.open(fileobj=member) as tar:
                links = {m.name: m.linkname for m in tar if m.issym()}
        assert f"THIS_TARGET_FAMILY = {family!r}" in dist_info.splitlines()
        into_runtime = {name: target for name, target in links.items() if "/_rocm_sdk_" in f"/{target}"}
        own = f"_rocm_sdk_libraries_{family.replace('-', '_')}/"
        assert any(own in target for target in into_runtime.values())
        assert not [target for target in into_runtime.values() if other in target]
        arch = "gfx942" if family.startswith("gfx94") else "gfx90a"
        assert f"_rocm_sdk_devel/lib/libMIOpenCKGroupedConv_{arch}.so" in into_runtime
        with zipfile.ZipFile(index.wheels[f"rocm[{family}]"]) as archive:
            meta = archive.read("rocm_sdk/_dist_info.py").decode().splitlines()
            requires = archive.read("rocm-7.13.0.dist-info/METADATA").decode()
        assert [line for line in meta if line.startswith("AVAILABLE_TARGET_FAMILIES.append")] == [
            f"AVAILABLE_TARGET_FAMILIES.append({family!r})"
        ]
        assert f'Requires-Dist: rocm-sdk-libraries-{family}==7.13.0; extra == "libraries"' in requires


def test_the_device_extra_is_the_default_family_on_a_gpu_less_host(tmp_path: Path) -> None:
    """``rocm[libraries,device]`` as TheRock's real sdist resolves it without a GPU: the first sorted target."""
    install = build_therock_install(tmp_path, extras=("libraries", "device"))
    device = sorted(p.name for p in install.site_packages.glob("rocm_sdk_device_*.dist-info"))
    assert device == ["rocm_sdk_device_gfx90a-7.13.0.dist-info"]
