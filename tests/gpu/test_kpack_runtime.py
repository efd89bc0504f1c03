"""kpack archives judged in the order the kpack runtime opens them (gpu/kpack_runtime.py).

Every verdict is held against a reading of the kpack runtime's ``kpack_load_code_object``
[rocm-systems: shared/kpack/runtime/src/loader.cpp at 1ddbe7e9, the fixed revision; the pre-fix
revision as rocm-systems PR 9953 describes it and as its ancestor stellaraccident/rocm-kpack
ae4f1c2e runtime/src/loader.cpp lines 370-412 does it: the first archive serving the arch is taken
(``break`` at line 391) and a kernel it lacks ends that arch's search]. Places in 1ddbe7e9 are
named by the loader's own landmarks, as line numbers of that revision were not available:
(a) the search-path loop ("Resolve embedded search paths": ``@GFXARCH@`` expanded per arch of
the list with ``for_each_compatible_target``, most specific first); (b) the open loop
("Try to open": a path that does not exist or does not open is skipped; none left returns
KPACK_ERROR_ARCHIVE_NOT_FOUND); (c) the candidate loop ("A single architecture's kernels may be
split across several archives": every archive whose ``gfx_arches`` holds a compatible target, then
"Try the next candidate" on a miss), which PR 9953 added in place of the commit-to-first lookup.

Fixtures are made here: device code objects compiled by clang-19 for each target, kpack'd host
libraries linked by gcc with the post-split sections, archives written in the KPAK layout
(formats.md 1.7), device wheels built as zip files and installed by pip.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import msgpack
import pytest

from rocm_audit.gpu import kpack_runtime as kr
from rocm_audit.severity import Severity
from rocm_audit.tree.targets import parse_target_id
from support.run import run_checked
from support.therock.artifacts import kpack_ref_asm

HIP = """\
extern "C" __attribute__((global)) void %s(int* out) { *out = 1; }
"""
DEVICE_ONLY = ["-x", "hip", "-nogpulib", "-nogpuinc", "--cuda-device-only", "--no-gpu-bundle-output"]


@pytest.fixture(scope="module")
def code_objects(tmp_path_factory, tools) -> dict[str, bytes]:
    """Real code objects, one per target id: target -> ELF bytes."""
    out = tmp_path_factory.mktemp("kpack-runtime-co")
    (out / "k.hip").write_text(HIP % "k")
    made = {}
    for target in ("gfx90a", "gfx90a:xnack-", "gfx90a:xnack+", "gfx942", "gfx942:xnack-"):
        name = target.replace(":", "_") + ".hsaco"
        run_checked([tools["clang++-19"], *DEVICE_ONLY, f"--offload-arch={target}", "k.hip", "-o", name], out)
        made[target] = (out / name).read_bytes()
        assert made[target][:4] == b"\x7fELF"
    return made


def write_archive(path: Path, arches: list[str], kernels: list[tuple[str, str, bytes]]) -> Path:
    """A KPAK v1 archive (scheme none) whose gfx_arches is given, as rocm-kpack writes one."""
    out = bytearray(64)
    blobs, toc = [], {}
    for ordinal, (key, arch, data) in enumerate(kernels):
        blobs.append({"offset": len(out), "size": len(data)})
        out += data
        toc.setdefault(key, {})[arch] = {"type": "hsaco", "ordinal": ordinal, "original_size": len(data)}
    document = {
        "format_version": 1,
        "group_name": "torch",
        "gfx_arch_family": arches[0] if arches else "",
        "gfx_arches": arches,
        "compression_scheme": "none",
        "blobs": blobs,
        "toc": toc,
    }
    toc_offset = len(out)
    out += msgpack.packb(document)
    out[:16] = struct.pack("<4sIQ", b"KPAK", 1, toc_offset)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(out))
    return path


def kpackd_library(path: Path, search_paths: list[str], kernel_name: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.parent / f"{path.name}.c"
    source.write_text("int marker(void) { return 1; }\n" + kpack_ref_asm(search_paths, kernel_name, 8192))
    run_checked(["gcc", "-shared", "-fPIC", str(source), "-o", str(path)])
    source.unlink()
    return path


def runtime_library(path: Path, *, fixed: bool) -> Path:
    """A stand-in for the kpack runtime library holding its debug texts (the real library is not
    available here): the fixed loader's text names the next candidate, the older one does not."""
    text = "kpack:   kernel not found in this archive" + (" (error %d), trying next candidate" if fixed else "")
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.parent / "rt.c"
    source.write_text(f'const char kpack_message[] = "{text}";\n')
    run_checked(["gcc", "-shared", "-fPIC", str(source), "-o", str(path)])
    source.unlink()
    return path


def torch_212(site: Path, co: dict[str, bytes]) -> Path:
    """torch 2.12's gfx90a layout (TheRock issues 7081, 7620): torch_gfx90a:xnack-.kpack with no
    kernels, torch_gfx90a:xnack+.kpack with another library's kernel only, torch_gfx90a.kpack with
    all of libtorch_hip.so's kernels."""
    lib = kpackd_library(site / "torch/lib/libtorch_hip.so", ["../.kpack/torch_@GFXARCH@.kpack"], "lib/libtorch_hip.so")
    kdir = site / "torch/.kpack"
    write_archive(kdir / "torch_gfx90a:xnack-.kpack", ["gfx90a:xnack-"], [])
    write_archive(
        kdir / "torch_gfx90a:xnack+.kpack",
        ["gfx90a:xnack+"],
        [("lib/libtorch_rocshmem.so#0", "gfx90a:xnack+", co["gfx90a:xnack+"])],
    )
    write_archive(kdir / "torch_gfx90a.kpack", ["gfx90a"], [("lib/libtorch_hip.so#0", "gfx90a", co["gfx90a"])])
    return lib


def findings_for(site: Path, targets: list[str], version: kr.RuntimeVersion):
    libraries = [kr.read_library(str(p)) for p in sorted(site.rglob("*.so"))]
    devices = [parse_target_id(t) for t in targets]
    return kr.kpack_findings([lib for lib in libraries if lib is not None], devices, version)


def test_the_loader_tries_targets_most_specific_first():
    """isa_target_match.h: descending mask over the features as spelled, bare processor last."""
    assert kr.compatible_targets("gfx942:sramecc+:xnack-") == [
        "gfx942:sramecc+:xnack-",
        "gfx942:sramecc+",
        "gfx942:xnack-",
        "gfx942",
    ]
    assert kr.compatible_targets("gfx1100") == ["gfx1100"]
    configurations = {str(c) for c in kr.device_configurations(parse_target_id("gfx90a"))}
    assert configurations == {f"gfx90a:sramecc{s}:xnack{x}" for s in "+-" for x in "+-"}
    assert [str(c) for c in kr.device_configurations(parse_target_id("gfx90a:xnack-"))] == [
        "gfx90a:sramecc+:xnack-",
        "gfx90a:sramecc-:xnack-",
    ]


@pytest.mark.toolchain
def test_torch_212_archives_shadow_the_bare_archive_under_the_loader_before_the_fix(tmp_path, code_objects):
    """Loader (a)+(b): for gfx90a:sramecc+:xnack- the paths are torch_gfx90a:sramecc+:xnack-,
    torch_gfx90a:sramecc+, torch_gfx90a:xnack-, torch_gfx90a; the last two exist. Pre-fix: the
    first archive serving the device is torch_gfx90a:xnack-.kpack, which lacks
    lib/libtorch_hip.so#0, and the load fails. Fixed (c): the miss falls through to
    torch_gfx90a.kpack, which holds it. An xnack+ device opens torch_gfx90a:xnack+.kpack first,
    never the xnack- one."""
    site = tmp_path / "site"
    lib = torch_212(site, code_objects)
    kdir = site / "torch/.kpack"
    rt = runtime_library(tmp_path / "rt-old/librocm_kpack.so.1", fixed=False)
    version = kr.runtime_version([str(rt)])
    assert version.revision is kr.Revision.COMMITS

    view = kr.resolve(kr.read_library(str(lib)), parse_target_id("gfx90a:sramecc+:xnack-"), kr.ArchiveCache())
    assert [Path(a.path).name for a in view.opened] == ["torch_gfx90a:xnack-.kpack", "torch_gfx90a.kpack"]
    (lookup,) = view.lookups
    assert Path(lookup.first.path).name == "torch_gfx90a:xnack-.kpack" and not lookup.first_holds
    assert Path(lookup.found_in.path).name == "torch_gfx90a.kpack"

    found = findings_for(site, ["gfx90a"], version)
    shadowing = sorted((f for f in found if f.rule == "KPACK001"), key=lambda f: f.data["first_archive"])
    assert [(Path(f.data["first_archive"]).name, Path(f.data["holding_archive"]).name) for f in shadowing] == [
        ("torch_gfx90a:xnack+.kpack", "torch_gfx90a.kpack"),
        ("torch_gfx90a:xnack-.kpack", "torch_gfx90a.kpack"),
    ]
    assert all(f.severity is Severity.ERROR and f.path == str(lib) for f in shadowing)
    xnack_minus = shadowing[1]
    assert xnack_minus.data["devices"] == ["gfx90a:sramecc+:xnack-", "gfx90a:sramecc-:xnack-"]
    assert "torch_gfx90a:xnack-.kpack" in xnack_minus.message and "torch_gfx90a.kpack" in xnack_minus.message
    assert "\n" not in xnack_minus.message
    # the kernel-less archive is also named on its own
    (empty,) = [f for f in found if f.rule == "KPACK003"]
    assert empty.path == str(kdir / "torch_gfx90a:xnack-.kpack") and empty.related_paths == (str(lib),)


@pytest.mark.toolchain
def test_the_fixed_loader_falls_through_and_an_unknown_one_is_a_warning(tmp_path, code_objects):
    site = tmp_path / "site"
    torch_212(site, code_objects)
    fixed = kr.runtime_version([str(runtime_library(tmp_path / "rt-new/librocm_kpack.so.1", fixed=True))])
    assert fixed.revision is kr.Revision.FALLS_THROUGH
    assert not [f for f in findings_for(site, ["gfx90a"], fixed) if f.rule == "KPACK001"]

    unknown = kr.runtime_version([], [("rocm-sdk-core", "7.15.0")])
    assert unknown.revision is kr.Revision.UNKNOWN
    shadowing = [f for f in findings_for(site, ["gfx90a:xnack-"], unknown) if f.rule == "KPACK001"]
    assert [f.severity for f in shadowing] == [Severity.WARNING]
    # a 7.14 release carries the loader before the fix
    assert kr.runtime_version([], [("rocm-sdk-core", "7.14.0")]).revision is kr.Revision.COMMITS


@pytest.mark.toolchain
def test_removing_the_feature_archives_leaves_nothing_to_shadow(tmp_path, code_objects):
    """The workaround of TheRock issue 7081: without the xnack archives every device's first
    (and only) archive is torch_gfx90a.kpack, which holds the kernel, under either loader."""
    site = tmp_path / "site"
    torch_212(site, code_objects)
    for name in ("torch_gfx90a:xnack-.kpack", "torch_gfx90a:xnack+.kpack"):
        (site / "torch/.kpack" / name).unlink()
    old = kr.RuntimeVersion(kr.Revision.COMMITS, "test")
    assert findings_for(site, ["gfx90a"], old) == []


@pytest.mark.toolchain
def test_a_complete_feature_archive_is_no_shadow(tmp_path, code_objects):
    """An xnack- archive that holds the kernel serves it first (loader (c), first candidate)."""
    site = tmp_path / "site"
    torch_212(site, code_objects)
    write_archive(
        site / "torch/.kpack/torch_gfx90a:xnack-.kpack",
        ["gfx90a:xnack-"],
        [("lib/libtorch_hip.so#0", "gfx90a:xnack-", code_objects["gfx90a:xnack-"])],
    )
    old = kr.RuntimeVersion(kr.Revision.COMMITS, "test")
    assert findings_for(site, ["gfx90a:xnack-"], old) == []


@pytest.mark.toolchain
def test_rccl_search_path_leading_to_no_archive(tmp_path, code_objects):
    """TheRock issue 5446. Loader (b): every expanded path of ../.kpack/rccl_lib_@GFXARCH@.kpack
    is missing, so no archive is left and the load returns KPACK_ERROR_ARCHIVE_NOT_FOUND."""
    site = tmp_path / "site"
    lib = kpackd_library(
        site / "_rocm_sdk_libraries/lib/librccl.so", ["../.kpack/rccl_lib_@GFXARCH@.kpack"], "lib/librccl.so"
    )
    old = kr.RuntimeVersion(kr.Revision.COMMITS, "test")
    (missing,) = findings_for(site, ["gfx942:sramecc+:xnack-"], old)
    assert missing.rule == "KPACK002" and missing.path == str(lib)
    assert missing.data["devices"] == ["gfx942:sramecc+:xnack-"] and "rccl_lib_@GFXARCH@" in missing.message
    # once the device wheel's archive is there, nothing is reported
    write_archive(
        site / "_rocm_sdk_libraries/.kpack/rccl_lib_gfx942.kpack",
        ["gfx942"],
        [("lib/librccl.so#0", "gfx942", code_objects["gfx942"])],
    )
    assert findings_for(site, ["gfx942:sramecc+:xnack-"], old) == []
    # an archive for another GPU only is still none for this one
    assert [f.rule for f in findings_for(site, ["gfx90a:xnack-"], old)] == ["KPACK002"]


def test_a_file_that_does_not_open_as_an_archive_is_skipped_like_a_missing_one(tmp_path):
    """Loader (b): kpack_open failing is 'continue', the same as a missing path."""
    site = tmp_path / "site"
    kpackd_library(site / "pkg/lib/libx.so", ["../.kpack/x_@GFXARCH@.kpack"], "lib/libx.so")
    (site / "pkg/.kpack").mkdir(parents=True)
    (site / "pkg/.kpack/x_gfx942.kpack").write_bytes(b"KPAK" + b"\x00" * 8)
    old = kr.RuntimeVersion(kr.Revision.COMMITS, "test")
    assert [f.rule for f in findings_for(site, ["gfx942"], old)] == ["KPACK002"]


# ---------------------------------------------------------------------------------------------
# Device wheels


def build_wheel(out: Path, name: str, version: str, requires: list[str]) -> Path:
    """A py3-none-any wheel holding only its dist-info (and one data file)."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    files = {
        f"{dist}/__init__.py": "",
        f"{info}/METADATA": metadata,
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},,\n" for path in files) + f"{info}/RECORD,,\n"
    path = out / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
        archive.writestr(f"{info}/RECORD", record)
    return path


def pip_install(site: Path, wheels: list[Path]) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(site),
            *map(str, wheels),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )


def installed(site: Path) -> list[kr.InstalledDistribution]:
    from rocm_audit.tree.ownership import read_distributions

    return [
        kr.InstalledDistribution(d.normalized, d.version, d.dist_info, d.site_dir)
        for d in read_distributions([str(site)], [])
    ]


def test_a_device_wheel_without_its_family_wheel(tmp_path):
    """rocm-systems PR 10685 / pytorch issue 194498: amd-torch-device-gfx1100 installed (here with
    --no-deps) without amd-torch-device-gfx11; an extra-only requirement is not required."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    device = build_wheel(
        wheels,
        "amd-torch-device-gfx1100",
        "2.12.0",
        [
            "amd-torch-device-gfx11==2.12.0",
            "rocm-sdk-device-gfx1100==7.14.0",
            'pytest; extra == "test"',
            'pywin32; sys_platform == "win32"',
        ],
    )
    sdk = build_wheel(wheels, "rocm-sdk-device-gfx1100", "7.14.0", [])
    site = tmp_path / "site"
    pip_install(site, [device, sdk])
    (finding,) = kr.device_wheel_findings(installed(site))
    assert finding.rule == "KPACK004" and finding.data["distribution"] == "amd-torch-device-gfx1100"
    assert finding.data["missing"] == ["amd-torch-device-gfx11==2.12.0"]
    assert finding.data["skipped"] == ['pytest; extra == "test"']
    assert "amd-torch-device-gfx11" in finding.message and "\n" not in finding.message

    pip_install(site, [build_wheel(wheels, "amd-torch-device-gfx11", "2.12.0", [])])
    assert kr.device_wheel_findings(installed(site)) == []


def test_a_family_wheel_of_another_version_is_named_with_its_version(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    site = tmp_path / "site"
    pip_install(
        site,
        [
            build_wheel(wheels, "amd-torch-device-gfx1100", "2.12.0", ["amd-torch-device-gfx11==2.12.0"]),
            build_wheel(wheels, "amd-torch-device-gfx11", "2.11.0", []),
        ],
    )
    (finding,) = kr.device_wheel_findings(installed(site))
    assert finding.data["missing"] == ["amd-torch-device-gfx11==2.12.0 (installed: 2.11.0)"]


def test_markers_are_evaluated_for_linux_or_left_unjudged():
    assert kr.marker_applies('sys_platform == "linux"', None) is True
    assert kr.marker_applies('sys_platform == "win32" or platform_machine == "x86_64"', None) is True
    assert kr.marker_applies('python_version < "3.11"', "3.12") is False
    assert kr.marker_applies('python_version < "3.11"', None) is None
    assert kr.marker_applies('extra == "device-gfx1100"', "3.12") is None
    assert kr.marker_applies('(sys_platform == "linux")', None) is None


# ---------------------------------------------------------------------------------------------
# Through the commands


@pytest.mark.toolchain
def test_verify_arch_reports_the_shadowing_and_the_empty_archive(tmp_path, code_objects, run_cli):
    """verify-arch on the torch 2.12 layout beside a kpack runtime that stops at the first
    archive (the rocm-sdk-core tree's librocm_kpack.so.0)."""
    site = tmp_path / "site"
    lib = torch_212(site, code_objects)
    runtime_library(site / "_rocm_sdk_core/lib/librocm_kpack.so.0", fixed=False)
    report = run_cli("verify-arch", "gfx90a:xnack-", "-p", str(site), "--format", "json").report
    findings = [f for f in report["findings"] if f["rule"].startswith("KPACK")]
    assert sorted((f["rule"], f["severity"]) for f in findings) == [("KPACK001", "error"), ("KPACK003", "warning")]
    (shadow,) = [f for f in findings if f["rule"] == "KPACK001"]
    assert shadow["path"] == str(lib)
    assert shadow["message"] == (
        "on gfx90a:xnack- the kpack runtime opens torch_gfx90a:xnack-.kpack first, which lacks 1 kernel(s) "
        "of this library that torch_gfx90a.kpack holds"
    )


@pytest.mark.toolchain
def test_check_reports_the_rccl_library_once_per_cause_and_the_device_wheel(tmp_path, code_objects, run_cli):
    """check. librccl.so with no archive at all (TheRock issue 5446) is the scan's 'no kpack archive
    found' (ARCH005) and a missing target (ARCH001): KPACK002 does not say it a third time. With only
    an xnack- archive, the xnack+ setting of a gfx942 (HSA_XNACK=1) finds none: loader (a)+(b)
    build rccl_lib_gfx942:sramecc+:xnack+, rccl_lib_gfx942:sramecc+, rccl_lib_gfx942:xnack+,
    rccl_lib_gfx942 (and the gfx9-4-generic names), none of which exists; only KPACK002 says so.
    The device wheel without its family wheel is KPACK004."""
    site = tmp_path / "site"
    lib = kpackd_library(
        site / "_rocm_sdk_libraries/lib/librccl.so", ["../.kpack/rccl_lib_@GFXARCH@.kpack"], "lib/librccl.so"
    )
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    pip_install(site, [build_wheel(wheels, "amd-torch-device-gfx1100", "2.12.0", ["amd-torch-device-gfx11==2.12.0"])])
    report = run_cli("check", "gfx942", "-p", str(site), "--format", "json").report
    rules = sorted((f["rule"], Path(f["path"]).name) for f in report["findings"] if f["rule"][:4] in ("KPAC", "ARCH"))
    assert rules == [
        ("ARCH001", "librccl.so"),
        ("ARCH005", "librccl.so"),
        ("KPACK004", "amd_torch_device_gfx1100-2.12.0.dist-info"),
    ], rules

    write_archive(
        site / "_rocm_sdk_libraries/.kpack/rccl_lib_gfx942:xnack-.kpack",
        ["gfx942:xnack-"],
        [("lib/librccl.so#0", "gfx942:xnack-", code_objects["gfx942:xnack-"])],
    )
    report = run_cli("check", "gfx942", "-p", str(site), "--format", "json").report
    rules = sorted((f["rule"], Path(f["path"]).name) for f in report["findings"] if f["rule"][:4] in ("KPAC", "ARCH"))
    assert rules == [("KPACK002", "librccl.so"), ("KPACK004", "amd_torch_device_gfx1100-2.12.0.dist-info")], rules
    (missing,) = [f for f in report["findings"] if f["rule"] == "KPACK002"]
    assert missing["path"] == str(lib) and missing["message"] == (
        "no kpack archive for gfx942:xnack+ at its search paths ../.kpack/rccl_lib_@GFXARCH@.kpack"
    )


def test_which_rocm_versions_surely_predate_the_fix():
    """PR 9953 was opened on 2026-08-10; 7.14 (the torch 2.12 wheels' ROCm) has the old loader."""
    assert kr.predates_fix("7.14.0") and kr.predates_fix("7.13.0a20260508") and kr.predates_fix("7.14.0rc2")
    assert kr.predates_fix("7.15.0a20260723")
    assert not kr.predates_fix("7.15.0a20260901") and not kr.predates_fix("10.0.0") and not kr.predates_fix("7.15.0")
