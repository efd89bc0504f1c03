"""One DT_NEEDED search for every user: post-build checks, dedup's verification and the closure model.

Under a sysroot (an unpacked image audited from outside), a library directory may hold an absolute
symlink (`libbase.so.1 -> /opt/real/libbase.so.1.0`). Inside the image it resolves to the image's
file; on the auditing host the same absolute path may name another file or nothing. Every user of
the search must resolve it into the sysroot, and none may ever find a host file instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rocm_audit.llvm.closure import load_closure
from rocm_audit.postbuild.checks import post_build_findings
from rocm_audit.tree.discovery import resolve_roots
from rocm_audit.tree.inventory import build_inventory, read_dynamic_info
from rocm_audit.tree.loader import RELATIVE_NEEDED, LoaderModel
from support.sdk_tree import build_library


@pytest.fixture()
def image_root(tmp_path) -> Path:
    """An image root: /opt/app/lib/libuser.so.1 needs libbase.so.1 (RUNPATH $ORIGIN), and
    /opt/app/lib/libbase.so.1 is an absolute link to /opt/real/libbase.so.1.0 inside the image."""
    root = tmp_path / "root"
    real_dir = root / "opt" / "real"
    base = build_library(real_dir, "base", "libbase.so.1", value=5)
    lib = root / "opt" / "app" / "lib"
    build_library(lib, "user", "libuser.so.1", needed=("libbase.so.1",), runpath="$ORIGIN", link_dir=real_dir)
    # gcc linked against the file under its SONAME name; inside the image it is reached by the link only.
    os.rename(base, real_dir / "libbase.so.1.0")
    os.symlink("/opt/real/libbase.so.1.0", lib / "libbase.so.1")
    system = root / "lib" / "x86_64-linux-gnu"  # the image's own C library (a default directory)
    system.mkdir(parents=True)
    for name in ("libc.so.6", "ld-linux-x86-64.so.2"):
        shutil.copy2(os.path.realpath(f"/lib/x86_64-linux-gnu/{name}"), system / name)
    return root


def _verdicts(root: Path) -> dict[str, object]:
    """What each user of the search says about libuser's DT_NEEDED libbase.so.1."""
    user = root / "opt" / "app" / "lib" / "libuser.so.1"
    loader = LoaderModel(sysroot=str(root))
    resolution = loader.resolve("libbase.so.1", str(user), read_dynamic_info(str(user)))
    inventory = build_inventory(resolve_roots([str(root / "opt" / "app")])[0])
    post_build = [f for f in post_build_findings(inventory, loader) if f.rule == "POST002"]
    closure = load_closure(loader, str(user))
    return {
        "resolve": resolution.path,
        "post_build_missing": [f.path for f in post_build],
        "closure": [o.path for o in closure.objects],
        "closure_missing": [m.name for m in closure.missing],
    }


def test_an_absolute_link_inside_the_sysroot_resolves_into_it(image_root):
    link = str(image_root / "opt" / "app" / "lib" / "libbase.so.1")
    assert not os.path.exists("/opt/real/libbase.so.1.0"), "the host must not hold the image's file"
    verdicts = _verdicts(image_root)
    assert verdicts == {
        "resolve": link,
        "post_build_missing": [],
        "closure": [
            str(image_root / "opt" / "app" / "lib" / "libuser.so.1"),
            link,
            str(image_root / "lib" / "x86_64-linux-gnu" / "libc.so.6"),
            str(image_root / "lib" / "x86_64-linux-gnu" / "ld-linux-x86-64.so.2"),
        ],
        "closure_missing": [],
    }


def test_a_host_file_at_the_link_target_is_never_found(image_root, tmp_path):
    """The link's target exists on the host (a decoy) but not in the image: every user says missing."""
    host_dir = Path("/opt/real")
    if host_dir.exists():
        pytest.fail("/opt/real exists on this host; the test needs to own that path")
    host_dir.mkdir(parents=True)
    try:
        shutil.copy2(build_library(tmp_path / "decoy", "base", "libbase.so.1"), host_dir / "libbase.so.1.0")
        os.unlink(image_root / "opt" / "real" / "libbase.so.1.0")
        verdicts = _verdicts(image_root)
        user = str(image_root / "opt" / "app" / "lib" / "libuser.so.1")
        system = image_root / "lib" / "x86_64-linux-gnu"
        libc, ld_so = str(system / "libc.so.6"), str(system / "ld-linux-x86-64.so.2")
        assert verdicts == {
            "resolve": None,
            "post_build_missing": [user],
            "closure": [user, libc, ld_so],
            "closure_missing": ["libbase.so.1"],
        }
    finally:
        shutil.rmtree(host_dir)


def test_dedup_verification_resolves_through_the_same_search(image_root):
    """dedup's before/after DT_NEEDED snapshot uses LoaderModel.resolve_all: the same answer."""
    user = image_root / "opt" / "app" / "lib" / "libuser.so.1"
    loader = LoaderModel(sysroot=str(image_root))
    resolved = loader.resolve_all(str(user), read_dynamic_info(str(user)))
    assert {n: r.path for n, r in resolved.items()} == {
        "libbase.so.1": str(user.parent / "libbase.so.1"),
        "libc.so.6": str(image_root / "lib" / "x86_64-linux-gnu" / "libc.so.6"),
    }


def _gcc_library(output: Path, soname: str, *link: Path) -> Path:
    """A gcc library whose SONAME is not its file name (``$ORIGIN/libbase.so``, ``sub/libsub.so``),
    linked against ``link`` by path: what support.sdk_tree.build_library, which names the file after
    the SONAME, cannot make."""
    source = output.parent / f".{output.name}.c"
    output.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(f"int value_{output.stem.replace('-', '_')}(void) {{ return 7; }}\n")
    argv = ["gcc", "-shared", "-fPIC", "-o", str(output), str(source), f"-Wl,-soname,{soname}", "-Wl,--no-as-needed"]
    subprocess.run(argv + [str(p) for p in link], check=True)
    return output


_DLOPEN = """
import ctypes, sys
try:
    ctypes.CDLL(sys.argv[1])
    print("loaded")
except OSError as error:
    print(error)
"""


def test_a_needed_name_with_a_slash_is_opened_as_glibc_opens_it(tmp_path):
    """glibc opens a DT_NEEDED name holding a '/' as given, after expanding $ORIGIN in it
    (dl-load.c _dl_map_object): ``$ORIGIN/libbase.so`` is found beside the requester, while
    ``sub/libsub.so`` is relative to the process's working directory, not to the requester."""
    lib = tmp_path / "lib"
    base = _gcc_library(lib / "libbase.so", "$ORIGIN/libbase.so")
    sub = _gcc_library(lib / "sub" / "libsub.so", "sub/libsub.so")
    by_origin = _gcc_library(lib / "libuser.so", "libuser.so", base)
    by_cwd = _gcc_library(lib / "libuser2.so", "libuser2.so", sub)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def real(path: Path, cwd: Path) -> str:
        done = subprocess.run([sys.executable, "-c", _DLOPEN, str(path)], cwd=cwd, capture_output=True, text=True)
        return done.stdout.strip()

    assert real(by_origin, elsewhere) == "loaded"
    assert "sub/libsub.so" in real(by_cwd, elsewhere) and real(by_cwd, lib) == "loaded"
    loader = LoaderModel()
    closure = load_closure(loader, str(by_origin))
    assert str(base) in closure.paths() and not closure.missing
    closure = load_closure(loader, str(by_cwd))
    assert str(sub) not in closure.paths()
    assert [(m.name, m.detail) for m in closure.missing] == [("sub/libsub.so", RELATIVE_NEEDED)]
    resolution = loader.resolve("$ORIGIN/libbase.so", str(by_origin), read_dynamic_info(str(by_origin)))
    assert resolution.path == str(base)
