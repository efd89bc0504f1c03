"""`rocm-audit image --archive` without a daemon: layer semantics and hostile input.

Hand-built layers (layer_writers.py) cover what no build tool writes: whiteouts in both orders,
the misspelled opaque marker, absolute names, '..', links out of the root, devices, huge headers,
truncation, bad JSON and limits. Every bad input must end as a finding with a file and an offset,
never a traceback, and nothing may be written outside the private extraction directory.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from rocm_audit.image import merge
from rocm_audit.image.audit import ImageOptions, extract_archive, new_state
from support.image.layer_writers import docker_save, layer, member, oci_layout, tar_directory
from support.sdk_tree import build_library

SP = "usr/lib/python3/dist-packages"


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> dict[str, bytes]:
    """Real gcc shared libraries (dedup only acts on ELF ET_DYN files)."""
    out = tmp_path_factory.mktemp("libs")
    one = build_library(out, "comgr", "libamd_comgr.so.3", payload=os.urandom(80_000))
    two = build_library(out, "other", "libother.so.1", value=2)
    return {"comgr": one.read_bytes(), "other": two.read_bytes()}


def merged(tmp_path: Path, archive: Path) -> tuple[merge.MergeState, Path]:
    work = tmp_path / "work"
    work.mkdir()
    state = new_state(str(work), ImageOptions(full=True))
    extract_archive(str(archive), str(work), state)
    merge.finish(state)
    return state, Path(state.root)


def rules(report: dict) -> set[str]:
    return {f["rule"] for f in report["findings"]}


def sdk_layers(libs: dict[str, bytes]) -> list[bytes]:
    """Layer 0: core; layer 1: the devel copy (a split hardlink); layer 2: include files."""
    core = layer(
        (f"{SP}/", None),
        (f"{SP}/_rocm_sdk_core/", None),
        (f"{SP}/_rocm_sdk_core/lib/", None),
        (f"{SP}/_rocm_sdk_core/lib/libamd_comgr.so.3", libs["comgr"]),
    )
    devel = layer(
        (f"{SP}/_rocm_sdk_devel/lib/libamd_comgr.so.3", libs["comgr"]),
        (f"{SP}/_rocm_sdk_devel/include/hip/a.h", b"a" * 10),
        (f"{SP}/_rocm_sdk_devel/include/hip/b.h", b"b" * 10),
    )
    return [core, devel]


def test_docker_save_split_copies_are_reported_with_their_layers(tmp_path, run_cli, libs):
    archive = docker_save(tmp_path / "save.tar", sdk_layers(libs), env=["GPU_ARCH=gfx942"])
    result = run_cli("image", "--archive", str(archive), "--format", "json", expect=1)
    report = result.report
    assert report["command"] == "image"
    dup = [f for f in report["findings"] if f["rule"] == "DUP001"]
    assert dup and all(f["path"].startswith(f"/{SP}/") for f in dup), dup
    assert not any(str(tmp_path) in json.dumps(f) for f in report["findings"])
    assert report["targets"] == [{"target": "gfx942", "agent": report["targets"][0]["agent"]}]
    waste = report["image"]["waste"]
    group = next(g for g in waste["groups"] if g["copies"][0]["path"].endswith("libamd_comgr.so.3"))
    assert group["scope"] == "cross-layer" and group["layers"] == [0, 1]
    assert [c["layer"] for c in group["copies"]] == [0, 1]
    assert waste["later_run_dedup_shrinks_image"] is False
    assert waste["cross_layer_bytes"] >= len(libs["comgr"])
    assert "IMG008" in rules(report)


def test_hardlink_into_site_packages_from_a_file_not_extracted(tmp_path, run_cli, libs):
    # The layer stores the bytes first under /opt (streamed past in the default mode) and links
    # the SDK's name to them: the second reading of the layer fills the link, so the split copy
    # of the next layer is found; a link to a name the layer holds no file at is refused.
    core = layer(
        ("opt/stage/libamd_comgr.so.3", libs["comgr"]),
        member(f"{SP}/_rocm_sdk_core/lib/libamd_comgr.so.3", kind=tarfile.LNKTYPE, link="opt/stage/libamd_comgr.so.3"),
        member(f"{SP}/_rocm_sdk_core/lib/libamd_comgr.so", kind=tarfile.LNKTYPE, link="/opt/stage/libamd_comgr.so.3"),
        member(f"{SP}/_rocm_sdk_core/lib/libghost.so", kind=tarfile.LNKTYPE, link="opt/stage/none.so"),
    )
    devel = layer((f"{SP}/_rocm_sdk_devel/lib/libamd_comgr.so.3", libs["comgr"]))
    archive = docker_save(tmp_path / "save.tar", [core, devel])
    report = run_cli("image", "--archive", str(archive), "--format", "json", expect=1).report
    dup = [f for f in report["findings"] if f["rule"] == "DUP001"]
    assert {p for f in dup for p in (f["path"], *f["related_paths"])} >= {
        f"/{SP}/_rocm_sdk_core/lib/libamd_comgr.so.3",
        f"/{SP}/_rocm_sdk_devel/lib/libamd_comgr.so.3",
    }
    ghost = hostile_finding(report, "IMG002", "libghost.so")
    assert "none.so" in ghost["message"] and ghost["data"]["layer"] == 0 and ghost["data"]["offset"] > 0
    assert [f["path"] for f in report["findings"] if f["rule"] == "IMG002"] == [ghost["path"]]
    work = tmp_path / "work"
    work.mkdir()
    state = new_state(str(work), ImageOptions())
    extract_archive(str(archive), str(work), state)
    lib = Path(state.root, SP, "_rocm_sdk_core/lib")
    assert (lib / "libamd_comgr.so.3").read_bytes() == libs["comgr"]
    assert os.path.samefile(lib / "libamd_comgr.so.3", lib / "libamd_comgr.so")
    assert not (lib / "libghost.so").exists()
    assert not Path(state.root, "opt/stage/libamd_comgr.so.3").exists()  # streamed past, as before


@pytest.mark.parametrize("source", ["stored", "absent"])
def test_a_link_waiting_for_its_bytes_then_replaced_in_its_layer_leaves_the_replacement(tmp_path, libs, source):
    # The last member of a name wins (as the engine extracts). The file that replaces a link
    # waiting for the second reading may get the waiting placeholder's freed inode number (ext4
    # reuses it at once): it must keep its own bytes, and no refusal of the link may remove it.
    lib = f"{SP}/_rocm_sdk_core/lib"
    stage = [("opt/stage/libamd_comgr.so.3", libs["comgr"])] if source == "stored" else []
    core = layer(
        *stage,
        member(f"{lib}/libamd_comgr.so.3", kind=tarfile.LNKTYPE, link="opt/stage/libamd_comgr.so.3"),
        (f"{lib}/libamd_comgr.so.3", libs["other"]),
        member(f"{lib}/libghost.so.1", kind=tarfile.LNKTYPE, link="opt/stage/none.so"),
        member(f"{lib}/libghost.so", kind=tarfile.LNKTYPE, link="opt/stage/none.so"),
    )
    work = tmp_path / "work"
    work.mkdir()
    state = new_state(str(work), ImageOptions())
    extract_archive(str(docker_save(tmp_path / "save.tar", [core])), str(work), state)
    assert Path(state.root, lib, "libamd_comgr.so.3").read_bytes() == libs["other"]
    # A link to no file fails the layer in the engine: refused (a finding), whatever replaced it.
    assert [f.rule for f in state.findings] == ["IMG002"] * (1 if source == "stored" else 2)
    assert not any(Path(state.root, lib).glob("libghost*")), "every link to no file is taken away"


@pytest.mark.parametrize("full", [False, True], ids=["default", "full"])
def test_libraries_outside_the_extracted_directories_still_resolve(tmp_path, run_cli, full):
    # A site-packages library with RUNPATH /opt/vendor/lib: the default mode does not write /opt,
    # but the loader model knows what the image holds there (a link and the file it names), so
    # only the library the image really lacks is POST002, and a whiteout takes one away again.
    build = tmp_path / "build"
    vendor = build_library(build, "vendor", "libvendor.so.1")
    other = build_library(build, "other", "libother.so.2")
    build_library(build, "missing", "libmissing.so.7")
    user = build_library(
        build / "user",
        "user",
        "libuser.so",
        needed=("libvendor.so.1", "libother.so.2", "libmissing.so.7"),
        runpath="/opt/vendor/lib",
        link_dir=build,
    )
    lower = layer(
        ("opt/vendor/lib/libvendor.so.1.0.0", vendor.read_bytes()),
        member("opt/vendor/lib/libvendor.so.1", kind=tarfile.SYMTYPE, link="libvendor.so.1.0.0"),
        ("opt/vendor/lib/libother.so.2", other.read_bytes()),
        (f"{SP}/pkg/libuser.so", user.read_bytes()),
    )
    upper = layer(("opt/vendor/lib/.wh.libother.so.2", b""))
    for name, layers in (("two", [lower]), ("whited-out", [lower, upper])):
        archive = docker_save(tmp_path / f"{name}.tar", layers)
        args = ["image", "--archive", str(archive), "--format", "json", *(["--full"] if full else [])]
        report = run_cli(*args, expect=0).report  # POST002 is a warning
        # The image has no libc either: the loader model says so, as for any other library.
        missing = [f["data"]["missing_sonames"] for f in report["findings"] if f["rule"] == "POST002"]
        if name == "two":
            assert missing == [["libmissing.so.7", "libc.so.6"]]
        else:
            assert missing == [["libother.so.2", "libmissing.so.7", "libc.so.6"]]


def test_same_layer_duplicates_say_dedup_belongs_in_that_step(tmp_path, run_cli, libs):
    one = layer(
        (f"{SP}/_rocm_sdk_core/lib/libamd_comgr.so.3", libs["comgr"]),
        (f"{SP}/_rocm_sdk_devel/lib/libamd_comgr.so.3", libs["comgr"]),
    )
    archive = docker_save(tmp_path / "save.tar", [one])
    report = run_cli("image", "--archive", str(archive), "--format", "json", expect=1).report
    finding = next(f for f in report["findings"] if f["rule"] == "IMG007")
    assert "in the step that writes this layer" in finding["message"]
    assert report["image"]["waste"]["same_layer_bytes"] == len(libs["comgr"])
    # One layer: the text has no layer to tell apart, so it names none.
    text = run_cli("image", "--archive", str(archive), expect=1).stdout
    said = " ".join(text.split())
    assert "in identical copies; a later RUN frees none of it" in said and "(layer 0" not in said


def test_same_layer_duplicates_name_the_step_that_wrote_the_layer(tmp_path, run_cli, libs):
    """IMG007 tells which Dockerfile step to add dedup to: the history's step, clipped; without a
    history that maps one step to each layer, the layer's digest as before."""
    staging = layer(("tmp/stage/README", b"staged"))
    install = layer(
        (f"{SP}/_rocm_sdk_core/lib/libamd_comgr.so.3", libs["comgr"]),
        (f"{SP}/_rocm_sdk_devel/lib/libamd_comgr.so.3", libs["comgr"]),
    )
    script = "pip install rocm[libraries,devel] && " + " && ".join(f"step{i}" for i in range(40))
    history = [
        "/bin/sh -c #(nop) ADD file:abc in / ",
        {"created_by": "ARG GPU_ARCH=gfx942", "empty_layer": True},
        f"RUN |1 GPU_ARCH=gfx942 /bin/sh -c {script} # buildkit",
    ]
    named = docker_save(tmp_path / "named.tar", [staging, install], history=history)
    finding = next(
        f
        for f in run_cli("image", "--archive", str(named), "--format", "json", expect=1).report["findings"]
        if f["rule"] == "IMG007"
    )
    step = "RUN " + script
    assert f"in layer 1 ({step[:57]}...): " in finding["message"]
    # Two steps that made a layer for three layers' worth of history: no step is named.
    unnamed = docker_save(tmp_path / "unnamed.tar", [staging, install], history=[*history, "RUN /bin/sh -c true"])
    report = run_cli("image", "--archive", str(unnamed), "--format", "json", expect=1).report
    finding = next(f for f in report["findings"] if f["rule"] == "IMG007")
    name = report["image"]["layers"][1]["name"]  # the layer's diff ID, from the config
    assert name.startswith("sha256:") and f"in layer 1 ({name[:19]}): " in finding["message"]
    assert "pip install" not in finding["message"]
    assert not any("step" in row for row in report["image"]["layers"])


def test_group_in_two_layers_with_two_copies_in_one_says_which_part_a_step_frees(tmp_path, run_cli, libs):
    # A staging copy in layer 0, core and devel copies in layer 1: dedup in layer 1's step frees one
    # copy (IMG007 for that layer), the staging copy is a cross-layer copy no step frees (IMG008).
    size = len(libs["comgr"])
    staging = layer(("tmp/stage/libamd_comgr.so.3", libs["comgr"]))
    install = layer(
        (f"{SP}/_rocm_sdk_core/lib/libamd_comgr.so.3", libs["comgr"]),
        (f"{SP}/_rocm_sdk_devel/lib/libamd_comgr.so.3", libs["comgr"]),
    )
    archive = docker_save(tmp_path / "save.tar", [staging, install])
    report = run_cli("image", "--archive", str(archive), "--format", "json", expect=1).report
    within = [f for f in report["findings"] if f["rule"] == "IMG007"]
    across = [f for f in report["findings"] if f["rule"] == "IMG008"]
    assert len(within) == 1 and within[0]["data"]["layers"] == [1] and within[0]["data"]["wasted_bytes"] == size
    assert {within[0]["path"], *within[0]["related_paths"]} == {
        f"/{SP}/_rocm_sdk_core/lib/libamd_comgr.so.3",
        f"/{SP}/_rocm_sdk_devel/lib/libamd_comgr.so.3",
    }
    assert len(across) == 1 and across[0]["data"]["layers"] == [0, 1] and across[0]["data"]["wasted_bytes"] == size
    waste = report["image"]["waste"]
    assert (waste["same_layer_bytes"], waste["cross_layer_bytes"]) == (size, size)
    group = next(g for g in waste["groups"] if g["size"] == size)
    assert group["wasted_bytes"] == 2 * size and group["fix"].startswith(
        "run rocm-audit dedup in the step that writes layer 1"
    )


def test_whiteout_deletes_lower_copy_but_its_bytes_still_count(tmp_path, run_cli, libs):
    layers = sdk_layers(libs) + [layer((f"{SP}/_rocm_sdk_devel/lib/.wh.libamd_comgr.so.3", b""))]
    archive = docker_save(tmp_path / "save.tar", layers)
    state, root = merged(tmp_path, archive)
    assert not (root / SP / "_rocm_sdk_devel/lib/libamd_comgr.so.3").exists()
    assert (root / SP / "_rocm_sdk_core/lib/libamd_comgr.so.3").read_bytes() == libs["comgr"]
    report = run_cli("image", "--archive", str(archive), "--format", "json").report
    assert "DUP001" not in rules(report)
    group = next(g for g in report["image"]["waste"]["groups"] if g["size"] == len(libs["comgr"]))
    assert [c["visible"] for c in group["copies"]] == [True, False]
    assert report["image"]["layers"][2]["whiteouts"] == 1


@pytest.mark.parametrize("marker_first", [True, False])
def test_opaque_directory_hides_lower_entries_only(tmp_path, libs, marker_first):
    new = (f"{SP}/_rocm_sdk_devel/include/hip/new.h", b"new")
    marker = (f"{SP}/_rocm_sdk_devel/include/.wh..wh..opq", b"")
    top = layer(*(marker, new) if marker_first else (new, marker))
    state, root = merged(tmp_path, docker_save(tmp_path / "save.tar", sdk_layers(libs) + [top]))
    include = root / SP / "_rocm_sdk_devel/include"
    assert sorted(str(p.relative_to(include)) for p in include.rglob("*")) == ["hip", "hip/new.h"]
    assert state.layers[2].opaque_dirs == 1


def test_misspelled_opaque_marker_hides_nothing_and_is_reported(tmp_path, run_cli, libs):
    top = layer((f"{SP}/_rocm_sdk_devel/include/.wh..wh.opq", b""))
    archive = docker_save(tmp_path / "save.tar", sdk_layers(libs) + [top])
    state, root = merged(tmp_path, archive)
    assert (root / SP / "_rocm_sdk_devel/include/hip/a.h").exists()
    report = run_cli("image", "--archive", str(archive), "--format", "json").report
    finding = next(f for f in report["findings"] if f["rule"] == "IMG006")
    assert finding["data"]["layer"] == 2 and isinstance(finding["data"]["offset"], int)


def test_same_layer_whiteout_does_not_hide_its_own_file(tmp_path, libs):
    top = layer((f"{SP}/x/new.txt", b"kept"), (f"{SP}/x/.wh.new.txt", b""), (f"{SP}/x/.wh.gone", b""))
    base = layer((f"{SP}/x/gone", b"lower"))
    state, root = merged(tmp_path, docker_save(tmp_path / "save.tar", [base, top]))
    assert (root / SP / "x/new.txt").read_bytes() == b"kept"
    assert not (root / SP / "x/gone").exists()


def test_type_change_and_replacement_follow_the_upper_layer(tmp_path):
    lower = layer(("a/", None), ("a/child", b"1"), ("f", b"file"))
    upper = layer(("a", b"now a file"), ("f/", None), ("f/inside", b"2"))
    state, root = merged(tmp_path, docker_save(tmp_path / "save.tar", [lower, upper]))
    assert (root / "a").read_bytes() == b"now a file"
    assert (root / "f" / "inside").read_bytes() == b"2"


def test_oci_layout_directory_and_archive_give_the_same_report(tmp_path, run_cli, libs):
    layout = oci_layout(tmp_path / "oci", sdk_layers(libs), ref="v1")
    from_dir = run_cli("image", "--archive", str(layout), "--format", "json", expect=1).report
    packed = tar_directory(layout, tmp_path / "oci.tar")
    from_tar = run_cli("image", "--archive", str(packed), "--format", "json", expect=1).report
    assert from_dir["image"]["source"]["format"] == "oci-layout"

    def key(report):
        return sorted((f["rule"], f["path"]) for f in report["findings"])

    assert key(from_dir) == key(from_tar)
    assert "DUP001" in rules(from_dir)


def test_compressed_docker_save_is_read(tmp_path, run_cli, libs):
    plain = docker_save(tmp_path / "save.tar", sdk_layers(libs))
    packed = tmp_path / "save.tar.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes(), compresslevel=1))
    report = run_cli("image", "--archive", str(packed), "--format", "json", expect=1).report
    assert "DUP001" in rules(report)


# --- hostile input -------------------------------------------------------------------------------


def hostile_finding(report: dict, rule: str, needle: str) -> dict:
    hits = [f for f in report["findings"] if f["rule"] == rule and needle in f["path"] + f["message"]]
    assert hits, (rule, needle, [(f["rule"], f["path"], f["message"]) for f in report["findings"]])
    return hits[0]


def test_unsafe_entries_are_refused_with_layer_and_offset(tmp_path, run_cli):
    outside = tmp_path / "outside"
    outside.mkdir()
    evil = layer(
        ("ok/", None),
        (f"/{outside}/abs.txt".replace("//", "/"), b"x"),
        ("ok/../../../escape.txt", b"x"),
        member("ok/up", kind=tarfile.SYMTYPE, link="../../../../.."),
        member("ok/abs-link", kind=tarfile.SYMTYPE, link="/usr/lib"),
        member("ok/hard", kind=tarfile.LNKTYPE, link="../etc/passwd"),
        member("ok/dev", kind=tarfile.CHRTYPE),
        member("ok/fifo", kind=tarfile.FIFOTYPE),
        member("link-to-outside", kind=tarfile.SYMTYPE, link=str(outside)),
    )
    through = layer(("link-to-outside/planted.txt", b"written in the image, never outside it"))
    archive = docker_save(tmp_path / "save.tar", [evil, through])
    report = run_cli("image", "--archive", str(archive), "--format", "json").report
    # What the engine refuses (a relative name or hardlink that climbs above the root) is refused.
    for needle in ("escape.txt", "ok/hard"):
        finding = hostile_finding(report, "IMG002", needle)
        assert isinstance(finding["data"].get("offset", 0), int)
    # What it accepts is placed as it places it, inside the root.
    for needle in ("abs.txt", "ok/up", "planted.txt"):
        assert not [f for f in report["findings"] if f["rule"] == "IMG002" and needle in f["path"]]
    devices = hostile_finding(report, "IMG003", "ok/dev")
    assert devices["data"]["paths"] == ["/ok/dev", "/ok/fifo"] and devices["data"]["type"] == "3"
    # The image path, the layer in words and data: no archive member (a digest) in a location.
    assert (devices["path"], devices["message"]) == ("/ok/dev", "layer 0: 2 device nodes or FIFOs not extracted")
    assert devices["related_paths"] == ["/ok/fifo"] and devices["data"]["layer"] == 0
    assert list(outside.iterdir()) == []
    state, root = merged(tmp_path, archive)
    real_root = os.path.realpath(root)
    assert (root / str(outside).lstrip("/") / "abs.txt").read_bytes() == b"x"  # a rooted name: from the root
    assert os.readlink(root / "ok" / "abs-link") == "../usr/lib"  # absolute: made relative to the root
    assert os.path.realpath(root / "ok" / "up") == real_root  # the kernel stops '..' at the root
    # The second layer's entry below the first layer's link makes that path a directory (overlay2).
    assert (root / "link-to-outside").is_dir() and not (root / "link-to-outside").is_symlink()
    assert (root / "link-to-outside" / "planted.txt").read_bytes().startswith(b"written in the image")


def test_a_directory_replaced_by_a_link_between_two_members_below_it_is_not_written_through(tmp_path, run_cli):
    """The merge walks a member's parents once per directory (the next member in the same
    directory skips the walk). Between two members of ``d/x``, the same layer replaces ``d`` by a
    link out of the image: the second member is refused, never written through the link."""
    outside = tmp_path / "outside"
    (outside / "x").mkdir(parents=True)
    evil = layer(
        (f"{SP}/d/x/first.txt", b"1"),  # in an extracted directory: written
        member(f"{SP}/d", kind=tarfile.SYMTYPE, link=str(outside)),
        (f"{SP}/d/x/second.txt", b"2"),
    )
    archive = docker_save(tmp_path / "save.tar", [evil])
    report = run_cli("image", "--archive", str(archive), "--format", "json").report
    finding = hostile_finding(report, "IMG002", "second.txt")
    assert "symbolic link of the same layer" in finding["message"]
    assert list((outside / "x").iterdir()) == []


def test_symlink_chain_that_climbs_out_is_aimed_at_the_root(tmp_path):
    # Each link alone stays inside; together the host would leave the root (a/s -> "..",
    # a/l -> "s/../.."). In the container '..' is taken after each link and stops at the root,
    # so a/l is the root there: the merged view says so, and nothing points outside it.
    evil = layer(
        ("a/", None),
        member("a/s", kind=tarfile.SYMTYPE, link=".."),
        member("a/l", kind=tarfile.SYMTYPE, link="s/../.."),
        member("a/m", kind=tarfile.SYMTYPE, link="s/a/s/a/.."),
    )
    state, root = merged(tmp_path, docker_save(tmp_path / "save.tar", [evil]))
    real_root = os.path.realpath(root)
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            resolved = os.path.realpath(os.path.join(directory, name))
            assert resolved == real_root or resolved.startswith(real_root + os.sep)
    assert os.path.realpath(root / "a" / "l") == real_root
    assert os.path.realpath(root / "a" / "m") == real_root  # s/a/s/a -> a (physical), its '..' the root
    assert os.readlink(root / "a" / "s") == ".."  # already resolves as in the container: untouched
    assert not [f for f in state.findings if f.rule == "IMG002"]


def test_huge_pax_header_is_refused_without_reading_it(tmp_path, run_cli):
    header = tarfile.TarInfo("././@PaxHeader")
    header.type, header.size = tarfile.XHDTYPE, 1 << 40  # declared 1 TiB, nothing follows
    raw = header.tobuf(tarfile.GNU_FORMAT)  # base-256 size field
    archive = docker_save(tmp_path / "save.tar", [layer(("a", b"1")), raw + bytes(1024)])
    report = run_cli("image", "--archive", str(archive), "--format", "json").report
    finding = hostile_finding(report, "IMG001", "layer 1")
    assert finding["data"]["offset"] == 0 and finding["data"]["layer"] == 1


@pytest.mark.parametrize("damage", ["truncated", "checksum", "gzip"])
def test_damaged_layers_are_findings_with_offsets(tmp_path, run_cli, damage):
    good = layer(("a", b"1" * 3000), ("b", b"2" * 3000))
    if damage == "truncated":
        bad = good[: 1536 + 700]
    elif damage == "checksum":
        second = 512 + 3072  # the header of "b"
        bad = good[:second] + b"garbage!" + good[second + 8 :]
    else:
        bad = gzip.compress(good)[:40] + b"\xff" * 64
    archive = docker_save(tmp_path / "save.tar", [layer(("ok", b"0")), bad])
    result = run_cli("image", "--archive", str(archive), "--format", "json", expect=1)
    finding = hostile_finding(result.report, "IMG001", "layer 1")
    assert finding["path"].startswith(str(archive) + ":")
    assert isinstance(finding["data"]["offset"], int)
    if damage == "checksum":
        assert finding["data"]["offset"] == 512 + 3072
    if damage == "truncated":
        assert finding["data"]["offset"] == 0  # the header of the member whose data is cut


@pytest.mark.parametrize("manifest", [b'[{"Layers": ["../../etc/passwd"]}]', b'[{"Layers": ["missing/layer.tar"]}]'])
def test_layers_a_manifest_names_but_the_archive_lacks_are_findings(tmp_path, run_cli, manifest):
    # The image could be opened, a layer of it is missing: IMG001 (tests/image/test_image_errors.py
    # has the manifests that cannot be read at all, an error).
    archive = docker_save(tmp_path / "save.tar", [layer(("a", b"1"))], manifest=manifest)
    result = run_cli("image", "--archive", str(archive), "--format", "json", "--fail-on", "never", expect=1)
    assert "IMG001" in rules(result.report)
    assert "Traceback" not in result.output


def test_oci_digest_mismatch_and_path_digest(tmp_path, run_cli):
    layout = oci_layout(tmp_path / "oci", [layer(("a", b"1" * 5000))], corrupt_digest=True)
    report = run_cli("image", "--archive", str(layout), "--format", "json", expect=1).report
    assert {"IMG001", "IMG005"} & rules(report)
    index = json.loads((layout / "index.json").read_text())
    index["manifests"][0]["digest"] = "sha256:../../../../etc/passwd"
    (layout / "index.json").write_text(json.dumps(index))
    unreadable = run_cli("image", "--archive", str(layout), expect=2)  # no manifest to read: no audit
    assert "bad digest 'sha256:../../../../etc/passwd'" in unreadable.stderr


def test_size_limit_stops_extraction(tmp_path, run_cli):
    archive = docker_save(tmp_path / "save.tar", [layer(("big", b"\0" * (3 << 20)))])
    report = run_cli("image", "--archive", str(archive), "--max-bytes", "1M", "--format", "json", expect=1).report
    assert "IMG004" in rules(report)
    assert "image" not in report
    (stopped,) = [f for f in report["findings"] if f["rule"] == "IMG004"]
    assert "image is larger than the 1.0 MiB allowed (raise --max-bytes)" in stopped["message"]


def test_not_an_archive_and_missing_file(tmp_path, run_cli):
    junk = tmp_path / "junk.tar"
    junk.write_bytes(os.urandom(4096))
    assert "is not a tar archive" in run_cli("image", "--archive", str(junk), expect=2).stderr
    missing = run_cli("image", "--archive", str(tmp_path / "nope.tar"))
    assert missing.exit_code == 2


def test_workdir_is_removed(tmp_path, run_cli, libs, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    run_cli(
        "image",
        "--archive",
        str(docker_save(tmp_path / "save.tar", sdk_layers(libs))),
        "--format",
        "json",
    )
    assert list((tmp_path / "tmp").iterdir()) == []


def test_gnu_long_names_and_base256_sizes(tmp_path):
    long_name = "d/" + "x" * 150 + "/file"
    payload = b"long" * 1000
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        info = tarfile.TarInfo(long_name)
        info.size = len(payload)
        archive.addfile(info, io.BytesIO(payload))
    state, root = merged(tmp_path, docker_save(tmp_path / "save.tar", [buffer.getvalue()]))
    assert (root / long_name).read_bytes() == payload


@pytest.mark.parametrize("compression", ["zstd", False])
def test_oci_layers_in_zstd_or_uncompressed(tmp_path, run_cli, libs, compression):
    layout = oci_layout(tmp_path / "oci", sdk_layers(libs), compress=compression)
    report = run_cli("image", "--archive", str(layout), "--format", "json", expect=1).report
    assert "DUP001" in rules(report) and "IMG005" not in rules(report)


def test_without_the_docker_sdk_the_daemon_mode_is_a_usage_error(run_cli, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "docker", None)  # import docker -> ImportError
    result = run_cli("image", "some/image:1")
    assert result.exit_code == 2
    assert "docker extra" in result.output and "--archive" in result.output
    assert max(len(line) for line in result.stderr.splitlines()) <= 100  # message, then a hint line


def test_multi_image_archive_needs_a_ref(tmp_path, run_cli, libs):
    one = layer(("a", b"1"))
    manifest = [
        {"Config": "c.json", "RepoTags": ["x:1"], "Layers": []},
        {"Config": "c.json", "RepoTags": ["y:1"], "Layers": []},
    ]
    archive = docker_save(tmp_path / "save.tar", [one], manifest=manifest)
    assert "name one as REF (its tags: x:1, y:1)" in run_cli("image", "--archive", str(archive), expect=2).stderr
    chosen = run_cli("image", "--archive", str(archive), "y:1", "--format", "json")
    assert chosen.report["image"]["source"]["tags"] == ["y:1"]


def test_entry_limit_stops_extraction(tmp_path, run_cli):
    many = layer(*[(f"f{i}", b"x") for i in range(10)])
    archive = docker_save(tmp_path / "save.tar", [many])
    args = ("image", "--archive", str(archive), "--max-entries", "5", "--format", "json")
    report = run_cli(*args, expect=1).report
    assert "more than 5 entries" in hostile_finding(report, "IMG004", "")["message"]


def test_names_the_filesystem_refuses_are_findings(tmp_path, run_cli):
    too_long = "d/" + "n" * 300  # one component over NAME_MAX
    archive = docker_save(tmp_path / "save.tar", [layer(("ok", b"1"), (too_long, b"2"))])
    report = run_cli("image", "--archive", str(archive), "--format", "json").report
    finding = hostile_finding(report, "IMG002", "could not be extracted")
    assert finding["data"]["offset"] > 0


def _mutated_layers():
    from hypothesis import strategies as st

    base = layer(
        ("d/", None),
        ("d/file", b"payload" * 100),
        member("d/link", kind=tarfile.SYMTYPE, link="file"),
        member("d/hard", kind=tarfile.LNKTYPE, link="d/file"),
        ("d/.wh.gone", b""),
    )
    flips = st.lists(st.tuples(st.integers(0, len(base) - 1), st.integers(0, 255)), min_size=1, max_size=8)
    return st.builds(lambda changes, cut: _apply(base, changes)[:cut], flips, st.integers(0, len(base)))


def _apply(data: bytes, changes: list[tuple[int, int]]) -> bytes:
    mutable = bytearray(data)
    for position, value in changes:
        mutable[position] = value
    return bytes(mutable)


def test_fuzzed_layers_never_raise_anything_but_format_errors(tmp_path):
    from hypothesis import HealthCheck, given, settings

    from rocm_audit.errors import FormatError

    base = str(tmp_path)

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_mutated_layers())
    def check(raw: bytes) -> None:
        work = tempfile.mkdtemp(dir=base)
        state = new_state(str(work), ImageOptions(full=True, max_bytes=1 << 20))
        try:
            merge.apply_layer(state, io.BytesIO(raw), 0, "fuzz", "fuzz.tar")
        except (FormatError, merge.LimitExceeded):
            pass
        merge.finish(state)
        real = os.path.realpath(state.root)
        for directory, dirs, files in os.walk(state.root):
            for name in dirs + files:
                resolved = os.path.realpath(os.path.join(directory, name))
                assert resolved == real or resolved.startswith(real + os.sep), name
        assert os.listdir(work) == ["rootfs"]  # nothing written beside the merged root
        shutil.rmtree(work)

    check()


@pytest.mark.parametrize("blob", ["layer", "manifest"])
def test_layout_directory_links_out_of_the_layout_are_refused(tmp_path, run_cli, blob):
    layout = oci_layout(tmp_path / "oci", [layer(("a", b"1" * 5000))])
    blobs = layout / "blobs" / "sha256"
    manifest_digest = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    manifest = json.loads((blobs / manifest_digest.split(":")[1]).read_bytes())
    digest = manifest_digest if blob == "manifest" else manifest["layers"][0]["digest"]
    linked = blobs / digest.split(":")[1]
    secret = tmp_path / "secret"
    secret.write_bytes(linked.read_bytes())
    linked.unlink()
    linked.symlink_to(secret)  # same bytes, but outside the layout
    if blob == "manifest":  # no manifest: nothing of the image can be read
        assert "resolves outside the layout" in run_cli("image", "--archive", str(layout), expect=2).stderr
        return
    report = run_cli("image", "--archive", str(layout), "--format", "json", expect=1).report
    assert "outside the layout" in hostile_finding(report, "IMG001", "")["message"]


def test_docker_25_save_layout_is_read_through_its_manifest(tmp_path, run_cli, libs):
    layout = oci_layout(tmp_path / "d25", sdk_layers(libs), compress=False, docker_manifest=True)
    archive = tar_directory(layout, tmp_path / "d25.tar")
    report = run_cli("image", "--archive", str(archive), "--format", "json", expect=1).report
    assert report["image"]["source"]["format"] == "docker-save+oci"
    assert report["image"]["source"]["tags"] == ["test/image:latest"]
    assert "DUP001" in rules(report) and "IMG005" not in rules(report)


def test_legacy_layer_tar_may_be_a_link_to_another(tmp_path, libs):
    same = layer(("x/data", b"z" * 5000))
    archive = docker_save(tmp_path / "save.tar", [same, layer(("y", b"1")), same], linked={2: 0})
    state, root = merged(tmp_path, archive)
    assert [s.entries for s in state.layers] == [1, 1, 1]
    assert (root / "x" / "data").read_bytes() == b"z" * 5000


def _in_a_small_tmpdir(script: str, tmpdir: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (sh) with a 1 MiB tmpfs mounted at ``tmpdir``, in a mount namespace of its
    own (a user namespace too, so it needs no root)."""
    command = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script]
    if os.geteuid() == 0:
        command = ["unshare", "--mount", "sh", "-c", script]
    probe = subprocess.run([*command[:-1], "mount -t tmpfs -o size=1m tmpfs " + shlex.quote(str(tmpdir))], check=False)
    if probe.returncode != 0:
        pytest.skip("this machine mounts no tmpfs for the test (unprivileged user namespaces disabled)")
    return subprocess.run(command, capture_output=True, text=True, check=False)


def test_a_full_scratch_disk_says_where_and_what_to_do(tmp_path, libs):
    """A runner's TMPDIR without room for the merged view: exit 2, the file system's word, where the
    scratch was and how to move it; nothing left behind in it."""
    payload = os.urandom(3 << 20)  # a file a check reads (JSON by name), larger than the tmpfs
    archive = docker_save(tmp_path / "save.tar", [layer((f"{SP}/pkg/", None), (f"{SP}/pkg/data.json", payload))])
    tmpdir = tmp_path / "small"
    tmpdir.mkdir()
    audit = shlex.join([sys.executable, "-m", "rocm_audit", "image", "--archive", str(archive), "-q", "gfx942"])
    script = (
        f"mount -t tmpfs -o size=1m tmpfs {shlex.quote(str(tmpdir))} && "
        f'TMPDIR={shlex.quote(str(tmpdir))} {audit}; echo "exit $?"; ls -A {shlex.quote(str(tmpdir))}'
    )
    done = _in_a_small_tmpdir(script, tmpdir)
    lines = done.stdout.splitlines()
    assert lines == ["exit 2"], (done.stdout, done.stderr)  # and nothing listed in the tmpfs after
    assert "cannot write the merged view: No space left on device" in done.stderr
    assert (
        f"hint: the audit's scratch files go to {tmpdir}: point TMPDIR at a file system with more room" in done.stderr
    )
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


def test_no_room_outside_the_layer_merge_is_the_same_error(tmp_path):
    from rocm_audit.image.audit import Workdir

    with pytest.raises(merge.ExtractionError) as raised, Workdir(str(tmp_path)) as work:
        (Path(work) / "part").write_bytes(b"x")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert raised.value.exit_code == 2
    assert raised.value.message == "cannot write the private work directory: No space left on device"
    assert raised.value.hint is not None and str(tmp_path) in raised.value.hint
    assert list(tmp_path.iterdir()) == []


def test_waste_groups_rank_sdk_trees_first_and_advise_what_frees_each(tmp_path, run_cli, libs):
    # Base-OS copies in layer 0 (larger than the SDK copy), two wheels vendoring one file in
    # site-packages, and the SDK library split over two layers: SDK first, then site-packages, then
    # the base OS; dedup is advised only for the SDK group, the base image's copies are its own.
    docs = [(f"usr/share/doc/p{i}/changelog.gz", os.urandom(200_000 + i)) for i in range(4)]
    vendored = os.urandom(150_000)
    base = layer(*docs, *[(name.replace("/p", "/q"), data) for name, data in docs])
    wheels = layer(
        (f"{SP}/_rocm_sdk_core/lib/libamd_comgr.so.3", libs["comgr"]),
        (f"{SP}/one/libgomp.bin", vendored),
        (f"{SP}/two/libgomp.bin", vendored),
    )
    devel = layer((f"{SP}/_rocm_sdk_devel/lib/libamd_comgr.so.3", libs["comgr"]))
    archive = docker_save(tmp_path / "save.tar", [base, wheels, devel], env=["GPU_ARCH=gfx942"])
    report = run_cli("image", "--archive", str(archive), "--format", "json", expect=1).report
    groups = report["image"]["waste"]["groups"]
    firsts = [g["copies"][0]["path"] for g in groups]
    assert firsts[:2] == [f"/{SP}/_rocm_sdk_core/lib/libamd_comgr.so.3", f"/{SP}/one/libgomp.bin"]
    assert all(path.startswith("/usr/share/doc/") for path in firsts[2:]) and len(firsts) == 6
    fixes = [g["fix"] for g in groups]
    assert "rocm-audit dedup" in fixes[0]
    assert fixes[1] == "write the file once (or hardlink it) in the step that writes layer 1"
    assert set(fixes[2:]) == {"the copies come from the base image (layer 0)"}
    by_rule = {rule: [f["path"] for f in report["findings"] if f["rule"] == rule] for rule in ("IMG008", "IMG010")}
    assert by_rule["IMG008"] == [f"/{SP}/_rocm_sdk_core/lib/libamd_comgr.so.3"]
    assert len(by_rule["IMG010"]) == 5 and not [f for f in report["findings"] if f["rule"] == "IMG007"]
    assert {f["severity"] for f in report["findings"] if f["rule"] == "IMG010"} == {"info"}
    text = run_cli("image", "--archive", str(archive), expect=1).output.splitlines()
    listed = [line for line in text if line.startswith("  2 copies of ") and " [" in line]
    assert len(listed) == 3 and "_rocm_sdk_core/lib/libamd_comgr.so.3" in listed[0]
    assert "  ... and 3 more groups (-v lists them)" in text
    every = run_cli("image", "--archive", str(archive), "-v", expect=1).output
    assert every.count("  2 copies of ") == 6 and "more groups" not in every


def test_the_base_images_copies_are_never_the_users_step_to_free(tmp_path, run_cli, libs):
    """A library the base image holds twice, whose bytes two later layers write into the SDK trees:
    no IMG007 for the base image's own pair (nothing the user runs frees it), and IMG008's fix says
    the base has the file, not "write the copies in one step" (the base is no step of the user's)."""
    base = layer(("usr/lib/x86_64-linux-gnu/libm.so.6", libs["comgr"]), ("opt/copy/libm.so.6", libs["comgr"]))
    core = layer((f"{SP}/_rocm_sdk_core/lib/libamd_comgr.so.3", libs["comgr"]))
    devel = layer((f"{SP}/_rocm_sdk_devel/lib/libamd_comgr.so.3", libs["comgr"]))
    archive = docker_save(tmp_path / "save.tar", [base, core, devel], env=["GPU_ARCH=gfx942"])
    report = run_cli("image", "--archive", str(archive), "--format", "json", expect=1).report
    assert not [f for f in report["findings"] if f["rule"] == "IMG007"]
    (spread,) = [f for f in report["findings"] if f["rule"] == "IMG008"]
    assert spread["message"].endswith(
        "the base image (layer 0) has the file already: do not write it again in layers 1, 2"
    )
    (group,) = report["image"]["waste"]["groups"]
    assert group["wasted_bytes"] == 3 * len(libs["comgr"])  # the base image's own copy counts as waste too


def test_one_image_under_two_names_in_an_oci_layout_needs_no_ref(tmp_path, run_cli, libs):
    """skopeo copies two tags of one image into one layout: two index entries, one manifest digest.
    That is one image to audit, not a choice to make."""
    layout = oci_layout(tmp_path / "oci", [layer((f"{SP}/_rocm_sdk_core/lib/libamd_comgr.so.3", libs["comgr"]))])
    index = json.loads((layout / "index.json").read_text())
    again = {**index["manifests"][0], "annotations": {"org.opencontainers.image.ref.name": "qa2"}}
    index["manifests"].append(again)
    (layout / "index.json").write_text(json.dumps(index))
    report = run_cli("image", "--archive", str(layout), "gfx942", "--format", "json").report
    assert report["image"]["source"]["format"].startswith("oci") and report["summary"]["findings"]["error"] == 0


def test_a_file_a_later_layer_writes_again_is_no_with_of_its_own(tmp_path, run_cli, libs):
    """A wheel reinstalled in a later layer: one path in two layers. The finding names its layers;
    it lists no "with" line naming its own path."""
    again = [layer((f"{SP}/pkg/libx.so", libs["comgr"])), layer((f"{SP}/pkg/libx.so", libs["comgr"]))]
    archive = docker_save(tmp_path / "save.tar", again)
    report = run_cli("image", "--archive", str(archive), "--format", "json", expect=0).report
    (finding,) = [f for f in report["findings"] if f["rule"] == "IMG010"]
    assert finding["path"] == f"/{SP}/pkg/libx.so" and finding["related_paths"] == []
    assert "(layer 0, hidden)" in finding["message"] and "(layer 1)" in finding["message"]
    text = run_cli("image", "--archive", str(archive), expect=0).stdout
    assert "    with " not in text


def test_a_legacy_layer_is_checked_against_the_config_s_diff_id(tmp_path, run_cli, libs):
    """A `<id>/layer.tar` is the uncompressed layer: its digest is the config's diff ID for its
    place, as `docker load` checks it. A wrong one and a config without one per layer are IMG005."""
    one = [layer((f"{SP}/pkg/libx.so", libs["comgr"]))]
    good = run_cli("image", "--archive", str(docker_save(tmp_path / "good.tar", one)), "--format", "json")
    digest = "sha256:" + hashlib.sha256(one[0]).hexdigest()
    assert good.report["image"]["layers"][0]["name"] == digest
    assert not [f for f in good.report["findings"] if f["rule"] == "IMG005"]
    wrong = docker_save(tmp_path / "wrong.tar", one, diff_ids=["sha256:" + "0" * 64])
    report = run_cli("image", "--archive", str(wrong), "--format", "json", expect=1).report
    (mismatch,) = [f for f in report["findings"] if f["rule"] == "IMG005"]
    assert mismatch["message"] == f"layer 0 does not match its digest sha256:{'0' * 64}"
    none = docker_save(tmp_path / "none.tar", one, diff_ids=[])
    report = run_cli("image", "--archive", str(none), "--format", "json", expect=1).report
    (unchecked,) = [f for f in report["findings"] if f["rule"] == "IMG005"]
    assert unchecked["message"].startswith("its config lists 0 layer digests (rootfs.diff_ids) for 1 layer: ")
    assert unchecked["path"] == str(none)


def test_a_compressed_layer_under_a_tool_s_own_name_is_not_held_to_the_diff_id(tmp_path, run_cli, libs):
    """`layer0.tar.gz` holds the compressed blob, whose digest is no diff ID: no false IMG005."""
    import gzip
    import io
    import json
    import tarfile

    raw = layer((f"{SP}/pkg/libx.so", libs["comgr"]))
    config = json.dumps(
        {
            "os": "linux",
            "architecture": "amd64",
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest()]},
        }
    ).encode()
    manifest = json.dumps([{"Config": "config.json", "RepoTags": ["t:1"], "Layers": ["layer0.tar.gz"]}]).encode()
    archive = tmp_path / "tool.tar"
    with tarfile.open(archive, "w") as tar:
        for name, data in (("manifest.json", manifest), ("config.json", config), ("layer0.tar.gz", gzip.compress(raw))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    report = run_cli("image", "--archive", str(archive), "--format", "json", expect=0).report
    assert not [f for f in report["findings"] if f["rule"] in ("IMG001", "IMG005")]
    assert report["image"]["layers"][0]["files"] == 1
