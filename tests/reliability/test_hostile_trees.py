"""Hostile trees: odd names, link loops, special files. Nothing hangs, nothing crashes, every report
stays machine-readable, and dedup/revert stay exact."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from support.sdk_tree import build_library

ODD_NAMES = [b"lib\xffodd.so.1", b"lib with spaces.so.1", b"lib\nnewline.so.1", "libünïcode.so.1".encode()]


@pytest.fixture()
def hostile(tmp_path) -> Path:
    site = tmp_path / "site-packages"
    core, devel = site / "_rocm_sdk_core" / "lib", site / "_rocm_sdk_devel" / "lib"
    library = build_library(tmp_path / "build", "odd", "libodd.so.1", value=5)
    body = library.read_bytes()
    for directory in (core, devel):
        directory.mkdir(parents=True)
        for name in ODD_NAMES:  # distinct content per name: one core/devel pair each
            with open(os.fsencode(directory) + b"/" + name, "wb") as handle:
                handle.write(body + name)
    os.symlink("loop-b", core / "loop-a")
    os.symlink("loop-a", core / "loop-b")
    os.symlink("/nonexistent/libgone.so.1", devel / "dangling.so.1")
    os.symlink("../../../../..", devel / "up-and-out")  # a directory link out of the root
    os.mkfifo(core / "libfifo.so.1")
    if os.geteuid() == 0:
        os.mknod(core / "libnull.so.1", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    return site


def rocm_audit(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "rocm_audit", *args], capture_output=True, timeout=120)


def test_reports_stay_valid_and_exact_whatever_the_file_names(hostile, report_validator):
    done = rocm_audit("dedup", "--check", "-p", str(hostile), "--format", "json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout.decode("utf-8"))  # strict UTF-8: no raw undecodable bytes
    report_validator.validate(report)
    # A name that is not UTF-8 is exact in its *_bytes_b64 sibling (the schema's encoding).
    keepers = {
        base64.b64decode(f["path_bytes_b64"]) if "path_bytes_b64" in f else os.fsencode(f["path"])
        for f in report["findings"]
        if f["rule"] == "DUP001"
    }
    assert keepers == {os.fsencode(hostile / "_rocm_sdk_core" / "lib") + b"/" + n for n in ODD_NAMES}
    text = rocm_audit("dedup", "--check", "-p", str(hostile)).stdout.decode("utf-8")
    finding_lines = [line for line in text.splitlines() if line.startswith("ERROR DUP001")]
    assert len(finding_lines) == len(ODD_NAMES)  # a newline in a name does not split a finding
    assert any("lib\\xffodd.so.1" in line for line in finding_lines)
    assert any("lib\\nnewline.so.1" in line for line in finding_lines)
    for fmt in ("sarif", "junit", "github"):
        out = rocm_audit("dedup", "--check", "-p", str(hostile), "--format", fmt)
        assert out.returncode == 1 and b"Traceback" not in out.stderr, (fmt, out.stderr)
        out.stdout.decode("utf-8")


def test_dedup_and_revert_are_exact_on_odd_names(hostile):
    done = rocm_audit("dedup", "-p", str(hostile), "-q")
    assert done.returncode == 0, done.stdout
    devel = os.fsencode(hostile / "_rocm_sdk_devel" / "lib")
    for name in ODD_NAMES:
        path = devel + b"/" + name
        assert os.path.islink(path) and os.readlink(path) == b"../../_rocm_sdk_core/lib/" + name
    done = rocm_audit("dedup", "--revert", str(hostile / ".rocm-audit" / "dedup-manifest.jsonl"), "-q")
    assert done.returncode == 0, done.stdout
    for name in ODD_NAMES:
        assert stat.S_ISREG(os.lstat(devel + b"/" + name).st_mode)


def test_special_files_and_link_loops_are_never_opened_or_followed(hostile):
    done = rocm_audit("dedup", "--check", "-p", str(hostile), "--format", "json")  # a FIFO read would hang
    report = json.loads(done.stdout)
    scanned = report["dedup"]["files_scanned"]
    assert scanned == 2 * len(ODD_NAMES)
    assert all("fifo" not in f["path"] and "null" not in f["path"] for f in report["findings"])


def _without_dac_override() -> list[str]:
    """Run as root without CAP_DAC_OVERRIDE/READ_SEARCH, so a mode-000 directory is really unreadable."""
    if os.geteuid() != 0:
        return []
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"]


def test_an_unreadable_directory_is_reported_and_the_rest_is_audited(tmp_path):
    from support.sdk_tree import build_sdk_tree

    tree = build_sdk_tree(tmp_path / "site-packages")
    locked = tree.devel / "share"
    locked.chmod(0o000)
    try:
        done = subprocess.run(
            [
                *_without_dac_override(),
                sys.executable,
                "-m",
                "rocm_audit",
                "dedup",
                "--check",
                "-p",
                str(tree.site),
                "--format",
                "json",
            ],
            capture_output=True,
            timeout=120,
        )
    finally:
        locked.chmod(0o755)
    assert done.returncode == 1, done.stderr  # the duplicates elsewhere still fail the check
    report = json.loads(done.stdout)
    unreadable = [f for f in report["findings"] if f["rule"] == "SCAN001"]
    assert [f["path"] for f in unreadable] == [str(locked)]
    assert "Permission denied" in unreadable[0]["message"]
    assert len(report["dedup"]["groups"]) == 6


@pytest.fixture()
def read_only_site(tmp_path):
    """The SDK tree seen through a read-only bind mount: EROFS from the kernel on every write."""
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root (CI runs as root)")
    from support.sdk_tree import build_sdk_tree

    tree = build_sdk_tree(tmp_path / "rw" / "site-packages")
    mount_point = tmp_path / "ro"
    mount_point.mkdir()
    subprocess.run(["mount", "--bind", str(tree.site), str(mount_point)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(mount_point)], check=True)
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def test_a_read_only_filesystem_changes_nothing_and_says_why(read_only_site):
    before = {p: p.lstat().st_ino for p in read_only_site.rglob("*")}
    done = rocm_audit("dedup", "-p", str(read_only_site), "--format", "json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    refused = [f for f in report["findings"] if f["rule"] == "DUP005"]
    assert len(refused) == 1 and "Read-only file system" in refused[0]["message"]
    assert report["dedup"]["replaced"] == 0 and report["dedup"]["manifest"] is None
    assert {p: p.lstat().st_ino for p in read_only_site.rglob("*")} == before


def test_fifos_where_metadata_belongs_never_block_a_run(hostile):
    """Files rocm-audit reads by name rather than by walking (a distribution's RECORD and METADATA,
    TheRock's dist_info.json, rocm-sdk-devel's _dist_info.py) made FIFOs: a plain open would wait for
    a writer forever. Every command finishes, and says what it could not read where it matters."""
    site = hostile
    info = site / "rocm_sdk_core-7.13.0.dist-info"
    info.mkdir()
    os.mkfifo(info / "RECORD")
    os.mkfifo(info / "METADATA")
    therock = site / "_rocm_sdk_core" / "share" / "therock"
    therock.mkdir(parents=True)
    os.mkfifo(therock / "dist_info.json")
    (site / "rocm_sdk_devel").mkdir()
    os.mkfifo(site / "rocm_sdk_devel" / "_dist_info.py")
    for args in (("dedup", "--check"), ("check", "gfx942"), ("prune", "gfx942", "--dry-run"), ("verify-arch",)):
        done = rocm_audit(*args, "-p", str(site), "--format", "json")
        assert done.returncode in (0, 1, 2) and b"Traceback" not in done.stderr, (args, done.stderr)
    done = rocm_audit("verify-arch", "-p", str(site))
    assert done.returncode == 2 and b"dist_info.json" in done.stderr, done.stderr


def _dedup_changes_nothing(site: Path) -> dict:
    """Run dedup on the hostile tree: no traceback, no link made; the JSON report."""
    done = rocm_audit("dedup", "-p", str(site), "--format", "json")
    assert b"Traceback" not in done.stderr, done.stderr
    devel = os.fsencode(site / "_rocm_sdk_devel" / "lib")
    assert not any(os.path.islink(devel + b"/" + name) for name in ODD_NAMES)
    return json.loads(done.stdout)


def test_a_planted_manifest_link_or_fifo_is_never_written_through(hostile, tmp_path):
    """The default revert manifests live in the audited tree (``.rocm-audit/``): one planted there as
    a symlink out of the root must not turn the run into a writer of the file it names, and a FIFO
    must not block it. The run refuses to journal, so it changes nothing (no way back, no change)."""
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    journal_dir = hostile / ".rocm-audit"
    journal_dir.mkdir()
    (journal_dir / "dedup-manifest.jsonl").symlink_to(outside)
    assert "DUP005" in {f["rule"] for f in _dedup_changes_nothing(hostile)["findings"]}
    assert outside.read_text() == "precious\n"
    (journal_dir / "dedup-manifest.jsonl").unlink()
    os.mkfifo(journal_dir / "dedup-manifest.jsonl")
    assert "DUP005" in {f["rule"] for f in _dedup_changes_nothing(hostile)["findings"]}


def test_a_planted_journal_directory_link_is_never_written_through(hostile, tmp_path):
    """``.rocm-audit`` itself planted as a symlink to a directory outside the audited tree: dedup
    creates no manifest there, and without one it changes nothing (prune journals the same way)."""
    outside = tmp_path / "outside-dir"
    outside.mkdir()
    (hostile / ".rocm-audit").symlink_to(outside)
    assert "DUP005" in {f["rule"] for f in _dedup_changes_nothing(hostile)["findings"]}
    assert list(outside.iterdir()) == []


def _is_utf8(name: bytes) -> bool:
    try:
        name.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_a_planted_dist_info_link_never_gets_a_record_row(hostile, tmp_path):
    """A ``.dist-info`` planted as a symlink to a directory outside the site directory, whose RECORD
    lists devel's files as expansions: dedup still links them (they are expansions by that RECORD),
    but never appends its manifest row to a RECORD it reached through a link."""
    outside = tmp_path / "outside-dist-info"
    outside.mkdir()
    listed = [os.fsdecode(name) for name in ODD_NAMES if b"\n" not in name and _is_utf8(name)]
    (outside / "RECORD").write_text("".join(f"_rocm_sdk_devel/lib/{name},,\n" for name in listed))
    (outside / "METADATA").write_text("Metadata-Version: 2.1\nName: rocm-sdk-devel\nVersion: 7.13.0\n")
    before = (outside / "RECORD").read_bytes()
    (hostile / "rocm_sdk_devel-7.13.0.dist-info").symlink_to(outside)
    done = rocm_audit("dedup", "-p", str(hostile), "--format", "json")
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr
    assert json.loads(done.stdout)["dedup"]["replaced"] > 0
    assert (outside / "RECORD").read_bytes() == before


def test_a_record_field_over_the_csv_limit_is_no_internal_error(hostile):
    """A RECORD row with a field longer than the csv module accepts (131,072 characters) lists
    nothing rocm-audit can trust: the distribution owns nothing, and no command stops on it."""
    info = hostile / "rocm_sdk_core-7.13.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rocm-sdk-core\nVersion: 7.13.0\n")
    (info / "RECORD").write_text("_rocm_sdk_core/" + "x" * 200_000 + ",,\n")
    for args in (("check", "gfx942"), ("prune", "gfx942", "--dry-run"), ("dedup", "--check")):
        done = rocm_audit(*args, "-p", str(hostile), "--format", "json")
        assert done.returncode in (0, 1) and b"internal error" not in done.stderr, (args, done.stderr)
