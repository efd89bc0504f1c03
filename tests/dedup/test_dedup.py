"""`rocm-audit dedup` on TheRock-shaped trees of real gcc-built ELF files."""

from __future__ import annotations

import fcntl
import json
import os
import random
import stat
import subprocess
from pathlib import Path

import pytest

from rocm_audit.dedup import apply as dedup_apply
from rocm_audit.dedup import link as dedup_link
from rocm_audit.dedup import manifest as dedup_manifest
from rocm_audit.dedup import plan as dedup_plan
from rocm_audit.dedup import tuning
from rocm_audit.dedup import verify as dedup_verify
from rocm_audit.dedup.apply import apply_plan
from rocm_audit.dedup.plan import hardlinked, make_plan
from rocm_audit.dedup.revert import revert_manifests
from rocm_audit.dedup.run import run_dedup
from rocm_audit.tree.discovery import resolve_roots
from rocm_audit.tree.inventory import TEMP_PREFIX, build_inventory
from support.sdk_tree import resolved_bytes, snapshot

CORE_DUPLICATES = ("librocm_sysdeps_z.so.1", "libamd_comgr.so.3", "libamdhip64.so.7")


def expected_links(sdk) -> dict[str, str]:
    """Duplicate path -> the relative link text `ln -sr` would write."""
    links = {str(sdk.devel / "lib" / n): f"../../_rocm_sdk_core/lib/{n}" for n in CORE_DUPLICATES}
    links[str(sdk.devel / "lib" / "libhard.so.1")] = "../../_rocm_sdk_core/lib/libhard.so.1"
    links[str(sdk.devel / "lib" / "llvm" / "lib" / "libLLVMdemo.so.1")] = (
        "../../../../_rocm_sdk_core/lib/llvm/lib/libLLVMdemo.so.1"
    )
    links[str(sdk.devel / "lib" / "librocblas.so.5")] = "../../_rocm_sdk_libraries_gfx94X_dcgpu/lib/librocblas.so.5"
    return links


def test_dry_run_plans_exactly_the_duplicate_libraries_and_changes_nothing(sdk, run_cli):
    before = snapshot(sdk.site)
    result = run_cli("dedup", "--dry-run", "-p", str(sdk.site), "--format", "json", expect=0)
    assert snapshot(sdk.site) == before
    section = result.report["dedup"]
    planned = {d["path"]: d["link_text"] for g in section["groups"] for d in g["duplicates"]}
    assert planned == expected_links(sdk)
    keepers = {g["keeper"] for g in section["groups"]}
    assert all("/_rocm_sdk_devel/" not in k for k in keepers)
    assert all(d["status"] == "planned" for g in section["groups"] for d in g["duplicates"])
    hard = [g for g in section["groups"] if g["reason"] == "hardlink"]
    assert [d["path"] for g in hard for d in g["duplicates"]] == [str(sdk.devel / "lib" / "libhard.so.1")]
    # Hardlinks share blocks already: only the five real copies count as freed bytes.
    sizes = {g["keeper"]: g["size"] for g in section["groups"] if g["reason"] != "hardlink"}
    assert section["bytes_freed"] == sum(sizes.values())
    assert section["replaced"] == 0
    assert len(section["shell_preview"]) == 6
    assert section["manifest"] is None


def test_dry_run_shell_commands_are_printed_whole_to_paste(sdk, run_cli):
    """-v prints the equivalent shell one command a line, however long: a command wrapped over two
    lines runs as two broken ones when pasted."""
    preview = run_cli("dedup", "--dry-run", "-p", str(sdk.site), "--format", "json", expect=0).report["dedup"]
    text = run_cli("dedup", "--dry-run", "-v", "-p", str(sdk.site), expect=0).stdout.splitlines()
    start = text.index("# equivalent shell (rocm-audit also re-checks each pair just before changing it):") + 1
    assert text[start : start + len(preview["shell_preview"])] == preview["shell_preview"]
    assert max(len(line) for line in preview["shell_preview"]) > 100  # long enough to have been wrapped


def test_never_plans_executables_data_files_lookalikes_or_files_outside_the_sdk(sdk, run_cli):
    result = run_cli("dedup", "--dry-run", "-p", str(sdk.site), "--format", "json", expect=0)
    planned = {d["path"] for g in result.report["dedup"]["groups"] for d in g["duplicates"]}
    planned |= {g["keeper"] for g in result.report["dedup"]["groups"]}
    for untouchable in (
        sdk.devel / "bin" / "amd-tool",
        sdk.devel / "share" / "therock" / "dist_info.json",
        sdk.devel / "lib" / "libpair_b.so.1",
        sdk.libraries / "lib" / "libpair_a.so.1",
        sdk.libraries / "lib" / "libpair_b.so.1",
        sdk.site / "torch" / "lib" / "libamdhip64.so.7",
    ):
        assert str(untouchable) not in planned
    # The fixture really has the traps: identical executables and data, same-size lookalikes.
    assert (sdk.devel / "bin" / "amd-tool").read_bytes() == (sdk.core / "bin" / "amd-tool").read_bytes()
    pair_a, pair_b = (sdk.libraries / "lib" / "libpair_a.so.1"), (sdk.libraries / "lib" / "libpair_b.so.1")
    assert pair_a.stat().st_size == pair_b.stat().st_size and pair_a.read_bytes() != pair_b.read_bytes()
    tail_a, tail_b = pair_b.read_bytes(), (sdk.devel / "lib" / "libpair_b.so.1").read_bytes()
    assert len(tail_a) == len(tail_b) and tail_a[:-4096] == tail_b[:-4096] and tail_a != tail_b


def test_check_changes_nothing_and_fails_until_dedup_ran(sdk, run_cli):
    before = snapshot(sdk.site)
    result = run_cli("dedup", "--check", "-p", str(sdk.site), "--format", "json", expect=1)
    assert snapshot(sdk.site) == before
    rules = sorted({f["rule"] for f in result.report["findings"]})
    assert rules == ["DUP001", "DUP002"]
    run_cli("dedup", "-p", str(sdk.site), "-q", expect=0)
    result = run_cli("dedup", "--check", "-p", str(sdk.site), "--format", "json", expect=0)
    assert result.report["dedup"]["groups"] == []


def test_apply_makes_relative_symlinks_to_the_keeper_and_keeps_every_byte(sdk, run_cli):
    contents_before = resolved_bytes(sdk.site)
    keepers_before = {p: os.stat(p) for p in (sdk.core / "lib" / n for n in CORE_DUPLICATES)}
    result = run_cli("dedup", "-p", str(sdk.site), "--format", "json", expect=0)
    section = result.report["dedup"]
    assert section["replaced"] == 6 and section["skipped"] == 0 and section["verified"] is True
    for path, link_text in expected_links(sdk).items():
        assert os.path.islink(path)
        assert os.readlink(path) == link_text and not os.path.isabs(link_text)
    for keeper, st in keepers_before.items():
        now = os.lstat(keeper)
        assert stat.S_ISREG(now.st_mode) and (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
        devel_path = sdk.devel / "lib" / keeper.name
        assert os.stat(devel_path).st_ino == now.st_ino  # one inode for the loader
    assert resolved_bytes(sdk.site) == contents_before  # every path resolves to its old bytes
    assert not [p for p in sdk.site.rglob("*") if p.name.startswith(TEMP_PREFIX)]
    manifest = Path(section["manifest"])
    assert manifest == sdk.site / ".rocm-audit" / "dedup-manifest.jsonl" and manifest.is_file()
    # Executables, data files and files outside the SDK trees are untouched regular files.
    for path in (
        sdk.devel / "bin" / "amd-tool",
        sdk.devel / "share" / "therock" / "dist_info.json",
        sdk.site / "torch" / "lib" / "libamdhip64.so.7",
        sdk.devel / "lib" / "libpair_b.so.1",
    ):
        assert stat.S_ISREG(os.lstat(path).st_mode)
    # Already-correct symlinks were left alone.
    assert os.readlink(sdk.devel / "lib" / "libamdhip64.so") == "libamdhip64.so.7"


def test_second_run_finds_nothing_to_do(sdk, run_cli):
    run_cli("dedup", "-p", str(sdk.site), "-q", expect=0)
    after_first = snapshot(sdk.site)
    result = run_cli("dedup", "-p", str(sdk.site), "--format", "json", expect=0)
    assert result.report["dedup"]["groups"] == [] and result.report["dedup"]["replaced"] == 0
    without_manifest = {k: v for k, v in snapshot(sdk.site).items() if "/.rocm-audit" not in k}
    assert without_manifest == {k: v for k, v in after_first.items() if "/.rocm-audit" not in k}


def test_loading_both_paths_maps_one_inode_after_dedup(sdk):
    """The loader-level effect: glibc maps the devel path onto the already loaded core copy."""
    script = (
        "import ctypes, os, sys\n"
        "a = ctypes.CDLL(sys.argv[1], mode=os.RTLD_GLOBAL)\n"
        "b = ctypes.CDLL(sys.argv[2])\n"
        "maps = [l.split()[-1] for l in open('/proc/self/maps') if 'libamd_comgr' in l]\n"
        "print(len(set(os.stat(m).st_ino for m in maps)))\n"
    )
    core, devel = sdk.core / "lib" / "libamd_comgr.so.3", sdk.devel / "lib" / "libamd_comgr.so.3"

    def inodes_mapped() -> int:
        done = subprocess.run(
            ["python3", "-c", script, str(core), str(devel)], capture_output=True, text=True, timeout=60, check=True
        )
        return int(done.stdout)

    assert inodes_mapped() == 2
    run_dedup([str(sdk.site)], mode="apply")
    assert inodes_mapped() == 1


def _write_trio(sdk) -> tuple[dict[str, Path], bytes, bytes]:
    """Three same-size libraries whose heads and tails agree; the core copy (the keeper by rule)
    differs in the middle, the other two are equal. Returns (paths by tree, the equal bytes, the
    core copy's bytes)."""
    from rocm_audit.tree.identical import CHUNK_BYTES

    library = bytearray((sdk.core / "lib" / "libamd_comgr.so.3").read_bytes())
    library[len(library) // 3] ^= 0x01  # a library of its own, not another copy of comgr
    library = bytes(library + random.Random(7).randbytes(6 * CHUNK_BYTES))  # bytes past the ELF's end
    middle_changed = bytearray(library)
    middle_changed[len(library) // 2] ^= 0x01
    trio = {
        "core": sdk.core / "lib" / "libtrio.so.1",
        "libraries": sdk.libraries / "lib" / "libtrio.so.1",
        "devel": sdk.devel / "lib" / "libtrio.so.1",
    }
    trio["core"].write_bytes(bytes(middle_changed))
    trio["libraries"].write_bytes(library)
    trio["devel"].write_bytes(library)
    return trio, library, bytes(middle_changed)


@pytest.mark.parametrize("sharing", ["one process", "helpers compare pieces"])
def test_apply_compares_once_and_regroups_members_that_differ_from_their_keeper(sdk, run_cli, monkeypatch, sharing):
    """An applying run plans on size, head and tail and byte-compares each pair just before the
    change. Three same-size files whose heads and tails agree, where the core copy (the keeper by
    rule) differs in the middle: the other two must still be linked to each other, exactly as the
    exact plan of a dry run says, and the revert manifest must undo it. With helpers, every
    comparison (the dry run's and the apply's) is cut into one-chunk pieces that several processes
    share, and the outcome must not change."""
    asked: list[tuple[int, int]] = []  # (items, processes) per comparison
    if sharing != "one process":
        fork_imap = dedup_apply.fork_imap

        def counting_fork_imap(function, items, priorities, workers, meanwhile=None):
            asked.append((len(items), workers))
            return fork_imap(function, items, priorities, workers, meanwhile)

        monkeypatch.setattr(dedup_plan, "fork_imap", counting_fork_imap)
        monkeypatch.setattr(dedup_apply, "fork_imap", counting_fork_imap)
        monkeypatch.setattr(tuning, "PARALLEL_MIN_BYTES", 0)
        monkeypatch.setattr(tuning, "PIECE_BYTES", 1)  # pieces of one chunk
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
        monkeypatch.setattr("rocm_audit.tree.forkmap.threading.active_count", lambda: 1)
    trio, library, middle_changed = _write_trio(sdk)
    before = snapshot(sdk.site)
    dry = run_cli("dedup", "--dry-run", "-p", str(sdk.site), "--format", "json", expect=0).report["dedup"]
    applied = run_cli("dedup", "-p", str(sdk.site), "--format", "json", expect=0).report["dedup"]

    def groups(section):
        return [(g["keeper"], [(d["path"], d["link_text"]) for d in g["duplicates"]]) for g in section["groups"]]

    assert groups(applied) == groups(dry)
    assert (
        str(trio["libraries"]),
        [(str(trio["devel"]), "../../_rocm_sdk_libraries_gfx94X_dcgpu/lib/libtrio.so.1")],
    ) in groups(applied)
    assert all(d["status"] == "replaced" for g in applied["groups"] for d in g["duplicates"])
    assert applied["verified"] is True and applied["replaced"] == 7
    assert stat.S_ISREG(os.lstat(trio["core"]).st_mode) and trio["core"].read_bytes() == bytes(middle_changed)
    assert os.path.islink(trio["devel"]) and trio["devel"].read_bytes() == library
    # The manifest holds the first, never-made plan as well; revert takes the tree back exactly.
    reverted = run_cli("dedup", "--revert", applied["manifest"], "--format", "json", expect=0).report["revert"]
    assert len(reverted["restored"]) == 7 and reverted["failed"] == 0
    after = {k: v for k, v in snapshot(sdk.site).items() if "/.rocm-audit" not in k}
    assert {k: v[:3] for k, v in after.items()} == {k: v[:3] for k, v in before.items()}
    if sharing != "one process":
        assert all(processes == 3 for _, processes in asked)
        pairs = 7 + 1  # the apply's first round compares keeper-devel, keeper-libraries too
        assert max(items for items, _ in asked) > pairs  # the trio's comparisons came in pieces


def test_apply_hands_out_the_snapshot_then_pairs_smallest_first_each_in_one_run_of_pieces(sdk, monkeypatch):
    """The order of work that lets the first link come early: every snapshot share before any
    comparison (no link is made without the snapshot), then the pairs from the smallest up, the
    pieces of one pair one after another from its first byte to its last."""
    from rocm_audit.tree.identical import CHUNK_BYTES

    handed_out: list[list] = []
    fork_imap = dedup_apply.fork_imap

    def recording_fork_imap(function, items, priorities, workers, meanwhile=None):
        order = sorted(range(len(items)), key=lambda i: -priorities[i])  # fork_imap's documented order
        handed_out.append([items[i] for i in order])
        return fork_imap(function, items, priorities, workers, meanwhile)

    monkeypatch.setattr(dedup_apply, "fork_imap", recording_fork_imap)
    monkeypatch.setattr(tuning, "PIECE_BYTES", 2 * CHUNK_BYTES)  # pieces of one chunk per file
    monkeypatch.setattr(tuning, "SNAPSHOT_SHARE", 2)
    big = random.Random(3).randbytes(5 * CHUNK_BYTES + 17)
    for tree in (sdk.core, sdk.devel):
        (tree / "lib" / "libbig.so.1").write_bytes((sdk.core / "lib" / "libamd_comgr.so.3").read_bytes() + big)
    outcome = run_dedup([str(sdk.site)], mode="apply")
    assert outcome.sections["dedup"]["replaced"] >= 4
    first_round = next(r for r in handed_out if any(isinstance(i, dedup_link.PairPiece) for i in r))
    shares = [item for item in first_round if isinstance(item, dedup_apply.SnapshotShare)]
    assert len(shares) >= 2 and first_round[: len(shares)] == shares
    pieces = first_round[len(shares) :]
    assert pieces and all(isinstance(item, dedup_link.PairPiece) for item in pieces)
    runs: list[tuple[str, str]] = []
    for item in pieces:
        if not runs or runs[-1] != (item.keeper, item.victim):
            runs.append((item.keeper, item.victim))
    assert len(runs) == len(set(runs))  # no pair's pieces are split up by another pair's
    sizes = []
    for pair in runs:
        of_pair = [p for p in pieces if (p.keeper, p.victim) == pair]
        sizes.append(of_pair[0].size)
        bounds = [b for p in of_pair for b in p.byte_range]  # 0, a, a, b, b, ..., size
        assert bounds[0] == 0 and bounds[-1] == of_pair[0].size and bounds[1:-1:2] == bounds[2:-1:2]
    assert sizes == sorted(sizes) and sizes[-1] > 5 * CHUNK_BYTES
    assert len([p for p in pieces if p.size > 5 * CHUNK_BYTES]) == 6  # libbig in pieces of one chunk


def test_a_manifest_that_cannot_be_written_means_no_change_at_all(sdk, run_cli, tmp_path):
    before = snapshot(sdk.site)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    report = run_cli(
        "dedup", "-p", str(sdk.site), "--manifest", str(blocker / "manifest.jsonl"), "--format", "json", expect=1
    ).report
    refused = [f for f in report["findings"] if f["rule"] == "DUP005" and "revert manifest" in f["message"]]
    assert refused and "nothing changed" in refused[0]["message"]
    assert report["dedup"]["replaced"] == 0 and report["dedup"]["manifest"] is None
    assert snapshot(sdk.site) == before


def test_when_the_regrouped_members_cannot_be_journalled_they_stay_and_the_rest_is_done(sdk, monkeypatch):
    """The manifest turns into a directory after the first plan is journalled (a real EISDIR on
    the next append): the members regrouped at apply time are left alone, every planned change
    that was journalled is made, and the run says why."""
    trio, library, _ = _write_trio(sdk)
    journal = dedup_manifest.journal_changes

    def journal_then_block(manifest_path, groups, run_id, *, header):
        journal(manifest_path, groups, run_id, header=header)
        if header:
            os.replace(manifest_path, manifest_path + ".kept")
            os.mkdir(manifest_path)

    monkeypatch.setattr(dedup_apply, "journal_changes", journal_then_block)
    outcome = run_dedup([str(sdk.site)], mode="apply")
    section = outcome.sections["dedup"]
    refused = [f for f in outcome.findings if f.rule == "DUP005" and "revert manifest" in f.message]
    assert len(refused) == 1 and "Is a directory" in refused[0].message
    for path in (trio["libraries"], trio["devel"]):
        assert stat.S_ISREG(os.lstat(path).st_mode) and path.read_bytes() == library
    replaced = {d["path"] for g in section["groups"] for d in g["duplicates"] if d["status"] == "replaced"}
    assert replaced == set(expected_links(sdk))
    assert all(os.path.islink(p) and os.readlink(p) == text for p, text in expected_links(sdk).items())


def test_file_modified_between_plan_and_apply_is_skipped_and_reported(sdk):
    roots, _ = resolve_roots([str(sdk.site)], for_dedup=True)
    plan = make_plan(build_inventory(roots))
    victim = sdk.devel / "lib" / "libamd_comgr.so.3"
    data = bytearray(victim.read_bytes())
    data[-100] ^= 0xFF  # same size, different bytes
    victim.write_bytes(bytes(data))
    findings = []
    result = apply_plan(plan, str(sdk.site / "manifest.jsonl"), findings)
    assert [(f.rule, f.path) for f in findings if f.rule.startswith("DUP0")] == [("DUP003", str(victim))]
    assert stat.S_ISREG(os.lstat(victim).st_mode) and victim.read_bytes() == bytes(data)
    assert result.replaced == 5 and result.skipped == 1


def test_bytes_changed_without_stat_change_are_caught_by_the_final_compare(sdk):
    """Same size and the same mtime restored: only the byte comparison can see it."""
    roots, _ = resolve_roots([str(sdk.site)], for_dedup=True)
    plan = make_plan(build_inventory(roots))
    victim = sdk.devel / "lib" / "librocblas.so.5"
    st = victim.stat()
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x5A
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    findings = []
    apply_plan(plan, str(sdk.site / "manifest.jsonl"), findings)
    assert [(f.rule, f.path) for f in findings if f.rule.startswith("DUP0")] == [("DUP003", str(victim))]
    assert "bytes differ" in findings[0].message
    assert victim.read_bytes() == bytes(data)


def _make_unwritable(directory: Path) -> callable:
    """A real kernel refusal: chattr +i as root (root ignores modes), mode 0555 otherwise."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(directory)], check=True, capture_output=True)
        return lambda: subprocess.run(["chattr", "-i", str(directory)], check=True)
    directory.chmod(0o555)
    return lambda: directory.chmod(0o755)


def test_permission_error_mid_run_is_reported_and_every_path_still_resolves(sdk, run_cli):
    contents_before = resolved_bytes(sdk.site)
    llvm_dir = sdk.devel / "lib" / "llvm" / "lib"
    undo = _make_unwritable(llvm_dir)
    try:
        result = run_cli("dedup", "-p", str(sdk.site), "--format", "json", expect=1)
    finally:
        undo()
    failed = [f for f in result.report["findings"] if f["rule"] == "DUP005"]
    assert [f["path"] for f in failed] == [str(llvm_dir / "libLLVMdemo.so.1")]
    assert result.report["dedup"]["replaced"] == 5
    assert stat.S_ISREG(os.lstat(llvm_dir / "libLLVMdemo.so.1").st_mode)
    assert resolved_bytes(sdk.site) == contents_before
    assert not [p for p in sdk.site.rglob("*") if p.name.startswith(TEMP_PREFIX)]


def test_revert_restores_bytes_mode_and_file_type(sdk, run_cli):
    before = snapshot(sdk.site)
    os.chmod(sdk.devel / "lib" / "libamdhip64.so.7", 0o640)  # differs from the keeper: restored as 0640
    before = snapshot(sdk.site)
    result = run_cli("dedup", "-p", str(sdk.site), "--format", "json", expect=0)
    assert any(f["rule"] == "DUP004" for f in result.report["findings"])
    manifest = result.report["dedup"]["manifest"]
    result = run_cli("dedup", "--revert", manifest, "--format", "json", expect=0)
    assert len(result.report["revert"]["restored"]) == 6
    after = snapshot(sdk.site)
    for path, state in before.items():
        now = after[path]
        if state[0] == "file":
            assert now[0] == "file" and now[1] == state[1] and now[2] == state[2], path
            assert now[4] == state[4], f"mtime of {path}"
        else:
            assert now[:2] == state[:2], path
    # The hardlinked pair is a hardlink again, not a third copy.
    assert os.stat(sdk.devel / "lib" / "libhard.so.1").st_ino == os.stat(sdk.core / "lib" / "libhard.so.1").st_ino
    # Revert is idempotent: a second revert finds everything original.
    again = revert_manifests([manifest])
    assert again.sections["revert"]["already_original"] == 6 and not again.findings


def test_revert_refuses_when_the_keeper_changed(sdk):
    outcome = run_dedup([str(sdk.site)], mode="apply")
    keeper = sdk.core / "lib" / "libamdhip64.so.7"
    keeper.write_bytes(keeper.read_bytes() + b"\0")
    outcome = revert_manifests([outcome.sections["dedup"]["manifest"]])
    refused = [f for f in outcome.findings if f.rule == "DUP007"]
    assert [f.path for f in refused] == [str(sdk.devel / "lib" / "libamdhip64.so.7")]
    assert os.path.islink(sdk.devel / "lib" / "libamdhip64.so.7")


def test_a_concurrent_run_is_refused_by_the_tree_lock(sdk, run_cli):
    before = snapshot(sdk.site)
    fd = os.open(sdk.devel, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        result = run_cli("dedup", "-p", str(sdk.site), "--format", "json", expect=1)
    finally:
        os.close(fd)
    assert [f["rule"] for f in result.report["findings"]] == ["DUP008"]
    assert snapshot(sdk.site) == before


def test_leftover_temporary_link_is_reported_then_removed(sdk, run_cli):
    leftover = sdk.devel / "lib" / f"{TEMP_PREFIX}deadbeef"
    os.symlink("../../_rocm_sdk_core/lib/libamdhip64.so.7", leftover)
    result = run_cli("dedup", "--check", "-p", str(sdk.site), "--format", "json", expect=1)
    assert any(f["rule"] == "SCAN004" and f["path"] == str(leftover) for f in result.report["findings"])
    result = run_cli("dedup", "-p", str(sdk.site), "--format", "json", expect=0)
    assert not os.path.lexists(leftover)
    assert not any(f["rule"] == "SCAN004" for f in result.report["findings"])


def test_a_leftover_temporary_hardlink_is_removed_not_planned(sdk, run_cli):
    """A run killed between link(2) and rename(2) of a hardlink leaves a temporary name on the
    keeper's inode: the next run removes it and plans nothing for it."""
    leftover = sdk.devel / "lib" / f"{TEMP_PREFIX}0123456789ab"
    os.link(sdk.core / "lib" / "libamdhip64.so.7", leftover)
    result = run_cli("dedup", "-p", str(sdk.site), "--format", "json", expect=0)
    planned = {d["path"] for g in result.report["dedup"]["groups"] for d in g["duplicates"]}
    assert str(leftover) not in planned and not os.path.lexists(leftover)
    assert not any(f["rule"] in ("DUP003", "SCAN004") for f in result.report["findings"])


def test_verification_reports_a_changed_dt_needed_resolution(sdk):
    """verify_applied compares DT_NEEDED resolution before and after: break it and it must say so."""

    roots, _ = resolve_roots([str(sdk.site)], for_dedup=True)
    plan = make_plan(build_inventory(roots))
    before = dedup_verify.needed_before([d.record.path for g in plan.groups for d in g.duplicates])
    comgr_devel = str(sdk.devel / "lib" / "libamd_comgr.so.3")
    assert before[comgr_devel].resolved["librocm_sysdeps_z.so.1"] == str(sdk.devel / "lib" / "librocm_sysdeps_z.so.1")
    os.unlink(sdk.devel / "lib" / "librocm_sysdeps_z.so.1")
    findings = []
    assert dedup_verify.verify_applied(plan, before, findings) is False
    assert any(f.rule == "DUP006" and f.path == comgr_devel and "librocm_sysdeps_z.so.1" in f.message for f in findings)


def test_sdk_tree_path_widens_to_its_siblings(sdk, run_cli):
    """-p _rocm_sdk_devel still finds the core copies its duplicates must link to."""
    result = run_cli("dedup", "--dry-run", "-p", str(sdk.devel), "--format", "json", expect=0)
    planned = {d["path"] for g in result.report["dedup"]["groups"] for d in g["duplicates"]}
    assert planned == set(expected_links(sdk))


def test_no_sdk_tree_says_where_it_looked(tmp_path, run_cli):
    (tmp_path / "somepkg").mkdir()
    (tmp_path / "somepkg" / "mod.py").write_text("x = 1\n")
    result = run_cli("dedup", "-p", str(tmp_path), expect=0)
    said = " ".join(result.stdout.split())
    assert said.count("no ROCm SDK tree (_rocm_sdk_*) found") == 1 and str(tmp_path) in said  # said once
    assert "dedup: nothing to link: no SDK tree in the audited paths" in said
    result = run_cli("dedup", "-p", str(tmp_path), "--format", "json", expect=0)
    scan003 = [f for f in result.report["findings"] if f["rule"] == "SCAN003"]
    assert scan003 and scan003[0]["data"]["looked_in"] == [str(tmp_path)]


def test_malformed_elf_is_a_finding_with_an_offset_and_the_run_goes_on(sdk, run_cli):
    good = (sdk.core / "lib" / "libamdhip64.so.7").read_bytes()
    # A program header table that points past the end of the file, in two identical copies (a
    # duplicate class dedup must classify before it could plan a link) ...
    patched = bytearray(good)
    patched[0x20:0x28] = (1 << 40).to_bytes(8, "little")
    pair = {str(sdk.core / "lib" / "libbroken.so.1"), str(sdk.devel / "lib" / "libbroken.so.1")}
    for path in pair:
        Path(path).write_bytes(bytes(patched))
    # ... and one of a size no other file has: it cannot have a duplicate, so dedup never opens it.
    unique = sdk.devel / "lib" / "libbroken-unique.so.1"
    unique.write_bytes(bytes(patched[:200]))
    result = run_cli("dedup", "--dry-run", "-p", str(sdk.site), "--format", "json", expect=0)
    scan002 = [f for f in result.report["findings"] if f["rule"] == "SCAN002"]
    assert len(scan002) == 1 and scan002[0]["path"] in pair  # one member names the identical class
    assert scan002[0]["data"]["offset"] == 1 << 40
    assert len(result.report["dedup"]["groups"]) == 6  # the malformed pair is not planned
    # check reads every file, so it names all three
    result = run_cli("check", "-p", str(sdk.site), "--format", "json", expect=None)
    assert {f["path"] for f in result.report["findings"] if f["rule"] == "SCAN002"} == pair | {str(unique)}


def test_shuffled_directory_order_gives_the_same_plan(sdk, monkeypatch):
    """rdfind's disorderfs idea: the plan must not depend on the order the OS lists entries in."""
    import random

    from rocm_audit.tree import inventory

    reference = run_dedup([str(sdk.site)], mode="dry-run").sections["dedup"]["groups"]
    original_scandir = os.scandir

    class Shuffled:
        def __init__(self, path):
            self._it = original_scandir(path)

        def __enter__(self):
            entries = list(self._it)
            random.Random(len(entries)).shuffle(entries)
            entries.reverse()
            return iter(entries)

        def __exit__(self, *exc):
            self._it.close()

    monkeypatch.setattr(inventory.os, "scandir", Shuffled)
    assert run_dedup([str(sdk.site)], mode="dry-run").sections["dedup"]["groups"] == reference


def test_json_report_written_to_a_file_atomically(sdk, run_cli, report_validator, tmp_path):
    out = tmp_path / "report.json"
    run_cli("dedup", "--check", "-p", str(sdk.site), "--format", "json", "-o", str(out), expect=1)
    report = json.loads(out.read_text())
    report_validator.validate(report)
    assert report["command"] == "dedup" and report["dedup"]["mode"] == "check"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(TEMP_PREFIX)]


@pytest.mark.parametrize("argv", [["--dry-run", "--check"], ["--check", "--revert", "x"]])
def test_exclusive_modes_are_a_usage_error(sdk, run_cli, argv):
    result = run_cli("dedup", "-p", str(sdk.site), *argv, expect=2)
    assert "exclude each other" in result.output


def test_keeper_rule_ranks_exact_tree_names_before_patterns(tmp_path):
    from rocm_audit.tree.keeper import KeeperRule

    order = ["_rocm_sdk_core", "_rocm_sdk_libraries*", "_rocm_sdk_*", "_rocm_sdk_devel"]

    def record(tree: str, rel: str) -> tuple[str, str]:
        return f"/sp/{tree}/{rel}", f"/sp/{tree}"

    candidates = [
        record("_rocm_sdk_devel", "lib/libx.so.1"),
        record("_rocm_profiler_sdk_x", "lib/libx.so.1"),
        record("_rocm_sdk_extra", "lib/libx.so.1"),
        record("_rocm_sdk_libraries_gfx950_dcgpu", "lib/libx.so.1"),
        record("_rocm_sdk_core", "lib/libx.so.1.2.3"),
        record("_rocm_sdk_core", "lib/libx.so.1"),
    ]
    rule = KeeperRule(tuple(order))
    ranked = sorted(candidates, key=lambda r: rule.sort_key(r[0], r[1], "libx.so.1"))
    assert [path for path, _ in ranked] == [
        "/sp/_rocm_sdk_core/lib/libx.so.1",  # the SONAME-named file wins inside the owner
        "/sp/_rocm_sdk_core/lib/libx.so.1.2.3",
        "/sp/_rocm_sdk_libraries_gfx950_dcgpu/lib/libx.so.1",
        "/sp/_rocm_sdk_extra/lib/libx.so.1",
        "/sp/_rocm_sdk_devel/lib/libx.so.1",
        "/sp/_rocm_profiler_sdk_x/lib/libx.so.1",
    ]


def test_a_version_nonce_ranks_like_the_tree_it_renames_and_a_wheel_copy_comes_first():
    """``_rocm_sdk_core_r7130`` ranks as ``_rocm_sdk_core`` (not as the ``_rocm_sdk_*`` pattern,
    where ``_rocm_sdk_devel_r7130`` would tie with it); a copy a wheel installed (a hashed RECORD
    row) is the keeper before any expansion, whatever the trees are called."""
    from rocm_audit.tree.keeper import KeeperRule

    rule = KeeperRule(("_rocm_sdk_core", "_rocm_sdk_libraries*", "_rocm_sdk_*", "_rocm_sdk_devel"))
    assert rule.owner_rank("/sp/_rocm_sdk_core_r7130") == 0
    assert rule.owner_rank("/sp/_rocm_sdk_devel_r7130") == 3
    assert rule.owner_rank("/sp/_rocm_sdk_libraries_r7130") == 1
    # TheRock's CI nonce is its bare run id, appended with no separator (--version-suffix ${ARTIFACT_RUN_ID}).
    assert rule.owner_rank("/sp/_rocm_sdk_core17154321") == 0
    assert rule.owner_rank("/sp/_rocm_sdk_devel17154321") == 3
    assert rule.owner_rank("/sp/_rocm_sdk_libraries17154321") == 1
    devel, extra = "/sp/_rocm_sdk_devel/lib/libx.so.1", "/sp/_unknown/lib/libx.so.1"
    assert rule.choose([devel, extra], lambda p: p.rsplit("/lib/", 1)[0], None, lambda p: p == extra) == extra


def _replace_same_bytes(path):
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data)  # a new inode with the very same bytes


def _delete(path):
    path.unlink()


def _turn_into_symlink(path):
    path.unlink()
    os.symlink("libamdhip64.so.7", path)


@pytest.mark.parametrize(
    "race", [_replace_same_bytes, _delete, _turn_into_symlink], ids=["replaced", "deleted", "symlinked"]
)
def test_a_duplicate_that_races_between_plan_and_apply_is_skipped_and_reported(sdk, race):
    roots, _ = resolve_roots([str(sdk.site)], for_dedup=True)
    plan = make_plan(build_inventory(roots))
    victim = sdk.devel / "lib" / "libamd_comgr.so.3"
    race(victim)
    state_after_race = (
        os.path.lexists(victim),
        os.path.islink(victim),
        os.readlink(victim) if os.path.islink(victim) else None,
    )
    findings = []
    result = apply_plan(plan, str(sdk.site / "manifest.jsonl"), findings)
    skipped = [(f.rule, f.path) for f in findings if f.rule.startswith("DUP0")]
    assert skipped[0] == ("DUP003", str(victim)), findings
    assert result.replaced == 5
    # The path was left exactly as the race left it: rocm-audit did not "repair" it.
    assert (
        os.path.lexists(victim),
        os.path.islink(victim),
        os.readlink(victim) if os.path.islink(victim) else None,
    ) == state_after_race


def test_a_keeper_that_changes_between_plan_and_apply_blocks_its_group(sdk):
    roots, _ = resolve_roots([str(sdk.site)], for_dedup=True)
    plan = make_plan(build_inventory(roots))
    keeper = sdk.core / "lib" / "libamd_comgr.so.3"
    _replace_same_bytes(keeper)
    findings = []
    apply_plan(plan, str(sdk.site / "manifest.jsonl"), findings)
    devel = sdk.devel / "lib" / "libamd_comgr.so.3"
    assert ("DUP003", str(devel)) in [(f.rule, f.path) for f in findings]
    assert not os.path.islink(devel)


@pytest.mark.parametrize("piece_bytes", [None, 1], ids=["whole buckets", "one-chunk pieces"])
def test_the_plan_is_the_same_when_forked_helpers_compare_half_the_buckets(sdk, monkeypatch, piece_bytes):
    """Classes, malformed-file findings (made while classifying) and read failures come back from
    the helpers exactly as a single process finds them; also when each bucket's middle is cut into
    pieces (libpair_a and libpair_b agree on size, head and tail and differ in the middle)."""

    library = (sdk.core / "lib" / "libamd_comgr.so.3").read_bytes()
    broken = bytearray(library)
    broken[0x20:0x28] = (1 << 40).to_bytes(8, "little")  # program headers past the end of the file
    for tree in (sdk.core, sdk.devel):
        (tree / "lib" / "libbroken.so.1").write_bytes(bytes(broken))
    from rocm_audit.tree.identical import CHUNK_BYTES

    big = bytearray(library + random.Random(3).randbytes(5 * CHUNK_BYTES))  # bytes past the ELF's end
    for tree in (sdk.core, sdk.devel):
        (tree / "lib" / "libbig.so.1").write_bytes(bytes(big))
    big[len(big) // 2] ^= 1  # same size, head and tail: only the middle tells it apart
    (sdk.libraries / "lib" / "libbig.so.1").write_bytes(bytes(big))
    gone = sdk.devel / "lib" / "libgone.so.1"
    roots, _ = resolve_roots([str(sdk.site)], for_dedup=True)

    def plan():
        gone.write_bytes(library[:-1] + b"!")  # a candidate that vanishes after the inventory
        inventory = build_inventory(roots, worth_reading=hardlinked)
        gone.unlink()
        made = make_plan(inventory)
        groups = [(g.keeper.path, [(d.record.path, d.link_text) for d in g.duplicates]) for g in made.groups]
        return groups, sorted((f.rule, f.path, f.message) for f in made.findings), made.stats.bytes_read

    asked: list[tuple[int, int]] = []  # (pieces among the items, processes)

    def counting_fork_imap(function, items, priorities, workers):
        asked.append((sum(isinstance(item, dedup_plan.BucketPiece) for item in items), workers))
        return fork_imap(function, items, priorities, workers)

    fork_imap = dedup_plan.fork_imap
    monkeypatch.setattr(dedup_plan, "fork_imap", counting_fork_imap)
    single = plan()
    monkeypatch.setattr(tuning, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setattr("rocm_audit.tree.forkmap.threading.active_count", lambda: 1)  # other tests may leave threads
    if piece_bytes:
        monkeypatch.setattr(tuning, "PIECE_BYTES", piece_bytes)
    shared = plan()
    assert shared[:2] == single[:2]
    (no_pieces, alone), (cut, processes) = asked
    assert no_pieces == 0 and alone == 1 and processes == 3
    if piece_bytes:  # pieces read a middle whole even where another piece already differs
        assert cut >= len(shared[0]) + 4 and shared[2] >= single[2]  # libbig: 5 pieces of its middle
    else:
        assert cut == 0 and shared[2] == single[2]
    rules = {rule for rule, _, _ in single[1]}
    assert {"SCAN001", "SCAN002"} <= rules and len(single[0]) == 7
    assert (
        str(sdk.core / "lib" / "libbig.so.1"),
        [(str(sdk.devel / "lib" / "libbig.so.1"), "../../_rocm_sdk_core/lib/libbig.so.1")],
    ) in single[0]


def test_bytes_changed_after_the_comparison_are_caught_by_the_ctime_before_the_rename(sdk):
    """The rename follows the comparison (which a helper may have made): a writer who changes the
    bytes in between and restores size and mtime still moves the ctime, which nobody can set back."""
    import time

    from rocm_audit.tree.identical import CompareStats

    roots, _ = resolve_roots([str(sdk.site)], for_dedup=True)
    plan = make_plan(build_inventory(roots))
    victim = sdk.devel / "lib" / "librocblas.so.5"
    group = next(g for g in plan.groups if any(d.record.path == str(victim) for d in g.duplicates))
    planned = next(d for d in group.duplicates if d.record.path == str(victim))
    before = dedup_link.look_before(group, planned)
    assert before.victim_ctime_ns is not None
    piece = dedup_link.PairPiece(group.keeper.path, str(victim), group.keeper.size, (0, group.keeper.size))
    assert dedup_link.compare_piece(piece, CompareStats())[0] is None  # equal when compared
    time.sleep(0.05)  # past the file system's timestamp granularity
    st = victim.stat()
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x5A
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(dedup_link.Skip) as skipped:
        dedup_link.replace_with_link(group, planned, before)
    assert skipped.value.rule == "DUP003" and "ctime" in skipped.value.message
    assert victim.read_bytes() == bytes(data) and not os.path.islink(victim)
    assert not [p for p in os.listdir(victim.parent) if p.startswith(TEMP_PREFIX)]  # link removed


def test_with_helpers_no_change_is_made_before_the_whole_dt_needed_snapshot_is_in(sdk, monkeypatch):
    """The snapshot that verification compares against is taken in shares by whichever process is
    free; every share must be in before the first link, and all of them must reach _verify."""
    made: list[dedup_apply.BeforeChanges] = []

    class Recorded(dedup_apply.BeforeChanges):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    complete_at_each_link: list[bool] = []
    replace = dedup_apply.replace_with_link

    def checked_link(group, planned, before):
        complete_at_each_link.append(set(made[0].snapshot) == set(made[0].snapshot_paths))
        return replace(group, planned, before)

    seen_by_verify: list[set[str]] = []
    verify_applied = dedup_apply.verify_applied

    def recording_verify(plan, before, findings):
        seen_by_verify.append(set(before))
        return verify_applied(plan, before, findings)

    monkeypatch.setattr(dedup_apply, "BeforeChanges", Recorded)
    monkeypatch.setattr(dedup_apply, "replace_with_link", checked_link)
    monkeypatch.setattr(dedup_apply, "verify_applied", recording_verify)
    monkeypatch.setattr(tuning, "SNAPSHOT_SHARE", 2)  # several shares
    monkeypatch.setattr(tuning, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setattr("rocm_audit.tree.forkmap.threading.active_count", lambda: 1)
    roots, _ = resolve_roots([str(sdk.site)], for_dedup=True)
    plan = make_plan(build_inventory(roots), exact=False)
    duplicates = {d.record.path for g in plan.groups for d in g.duplicates}
    findings = []
    result = apply_plan(plan, str(sdk.site / "manifest.jsonl"), findings)
    assert result.replaced == len(duplicates) and result.verified is True
    assert complete_at_each_link and all(complete_at_each_link)
    assert seen_by_verify == [duplicates]  # every duplicate is an ELF library with a dynamic section


@pytest.mark.parametrize(
    ("tie_break", "kept"),
    [
        (["soname-name", "shortest-path", "path-order"], "lib/libtie.so.1"),  # the SONAME-named file
        (["shortest-path", "soname-name", "path-order"], "lib/a.so"),  # the shortest path, though not the SONAME
        (["path-order"], "lib/a.so"),
    ],
)
def test_tie_break_in_the_rules_file_decides_the_keeper(tmp_path, run_cli, tie_break, kept):
    """Two byte-identical copies inside one tree rank alike by owner; the tie-break setting decides."""
    import shutil

    from support.sdk_tree import build_library

    site = tmp_path / "site-packages"
    library = build_library(site / "_rocm_sdk_core" / "lib", "tie", "libtie.so.1")
    shutil.copy2(library, site / "_rocm_sdk_core" / "lib" / "a.so")
    rules = tmp_path / "rules.toml"
    rules.write_text(f"[policy.dedup]\ntie_break = {tie_break!r}\n".replace("'", '"'))
    result = run_cli("dedup", "--dry-run", "-p", str(site), "--rules", str(rules), "--format", "json", expect=0)
    (group,) = result.report["dedup"]["groups"]
    assert group["keeper"] == str(site / "_rocm_sdk_core" / kept)


def test_revert_shows_paths_relative_to_the_tree_it_put_back(sdk, run_cli, tmp_path):
    """The manifest in the tree's .rocm-audit: paths relative to that tree; kept elsewhere: relative
    to the deepest directory holding them all."""
    run_cli("dedup", "-p", str(sdk.site), expect=0)
    manifest = sdk.site / ".rocm-audit" / "dedup-manifest.jsonl"
    text = run_cli("dedup", "--revert", str(manifest), expect=0).stdout.splitlines()
    assert text[0] == f"paths relative to {sdk.site}"
    assert "restored _rocm_sdk_devel/lib/libamd_comgr.so.3" in text
    elsewhere = tmp_path / "journal.jsonl"
    run_cli("dedup", "-p", str(sdk.site), "--manifest", str(elsewhere), expect=0)
    text = run_cli("dedup", "--revert", str(elsewhere), expect=0).stdout.splitlines()
    assert text[0] == f"paths relative to {sdk.devel / 'lib'}"  # every restored path is under it
