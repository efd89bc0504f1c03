"""`prune --fatbins` proof (d): Debian's comgr (libamd-comgr2, ROCm 5.2) looks up the same code
object in the original and the slimmed bundle.

Fixtures: HIP host libraries built with clang++-19 for gfx90a, gfx1030 and gfx942 (which comgr 2
does not know), plain and CCOB. Kept gfx90a: comgr agrees on every bundle; kept gfx942: comgr
knows none of the kept targets and says so; a slimmed bundle built wrong on purpose (the gfx90a
entry's bytes swapped for gfx1030's) is caught by comgr alone.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

from rocm_audit.formats.offload_bundle import parse_bundle
from rocm_audit.prune.fatbins.comgr import KNOWS_NONE, ComgrProof, isa_queries, site_comgr, system_comgr
from rocm_audit.prune.fatbins.library import locate
from rocm_audit.prune.fatbins.rewrite import slim
from rocm_audit.tree.targets import kept_target
from support.hip_host import HIP_FLAGS, TU
from support.run import run_checked
from support.tools import require_tool

DEBIAN_COMGR = "libamd_comgr.so.2"  # tests/apt-packages.txt: libamd-comgr2
ARCHES = ["--offload-arch=gfx90a", "--offload-arch=gfx1030", "--offload-arch=gfx942"]


@pytest.fixture(scope="module")
def comgr() -> str:
    found = system_comgr()
    assert found is not None, "Debian's libamd-comgr2 is not installed (tests/apt-packages.txt)"
    return found


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    cxx = require_tool("clang++-19")
    out = tmp_path_factory.mktemp("fatbins-comgr")
    made = {}
    for name, extra in (("libplain.so", []), ("libccob.so", ["--offload-compress"])):
        objects = []
        for index in (1, 2):
            (out / f"k{index}.hip").write_text(TU % (f"k{index}", index))
            objects.append(f"{name}.k{index}.o")
            run_checked([cxx, *HIP_FLAGS, "-c", *extra, *ARCHES, f"k{index}.hip", "-o", objects[-1]], out)
        run_checked([cxx, "-shared", *objects, "-o", name], out)
        made[name] = out / name
    return made


def _bundles(path: Path) -> list[bytes]:
    fd = os.open(path, os.O_RDONLY)
    try:
        return [os.pread(fd, p.extent, p.offset) for p in locate(fd)[1]]
    finally:
        os.close(fd)


def _plain(data: bytes) -> bytes:
    """A bundle's uncompressed form (a CCOB inflated one-shot; clang++-19 writes zstd v2)."""
    if not data.startswith(b"CCOB"):
        return data
    total = struct.unpack_from("<I", data, 8)[0]
    return zstandard.ZstdDecompressor().decompress(data[24:total])


def _slimmed(tmp_path: Path, original: bytes, kept):
    """The slimmed bundle (rewrite.slim over a file holding just ``original``), as a context."""
    path = tmp_path / f"bundle-{len(list(tmp_path.iterdir()))}"
    path.write_bytes(original)
    fd = os.open(path, os.O_RDONLY)
    made = slim(fd, 0, len(original), kept, None, str(tmp_path))
    made.spools.append(os.fdopen(fd, "rb"))  # closed with the slimmed bundle
    return made


def test_only_settings_of_targets_comgr_knows_are_asked():
    known = ["amdgcn-amd-amdhsa--gfx90a", "amdgcn-amd-amdhsa--gfx1030"]
    asked = isa_queries([kept_target("gfx90a"), kept_target("gfx942")], known)
    assert len(asked) == 4 and all(q.startswith("amdgcn-amd-amdhsa--gfx90a:") for q in asked)
    assert isa_queries([kept_target("gfx942")], known) == []


def test_the_sites_own_comgr_comes_first(tmp_path):
    lib = tmp_path / "site" / "_rocm_sdk_core" / "lib"
    lib.mkdir(parents=True)
    (lib / "libamd_comgr.so.3.0").write_bytes(b"x")
    (lib / "libamd_comgr.so.3").symlink_to("libamd_comgr.so.3.0")
    (tmp_path / "libamd_comgr.so.3").write_bytes(b"x")  # not in _rocm_sdk_core/lib
    paths = [str(lib / "libamd_comgr.so.3"), str(lib / "libamd_comgr.so.3.0"), str(tmp_path / "libamd_comgr.so.3")]
    assert site_comgr(paths) == str(lib / "libamd_comgr.so.3.0")
    assert site_comgr([str(tmp_path / "libamd_comgr.so.3")]) is None


@pytest.mark.parametrize("name", ["libplain.so", "libccob.so"])
def test_comgr_picks_the_same_code_object_before_and_after(built, comgr, tmp_path, name):
    kept = [kept_target("gfx90a")]
    with ComgrProof(comgr, kept) as proof:
        assert proof.version[0] == 2
        assert len(proof.queries) == 4  # every sramecc and xnack setting of gfx90a
        for original in _bundles(built[name]):
            with _slimmed(tmp_path, original, kept) as made:
                assert sorted(r.rsplit("-", 1)[-1] for r in made.removed) == ["gfx1030", "gfx942"]
                before, after = _plain(original), _plain(made.read_at(0, made.size))
                found_before, found_after = proof.lookup(before), proof.lookup(after)
                assert all(size for _offset, size in found_before), "comgr finds gfx90a code in the original"
                assert found_before != found_after  # the slimmed bundle moved the entry...
                assert proof.check(before, after) is None  # ...and comgr still picks the same bytes
                assert proof.check_slimmed(made) is None  # the same, read as prune reads it
        assert proof.checked == 4


def test_a_wrong_slimmed_bundle_is_caught_by_comgr(built, comgr, tmp_path):
    kept = [kept_target("gfx90a")]
    original = _bundles(built["libplain.so"])[0]
    bundle = parse_bundle(original, 0, len(original))
    by_target = {e.entry_id.raw.rsplit("-", 1)[-1]: e for e in bundle.entries}
    with _slimmed(tmp_path, original, kept) as made:
        wrong = bytearray(made.read_at(0, made.size))
    slimmed = parse_bundle(bytes(wrong), 0, len(wrong))
    mine = next(e for e in slimmed.entries if e.entry_id.raw.endswith("gfx90a"))
    other = by_target["gfx1030"]
    code = original[other.offset : other.offset + other.size]
    # the gfx90a record now points at gfx1030's code object (size too): a slimming bug comgr must see
    wrong[mine.offset :] = code
    struct.pack_into("<Q", wrong, mine.table_offset + 8, len(code))
    with ComgrProof(comgr, kept) as proof:
        problem = proof.check(original, bytes(wrong))
    assert problem is not None and "picks other code for amdgcn-amd-amdhsa--gfx90a" in problem


def _site(tmp_path: Path, built: dict[str, Path]) -> Path:
    root = tmp_path / "site-packages"
    (root / "hippkg").mkdir(parents=True)
    info = root / "hippkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hippkg\nVersion: 1.0\n")
    (info / "RECORD").write_text("hippkg/libplain.so,,\nhippkg/libccob.so,,\nhippkg-1.0.dist-info/RECORD,,\n")
    for name in ("libplain.so", "libccob.so"):
        shutil.copy2(built[name], root / "hippkg" / name)
    return root


def _dry_run(site: Path, target: str) -> dict:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rocm_audit",
            "prune",
            "--fatbins",
            "--dry-run",
            "-p",
            str(site),
            target,
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def test_the_report_says_whether_comgr_agreed(tmp_path, built, comgr):
    site = _site(tmp_path, built)
    rows = _dry_run(site, "gfx90a")["prune_fatbins"]["libraries"]
    assert {Path(r["path"]).name: r["comgr"] for r in rows} == {"libplain.so": "agreed", "libccob.so": "agreed"}
    assert all(r["bytes"] > 0 and r["status"] == "planned" for r in rows)
    rows = _dry_run(site, "gfx942")["prune_fatbins"]["libraries"]
    assert {r["comgr"] for r in rows} == {KNOWS_NONE}


def test_an_applying_run_asks_comgr_as_it_slims(tmp_path, built, comgr):
    """The applying run slims each library once, and comgr's proof is part of that one slimming."""
    site = _site(tmp_path, built)
    done = subprocess.run(
        [sys.executable, "-m", "rocm_audit", "prune", "--fatbins", "-p", str(site), "gfx90a", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["prune_fatbins"]["libraries"]
    assert {Path(r["path"]).name: (r["status"], r["comgr"]) for r in rows} == {
        "libplain.so": ("slimmed", "agreed"),
        "libccob.so": ("slimmed", "agreed"),
    }


def test_a_comgr_child_that_fails_mid_apply_leaves_the_other_proofs_and_a_whole_file(
    tmp_path, built, comgr, monkeypatch
):
    """The comgr child fails on the second bundle it is asked about, once the first is written
    into the copy: the library is slimmed without comgr (from a fresh copy) and ends up exactly
    as a slimming without comgr writes it; its row and the next library's say comgr did not run."""
    from rocm_audit.prune.fatbins import comgr as comgr_module
    from rocm_audit.prune.fatbins.library import prove_file, slim_library
    from support.cli import invoke_cli, report_validator

    site = _site(tmp_path, built)
    kept = [kept_target("gfx90a")]
    expected = {}
    for name in ("libplain.so", "libccob.so"):
        copy = tmp_path / f"expected-{name}"
        shutil.copyfile(site / "hippkg" / name, copy)
        with open(site / "hippkg" / name, "rb") as before, open(copy, "r+b") as after:
            result = slim_library(str(site / "hippkg" / name), kept, after.fileno())
            assert prove_file(before.fileno(), after.fileno(), result) is None
        expected[name] = copy.read_bytes()

    real, calls = comgr_module.ComgrProof.check_slimmed, []

    def fails(self, made):
        calls.append(made)
        if len(calls) == 1:  # the first bundle is checked and written, then the child stops
            return real(self, made)
        raise comgr_module.ComgrError("the child stopped")

    monkeypatch.setattr(comgr_module.ComgrProof, "check_slimmed", fails)
    done = invoke_cli(report_validator(), ["prune", "--fatbins", "-p", str(site), "gfx90a", "--format", "json"])
    assert done.exit_code == 0, done.output
    rows = {Path(r["path"]).name: r for r in done.report["prune_fatbins"]["libraries"]}
    assert rows["libplain.so"]["status"] == rows["libccob.so"]["status"] == "slimmed"
    first, second = (Path(r["path"]).name for r in done.report["prune_fatbins"]["libraries"])
    assert len(calls) == 2 and rows[first]["comgr"] == "not run: the child stopped"
    assert rows[second]["comgr"] == "not run: the comgr child failed on an earlier library"
    assert {name: (site / "hippkg" / name).read_bytes() for name in expected} == expected
