"""A layer whose tar stores one path twice (what `tar --append` leaves): the earlier member weighs in
the layer and nothing sees it. It is neither an identical copy under another name nor a step for
dedup (IMG007), so it is reported apart (IMG011) and kept out of the waste groups and total."""

from __future__ import annotations

import os
import tarfile

import pytest

from support.image.layer_writers import docker_save, layer, member
from support.sdk_tree import build_library

SP = "usr/lib/python3/dist-packages"
CORE = f"{SP}/_rocm_sdk_core/lib/libamd_comgr.so.3"
DEVEL = f"{SP}/_rocm_sdk_devel/lib/libamd_comgr.so.3"


@pytest.fixture(scope="module")
def comgr(tmp_path_factory) -> bytes:
    """A real gcc shared library large enough to be listed (64 KiB and more)."""
    out = tmp_path_factory.mktemp("libs")
    return build_library(out, "comgr", "libamd_comgr.so.3", payload=os.urandom(80_000)).read_bytes()


def by_rule(report: dict, rule: str) -> list[dict]:
    return [f for f in report["findings"] if f["rule"] == rule]


def test_a_path_stored_twice_is_not_an_identical_copy_for_dedup(tmp_path, run_cli, comgr):
    """The core library stored twice with the same bytes, and a devel copy under its own name: one
    IMG007 pair (core and devel), not three copies, and one IMG011 for the member stored again."""
    archive = docker_save(tmp_path / "save.tar", [layer((CORE, comgr), (CORE, comgr), (DEVEL, comgr))])
    report = run_cli("image", "--archive", str(archive), "--format", "json", expect=1).report
    [pair] = by_rule(report, "IMG007")
    assert pair["message"].startswith("2 identical copies")
    assert sorted([pair["path"], *pair["related_paths"]]) == sorted(["/" + CORE, "/" + DEVEL])
    [again] = by_rule(report, "IMG011")
    assert again["severity"] == "warning" and again["path"] == "/" + CORE and again["related_paths"] == []
    assert again["data"] == {"layer": 0, "stored_again_bytes": len(comgr), "paths": ["/" + CORE]}
    waste = report["image"]["waste"]
    assert waste["wasted_bytes"] == len(comgr) and waste["stored_again_bytes"] == len(comgr)
    [group] = waste["groups"]
    assert [c["path"] for c in group["copies"]] == ["/" + CORE, "/" + DEVEL]
    # The layer's counts are of the members it stores: the blob holds three files.
    assert report["image"]["layers"][0]["files"] == 3
    text = " ".join(run_cli("image", "--archive", str(archive), expect=1).stdout.split())
    assert "in paths a layer stores more than once (IMG011)" in text


def test_a_path_stored_twice_with_other_bytes_is_reported_without_a_group(tmp_path, run_cli, comgr):
    other = os.urandom(len(comgr))  # the same size: only a digest could tell them apart
    archive = docker_save(tmp_path / "save.tar", [layer((CORE, comgr), (f"{SP}/x/a.bin", b"a" * 9000), (CORE, other))])
    report = run_cli("image", "--archive", str(archive), "--format", "json", expect=0).report
    [again] = by_rule(report, "IMG011")
    assert again["data"]["stored_again_bytes"] == len(comgr)
    assert report["image"]["waste"]["groups"] == [] and report["image"]["waste"]["wasted_bytes"] == 0
    assert not by_rule(report, "IMG007")


def test_a_later_layer_replacing_a_path_is_not_stored_again(tmp_path, run_cli, comgr):
    """A reinstall in a later layer is IMG008's (no later step frees it), not IMG011's."""
    archive = docker_save(tmp_path / "save.tar", [layer((CORE, comgr)), layer((CORE, comgr))])
    report = run_cli("image", "--archive", str(archive), "--format", "json", expect=0).report
    assert not by_rule(report, "IMG011") and report["image"]["waste"]["stored_again_bytes"] == 0
    assert by_rule(report, "IMG008")


def test_a_member_a_hardlink_still_shows_is_not_stored_again(tmp_path, run_cli, comgr):
    """The first member stays seen under a hardlink's name: replacing its path loses nothing."""
    link = member(f"{SP}/_rocm_sdk_core/lib/libamd_comgr.so", kind=tarfile.LNKTYPE, link=CORE)
    archive = docker_save(tmp_path / "save.tar", [layer((CORE, comgr), link, (CORE, os.urandom(len(comgr))))])
    report = run_cli("image", "--archive", str(archive), "--format", "json", expect=0).report
    assert not by_rule(report, "IMG011") and report["image"]["waste"]["stored_again_bytes"] == 0


@pytest.mark.docker
def test_the_engine_refuses_a_layer_that_stores_a_path_twice(tmp_path, docker, run_cli, comgr):
    """What IMG011 says, from the real engine: `docker load` of such a layer fails, and the same
    archive with each path once loads (the refusal is the duplicate's, not the archive's)."""
    tag = "rocm-audit-test/stored-twice:1"
    twice = docker_save(tmp_path / "twice.tar", [layer((CORE, comgr), (CORE, os.urandom(len(comgr))))], tag=tag)
    refused = docker.run("load", "-i", str(twice), check=False)
    assert refused.returncode != 0 and "duplicates of file paths not supported" in refused.stderr
    once = docker_save(tmp_path / "once.tar", [layer((CORE, comgr))], tag=tag)
    docker.run("load", "-i", str(once))
    docker.run("rmi", tag)
    report = run_cli("image", "--archive", str(twice), "--format", "json", expect=0).report
    [again] = by_rule(report, "IMG011")
    assert "duplicates of file paths not supported" in again["message"]
