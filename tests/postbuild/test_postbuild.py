"""Post-build checks on real gcc-built files, with the real dynamic loader as the oracle."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rocm_audit.postbuild.checks import post_build_findings, site_python
from rocm_audit.tree.discovery import resolve_roots
from rocm_audit.tree.inventory import build_inventory
from rocm_audit.tree.loader import LoaderModel
from support.sdk_tree import build_library


def elf_hash(name: bytes) -> int:
    """The SysV ELF hash that Vernaux.vna_hash holds (System V ABI)."""
    value = 0
    for byte in name:
        value = (value << 4) + byte
        high = value & 0xF0000000
        if high:
            value ^= high >> 24
        value &= ~high
    return value & 0xFFFFFFFF


def require_newer_glibc(path: Path, old: bytes, new: bytes) -> None:
    """Rewrite one needed GLIBC version of a real library (same length, hash fixed), as if built on a newer base."""
    from elftools.elf.elffile import ELFFile

    data = bytearray(path.read_bytes())
    with open(path, "rb") as handle:
        elf = ELFFile(handle)
        dynstr = elf.get_section_by_name(".dynstr")
        verneed = elf.get_section_by_name(".gnu.version_r")
        dynstr_range = (dynstr["sh_offset"], dynstr["sh_offset"] + dynstr["sh_size"])
        verneed_range = (verneed["sh_offset"], verneed["sh_offset"] + verneed["sh_size"])
    where = data.find(old + b"\0", *dynstr_range)
    assert where > 0, f"{old!r} not in .dynstr"
    data[where : where + len(old)] = new
    old_hash, new_hash = elf_hash(old).to_bytes(4, "little"), elf_hash(new).to_bytes(4, "little")
    hash_at = data.find(old_hash, *verneed_range)
    assert hash_at > 0
    data[hash_at : hash_at + 4] = new_hash
    path.write_bytes(bytes(data))


@pytest.fixture()
def site(tmp_path) -> Path:
    """lib/python3.11/site-packages with an SDK-ish package of real libraries."""
    root = tmp_path / "lib" / "python3.11" / "site-packages"
    lib = root / "pkg" / "lib"
    build_library(lib, "base", "libbase.so.1", value=1)
    build_library(lib, "user", "libuser.so.1", value=2, needed=("libbase.so.1",), rpath="$ORIGIN")
    # Uses memcpy -> needs a GLIBC version from libc.so.6.
    source = lib / ".newglibc.c"
    source.write_text("#include <string.h>\nvoid copy(char *d, const char *s, unsigned long n) { memcpy(d, s, n); }\n")
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O0",
            "-fno-builtin",
            "-o",
            str(lib / "libnewglibc.so.1"),
            str(source),
            "-Wl,-soname,libnewglibc.so.1",
        ],
        check=True,
        capture_output=True,
    )
    source.unlink()
    return root


def findings_by_rule(root: Path) -> dict[str, list]:
    inventory = build_inventory(resolve_roots([str(root)])[0])
    grouped: dict[str, list] = {}
    for finding in post_build_findings(inventory, LoaderModel()):
        grouped.setdefault(finding.rule, []).append(finding)
    return grouped


def loader_error(path: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1])", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stderr if done.returncode else ""


def test_clean_tree_has_no_post_build_finding(site):
    assert findings_by_rule(site) == {}
    assert loader_error(site / "pkg" / "lib" / "libuser.so.1") == ""


def test_a_library_built_for_a_newer_glibc_is_an_error_the_loader_agrees(site):
    target = site / "pkg" / "lib" / "libnewglibc.so.1"
    from rocm_audit.elf.versions import read_versions

    needed = sorted(read_versions(str(target)).needed["libc.so.6"])
    old = next(v for v in needed if v.startswith("GLIBC_2.")).encode()
    new = b"GLIBC_2." + b"9" * (len(old) - len(b"GLIBC_2."))
    require_newer_glibc(target, old, new)
    found = findings_by_rule(site)
    assert list(found) == ["POST001"]
    (finding,) = found["POST001"]
    assert finding.path == str(target) and new.decode() in finding.message
    assert finding.data["needed"] == "libc.so.6" and finding.data["missing"] == [new.decode()]
    assert "defines GLIBC up to 2." in finding.message
    assert f"version `{new.decode()}' not found" in loader_error(target)  # the real loader's verdict


def test_a_needed_library_that_no_search_path_finds(site):
    os.unlink(site / "pkg" / "lib" / "libbase.so.1")
    found = findings_by_rule(site)
    assert [(f.path, f.data["needed"]) for f in found["POST002"]] == [
        (str(site / "pkg" / "lib" / "libuser.so.1"), "libbase.so.1")
    ]
    assert "libbase.so.1: cannot open shared object file" in loader_error(site / "pkg" / "lib" / "libuser.so.1")


def test_extension_modules_must_match_their_interpreter_and_machine(site):
    lib = site / "pkg" / "lib" / "libbase.so.1"
    good = site / "pkg" / "_ok.cpython-311-x86_64-linux-gnu.so"
    wrong_python = site / "pkg" / "_old.cpython-312-x86_64-linux-gnu.so"
    wrong_machine = site / "pkg" / "_arm.cpython-311-aarch64-linux-gnu.so"
    for path in (good, wrong_python, wrong_machine):
        path.write_bytes(lib.read_bytes())
    found = findings_by_rule(site)
    paths = sorted(f.path for f in found["POST003"])
    assert paths == sorted([str(wrong_machine), str(wrong_python)])
    assert site_python(str(good)) == (3, 11)


def test_one_post002_per_library_names_every_missing_soname(site):
    user = site / "pkg" / "lib" / "libuser.so.1"
    missing = ["libgone_a.so.1", "libgone_b.so.2", "libgone_c.so.3"]
    subprocess.run(["patchelf", *(a for name in missing for a in ("--add-needed", name)), str(user)], check=True)
    os.unlink(site / "pkg" / "lib" / "libbase.so.1")
    (finding,) = findings_by_rule(site)["POST002"]
    assert finding.path == str(user)
    assert sorted(finding.data["missing_sonames"]) == sorted([*missing, "libbase.so.1"])
    assert finding.data["needed"] == finding.data["missing_sonames"][0]
    assert all(name in finding.message for name in finding.data["missing_sonames"])
    assert all(name in finding.message for name in [*missing, "libbase.so.1"])


# -- a library judged where its consumers load it (POST002) ---------------------------------------

_EXTENSION = "cpython-311-x86_64-linux-gnu.so"


def _wheel_libs(tmp_path: Path, consumers: dict[str, str]) -> Path:
    """auditwheel's shape: ``pkg.libs/libmid.so`` needs ``libdep.so`` beside it but has neither
    RPATH nor RUNPATH (scipy.libs' libgfortran and libquadmath); each consumer, an extension module
    of ``pkg``, needs libmid through ``$ORIGIN/../pkg.libs`` as DT_RPATH ("rpath") or DT_RUNPATH
    ("runpath"), directly or through ``libouter.so`` (``"rpath-outer"``), which has no path of
    its own either."""
    root = tmp_path / "lib" / "python3.11" / "site-packages"
    libs, pkg = root / "pkg.libs", root / "pkg"
    build_library(libs, "dep", "libdep.so", value=1)
    build_library(libs, "mid", "libmid.so", value=2, needed=("libdep.so",))
    if "rpath-outer" in consumers.values():
        build_library(libs, "outer", "libouter.so", value=3, needed=("libmid.so",))
    for index, (name, kind) in enumerate(sorted(consumers.items())):
        how = {"rpath": "rpath", "runpath": "runpath", "rpath-outer": "rpath"}[kind]
        needed = ("libouter.so",) if kind == "rpath-outer" else ("libmid.so",)
        built = build_library(
            pkg,
            name,
            f"{name}.{_EXTENSION}",
            value=10 + index,
            needed=needed,
            link_dir=libs,
            **{how: "$ORIGIN/../pkg.libs"},
        )
        assert built.is_file()
    return root


def _post002(root: Path) -> dict[str, object]:
    """POST002 by file name, judged with the load scopes of a real run (check's wiring)."""
    from rocm_audit.postbuild.symbols import Resolver

    inventory = build_inventory(resolve_roots([str(root)])[0])
    loader = LoaderModel()
    findings = post_build_findings(inventory, loader, Resolver(loader, None, inventory))
    return {os.path.basename(f.path): f for f in findings if f.rule == "POST002"}


@pytest.mark.parametrize(
    "consumers",
    [
        {"_fast": "rpath"},
        {"_fast": "rpath-outer"},
        {"_fast": "runpath"},
        {"_fast": "rpath", "_slow": "runpath"},
    ],
    ids=["rpath", "rpath-through-a-library", "runpath", "one-of-two"],
)
def test_a_library_without_paths_is_judged_where_its_consumers_load_it(tmp_path, consumers):
    """The verdict on libmid.so follows real RTLD_NOW loads of its consumers: a loader's DT_RPATH is
    searched for its dependencies too, a DT_RUNPATH is not (glibc dl-load.c; formats.md 4)."""
    root = _wheel_libs(tmp_path, consumers)
    failing = sorted(name for name in consumers if loader_error(root / "pkg" / f"{name}.{_EXTENSION}"))
    for name in failing:
        assert "libdep.so: cannot open shared object file" in loader_error(root / "pkg" / f"{name}.{_EXTENSION}")
    assert "libdep.so" in loader_error(root / "pkg.libs" / "libmid.so"), "alone, it does not load"
    reported = _post002(root)
    assert set(reported) <= {"libmid.so"}, reported  # its consumers find libmid, and libouter finds it
    assert bool(reported) == bool(failing), (failing, reported)
    if failing:
        finding = reported["libmid.so"]
        assert finding.data["missing_sonames"] == ["libdep.so"]
        named = [n for n in consumers if f"{n}.{_EXTENSION}" in finding.detail]
        assert named == failing, finding.detail  # the loads that fail, not the one that works


def test_without_the_load_scopes_every_library_is_judged_alone(tmp_path):
    root = _wheel_libs(tmp_path, {"_fast": "rpath"})
    inventory = build_inventory(resolve_roots([str(root)])[0])
    alone = {os.path.basename(f.path) for f in post_build_findings(inventory, LoaderModel()) if f.rule == "POST002"}
    assert alone == {"libmid.so"}


def test_a_load_the_model_cannot_follow_does_not_vouch_for_a_dependency(tmp_path):
    """The one consumer also needs a library the image holds but the audit did not extract: its
    load cannot be followed to the end, so libmid.so is judged alone (reported), as before."""
    from rocm_audit.postbuild.symbols import Resolver
    from rocm_audit.tree.loader import HostView

    root = tmp_path / "image"
    site = root / "usr" / "lib" / "python3" / "dist-packages"
    libs, pkg, elsewhere = site / "pkg.libs", site / "pkg", tmp_path / "built"
    build_library(libs, "dep", "libdep.so", value=1)
    build_library(libs, "mid", "libmid.so", value=2, needed=("libdep.so",))
    build_library(elsewhere, "ghost", "libghost.so", value=4)
    (libs / "libghost.so").symlink_to(elsewhere / "libghost.so")  # only for the link step below
    build_library(
        pkg,
        "_fast",
        f"_fast.{_EXTENSION}",
        value=3,
        needed=("libmid.so", "libghost.so"),
        link_dir=libs,
        rpath="$ORIGIN/../pkg.libs",
    )
    (libs / "libghost.so").unlink()
    (root / "usr" / "lib" / "x86_64-linux-gnu").mkdir(parents=True)
    system = root / "lib" / "x86_64-linux-gnu"  # the image's own C library (a default directory)
    system.mkdir(parents=True)
    for name in ("libc.so.6", "ld-linux-x86-64.so.2"):
        shutil.copy2(os.path.realpath(f"/lib/x86_64-linux-gnu/{name}"), system / name)
    inventory = build_inventory(resolve_roots([str(site)])[0])

    def reported(unextracted: frozenset[str]) -> set[str]:
        host = HostView(str(root), known_elf_keys=inventory.elf_keys(), unextracted=unextracted)
        loader = LoaderModel(sysroot=str(root), host=host)
        findings = post_build_findings(inventory, loader, Resolver(loader, None, inventory))
        return {os.path.basename(f.path) for f in findings if f.rule == "POST002"}

    # extracted nowhere: the consumer itself misses libghost.so, and its load still finds libdep.so
    assert reported(frozenset()) == {f"_fast.{_EXTENSION}"}
    # held by the image but not extracted: the consumer's load is unknown past it
    assert reported(frozenset({"/usr/lib/x86_64-linux-gnu/libghost.so"})) == {"libmid.so"}


def test_missing_libraries_of_whole_stacks_share_one_cause():
    """An image without a glibc base misses the C runtime in every extension: one cause, so the text
    report has one entry for every such file (and one for those missing ROCm's libraries too)."""
    from rocm_audit.postbuild.checks import software_stack

    assert software_stack(["libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2", "libstdc++.so.6"]) == "C runtime"
    assert software_stack(["libamdhip64.so.7", "libc.so.6", "libgcc_s.so.1"]) == "C runtime and ROCm"
    assert software_stack(["libamdhip64.so.7", "librocblas.so.5"]) == "ROCm"
    assert software_stack(["libc.so.6", "libtorch.so"]) is None  # a library of no known stack: its own entry
    assert software_stack(["libcrypto.so.3"]) is None and software_stack([]) is None
