"""kpack'd libraries of a TheRock-faithful install judged as the kpack runtime resolves them (issue 15,
item 6): ``librocblas.so.5`` is installed under its SONAME while the kpack TOC keys its build path
(``math-libs/BLAS/rocBLAS/stage/lib/librocblas.so.5.0.0``); its reference names the component and the
``.kpm`` that lists the per-arch archives the device wheels install."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocm_audit.gpu import verify
from support.therock import build_therock_install

pytestmark = pytest.mark.toolchain  # venvs made and installed by pip from a local index


def test_rocblas_is_judged_through_its_build_key_and_named_when_a_target_is_missing(tmp_path: Path) -> None:
    install = build_therock_install(tmp_path, kpack=True)
    site = install.libraries.parent
    rocblas = install.libraries / "lib" / "librocblas.so.5"
    outcome = verify.verify_arch([str(site)], ["gfx942", "gfx950"], environ={})
    (carrier,) = [c for c in outcome.sections["carriers"] if c["path"] == str(rocblas)]
    assert carrier["kind"] == "library" and carrier["containers"] == ["kpack"]
    assert carrier["targets"] == ["gfx90a", "gfx942"] and carrier["missing"] == ["gfx950"]
    assert [m["how"] for m in carrier["matches"]] == ["native", None]
    named = [f for f in outcome.findings if f.path == str(rocblas)]
    assert [f.rule for f in named] == ["ARCH001"], named
    assert "gfx950" in named[0].message


def test_default_targets_are_the_build_s_narrowed_to_the_installed_device_wheels(tmp_path: Path) -> None:
    """``rocm[libraries,devel,device-gfx942]`` (pick your GPU's device wheel, as TheRock advises) of a
    gfx90a;gfx942 build: dist_info.json lists both, only gfx942's kernels are installed. Observed with
    TheRock's real build_python_packages.py: check failed such an install (ARCH001/ARCH008 for gfx90a).
    An explicit target still judges gfx90a, and prune's default keeps the build's whole list."""
    install = build_therock_install(tmp_path, kpack=True, extras=("libraries", "devel", "device-gfx942"), init=True)
    site = str(install.site_packages)
    outcome = verify.verify_arch([site], [], environ={})
    assert not outcome.findings, [(f.rule, f.path, f.message) for f in outcome.findings]
    assert outcome.sections["targets_origin"]["device_wheels"] == ["gfx942"]
    assert outcome.sections["targets_origin"]["value"] == "gfx942"
    assert "narrowed to the installed device wheels (rocm-sdk-device-gfx942)" in outcome.sections["targets_source"]
    explicit = verify.verify_arch([site], [], environ={"GPU_ARCH": "gfx90a;gfx942"})
    assert {f.rule for f in explicit.findings} >= {"ARCH001", "ARCH008"}
    required, _ = verify.requested_targets([], [site], {})
    assert [t.spelled for t in required] == ["gfx90a", "gfx942"]
    # No device wheel at all: nothing narrows, and the kernel-less libraries fail for every target.
    bare = build_therock_install(tmp_path / "bare", kpack=True, extras=("libraries", "devel"), init=True)
    outcome = verify.verify_arch([str(bare.site_packages)], [], environ={})
    assert "device_wheels" not in outcome.sections["targets_origin"]
    assert {f.rule for f in outcome.findings} >= {"ARCH001"}


def test_default_targets_of_a_legacy_family_install_are_its_family_s_processors(tmp_path: Path) -> None:
    """The legacy flow (no kpack split): a gfx90a;gfx942 build, one family wheel installed
    (rocm-sdk-libraries-gfx94X-dcgpu). dist_info.json lists both targets; the install holds code for
    gfx942 only, which is right for a gfx94X machine: check judged gfx90a too and failed it (ARCH001,
    ARCH008) with a device wheel the legacy flow has none of. An explicit target list still judges
    gfx90a. With both families co-installed, rocm_sdk loads the tree of the GPU's family: each
    family's carriers are judged for their family's targets, and a target no family covers for all."""
    install = build_therock_install(tmp_path, legacy_families=("gfx94X-dcgpu",), extras=("devel",), init=True)
    site = str(install.site_packages)
    outcome = verify.verify_arch([site], [], environ={})
    assert not outcome.findings, [(f.rule, f.path, f.message) for f in outcome.findings]
    assert outcome.sections["targets_origin"]["library_families"] == ["gfx94X-dcgpu"]
    assert outcome.sections["targets_origin"]["value"] == "gfx942"
    explicit = verify.verify_arch([site], [], environ={"GPU_ARCH": "gfx90a;gfx942"})
    assert {f.rule for f in explicit.findings} >= {"ARCH001"}
    both = build_therock_install(
        tmp_path / "both", legacy_families=("gfx94X-dcgpu", "gfx90X-dcgpu"), extras=("devel",), init=True
    )
    site = str(both.site_packages)
    outcome = verify.verify_arch([site], [], environ={})
    assert not outcome.findings, [(f.rule, f.path, f.message) for f in outcome.findings]
    assert [t["target"] for t in outcome.sections["targets"]] == ["gfx90a", "gfx942"]
    asked = {c["path"]: [m["target"] for m in c["matches"]] for c in outcome.sections["carriers"]}
    assert {tuple(v) for k, v in asked.items() if "gfx94X" in k} == {("gfx942",)}
    assert {tuple(v) for k, v in asked.items() if "gfx90X" in k} == {("gfx90a",)}
    beyond = verify.verify_arch([site], ["gfx942", "gfx950"], environ={})
    missing = {f.path for f in beyond.findings if f.rule in ("ARCH001", "ARCH008") and "gfx950" in f.message}
    assert any("gfx90X" in p for p in missing) and any("gfx94X" in p for p in missing)


def test_a_legacy_flow_devel_is_judged_as_its_own_familys_tree(tmp_path: Path) -> None:
    """The legacy flow as ``_run_legacy`` packages it: ``rocm[libraries,devel]`` of gfx94X-dcgpu with
    gfx90X-dcgpu's libraries beside it. Its devel is gfx94X's (one per family, holding gfx942's device
    files, ``THIS_TARGET_FAMILY = 'gfx94X-dcgpu'``), so a target another installed family covers is
    not asked of it, as of gfx94X's libraries tree: a fresh install passes by default and for
    gfx90a;gfx942. A target no family covers is still asked of it, and it says so."""
    install = build_therock_install(
        tmp_path, kpack=False, flow="legacy", legacy_families=("gfx94X-dcgpu", "gfx90X-dcgpu"), init=True
    )
    site = str(install.site_packages)
    for environ in ({}, {"GPU_ARCH": "gfx90a;gfx942"}):
        outcome = verify.verify_arch([site], [], environ=environ)
        assert not outcome.findings, [(f.rule, f.path, f.message) for f in outcome.findings]
    devel = [c for c in outcome.sections["carriers"] if c["package"] == install.devel.name]
    assert devel and all([m["target"] for m in c["matches"]] == ["gfx942"] for c in devel), devel
    beyond = verify.verify_arch([site], ["gfx942", "gfx950"], environ={})
    missing = {f.path for f in beyond.findings if f.rule in ("ARCH001", "ARCH008") and "gfx950" in f.message}
    assert any(p.startswith(str(install.devel)) for p in missing), missing
    # Without the family its rocm-sdk-devel names, the devel is everybody's and fails gfx90a.
    (install.site_packages / "rocm_sdk_devel" / "_dist_info.py").write_text("THIS_TARGET_FAMILY = None\n")
    unnamed = verify.verify_arch([site], [], environ={"GPU_ARCH": "gfx90a;gfx942"})
    failing = {(f.rule, f.path) for f in unnamed.findings if "gfx90a" in f.message}
    assert failing and all(path.startswith(str(install.devel)) for _, path in failing), failing


def test_rocblas_split_by_the_gfxarch_splitter_is_judged_through_the_pattern_its_reference_holds(
    tmp_path: Path,
) -> None:
    """The splitter TheRock builds from rocm-systems shared/kpack: rocBLAS's reference names
    ``../.kpack/blas_lib_@GFXARCH@.kpack`` and ``kernel_name`` ``<prefix>/lib/librocblas.so.5.0.0`` (its build
    name, not the SONAME the wheel installs it under), the TOC keys that name plus ``#0``, and no ``.kpm`` is
    shipped. Checked against TheRock 89553ce's real build_python_packages.py on the same artifacts: the device
    wheels carry ``.kpack/blas_lib_<arch>.kpack`` into ``_rocm_sdk_libraries``. The runtime opens the archive
    the device's arch names, so a device wheel uninstalled by pip takes its target with it."""
    install = build_therock_install(tmp_path, kpack=True, kpack_flow="gfxarch", init=True)
    site = install.libraries.parent
    rocblas = install.libraries / "lib" / "librocblas.so.5"
    assert not list(install.libraries.glob(".kpack/*.kpm"))
    assert sorted(p.name for p in install.libraries.glob(".kpack/*")) == [
        "blas_lib_gfx90a.kpack",
        "blas_lib_gfx942.kpack",
    ]
    outcome = verify.verify_arch([str(site)], ["gfx942", "gfx950"], environ={})
    (carrier,) = [c for c in outcome.sections["carriers"] if c["path"] == str(rocblas)]
    assert carrier["containers"] == ["kpack"]
    assert carrier["targets"] == ["gfx90a", "gfx942"] and carrier["missing"] == ["gfx950"]
    named = [f for f in outcome.findings if f.path == str(rocblas)]
    assert [f.rule for f in named] == ["ARCH001"], named
    install.pip("uninstall", "-y", "rocm-sdk-device-gfx942")
    outcome = verify.verify_arch([str(site)], ["gfx90a", "gfx942"], environ={})
    (carrier,) = [c for c in outcome.sections["carriers"] if c["path"] == str(rocblas)]
    assert carrier["targets"] == ["gfx90a"] and carrier["missing"] == ["gfx942"]
    assert not any(f.rule == "ARCH005" for f in outcome.findings if f.path == str(rocblas))
