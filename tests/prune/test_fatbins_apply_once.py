"""An applying `prune --fatbins` slims each library once, and what it writes is what was proved.

Real HIP host libraries built with clang++-19 (a plain bundle library and a CCOB one, two bundles
each), in a site-packages a RECORD owns; the CLI run in this process so that the slimming
functions can be counted. A library changed after it was journalled (the same size, its mtime
put back: only its ctime tells) is refused with PRUNE003 and left byte for byte as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
from collections import Counter
from pathlib import Path

import pytest

from rocm_audit.cli.common import EXIT_INTERRUPTED
from rocm_audit.prune.fatbins import apply as fatbin_apply
from rocm_audit.prune.fatbins import library as fatbin_library
from rocm_audit.prune.fatbins.library import prove_file, slim_library
from rocm_audit.tree.inventory import TEMP_PREFIX
from rocm_audit.tree.targets import kept_target
from support.cli import invoke_cli, report_validator
from support.hip_host import HIP_FLAGS, TU, hippkg_site
from support.run import run_checked
from support.tools import require_tool

NAMES = ("libplain.so", "libccob.so")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    cxx = require_tool("clang++-19")
    out = tmp_path_factory.mktemp("fatbins-once")
    for tu in ("k1", "k2"):
        (out / f"{tu}.hip").write_text(TU % (tu, int(tu[1])))
    arches = ["--offload-arch=gfx942", "--offload-arch=gfx90a"]
    made = {}
    for name, extra in zip(NAMES, ([], ["--offload-compress"]), strict=True):
        for tu in ("k1", "k2"):  # two translation units: two wrappers, two bundles
            run_checked([cxx, *HIP_FLAGS, "-c", *extra, *arches, f"{tu}.hip", "-o", f"{name}.{tu}.o"], out)
        run_checked([cxx, "-shared", f"{name}.k1.o", f"{name}.k2.o", "-o", name], out)
        made[name] = out / name
    return made


@pytest.fixture
def site(tmp_path, built) -> Path:
    return hippkg_site(tmp_path / "site-packages", {name: built[name] for name in NAMES})


def _count_slimming(monkeypatch, after=None) -> tuple[Counter[str], Counter[str]]:
    """Count, per library name, the calls of slim_library (through apply.py, which every run
    goes through) and of the per-bundle slim (library.py). ``after(path)``: run after each
    slim_library call returns."""
    libraries: Counter[str] = Counter()
    bundles: Counter[str] = Counter()
    real_library, real_bundle = fatbin_apply.slim_library, fatbin_library.slim

    def counted_library(path, *args, **kwargs):
        libraries[Path(path).name] += 1
        result = real_library(path, *args, **kwargs)
        if after is not None:
            after(path)
        return result

    def counted_bundle(fd, *args, **kwargs):
        bundles[Path(os.readlink(f"/proc/self/fd/{fd}")).name] += 1
        return real_bundle(fd, *args, **kwargs)

    monkeypatch.setattr(fatbin_apply, "slim_library", counted_library)
    monkeypatch.setattr(fatbin_library, "slim", counted_bundle)
    return libraries, bundles


def _proved_bytes(path: Path, tmp_path: Path) -> bytes:
    """The library slimmed for gfx942 into a copy and proved, apart from any prune run."""
    copy = tmp_path / f"proved-{path.name}"
    shutil.copyfile(path, copy)
    with open(path, "rb") as before, open(copy, "r+b") as after:
        result = slim_library(str(path), [kept_target("gfx942")], after.fileno())
        assert prove_file(before.fileno(), after.fileno(), result) is None
    return copy.read_bytes()


def _temporaries(site: Path) -> list[Path]:
    return [p for p in site.rglob("*") if p.name.startswith(TEMP_PREFIX)]


def test_an_applying_run_slims_each_library_once_and_writes_the_proved_bytes(site, tmp_path, monkeypatch):
    originals = {name: (site / "hippkg" / name).read_bytes() for name in NAMES}
    proved = {name: _proved_bytes(site / "hippkg" / name, tmp_path) for name in NAMES}
    validator = report_validator()
    libraries, bundles = _count_slimming(monkeypatch)

    dry = invoke_cli(validator, ["prune", "--fatbins", "--dry-run", "-p", str(site), "gfx942", "--format", "json"])
    assert libraries == dict.fromkeys(NAMES, 1) and bundles == dict.fromkeys(NAMES, 2)
    planned = {Path(r["path"]).name: r for r in dry.report["prune_fatbins"]["libraries"]}
    libraries.clear()
    bundles.clear()

    backup = tmp_path / "backup"
    args = ["prune", "--fatbins", "-p", str(site), "--backup", str(backup), "gfx942", "--format", "json"]
    done = invoke_cli(validator, args, expect=0)
    # once per library, each of its two bundles once: no planning pass slims it before
    assert libraries == dict.fromkeys(NAMES, 1) and bundles == dict.fromkeys(NAMES, 2)
    rows = {Path(r["path"]).name: r for r in done.report["prune_fatbins"]["libraries"]}
    manifest = site / ".rocm-audit" / "prune-manifest.jsonl"
    written = {
        Path(record["path"]).name: record["sha256_after"]
        for record in map(json.loads, manifest.read_text().splitlines())
        if record.get("type") == "fatbin-done"
    }
    for name in NAMES:
        now = (site / "hippkg" / name).read_bytes()
        assert now == proved[name] != originals[name]  # the very bytes slim_library wrote and proved
        assert written[name] == hashlib.sha256(now).hexdigest()
        assert rows[name]["status"] == "slimmed"
        # the applying run reports exactly what the dry run planned
        for key in ("bytes", "file_bytes", "layout", "removed_targets"):
            assert rows[name][key] == planned[name][key], key
        assert len(originals[name]) - len(now) == rows[name]["file_bytes"]
    assert done.report["prune_fatbins"]["bytes"] == dry.report["prune_fatbins"]["bytes"]
    prune001 = next(f for f in done.report["findings"] if f["rule"] == "PRUNE001")
    assert prune001["data"]["fatbins_bytes"] == dry.report["prune_fatbins"]["bytes"]
    assert not _temporaries(site)


@pytest.mark.parametrize("backup", [False, True])
def test_a_library_changed_before_its_replace_is_refused_and_left_as_it_is(site, tmp_path, monkeypatch, backup):
    """libplain.so is rewritten right after it was slimmed (one byte, the same size, its mtime
    put back): the re-check before the replace (or the backup's sha256) refuses it."""
    target = site / "hippkg" / "libplain.so"
    record = site / "hippkg-1.0.dist-info" / "RECORD"
    record_before = record.read_text()
    changed: dict[str, bytes] = {}

    def change(path: str) -> None:
        if Path(path) != target or changed:
            return
        st = os.stat(path)
        with open(path, "r+b") as handle:
            handle.seek(st.st_size - 1)
            last = handle.read(1)
            handle.seek(st.st_size - 1)
            handle.write(bytes([last[0] ^ 0xFF]))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        changed["bytes"] = target.read_bytes()

    libraries, _bundles = _count_slimming(monkeypatch, after=change)
    args = ["prune", "--fatbins", "-p", str(site), "gfx942", "--format", "json"]
    if backup:
        args += ["--backup", str(tmp_path / "backup")]
    done = invoke_cli(report_validator(), args)
    assert libraries == dict.fromkeys(NAMES, 1)
    assert target.read_bytes() == changed["bytes"]  # not replaced: the bytes the change left
    refused = [f for f in done.report["findings"] if f["rule"] == "PRUNE003"]
    assert [Path(f["path"]).name for f in refused] == ["libplain.so"]
    assert "changed" in refused[0]["message"]
    rows = {Path(r["path"]).name: r for r in done.report["prune_fatbins"]["libraries"]}
    assert rows["libplain.so"]["status"] == "skipped" and rows["libccob.so"]["status"] == "slimmed"
    lines = record.read_text().splitlines()
    assert [line for line in lines if "libplain.so" in line] == [
        line for line in record_before.splitlines() if "libplain.so" in line
    ]
    assert [line for line in lines if "libccob.so" in line] != [
        line for line in record_before.splitlines() if "libccob.so" in line
    ]
    assert not _temporaries(site)
    if backup:  # nothing of the refused library went into the backup's place either
        assert not list((tmp_path / "backup").rglob("libplain.so"))


def test_an_interrupted_slimming_leaves_no_temporary_file(site, monkeypatch):
    """Ctrl-C (KeyboardInterrupt) inside the slimming: the library is as it was, and the copy
    being slimmed in its directory is gone."""
    originals = {name: (site / "hippkg" / name).read_bytes() for name in NAMES}

    def interrupt(_path: str) -> None:
        assert _temporaries(site)  # the copy being written exists right now
        raise KeyboardInterrupt

    _count_slimming(monkeypatch, after=interrupt)
    stopped = invoke_cli(report_validator(), ["prune", "--fatbins", "-p", str(site), "gfx942"])
    assert stopped.exit_code == EXIT_INTERRUPTED and "interrupted" in stopped.stderr
    assert {name: (site / "hippkg" / name).read_bytes() for name in NAMES} == originals
    assert not _temporaries(site)


def test_a_library_with_nothing_to_remove_is_slimmed_once_and_not_written(site, monkeypatch):
    """Kept gfx942 and gfx90a: every entry stays. The one slimming finds nothing to remove, so
    nothing is written or recorded as done."""
    originals = {name: (site / "hippkg" / name).read_bytes() for name in NAMES}
    record_before = (site / "hippkg-1.0.dist-info" / "RECORD").read_bytes()
    libraries, _bundles = _count_slimming(monkeypatch)
    args = ["prune", "--fatbins", "-p", str(site), "gfx942", "gfx90a", "--format", "json"]
    done = invoke_cli(report_validator(), args, expect=0)
    assert libraries == dict.fromkeys(NAMES, 1)
    assert {name: (site / "hippkg" / name).read_bytes() for name in NAMES} == originals
    assert (site / "hippkg-1.0.dist-info" / "RECORD").read_bytes() == record_before
    rows = done.report["prune_fatbins"]["libraries"]
    assert {r["status"] for r in rows} == {"unchanged"} and not any(r["bytes"] for r in rows)
    manifest = site / ".rocm-audit" / "prune-manifest.jsonl"
    records = [json.loads(line) for line in manifest.read_text().splitlines()] if manifest.exists() else []
    assert not [r for r in records if r.get("type") == "fatbin-done"]
    assert not _temporaries(site)


def test_a_real_ctrl_c_while_slimming_counts_the_libraries_replaced_and_the_undo_restores_them(site, tmp_path):
    """A real SIGINT (strace) on entry to the n-th rename of an applying --fatbins run: the message
    counts the libraries replaced (it said "nothing was changed" with one already slimmed), and its
    undo line brings every byte back."""
    from support.killpoints import interrupted, rocm_audit

    originals = {name: (site / "hippkg" / name).read_bytes() for name in NAMES}
    record = (site / "hippkg-1.0.dist-info" / "RECORD").read_bytes()
    counts = []
    for nth in (1, 2, 3, 4):
        backup = tmp_path / f"backup{nth}"
        args = ["prune", "--fatbins", "-p", str(site), "gfx942", "--backup", str(backup)]
        stopped = interrupted(args, ("rename", "renameat", "renameat2"), nth)
        changed = [n for n in NAMES if (site / "hippkg" / n).read_bytes() != originals[n]]
        if stopped.returncode == 0:  # the run made fewer renames than nth
            break
        assert stopped.returncode == EXIT_INTERRUPTED, stopped.stderr
        if not changed:
            assert "before its first change: nothing was changed" in stopped.stderr
            continue
        assert f"prune interrupted: {len(changed)} of {len(NAMES)} changes made" in stopped.stderr
        counts.append(len(changed))
        undo = stopped.stderr.split("To undo, run:\n", 1)[1].strip()
        assert undo.startswith("rocm-audit prune --revert ")
        reverted = rocm_audit(*shlex.split(undo)[1:])
        assert reverted.returncode == 0, reverted.stderr
        assert {n: (site / "hippkg" / n).read_bytes() for n in NAMES} == originals
        assert (site / "hippkg-1.0.dist-info" / "RECORD").read_bytes() == record
        assert not _temporaries(site)
    assert counts, "no interrupt came after a library was replaced"


def test_a_real_ctrl_c_during_the_revert_says_how_many_libraries_are_back(site, tmp_path):
    """The revert of slimmed libraries, sent SIGINT on entry to its n-th rename: the message counts
    the libraries restored (it said only "interrupted"), and running it again finishes."""
    from support.killpoints import interrupted, rocm_audit

    originals = {name: (site / "hippkg" / name).read_bytes() for name in NAMES}
    applied = rocm_audit("prune", "--fatbins", "-p", str(site), "gfx942", "--backup", str(tmp_path / "backup"))
    assert applied.returncode == 0, applied.stderr
    manifest = str(site / ".rocm-audit" / "prune-manifest.jsonl")
    stopped = interrupted(["prune", "--revert", manifest], ("rename", "renameat", "renameat2"), 1)
    assert stopped.returncode == EXIT_INTERRUPTED, stopped.stderr
    back = [n for n in NAMES if (site / "hippkg" / n).read_bytes() == originals[n]]
    assert back, "the first rename of the revert is a library's restore, completed before the interrupt"
    assert stopped.stderr.startswith(f"rocm-audit: prune --revert interrupted: {len(back)} of {len(NAMES)} changes")
    assert "To finish, run the same command again." in stopped.stderr
    again = rocm_audit("prune", "--revert", manifest)
    assert again.returncode == 0, again.stderr
    assert {n: (site / "hippkg" / n).read_bytes() for n in NAMES} == originals


def test_verify_arch_names_the_prune_that_removed_a_target_not_the_shipper(site, run_cli):
    """After `prune --fatbins gfx942`, verify-arch gfx90a finds gfx90a missing from the libraries it
    slimmed: each ARCH001 names that run and its undo (not a defect to report upstream); once the
    run is reverted, the libraries hold gfx90a again and nothing is marked."""
    run_cli("prune", "--fatbins", "-p", str(site), "gfx942", "--backup", str(site.parent / "backup"), expect=0)
    manifest = str(site / ".rocm-audit" / "prune-manifest.jsonl")
    for command in ("verify-arch", "check"):
        report = run_cli(command, "-p", str(site), "gfx90a", "--format", "json", expect=1).report
        missing = [f for f in report["findings"] if f["rule"] == "ARCH001"]
        assert sorted(Path(f["path"]).name for f in missing) == sorted(NAMES), command
        for finding in missing:
            assert finding["data"]["pruned_by"] == manifest
            assert (
                f"rocm-audit prune --fatbins kept only gfx942 in it: `rocm-audit prune --revert {manifest}`"
                in (finding["message"])
            )
    # Other bytes at a slimmed path (a reinstall of another build) are the shipper's again.
    plain = site / "hippkg" / "libplain.so"
    size = plain.stat().st_size
    with open(plain, "ab") as handle:
        handle.write(b"\0")
    report = run_cli("verify-arch", "-p", str(site), "gfx90a", "--format", "json", expect=1).report
    marked = {Path(f["path"]).name: "pruned_by" in f["data"] for f in report["findings"] if f["rule"] == "ARCH001"}
    assert marked == {"libplain.so": False, "libccob.so": True}
    os.truncate(plain, size)
    run_cli("prune", "--revert", manifest, expect=0)
    after = run_cli("verify-arch", "-p", str(site), "gfx90a", "--format", "json", expect=0).report
    assert not [f for f in after["findings"] if f["rule"] == "ARCH001" or "pruned_by" in f["data"]]
