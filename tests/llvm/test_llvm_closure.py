"""The load-closure model against glibc: each modelled case is also loaded for real in a probe."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rocm_audit.llvm.closure import HostView, ProcessModel, load_closure
from rocm_audit.llvm.probes import ProbeOutcome, probe_closure
from rocm_audit.tree.loader import LoaderModel
from support.llvm.llvm_builders import cc_shared

LEAF = "int leaf(void) { return 7; }\n"
MID = "int leaf(void); int mid(void) { return leaf(); }\n"
TOP = "int mid(void); int top(void) { return mid(); }\n"


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> dict[str, Path]:
    """top -> mid -> leaf in three directories; top names both directories, in RPATH or RUNPATH."""
    root = tmp_path_factory.mktemp("chain")
    leaf = cc_shared(root / "leafdir" / "libleaf.so", LEAF, "-Wl,-soname,libleaf.so")
    mid = cc_shared(root / "middir" / "libmid.so", MID, "-Wl,-soname,libmid.so", f"-L{leaf.parent}", "-lleaf")
    search = f"{mid.parent}:{leaf.parent}"
    top_rpath = cc_shared(
        root / "top" / "libtop-rpath.so",
        TOP,
        f"-L{mid.parent}",
        "-lmid",
        f"-Wl,--disable-new-dtags,-rpath,{search}",
        f"-Wl,-rpath-link,{leaf.parent}",
    )
    top_runpath = cc_shared(
        root / "top" / "libtop-runpath.so",
        TOP,
        f"-L{mid.parent}",
        "-lmid",
        f"-Wl,--enable-new-dtags,-rpath,{search}",
        f"-Wl,-rpath-link,{leaf.parent}",
    )
    return {"leaf": leaf, "mid": mid, "rpath": top_rpath, "runpath": top_runpath}


def test_rpath_is_inherited_by_dependencies(chain):
    closure = load_closure(LoaderModel(), str(chain["rpath"]))
    found = {Path(o.path).name: o for o in closure.objects}
    assert found["libmid.so"].via == "rpath"
    # libmid.so has no search path of its own: it finds libleaf.so through its loader's DT_RPATH.
    assert found["libleaf.so"].via == "rpath" and found["libleaf.so"].needed_by == str(chain["mid"])
    assert [o.depth for o in closure.objects][:3] == [0, 1, 2]
    assert probe_closure(str(chain["rpath"]), "local").outcome is ProbeOutcome.CLEAN


def test_runpath_is_not_inherited(chain):
    closure = load_closure(LoaderModel(), str(chain["runpath"]))
    assert [(m.needed_by, m.name) for m in closure.missing] == [(str(chain["mid"]), "libleaf.so")]
    real = probe_closure(str(chain["runpath"]), "local")
    assert real.outcome is ProbeOutcome.LOAD_ERROR and "libleaf.so" in real.detail


def test_ld_library_path_is_searched_before_runpath(chain, tmp_path):
    shadow = cc_shared(tmp_path / "shadow" / "libleaf.so", LEAF, "-Wl,-soname,libleaf.so")
    model = LoaderModel(ld_library_path=(str(shadow.parent),))
    closure = load_closure(model, str(chain["runpath"]))
    assert not closure.missing
    leaf = next(o for o in closure.objects if o.request == "libleaf.so")
    assert (leaf.path, leaf.via) == (str(shadow), "ld_library_path")


def test_a_non_elf_file_on_the_search_path_stops_the_search(tmp_path):
    """glibc gives up at an existing non-ELF file ("invalid ELF header"); so does the model."""
    good = cc_shared(tmp_path / "second" / "libleaf.so", LEAF, "-Wl,-soname,libleaf.so")
    (tmp_path / "first").mkdir()
    (tmp_path / "first" / "libleaf.so").write_bytes(b"\0" * 128)
    top = cc_shared(
        tmp_path / "app" / "libtop.so",
        "int leaf(void); int top(void) { return leaf(); }\n",
        f"-L{good.parent}",
        "-lleaf",
        f"-Wl,--enable-new-dtags,-rpath,{tmp_path}/first:{good.parent}",
    )
    closure = load_closure(LoaderModel(), str(top))
    assert [m.detail for m in closure.missing] == [f"not an ELF file: {tmp_path}/first/libleaf.so"]
    assert probe_closure(str(top), "local").outcome is ProbeOutcome.LOAD_ERROR


def test_origin_is_the_directory_of_the_symlink_not_of_its_target(tmp_path):
    """formats.md 4: devel/lib/liba.so -> core/lib/liba.so, RUNPATH $ORIGIN, finds devel's libb."""
    libb = cc_shared(tmp_path / "devel" / "lib" / "libb.so", "int b(void) { return 2; }\n", "-Wl,-soname,libb.so")
    liba = cc_shared(
        tmp_path / "core" / "lib" / "liba.so",
        "int b(void); int a(void) { return b(); }\n",
        f"-L{libb.parent}",
        "-lb",
        "-Wl,--enable-new-dtags,-rpath,$ORIGIN",
    )
    link = tmp_path / "devel" / "lib" / "liba.so"
    link.symlink_to(os.path.relpath(liba, link.parent))
    via_link = load_closure(LoaderModel(), str(link))
    assert not via_link.missing and str(libb) in via_link.paths()
    assert load_closure(LoaderModel(), str(liba)).missing  # from core/lib, libb.so is not found
    assert probe_closure(str(link), "local").outcome is ProbeOutcome.CLEAN
    assert probe_closure(str(liba), "local").outcome is ProbeOutcome.LOAD_ERROR


def test_hardlinks_and_symlinks_are_one_object_and_soname_matches_reuse(same_inode, runpath_closures):
    process = ProcessModel(LoaderModel())
    first = process.dlopen(str(same_inode.paths["core"]))
    for alias in ("hardlink", "symlink"):
        again = process.dlopen(str(same_inode.paths[alias]))
        assert again.objects[0].reused and again.objects[0].identity == first.objects[0].identity
        assert again.objects[0].path == str(same_inode.paths["core"])
    # libtwo.so needs "libLLVM-15.so.1": the SONAME of the copy already mapped, so that copy is
    # reused even though libtwo's RUNPATH holds another inode of that name (formats.md 4, step 1).
    two = process.dlopen(str(runpath_closures.paths["two"]))
    llvm15 = next(o for o in two.objects if o.request == "libLLVM-15.so.1")
    assert llvm15.reused and llvm15.path == str(same_inode.paths["core"]) and llvm15.via == "loaded"
    fresh = load_closure(LoaderModel(), str(runpath_closures.paths["two"]))
    assert next(o for o in fresh.objects if o.request == "libLLVM-15.so.1").path == str(runpath_closures.paths["v15"])


def test_a_second_file_name_for_one_soname_is_a_second_object(runpath_closures):
    closure = load_closure(LoaderModel(), str(runpath_closures.paths["copies"]))
    llvms = [o for o in closure.objects if o.soname == "libLLVM-15.so.1"]
    assert [o.request for o in llvms] == ["libLLVM-15.so.1", "libLLVM-15-bis.so.1"]
    assert len({o.identity for o in llvms}) == 2 and all(o.via == "runpath" for o in llvms)


def test_sysroot_keeps_absolute_links_and_ld_so_conf_inside_the_root(tmp_path):
    root = tmp_path / "image"
    (root / "etc" / "ld.so.conf.d").mkdir(parents=True)
    (root / "etc" / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "etc" / "ld.so.conf.d" / "opt.conf").write_text("# vendor libraries\n/opt/vendor/lib\n")
    real = cc_shared(root / "opt" / "real" / "libleaf.so.1", LEAF, "-Wl,-soname,libleaf.so.1")
    (root / "opt" / "vendor" / "lib").mkdir(parents=True)
    # An absolute link means /opt/real inside the image; on this host that path does not exist.
    (root / "opt" / "vendor" / "lib" / "libleaf.so.1").symlink_to("/opt/real/libleaf.so.1")
    top = cc_shared(
        root / "app" / "libtop.so",
        "int leaf(void); int top(void) { return leaf(); }\n",
        f"-L{real.parent}",
        "-l:libleaf.so.1",
    )
    model = LoaderModel(sysroot=str(root))
    closure = load_closure(model, str(top), host=HostView(str(root)))
    leaf = next(o for o in closure.objects if o.request == "libleaf.so.1")
    assert leaf.via == "ld.so.conf" and leaf.path == str(root / "opt" / "vendor" / "lib" / "libleaf.so.1")
    assert leaf.identity == (os.stat(real).st_dev, os.stat(real).st_ino)
    assert HostView(str(root)).realpath(leaf.path) == str(real)


def test_rpath_inheritance_skips_a_runpath_loader_and_goes_on_up(tmp_path):
    """A (RPATH B:X) -> B (RUNPATH C) -> C -> D in X: glibc finds D through A's RPATH."""
    d = cc_shared(tmp_path / "X" / "libd.so", "int d(void) { return 4; }\n")
    c = cc_shared(
        tmp_path / "C" / "libc_.so",
        "int d(void); int c(void) { return d(); }\n",
        f"-L{d.parent}",
        "-ld",
    )
    b = cc_shared(
        tmp_path / "B" / "libb.so",
        "int c(void); int b(void) { return c(); }\n",
        f"-L{c.parent}",
        "-l:libc_.so",
        f"-Wl,--enable-new-dtags,-rpath,{c.parent}",
        f"-Wl,-rpath-link,{d.parent}",
    )
    a = cc_shared(
        tmp_path / "A" / "liba.so",
        "int b(void); int a(void) { return b(); }\n",
        f"-L{b.parent}",
        "-lb",
        f"-Wl,--disable-new-dtags,-rpath,{b.parent}:{d.parent}",
        f"-Wl,-rpath-link,{c.parent}:{d.parent}",
    )
    closure = load_closure(LoaderModel(), str(a))
    assert not closure.missing
    found = next(o for o in closure.objects if o.request == "libd.so")
    assert (found.path, found.via, found.needed_by) == (str(d), "rpath", str(c))
    assert probe_closure(str(a), "local").outcome is ProbeOutcome.CLEAN
