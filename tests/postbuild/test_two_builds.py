"""Two builds of one SONAME in one process (POST004/POST005, pytorch issue 186516), judged against
real loads: a child process (this interpreter) imports the packages the way a user would and
reads /proc/self/maps; the warning must name a pair exactly when both files are mapped."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rocm_audit.postbuild.pyloads import loads_in_source
from rocm_audit.postbuild.sonames import two_builds_findings
from rocm_audit.tree.discovery import resolve_roots
from rocm_audit.tree.inventory import build_inventory
from rocm_audit.tree.loader import LoaderModel
from support.run import run_checked
from support.sdk_tree import build_library, build_sdk_tree

SONAME = "libamd_smi.so.26"
SMI_SOURCE = "int amdsmi_build(void) {{ return {value}; }}\nint {only}(void) {{ return 0; }}\n"


def build_smi(path: Path, value: int, only: str, soname: str | None = SONAME) -> Path:
    """A real libamd_smi build: ``value`` and one symbol of its own tell the builds apart."""
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.parent / f".{path.name}.c"
    source.write_text(SMI_SOURCE.format(value=value, only=only))
    argv = ["gcc", "-shared", "-fPIC", "-O1", "-o", str(path), str(source)]
    if soname:
        argv.append(f"-Wl,-soname,{soname}")
    run_checked(argv, timeout=120)
    source.unlink()
    return path


def write_record(site: Path, name: str, files: list[Path]) -> None:
    """A dist-info whose RECORD lists ``files`` with their sha256, as pip writes it."""
    dist_info = site / f"{name}-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    rows = []
    for path in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
        rows.append(f"{path.relative_to(site)},sha256={digest},{path.stat().st_size}")
    rows += [f"{dist_info.name}/METADATA,,", f"{dist_info.name}/RECORD,,"]
    (dist_info / "RECORD").write_text("\n".join(rows) + "\n")


def make_site(tmp_path: Path, amdsmi_open: str, amdsmi_lib: str = "build") -> Path:
    """site-packages with TheRock's core holding build A, torch linked against it (RUNPATH), and an
    amdsmi package whose wrapper opens a library with ``amdsmi_open`` (a Python expression).
    ``amdsmi_lib``: "build" (build B), "symlink" (a link to core's file) or "copy" (A's bytes)."""
    site = tmp_path / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    core_lib = site / "_rocm_sdk_core" / "lib"
    core_smi = build_smi(core_lib / SONAME, 1, "built_by_the_sdk")
    (site / "_rocm_sdk_core" / "__init__.py").parent.mkdir(parents=True, exist_ok=True)
    (site / "_rocm_sdk_core" / "__init__.py").write_text("")
    write_record(site, "rocm_sdk_core", [core_smi, site / "_rocm_sdk_core" / "__init__.py"])
    torch_lib = site / "torch" / "lib"
    hip = build_library(
        torch_lib,
        "torch_hip",
        "libtorch_hip.so",
        needed=(SONAME,),
        runpath="$ORIGIN/../../_rocm_sdk_core/lib",
        link_dir=core_lib,
    )
    (site / "torch" / "__init__.py").write_text(
        "import ctypes, os\n_hip = ctypes.CDLL(os.path.join(os.path.dirname(__file__), 'lib', 'libtorch_hip.so'))\n"
    )
    write_record(site, "torch", [hip, site / "torch" / "__init__.py"])
    package = site / "amdsmi"
    package.mkdir()
    smi = package / "libamd_smi.so"
    if amdsmi_lib == "build":
        build_smi(smi, 2, "built_by_amdsmi")
    elif amdsmi_lib == "symlink":
        os.symlink(os.path.relpath(core_smi, package), smi)
    else:
        shutil.copy2(core_smi, smi)
    (package / "__init__.py").write_text("from amdsmi.amdsmi_wrapper import lib\n")
    (package / "amdsmi_wrapper.py").write_text(f"import ctypes, os, pathlib\n\nlib = ctypes.CDLL({amdsmi_open})\n")
    write_record(
        site,
        "amdsmi",
        [package / "__init__.py", package / "amdsmi_wrapper.py"] + ([smi] if amdsmi_lib != "symlink" else []),
    )
    return site


def mapped_inodes(site: Path, *imports: str) -> set[int]:
    """Inodes of the files a real process maps after ``import`` of each module in order."""
    code = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]: importlib.import_module(name)\n"
        "print('\\n'.join(line.split()[4] for line in open('/proc/self/maps') if len(line.split()) > 5))\n"
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(site), "PYTHONNOUSERSITE": "1"}
    done = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r})\n" + code, *imports],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return {int(inode) for inode in done.stdout.split() if inode != "0"}


def both_mapped(site: Path, first: Path, second: Path, *imports: str) -> bool:
    inodes = mapped_inodes(site, *imports)
    assert os.stat(first).st_ino in inodes  # the load really happened
    return os.stat(second).st_ino in inodes


def findings(site: Path, rule_prefix: str = "POST00") -> list:
    inventory = build_inventory(resolve_roots([str(site)])[0])
    return [f for f in two_builds_findings(inventory, LoaderModel()) if f.rule.startswith(rule_prefix)]


BY_PATH = "os.path.join(os.path.dirname(__file__), 'libamd_smi.so')"


def test_a_package_opening_its_own_build_by_path_is_a_warning_both_are_mapped(tmp_path):
    site = make_site(tmp_path, BY_PATH)
    core, own = site / "_rocm_sdk_core" / "lib" / SONAME, site / "amdsmi" / "libamd_smi.so"
    (finding,) = findings(site)
    assert finding.rule == "POST004" and finding.severity.value == "warning"
    assert (finding.path, finding.related_paths) == (str(core), (str(own),))
    assert (
        finding.message
        == f"another build of {SONAME} (amdsmi/libamd_smi.so from amdsmi 1.0) loads into the same process"
    )
    assert (
        "import torch maps _rocm_sdk_core/lib/libamd_smi.so.26 (from rocm_sdk_core 1.0) through the DT_NEEDED"
        in finding.detail
    )
    assert "of torch/lib/libtorch_hip.so" in finding.detail
    assert (
        "import amdsmi.amdsmi_wrapper opens amdsmi/libamd_smi.so (from amdsmi 1.0) by path (amdsmi/amdsmi_wrapper.py:3)"
        in finding.detail
    )
    assert finding.data["soname"] == SONAME and finding.data["owners"] == ["rocm_sdk_core", "amdsmi"]
    assert both_mapped(site, core, own, "torch", "amdsmi")  # the real load agrees
    # The other order maps one build, amdsmi's: torch's request by SONAME reuses it (formats.md 4).
    inodes = mapped_inodes(site, "amdsmi", "torch")
    assert os.stat(own).st_ino in inodes and os.stat(core).st_ino not in inodes
    assert "in the other order" in finding.detail


@pytest.mark.parametrize(
    "spelling",
    [
        "str(pathlib.Path(__file__).resolve().parent / 'libamd_smi.so')",
        "f'{os.path.dirname(os.path.abspath(__file__))}/libamd_smi.so'",
        "pathlib.Path(__file__).parent.joinpath('libamd_smi.so')",
    ],
)
def test_other_spellings_of_a_path_beside_the_module_are_recognised(tmp_path, spelling):
    site = make_site(tmp_path, spelling)
    assert [f.rule for f in findings(site)] == ["POST004"]
    assert both_mapped(
        site, site / "_rocm_sdk_core" / "lib" / SONAME, site / "amdsmi" / "libamd_smi.so", "torch", "amdsmi"
    )


def test_opening_the_library_by_its_soname_is_quiet_the_loader_reuses_the_loaded_one(tmp_path):
    site = make_site(tmp_path, repr(SONAME))
    assert findings(site) == []
    assert not both_mapped(
        site, site / "_rocm_sdk_core" / "lib" / SONAME, site / "amdsmi" / "libamd_smi.so", "torch", "amdsmi"
    )


def test_one_file_reached_through_a_symlink_is_quiet_one_inode_is_mapped(tmp_path):
    site = make_site(tmp_path, BY_PATH, amdsmi_lib="symlink")
    assert findings(site) == []
    inodes = mapped_inodes(site, "torch", "amdsmi")
    assert os.stat(site / "_rocm_sdk_core" / "lib" / SONAME).st_ino in inodes


def test_a_byte_identical_copy_is_left_to_dedup(tmp_path):
    site = make_site(tmp_path, BY_PATH, amdsmi_lib="copy")
    assert findings(site) == []


def test_a_path_computed_at_run_time_is_info_not_a_warning(tmp_path):
    site = make_site(tmp_path, "os.environ.get('AMDSMI_LIB', os.path.join(os.path.dirname(__file__), 'libamd_smi.so'))")
    (finding,) = findings(site)
    assert finding.rule == "POST005" and finding.severity.value == "info"
    assert "whose path cannot be read from its source (amdsmi/amdsmi_wrapper.py:3)" in finding.detail


def test_two_runpaths_to_one_name_map_one_build_quiet(tmp_path):
    """Another library needs the same SONAME through its own RUNPATH, where build B lies: the loader
    reuses the first one loaded by name, so the process maps one build whatever the RUNPATHs say."""
    site = make_site(tmp_path, repr(SONAME))
    other_lib = site / "other" / "lib"
    build_b = build_smi(other_lib / SONAME, 2, "built_by_other")
    build_library(other_lib, "other", "libother.so", needed=(SONAME,), runpath="$ORIGIN", link_dir=other_lib)
    (site / "other" / "__init__.py").write_text(
        "import ctypes, os\n_lib = ctypes.CDLL(os.path.join(os.path.dirname(__file__), 'lib', 'libother.so'))\n"
    )
    assert findings(site) == []
    core = site / "_rocm_sdk_core" / "lib" / SONAME
    assert not both_mapped(site, core, build_b, "torch", "other")
    assert not both_mapped(site, build_b, core, "other", "torch")


def test_two_needed_names_that_lead_to_two_builds_in_one_closure_are_a_warning(tmp_path):
    """libmix.so needs libamd_smi.so.26 (core, through RUNPATH) and libamd_smi.so (its own
    directory, build B whose SONAME is libamd_smi.so.26): neither request matches the other's."""
    site = make_site(tmp_path, repr(SONAME))
    mix_lib = site / "mix" / "lib"
    stub = build_smi(tmp_path / "stub" / "libamd_smi.so", 0, "stub", soname=None)  # links as "libamd_smi.so"
    mix_lib.mkdir(parents=True)
    # DT_NEEDED holds the SONAME of what it linked against, or the file name of one without a SONAME.
    run_checked(
        [
            "gcc", "-shared", "-fPIC", "-o", str(mix_lib / "libmix.so"), "-x", "c", "/dev/null", "-x", "none",
            "-Wl,-soname,libmix.so", "-Wl,--no-as-needed",
            f"-L{site / '_rocm_sdk_core' / 'lib'}", f"-l:{SONAME}", f"-L{stub.parent}", "-l:libamd_smi.so",
            "-Wl,--enable-new-dtags,-rpath,$ORIGIN/../../_rocm_sdk_core/lib:$ORIGIN",
        ],
        timeout=120,
    )  # fmt: skip
    build_b = build_smi(mix_lib / "libamd_smi.so", 2, "built_by_mix")
    (site / "mix" / "__init__.py").write_text(
        "import ctypes, os\n_lib = ctypes.CDLL(os.path.join(os.path.dirname(__file__), 'lib', 'libmix.so'))\n"
    )
    (finding,) = findings(site)
    assert finding.rule == "POST004"
    assert {finding.path, *finding.related_paths} == {str(site / "_rocm_sdk_core" / "lib" / SONAME), str(build_b)}
    assert "loading mix/lib/libmix.so maps both" in finding.detail
    assert both_mapped(site, site / "_rocm_sdk_core" / "lib" / SONAME, build_b, "mix")


def test_therock_trees_of_one_soname_stay_quiet(tmp_path):
    """core/devel copies (one differing in its last block), hardlinks and symlinks: TheRock's own layout."""
    tree = build_sdk_tree(tmp_path / "site")
    assert findings(tree.site) == []


def test_the_recogniser_reads_names_paths_and_what_it_cannot_tell():
    source = b"""
import ctypes, os
from ctypes.util import find_library
here = os.path.dirname(os.path.abspath(__file__))
ctypes.cdll.LoadLibrary(f"{here}/liby.so")
ctypes.PyDLL(find_library("amd_smi"))
ctypes.CDLL("relative/libz.so")
def load(p):
    lib = os.path.join(here, "libw.so")
    return ctypes.CDLL(lib), ctypes.CDLL(p)
"""
    found = [(one.line, one.kind, one.target) for one in loads_in_source(source, "/s/pkg/mod.py")]
    assert found == [
        (5, "path", "/s/pkg/liby.so"),
        (6, "name", "find_library"),
        (7, "unknown", ""),
        (10, "path", "/s/pkg/libw.so"),
        (10, "unknown", ""),
    ]


def test_check_reports_it_by_default(tmp_path, run_cli):
    site = make_site(tmp_path, BY_PATH)
    report = run_cli("check", "--path", str(site), "--format", "json", "--skip", "llvm").report
    rules = [f["rule"] for f in report["findings"]]
    assert "POST004" in rules


def _sonames_with_two_builds(site: Path) -> set[str]:
    """SONAMEs that files of different bytes carry under ``site`` (the precondition of the quiet tests)."""
    inventory = build_inventory(resolve_roots([str(site)])[0])
    contents: dict[str, set[bytes]] = {}
    for record in inventory.files:
        if record.kind is not None and record.kind.value == "shared-library":
            soname = inventory.dynamic(record).soname
            if soname:
                contents.setdefault(soname, set()).add(hashlib.sha256(Path(record.path).read_bytes()).digest())
    return {soname for soname, digests in contents.items() if len(digests) > 1}


@pytest.mark.toolchain  # builds and installs TheRock-shaped wheels with pip: seconds each
@pytest.mark.parametrize("layout", ["legacy-families", "kpack-split-init"])
def test_real_therock_installs_stay_quiet(tmp_path, layout):
    """Per-family libraries wheels (one family loaded per process), device wheels and the
    ``rocm-sdk init`` expansion, installed by pip from TheRock-faithful wheels."""
    from support.therock import build_therock_install

    if layout == "legacy-families":
        install = build_therock_install(
            tmp_path, legacy_families=("gfx94X-dcgpu", "gfx90X-dcgpu"), kpack=False, flow="legacy", init=True
        )
        # Real family wheels embed different device code in one host library; the fixture's host
        # code is the same, so one family's copies get bytes of their own.
        for library in sorted((install.platform_dir("libraries_gfx90X_dcgpu") / "lib").glob("lib*.so.*")):
            with open(library, "ab") as handle:
                handle.write(b"device code of another family")
        assert _sonames_with_two_builds(install.site_packages)  # not a vacuous check
    else:
        install = build_therock_install(tmp_path, init=True)
    assert findings(install.site_packages) == []


def test_two_needed_names_from_two_unrelated_libraries_are_info_a_process_loading_both_maps_both(tmp_path):
    """torch needs libamd_smi.so.26 (core); another package's library needs libamd_smi.so, its own
    build B: only a process that loads both libraries maps both, which the files do not tell."""
    site = make_site(tmp_path, repr(SONAME))
    other_lib = site / "other" / "lib"
    stub = build_smi(tmp_path / "stub" / "libamd_smi.so", 0, "stub", soname=None)
    other_lib.mkdir(parents=True)
    run_checked(
        [
            "gcc", "-shared", "-fPIC", "-o", str(other_lib / "libother.so"), "-x", "c", "/dev/null", "-x", "none",
            "-Wl,-soname,libother.so", "-Wl,--no-as-needed", f"-L{stub.parent}", "-l:libamd_smi.so",
            "-Wl,--enable-new-dtags,-rpath,$ORIGIN",
        ],
        timeout=120,
    )  # fmt: skip
    build_b = build_smi(other_lib / "libamd_smi.so", 2, "built_by_other")
    (site / "other" / "__init__.py").write_text(
        "import ctypes, os\n_lib = ctypes.CDLL(os.path.join(os.path.dirname(__file__), 'lib', 'libother.so'))\n"
    )
    (finding,) = findings(site)
    assert finding.rule == "POST005" and finding.severity.value == "info"
    assert "cannot be told" in finding.detail and "of other/lib/libother.so" in finding.detail
    core = site / "_rocm_sdk_core" / "lib" / SONAME
    assert both_mapped(site, core, build_b, "torch", "other")  # a process loading both does map both


def test_check_under_a_sysroot_reads_the_same_pair(tmp_path, run_cli):
    """An image is audited as a system root: the paths the source builds are the tree's own."""
    site = make_site(tmp_path / "root" / "usr", BY_PATH)
    report = run_cli(
        "check", "--path", str(site), "--sysroot", str(tmp_path / "root"), "--format", "json", "--skip", "llvm"
    ).report
    assert [f["related_paths"] for f in report["findings"] if f["rule"] == "POST004"] == [
        [str(site / "amdsmi" / "libamd_smi.so")]
    ]


@pytest.mark.parametrize("depth", [50, 2000, 20000])
def test_the_recogniser_survives_hostile_nesting(depth):
    """A module is read, never trusted: deep attribute chains and sums end in a verdict, not a crash."""
    source = f"import ctypes\nx{'.a' * depth}()\nctypes.CDLL('/a'{' + chr(98)' * depth})\n".encode()
    found = [(one.line, one.kind) for one in loads_in_source(source, "/s/pkg/mod.py")]
    # A module too deep for the parser yields nothing; one it parses, the load it cannot evaluate.
    assert found == [(3, "unknown")] if depth == 50 else found in ([], [(3, "unknown")])
