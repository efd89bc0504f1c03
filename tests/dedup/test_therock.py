"""`rocm-audit dedup` on a TheRock-faithful install (tests/support/therock): one run fixes every real
split, `rocm-sdk init/path/test` keep it fixed, a fresh install passes the gate, and ownership from
RECORD decides what may become a link. Real effects decide: the fixture's real LLVM-15 abort and
the fixture's `python -m rocm_sdk test` (TheRock's own tests, testLibrariesMirroredIntoDevel included)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.sdk_tree import build_library
from support.therock import SPLIT_KINDS, TheRockInstall, build_therock_install
from support.therock.packaging import record_hash

pytestmark = pytest.mark.toolchain  # venvs made and installed by pip from a local index


def audit(*args: str) -> tuple[int, dict]:
    done = subprocess.run(
        [sys.executable, "-m", "rocm_audit", *args, "--format", "json"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def rules(report: dict) -> set[str]:
    return {f["rule"] for f in report["findings"]}


def same_bytes_distinct_inodes(install: TheRockInstall) -> list[str]:
    """Devel files on an inode of their own while a runtime tree holds the same bytes: what one
    dedup run must leave none of (copies between two runtime files are reported, never linked)."""
    by_content: dict[bytes, set[tuple[int, int]]] = {}
    paths: dict[tuple[int, int], list[str]] = {}
    for tree in sorted(install.site_packages.glob("_rocm_sdk_*")):
        for path in sorted(tree.rglob("*")):
            if path.is_symlink() or not path.is_file() or "__pycache__" in path.parts or path.name == "__init__.py":
                continue
            if path.name == ".devel_reconcile.lock" or ".devel_links" in path.parts:
                continue
            st = path.stat()
            key = (st.st_dev, st.st_ino)
            paths.setdefault(key, []).append(str(path))
            by_content.setdefault(path.read_bytes(), set()).add(key)
    split = []
    for inodes in by_content.values():
        runtime = [i for i in inodes if any("_rocm_sdk_devel" not in p for p in paths[i])]
        if runtime:
            split += sorted(p for i in inodes if i not in runtime for p in paths[i])
    return split


def assert_converged(install: TheRockInstall) -> None:
    sp = str(install.site_packages)
    code, report = audit("dedup", "--check", "-p", sp)
    assert code == 0, [(f["rule"], f["path"]) for f in report["findings"]]
    code, report = audit("check", "-p", sp)
    assert not rules(report) & {"DUP001", "DUP002", "DUP011", "LLVM001"}, report["findings"]
    code, report = audit("llvm", "-p", sp)
    assert "LLVM001" not in rules(report)
    tested = install.run_rocm_sdk("test")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "testLibrariesMirroredIntoDevel" in tested.stdout + tested.stderr
    load = install.preload_after_devel_hip()
    assert load.returncode == 0 and "loaded" in load.stdout, load.stderr


@pytest.fixture()
def install(tmp_path: Path) -> TheRockInstall:
    return build_therock_install(tmp_path, init=True)


def test_a_fresh_install_passes_the_gate_and_dedup_hardens_only_what_rocm_sdk_leaves_alone(install):
    """Intact hardlinks are one library for the loader: --check passes (DUP013, info). A plain run
    makes the library aliases symlinks (they survive a per-tree copy) and leaves what TheRock's
    reconcile re-hardlinks on every init/path/test (device files) and the mirrored data files."""
    sp = str(install.site_packages)
    code, report = audit("dedup", "--check", "-p", sp)
    assert code == 0, [(f["rule"], f["path"]) for f in report["findings"]]
    assert "DUP013" in rules(report) and not rules(report) & {"DUP001", "DUP002", "DUP011"}
    hardened = {d["path"] for g in report["dedup"]["groups"] for d in g["duplicates"] if d["intact"]}
    assert str(install.devel / "lib/libamd_comgr.so.3.0.0") in hardened
    left = {p for entry in report["dedup"]["intact_links"] for p in entry["paths"]}
    assert {
        str(install.devel / ".kpack/blas_lib.kpm"),
        str(install.devel / "lib/libMIOpenCKGroupedConv_gfx942.so"),
    } <= left
    before = {p: os.lstat(p).st_ino for p in left}
    code, report = audit("dedup", "-p", sp)
    assert code == 0 and report["dedup"]["replaced"] == len(hardened)
    assert {p: os.lstat(p).st_ino for p in left} == before
    assert (install.devel / "lib/libamd_comgr.so.3.0.0").is_symlink()
    assert_converged(install)
    for args in (("init",), ("path", "--root"), ("test",)):
        assert install.run_rocm_sdk(*args).returncode == 0
    assert (install.devel / "lib/libamd_comgr.so.3.0.0").is_symlink()
    code, report = audit("dedup", "--check", "-p", sp)
    assert code == 0 and report["dedup"]["groups"] == []


# The devel tree copied (TheRock issue 7818's split) in the default suite; the rest in CI (long).
QUICK_SPLITS = ("devel-copy",)


@pytest.mark.parametrize(
    "kind", [pytest.param(kind, marks=() if kind in QUICK_SPLITS else pytest.mark.long) for kind in SPLIT_KINDS]
)
def test_one_run_fixes_every_split_and_rocm_sdk_keeps_it_fixed(install, kind):
    install.split(kind)
    sp = str(install.site_packages)
    assert same_bytes_distinct_inodes(install)
    # Before: every command says the tree is split (they agree).
    check_code, checked = audit("dedup", "--check", "-p", sp)
    dry_code, dry = audit("dedup", "--dry-run", "-p", sp)
    _, whole = audit("check", "-p", sp)
    assert check_code == 1 and dry_code == 0
    assert rules(dry) & {"DUP001", "DUP011"} and rules(dry) & {"DUP001", "DUP011"} == rules(checked) & {
        "DUP001",
        "DUP011",
    }
    assert {(f["rule"], f["path"]) for f in whole["findings"] if f["rule"] in ("DUP001", "DUP011")} == {
        (f["rule"], f["path"]) for f in checked["findings"] if f["rule"] in ("DUP001", "DUP011")
    }
    if install.preload_after_devel_hip().returncode == -6:  # the real abort: the gate and llvm say so
        assert "DUP001" in rules(checked)
        assert rules(audit("llvm", "-p", sp)[1]) & {"LLVM001", "LLVM012", "LLVM013"}
    # One run.
    code, applied = audit("dedup", "-p", sp)
    assert code == 0 and applied["dedup"]["verified"] is True, applied["findings"]
    assert same_bytes_distinct_inodes(install) == []
    assert_converged(install)
    # TheRock's own commands after dedup: they change nothing that matters, and the gate still passes.
    for args in (("init",), ("path", "--root"), ("test",)):
        result = install.run_rocm_sdk(*args)
        assert result.returncode == 0, result.stdout + result.stderr
    assert_converged(install)
    # Mirrored data files and executables are hardlinks again, never symlinks.
    for relpath in (".kpack/blas_lib.kpm", "lib/rocblas/library/TensileLibrary_lazy_fallback.dat"):
        devel_file = install.devel / relpath
        assert not devel_file.is_symlink() and devel_file.samefile(install.libraries / relpath)
    clang = install.devel / "lib/llvm/bin/clang"
    assert not clang.is_symlink() and clang.samefile(install.core / "lib/llvm/bin/clang")
    # The revert manifest takes the tree back to the split it found.
    reverted = subprocess.run(
        [sys.executable, "-m", "rocm_audit", "dedup", "--revert", applied["dedup"]["manifest"], "--format", "json"],
        capture_output=True,
        text=True,
    )
    assert reverted.returncode == 0, reverted.stdout + reverted.stderr
    assert same_bytes_distinct_inodes(install)


def test_llvm_agrees_with_the_real_abort_of_a_split_install(install):
    install.split("cp-r")
    load = install.preload_after_devel_hip()
    assert load.returncode == -6 and "registered more than once" in load.stderr
    found = audit("llvm", "-p", str(install.site_packages))[1]
    assert rules(found) & {"LLVM001", "LLVM012", "LLVM013"}, sorted(rules(found))


def test_llvm_on_the_devel_tree_alone_names_the_keeper_dedup_keeps(install):
    install.split("cp-r")
    found = audit("llvm", "-p", str(install.devel))[1]
    fixes = [c["fix"] for c in found["clashes"] if c["soname"] == "libamd_comgr.so.3"]
    assert fixes and all(f"keeps {install.core / 'lib/libamd_comgr.so.3'}," in fix for fix in fixes), fixes
    planned = audit("dedup", "--dry-run", "-p", str(install.devel))[1]["dedup"]["groups"]
    assert str(install.core / "lib/libamd_comgr.so.3") in {g["keeper"] for g in planned}


def test_copies_two_runtime_packages_own_are_reported_and_never_linked(tmp_path):
    install = build_therock_install(tmp_path, legacy_families=("gfx94X-dcgpu", "gfx90X-dcgpu"), extras=("devel",))
    first = install.site_packages / "_rocm_sdk_libraries_gfx94X_dcgpu/lib/libhipblas.so.3"
    second = install.site_packages / "_rocm_sdk_libraries_gfx90X_dcgpu/lib/libhipblas.so.3"
    sp = str(install.site_packages)
    code, report = audit("dedup", "-p", sp)
    assert code == 0
    assert any(
        f["rule"] == "DUP010" and {str(first), str(second)} <= {f["path"], *f["related_paths"]}
        for f in report["findings"]
    )
    assert not first.is_symlink() and not second.is_symlink() and not first.samefile(second)
    code, report = audit("dedup", "--check", "-p", sp)
    assert code == 0 and "DUP010" in rules(report)
    install.pip("uninstall", "-y", "rocm-sdk-libraries-gfx94X-dcgpu")
    dangling = [p for p in install.site_packages.rglob("*") if p.is_symlink() and not p.exists()]
    assert dangling == [] and second.is_file()


def _legacy_family_site(site: Path, *, devel_copy: str, devel_family: str | None = None) -> dict[str, Path]:
    """What TheRock's legacy flow leaves after ``rocm-sdk init`` with two family wheels installed:
    each ``rocm-sdk-libraries-<family>`` owns its copy (hashed RECORD rows), and the one
    ``rocm-sdk-devel`` (built per family by build_python_packages.py ``_run_legacy``, linked into
    that family's tree only) expanded its file as a hardlink of gfx94X's copy (``devel_copy`` =
    "hardlink") or, after a copy that broke the link, as a file of its own ("copy"). ``devel_family``:
    the ``THIS_TARGET_FAMILY`` its ``rocm_sdk_devel/_dist_info.py`` names (none: no such module)."""
    import shutil

    built = build_library(site.parent / "build", "x", "libx.so.1")
    data = built.read_bytes()
    paths = {}
    for dist, tree, hashed in (
        ("rocm_sdk_libraries_gfx90X_dcgpu", "_rocm_sdk_libraries_gfx90X_dcgpu", True),
        ("rocm_sdk_libraries_gfx94X_dcgpu", "_rocm_sdk_libraries_gfx94X_dcgpu", True),
        ("rocm_sdk_devel", "_rocm_sdk_devel", False),
    ):
        library = site / tree / "lib/libx.so.1"
        library.parent.mkdir(parents=True)
        (site / tree / "__init__.py").touch()
        if not hashed and devel_copy == "hardlink":
            os.link(paths["_rocm_sdk_libraries_gfx94X_dcgpu"], library)
        else:
            shutil.copy2(built, library)
        paths[tree] = library
        info = site / f"{dist}-7.13.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: 7.13.0\n")
        row = f"{record_hash(data)},{len(data)}" if hashed else ","
        module_row = ""
        if not hashed and devel_family is not None:
            module = site / "rocm_sdk_devel" / "_dist_info.py"
            module.parent.mkdir()
            module.write_text(f"THIS_TARGET_FAMILY = {devel_family!r}\n")
            module_row = f"rocm_sdk_devel/_dist_info.py,{record_hash(module.read_bytes())},{module.stat().st_size}\n"
        (info / "RECORD").write_text(
            f"{tree}/__init__.py,,\n{tree}/lib/libx.so.1,{row}\n{module_row}{dist}-7.13.0.dist-info/RECORD,,\n"
        )
    return paths


def test_a_legacy_family_devel_stays_with_its_own_familys_copy(tmp_path):
    """Two legacy family wheels and the devel of one of them: devel's file shares gfx94X's inode,
    so dedup leaves it there (as rocm-sdk made it) and never points it at gfx90X's copy, which
    would split the very library the runtime loads for gfx94X from devel's. A devel copy on its own
    inode could come from either family: it is reported and left alone, never linked to a guess."""
    site = tmp_path / "site"
    paths = _legacy_family_site(site, devel_copy="hardlink")
    devel, ours = paths["_rocm_sdk_devel"], paths["_rocm_sdk_libraries_gfx94X_dcgpu"]
    code, report = audit("dedup", "-p", str(site))
    assert code == 0, report["findings"]
    assert devel.samefile(ours) and not devel.is_symlink(), "devel was moved off its family's copy"
    assert {"keeper": str(ours), "paths": [str(devel)]} in report["dedup"]["intact_links"]
    assert "DUP001" not in rules(report) and "DUP010" in rules(report)
    # A fix text for devel alone names the same copy dedup leaves it on (tree/ownership.runtime_twin).
    from rocm_audit.tree.ownership import Ownership, runtime_twin

    trees = sorted(str(p.parent.parent) for p in paths.values())
    assert runtime_twin(str(devel), str(devel.parent.parent), Ownership.of_trees(trees)) == str(ours)
    site = tmp_path / "copied"
    paths = _legacy_family_site(site, devel_copy="copy")
    devel = paths["_rocm_sdk_devel"]
    before = os.stat(devel)
    code, report = audit("dedup", "-p", str(site))
    after = os.stat(devel, follow_symlinks=False)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode), "devel was linked to a guessed family"
    undecided = [f for f in report["findings"] if f["rule"] == "DUP010" and f["path"] == str(devel)]
    assert len(undecided) == 1 and "which one it was made from" in undecided[0]["message"], report["findings"]
    trees = sorted(str(p.parent.parent) for p in paths.values())
    assert runtime_twin(str(devel), str(devel.parent.parent), Ownership.of_trees(trees)) is None
    assert set(undecided[0]["related_paths"]) == {
        str(paths["_rocm_sdk_libraries_gfx90X_dcgpu"]),
        str(paths["_rocm_sdk_libraries_gfx94X_dcgpu"]),
    }


def test_a_legacy_devel_copy_goes_to_the_family_its_distribution_names_and_only_if_installed(tmp_path):
    """The devel copy of ``_legacy_family_site`` (own inode, bytes of both families' copies) whose
    ``rocm_sdk_devel/_dist_info.py`` names gfx94X-dcgpu becomes a link to gfx94X's copy; one naming a
    family with no copy installed (gfx950-dcgpu) is left alone, and the finding says why."""
    site = tmp_path / "named"
    paths = _legacy_family_site(site, devel_copy="copy", devel_family="gfx94X-dcgpu")
    devel, ours = paths["_rocm_sdk_devel"], paths["_rocm_sdk_libraries_gfx94X_dcgpu"]
    code, report = audit("dedup", "-p", str(site))
    assert code == 0, report["findings"]
    assert os.readlink(devel) == "../../_rocm_sdk_libraries_gfx94X_dcgpu/lib/libx.so.1"
    assert devel.read_bytes() == ours.read_bytes() and ours.is_file() and not ours.is_symlink()
    assert not [f for f in report["findings"] if f["rule"] == "DUP010" and f["path"] == str(devel)]
    site = tmp_path / "elsewhere"
    paths = _legacy_family_site(site, devel_copy="copy", devel_family="gfx950-dcgpu")
    devel = paths["_rocm_sdk_devel"]
    code, report = audit("dedup", "-p", str(site))
    assert not devel.is_symlink()
    (left,) = [f for f in report["findings"] if f["rule"] == "DUP010" and f["path"] == str(devel)]
    assert "built against rocm_sdk_libraries_gfx950_dcgpu, which installs no copy" in left["message"]
    # The named family's copy holds other bytes (another build): never linked to the family that matches.
    site = tmp_path / "differs"
    paths = _legacy_family_site(site, devel_copy="copy", devel_family="gfx94X-dcgpu")
    devel, ours = paths["_rocm_sdk_devel"], paths["_rocm_sdk_libraries_gfx94X_dcgpu"]
    ours.write_bytes(ours.read_bytes() + b"another build")
    code, report = audit("dedup", "-p", str(site))
    assert code == 0 and not devel.is_symlink()
    (left,) = [f for f in report["findings"] if f["rule"] == "DUP010" and f["path"] == str(devel)]
    assert "built against rocm_sdk_libraries_gfx94x_dcgpu, which installs no copy with these bytes" in left["message"]


def test_each_site_s_devel_follows_the_family_its_own_dist_info_names(tmp_path):
    """Two site directories audited in one run, the same distributions in each, their devels naming
    different families: each devel goes to the family its own site's ``_dist_info.py`` names."""
    first = _legacy_family_site(tmp_path / "one", devel_copy="copy", devel_family="gfx94X-dcgpu")
    second = _legacy_family_site(tmp_path / "two", devel_copy="copy", devel_family="gfx90X-dcgpu")
    code, report = audit("dedup", "-p", str(tmp_path / "one"), "-p", str(tmp_path / "two"))
    assert code == 0, report["findings"]
    assert os.readlink(first["_rocm_sdk_devel"]) == "../../_rocm_sdk_libraries_gfx94X_dcgpu/lib/libx.so.1"
    assert os.readlink(second["_rocm_sdk_devel"]) == "../../_rocm_sdk_libraries_gfx90X_dcgpu/lib/libx.so.1"


_ONE_LIBRARY = """
import ctypes, sys
handles = [ctypes.CDLL(path) for path in sys.argv[1:]]
print(len({ctypes.cast(handle.hipblasGetVersion, ctypes.c_void_p).value for handle in handles}))
"""


def test_a_legacy_family_devel_split_from_its_family_goes_back_to_that_familys_copy(tmp_path):
    """TheRock's legacy flow as packaged (build_python_packages.py ``_run_legacy``): a devel wheel
    per family, linked into that family's tree only and naming it as ``THIS_TARGET_FAMILY`` in its
    ``_dist_info.py``. ``rocm[libraries,devel]`` of gfx94X with gfx90X's libraries beside it, then
    ``cp -r``: devel's libraries are copies again, equal to both families' copies. One dedup run
    links them to gfx94X's (the family the devel names), so a process loading devel's hipblas and
    gfx94X's gets one library again, comgr loads once, and removing gfx90X's wheel dangles nothing."""
    install = build_therock_install(
        tmp_path, kpack=False, flow="legacy", legacy_families=("gfx94X-dcgpu", "gfx90X-dcgpu"), init=True
    )
    sp = str(install.site_packages)
    ours = install.site_packages / "_rocm_sdk_libraries_gfx94X_dcgpu/lib/libhipblas.so.3"
    theirs = install.site_packages / "_rocm_sdk_libraries_gfx90X_dcgpu/lib/libhipblas.so.3"
    devel = install.devel / "lib/libhipblas.so.3"
    assert devel.samefile(ours) and not devel.samefile(theirs), "rocm-sdk init links devel into its own family"
    assert audit("dedup", "--check", "-p", sp)[0] == 0
    probe = [str(install.python), "-c", _ONE_LIBRARY, str(devel), str(ours)]
    install.split("cp-r")
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip() == "2"
    assert install.preload_after_devel_hip().returncode == -6
    from rocm_audit.tree.ownership import Ownership, runtime_twin

    trees = [str(t) for t in install.site_packages.glob("_rocm_sdk_*")]
    assert runtime_twin(str(devel), str(install.devel), Ownership.of_trees(trees)) == str(ours)
    code, report = audit("dedup", "-p", sp)
    assert code == 0, [(f["rule"], f["path"]) for f in report["findings"] if f["severity"] == "error"]
    assert devel.resolve() == ours.resolve() and devel.is_symlink()
    assert (install.devel / "share/miopen/db/gfx942130.kdb").samefile(
        install.site_packages / "_rocm_sdk_libraries_gfx94X_dcgpu/share/miopen/db/gfx942130.kdb"
    )
    assert not [p for p in install.devel.rglob("*") if "gfx90X" in str(p.resolve())]
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip() == "1"
    load = install.preload_after_devel_hip()
    assert load.returncode == 0 and "loaded" in load.stdout, load.stderr
    assert audit("dedup", "--check", "-p", sp)[0] == 0
    tested = install.run_rocm_sdk("test")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    install.pip("uninstall", "-y", "rocm-sdk-libraries-gfx90X-dcgpu")
    assert [p for p in install.site_packages.rglob("*") if p.is_symlink() and not p.exists()] == []
    assert theirs.exists() is False and devel.read_bytes() == ours.read_bytes()


def _profiler_wheel(directory: Path) -> Path:
    """rocm-profiler as TheRock builds it: populate_runtime_files writes libprofiler-hub.so.0 (the
    SONAME file) and ensure_profiler_library_symlinks adds libprofiler-hub.so -> it; setuptools
    follows the symlink into the wheel, which holds two regular files (profiler_test.py accepts
    "a symlink or a plain file")."""
    import zipfile

    data = build_library(directory / "build", "hub", "libprofiler-hub.so.0").read_bytes()
    wheel = directory / "rocm_profiler-7.13.0-py3-none-linux_x86_64.whl"
    info = "rocm_profiler-7.13.0.dist-info"
    members = {
        "_rocm_profiler/__init__.py": b"",
        "_rocm_profiler/lib/libprofiler-hub.so.0": data,
        "_rocm_profiler/lib/libprofiler-hub.so": data,
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: rocm-profiler\nVersion: 7.13.0\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: py3-none-linux_x86_64\n",
    }
    rows = []
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, body in members.items():
            entry = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            entry.external_attr = 0o100755 << 16
            archive.writestr(entry, body)
            rows.append(f"{name},{record_hash(body)},{len(body)}")
        archive.writestr(f"{info}/RECORD", "\n".join(rows + [f"{info}/RECORD,,"]) + "\n")
    return wheel


_BOTH_NAMES_LOADED = """
import ctypes, sys
lib = sys.argv[1]
first, second = ctypes.CDLL(lib + "/libprofiler-hub.so"), ctypes.CDLL(lib + "/libprofiler-hub.so.0")
address = [ctypes.cast(handle.hub_value, ctypes.c_void_p).value for handle in (first, second)]
print(address[0] == address[1])
"""


def test_the_profiler_trees_unversioned_copy_becomes_a_link_to_its_soname_file(tmp_path):
    """The rocm-profiler wheel (``_rocm_profiler``, not ``_rocm_sdk_*``) is a TheRock tree too:
    pip installs its two names as two files, which a dlopen of each loads twice (two states). One
    dedup run makes the unversioned name a relative symlink to the SONAME file, as TheRock meant."""
    site = tmp_path / "site"
    wheel = _profiler_wheel(tmp_path)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
        check=True,
    )
    lib = site / "_rocm_profiler/lib"
    probe = [sys.executable, "-c", _BOTH_NAMES_LOADED, str(lib)]
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip() == "False"
    code, report = audit("dedup", "--check", "-p", str(site))
    assert code == 1 and "DUP001" in rules(report), report["findings"]
    code, report = audit("dedup", "-p", str(site))
    assert code == 0, report["findings"]
    assert os.readlink(lib / "libprofiler-hub.so") == "libprofiler-hub.so.0"
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip() == "True"


def test_the_nonce_ranks_like_the_tree_it_renames(tmp_path):
    """TheRock's CI appends its run id verbatim (``--version-suffix ${ARTIFACT_RUN_ID}``):
    ``_rocm_sdk_core17154321``, no separator. check still finds dist_info.json in it and llvm's
    --preload-rocm-sdk still finds core's libraries (both looked for ``_rocm_sdk_core_*`` only)."""
    install = build_therock_install(tmp_path, nonce="17154321", init=True)
    assert install.core.name == "_rocm_sdk_core17154321"
    sp = str(install.site_packages)
    code, report = audit("check", "-p", sp)
    assert "CHK001" not in rules(report), report["findings"]
    install.split("per-tree")
    code, report = audit("llvm", "--preload-rocm-sdk", "-p", sp)
    assert code == 1 and "LLVM001" in rules(report)
    code, report = audit("dedup", "-p", sp)
    assert code == 0
    keepers = {g["keeper"] for g in report["dedup"]["groups"]}
    assert str(install.core / "lib/libamd_comgr.so.3") in keepers
    assert not any("_rocm_sdk_devel" in k for k in keepers)
    assert_converged(install)
    # rocm_sdk's preloads are found in the renamed core tree (exit 2 "no _rocm_sdk_core/lib" before).
    code, modelled = audit("llvm", "--preload-rocm-sdk", "-p", str(install.site_packages))
    assert code == 0 and "LLVM001" not in rules(modelled)


@pytest.mark.long
def test_upstream_unsorted_member_order_converges_too(tmp_path):
    """TheRock tars devel in the file system's os.walk order: which aliases `rocm-sdk init` leaves
    symlinks (``libX.so.1.0.0 -> libX.so.1``) and which it hardlinks (``libX.so``) is the file
    system's choice (seen with the real build_python_packages.py), so no fixed order is assumed."""
    install = build_therock_install(tmp_path, member_order="walk", init=True)
    sp = str(install.site_packages)
    code, report = audit("dedup", "--check", "-p", sp)
    assert code == 0, [(f["rule"], f["path"]) for f in report["findings"]]
    install.split("per-tree")
    code, _ = audit("dedup", "-p", sp)
    assert code == 0
    assert not same_bytes_distinct_inodes(install)
    assert_converged(install)
    for command in (["init"], ["path", "--root"], ["test"]):
        assert install.run_rocm_sdk(*command).returncode == 0
    assert_converged(install)


def test_revert_undoes_what_rocm_audit_did_and_names_what_rocm_sdk_re_linked(install):
    install.split("per-tree")
    code, applied = audit("dedup", "-p", str(install.site_packages))
    assert code == 0
    made = {d["path"]: d["made"] for g in applied["dedup"]["groups"] for d in g["duplicates"]}
    device_path = str(install.devel / "lib/libMIOpenCKGroupedConv_gfx942.so")
    assert made[device_path] == "hardlink"  # what TheRock's reconcile would make of a symlink
    assert made[str(install.devel / "lib/libhipblas.so.3")] == "symlink"
    # rocm-sdk (an older rocm-audit's symlink at a reconciled path, say) hardlinks a path rocm-audit
    # symlinked: revert leaves rocm-sdk's link and names it.
    relinked = install.devel / "lib/libhipblas.so.3"
    relinked.unlink()
    os.link(install.libraries / "lib/libhipblas.so.3", relinked)
    for args in (("path", "--root"), ("test",)):
        assert install.run_rocm_sdk(*args).returncode == 0
    code, reverted = audit("dedup", "--revert", applied["dedup"]["manifest"])
    assert code == 0 and reverted["revert"]["failed"] == 0
    assert reverted["revert"]["relinked_by_rocm_sdk"] == [str(relinked)]
    assert relinked.samefile(install.libraries / "lib/libhipblas.so.3")
    device = Path(device_path)
    assert not device.is_symlink() and not device.samefile(install.libraries / "lib/libMIOpenCKGroupedConv_gfx942.so")
    assert str(install.devel / "lib/libhipblas.so.3.0.0") in reverted["revert"]["restored"]


def test_pip_uninstall_of_everything_takes_the_manifest_away(install):
    install.split("per-tree")
    code, applied = audit("dedup", "-p", str(install.site_packages))
    assert code == 0 and applied["dedup"]["replaced"] > 0
    manifest = Path(applied["dedup"]["manifest"])
    assert manifest.parent == install.site_packages / ".rocm-audit"
    record = next(install.site_packages.glob("rocm_sdk_devel-*.dist-info")) / "RECORD"
    assert ".rocm-audit/dedup-manifest.jsonl,," in record.read_text().splitlines()
    # A second run appends to the same manifest and lists it once.
    install.split("per-tree")
    assert audit("dedup", "-p", str(install.site_packages))[0] == 0
    assert record.read_text().splitlines().count(".rocm-audit/dedup-manifest.jsonl,,") == 1
    names = [
        "rocm",
        "rocm-sdk-core",
        "rocm-sdk-libraries",
        "rocm-sdk-devel",
        *(f"rocm-sdk-device-{arch}" for arch in install.arches),
    ]
    install.pip("uninstall", "-y", *names)
    assert not (install.site_packages / ".rocm-audit").exists()
    # pip skips a RECORD path whose os.path.exists() is false: devel's links into a runtime tree
    # uninstalled before it dangle and stay (TheRock's own bin/amd* links do the same).
    left = [p for p in install.devel.rglob("*") if not p.is_dir() or p.is_symlink()]
    assert all(p.is_symlink() and not p.exists() for p in left if p.name != ".devel_reconcile.lock"), left


def test_pip_uninstall_with_devel_first_leaves_only_therock_s_lock(install):
    """Seen with TheRock's real packaging: uninstalling rocm-sdk-devel before the runtime packages
    removes every link dedup made (their targets still exist when pip checks them)."""
    install.split("per-tree")
    assert audit("dedup", "-p", str(install.site_packages))[0] == 0
    names = ["rocm-sdk-devel", "rocm", "rocm-sdk-core", "rocm-sdk-libraries"]
    install.pip("uninstall", "-y", *names, *(f"rocm-sdk-device-{arch}" for arch in install.arches))
    left = sorted(p.name for p in install.devel.rglob("*") if not p.is_dir() or p.is_symlink())
    assert left == [".devel_reconcile.lock"]
    assert not (install.site_packages / ".rocm-audit").exists()


@pytest.mark.parametrize("reinstall", ["reinstall-core", pytest.param("reinstall-libraries", marks=pytest.mark.long)])
def test_the_fix_survives_a_reinstall_and_a_second_run_restores_what_pip_split(install, reinstall):
    """Symlinks point at paths: pip writing new runtime files under them keeps the loader on one
    inode. The hardlinks TheRock (and dedup) keep for mirrored files are split by the reinstall, as
    on a fresh install; `--check` says so and one more run restores them."""
    install.split("per-tree")
    assert audit("dedup", "-p", str(install.site_packages))[0] == 0
    install.split(reinstall)
    load = install.preload_after_devel_hip()
    assert load.returncode == 0 and "loaded" in load.stdout, load.stderr
    code, checked = audit("dedup", "--check", "-p", str(install.site_packages))
    assert "DUP001" not in rules(checked)
    if code == 1:
        assert rules(checked) & {"DUP011"}
    assert audit("dedup", "-p", str(install.site_packages))[0] == 0
    assert same_bytes_distinct_inodes(install) == []
    assert_converged(install)


@pytest.mark.parametrize(
    ("source", "family"),
    [
        ("THIS_TARGET_FAMILY = None\nTHIS_TARGET_FAMILY = 'gfx94X-dcgpu'\n", "gfx94X-dcgpu"),
        ("THIS_TARGET_FAMILY = 'gfx942:xnack+'\n", "gfx942"),
        ("THIS_TARGET_FAMILY = 'gfx94X-dcgpu'\nTHIS_TARGET_FAMILY = None\n", None),
        ("THIS_TARGET_FAMILY = family()\n", None),
        ("if True:\n    THIS_TARGET_FAMILY = 'gfx90X-dcgpu'\n", None),
        ("THIS_TARGET_FAMILY = 'gfx94X-dcgpu'\n(", None),
        ("import os\nos.system('exit 3')\nTHIS_TARGET_FAMILY = 'gfx94X-dcgpu'\n", "gfx94X-dcgpu"),
        ("# " + "x" * (1 << 20) + "\nTHIS_TARGET_FAMILY = 'gfx94X-dcgpu'\n", None),
    ],
)
def test_the_family_a_devel_was_built_for_is_read_as_data(tmp_path, source, family):
    """``THIS_TARGET_FAMILY`` as TheRock's generated ``_dist_info.py`` spells it (a top-level string
    assignment, the last one wins, ``:xnack`` stripped as get_dist_package_name does); the module is
    parsed, never run, and a broken or oversized one names no family (the expansion stays undecided)."""
    from rocm_audit.tree.ownership import this_target_family

    module = tmp_path / "rocm_sdk_devel" / "_dist_info.py"
    module.parent.mkdir()
    module.write_text(source)
    assert this_target_family(str(tmp_path), "rocm_sdk_devel") == family


def test_the_family_module_is_never_read_through_a_link_or_from_a_fifo(tmp_path):
    """A hostile tree: the package directory a symlink out of the site directory, the module a
    symlink or a FIFO (which would block an open without O_NONBLOCK): no family, no hang."""
    from rocm_audit.tree.ownership import this_target_family

    outside = tmp_path / "outside" / "rocm_sdk_devel"
    outside.mkdir(parents=True)
    (outside / "_dist_info.py").write_text("THIS_TARGET_FAMILY = 'gfx94X-dcgpu'\n")
    site = tmp_path / "site"
    site.mkdir()
    (site / "rocm_sdk_devel").symlink_to(outside)
    assert this_target_family(str(outside.parent), "rocm_sdk_devel") == "gfx94X-dcgpu"
    assert this_target_family(str(site), "rocm_sdk_devel") is None
    (site / "rocm_sdk_devel").unlink()
    (site / "rocm_sdk_devel").mkdir()
    (site / "rocm_sdk_devel" / "_dist_info.py").symlink_to(outside / "_dist_info.py")
    assert this_target_family(str(site), "rocm_sdk_devel") is None
    (site / "rocm_sdk_devel" / "_dist_info.py").unlink()
    os.mkfifo(site / "rocm_sdk_devel" / "_dist_info.py")
    assert this_target_family(str(site), "rocm_sdk_devel") is None
    assert this_target_family(str(site), "..") is None
