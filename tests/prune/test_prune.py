"""`rocm-audit prune` on per-arch units built at test time: plan, weight, apply, revert, gate, races."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest

from rocm_audit.tree.archfiles import arch_unit_of, device_distribution_arch
from rocm_audit.tree.targets import MatchKind, kept_target, serves_kept
from support.prune_units import KEPT_FOR_SAFETY, REMOVED, tree_state


def _prune(run_cli, site: Path, *args: str, expect: int | None = 0):
    return run_cli("prune", *args, "-p", str(site), "--format", "json", expect=expect).report


def _rel(site: Path, paths: list[str]) -> set[str]:
    return {os.path.relpath(p, site) for p in paths}


def test_units_are_recognised_by_name():
    cases = {
        "/s/_rocm_sdk_libraries/.kpack/blas_lib_gfx942.kpack": ("kpack-archive", ("gfx942",)),
        "/s/_rocm_sdk_libraries/.kpack/blas_lib_gfx942:xnack+.kpack": ("kpack-archive", ("gfx942:xnack+",)),
        "/s/x/rocblas/library/TensileLibrary_lazy_gfx90a.dat": ("tensile", ("gfx90a",)),
        "/s/x/rocblas/library/Kernels.so-000-gfx90a-xnack+.hsaco": ("tensile", ("gfx90a:xnack+",)),
        "/s/x/hipblaslt/library/gfx950/TensileLibrary.dat": ("tensile-dir", ("gfx950",)),
        "/s/x/share/miopen/db/gfx942130.kdb": ("miopen-db", ("gfx942",)),
        "/s/x/lib/libMIOpenCKGroupedConv_gfx950.so": ("miopen-ck", ("gfx950",)),
        "/s/torch/lib/aotriton.images/amd-gfx11xx/flash/k.aks2": ("aotriton", ()),  # named by its content
        "/s/torch/lib/aotriton.images/amd-gfx942/flash/k.aks2": ("aotriton", ("gfx942",)),
        "/s/x/aotriton/kernels/gfx110x/k.hsaco": ("aotriton", ()),
        "/s/x/aotriton/kernels/gfx90a/k.hsaco": ("aotriton", ("gfx90a",)),
    }
    for path, (kind, arches) in cases.items():
        unit = arch_unit_of(path)
        assert unit is not None and (unit.kind, unit.arches) == (kind, arches), path
    for shared in ("/s/x/rocblas/library/TensileLibrary_lazy_fallback.dat", "/s/x/lib/librocblas.so.5", "/s/x/a.kpm"):
        assert arch_unit_of(shared) is None
    assert device_distribution_arch("rocm-sdk-device-gfx942") == "gfx942"
    assert device_distribution_arch("amd_torch_device_gfx950") == "gfx950"
    assert device_distribution_arch("rocm-sdk-device-gfx94X-dcgpu") == "gfx94X"
    assert device_distribution_arch("rocm-sdk-libraries") is None


def test_kept_targets_match_as_the_runtime_does_with_unspelled_features_open():
    bare = kept_target("gfx942")
    assert serves_kept("gfx942:xnack+", bare) is MatchKind.NATIVE  # HSA_XNACK=1 loads it
    assert serves_kept("gfx942:sramecc-", bare) is MatchKind.NATIVE
    assert serves_kept("gfx9-4-generic", bare, code_object_version=6, generic_version=1) is MatchKind.GENERIC
    assert serves_kept("gfx9-4-generic", bare, code_object_version=5) is None
    assert serves_kept("amdgcnspirv", bare) is MatchKind.SPIRV
    assert serves_kept("gfx94X", bare) is MatchKind.NATIVE and serves_kept("gfx11xx", bare) is None
    assert serves_kept("gfx90a", bare) is None
    assert serves_kept("gfx942:xnack+", kept_target("gfx942:xnack-")) is None
    assert serves_kept("gfx11xx", kept_target("gfx1100")) is MatchKind.NATIVE


def test_dry_run_plans_whole_units_only_and_changes_nothing(run_cli, units):
    before = tree_state(units)
    report = _prune(run_cli, units, "gfx942", "--dry-run")
    assert tree_state(units) == before
    section = report["prune"]
    assert _rel(units, [r["path"] for r in section["removals"]]) == set(REMOVED)
    assert all(r["status"] == "planned" for r in section["removals"])
    kept = {os.path.relpath(k["path"], units): k["reason"] for k in section["kept_units"]}
    assert set(kept) == set(KEPT_FOR_SAFETY)
    assert "gfx942" in kept[KEPT_FOR_SAFETY[0]] and "DT_NEEDED" in kept[KEPT_FOR_SAFETY[1]]
    assert "link" in kept[KEPT_FOR_SAFETY[2]]
    assert {f["rule"] for f in report["findings"]} == {"PRUNE001", "PRUNE002"}
    # the HIP library's gfx90a code is weighed as unused, never removable
    fat = [r for r in section["weight"] if r["distribution"] == "mylib" and r["target"] == "gfx90a"]
    assert fat and fat[0]["needed"] is False and fat[0]["bytes"] > fat[0]["removable_bytes"] > 0
    totals = section["totals"]
    assert totals["removable_bytes"] == sum(r["bytes"] for r in section["removals"]) > 0
    assert totals["unused_in_host_libraries_bytes"] > 0
    assert [r["bytes"] for r in section["weight"]] == sorted((r["bytes"] for r in section["weight"]), reverse=True)
    assert any(line.startswith("rm -rf -- ") for line in section["shell_preview"])
    text = run_cli("prune", "gfx942", "-p", str(units), "--dry-run", expect=0).stdout
    assert "would remove" in text and any(line.startswith("distribution ") for line in text.splitlines())


def test_check_gates_until_applied_then_a_second_run_finds_nothing(run_cli, units):
    _prune(run_cli, units, "gfx942", "--check", expect=1)
    applied = _prune(run_cli, units, "gfx942")
    assert all(r["status"] == "removed" for r in applied["prune"]["removals"])
    for rel in REMOVED:
        assert not os.path.lexists(units / rel), rel
    for rel in KEPT_FOR_SAFETY:
        assert os.path.lexists(units / rel), rel
    again = _prune(run_cli, units, "gfx942", "--check", expect=0)
    assert again["prune"]["removals"] == [] and again["prune"]["totals"]["removable_bytes"] == 0


def test_apply_keeps_what_kept_targets_load_and_verify_arch_agrees(run_cli, units):
    before = tree_state(units)
    # Kernels_gfx90a.hsaco is a carrier without gfx942 code: it fails before and is gone after
    verdicts_before = run_cli("verify-arch", "gfx942", "-p", str(units), "--format", "json", expect=1).report
    _prune(run_cli, units, "gfx942")
    after = tree_state(units)
    gone = {rel for rel in before if rel not in after}
    assert all(any(rel == r or rel.startswith(r + "/") for r in REMOVED) for rel in gone), gone
    assert all(before[rel] == after[rel] for rel in after), "a kept file changed"
    assert "mylib/lib/rocblas/library/Kernels.so-000-gfx942-xnack+.hsaco" in after  # bare target: both xnack
    assert "mylib/libfat.so" in after and "mylib/lib/rocblas/library/TensileLibrary_lazy_fallback.dat" in after
    verdicts_after = run_cli("verify-arch", "gfx942", "-p", str(units), "--format", "json", expect=0).report

    def verdicts(report):
        return {(c["path"], json.dumps(c["matches"])) for c in report["carriers"] if os.path.lexists(c["path"])}

    assert verdicts(verdicts_after) == verdicts(verdicts_before)
    assert [c["path"] for c in verdicts_before["carriers"] if c["missing"]] == [
        str(units / "mylib/kernels/Kernels_gfx*.hsaco")
    ]


def test_a_spelled_feature_prunes_the_other_setting(run_cli, units):
    report = _prune(run_cli, units, "gfx942:xnack-", "--dry-run")
    planned = _rel(units, [r["path"] for r in report["prune"]["removals"]])
    assert "mylib/lib/rocblas/library/Kernels.so-000-gfx942-xnack+.hsaco" in planned


def test_revert_from_backup_gives_back_the_exact_tree(run_cli, units, tmp_path):
    before = tree_state(units)
    applied = _prune(run_cli, units, "gfx942", "--backup", str(tmp_path / "backup"))
    manifest = applied["prune"]["manifest"]
    assert manifest and os.path.isfile(manifest)
    reverted = run_cli("prune", "--revert", manifest, "--format", "json", expect=0).report
    assert reverted["prune_revert"]["reinstall"] == []
    assert tree_state(units) == before
    again = run_cli("prune", "--revert", manifest, "--format", "json", expect=0).report
    assert again["prune_revert"]["restored"] == [] and again["prune_revert"]["original"]


def test_revert_without_backup_names_the_pip_reinstall(run_cli, units):
    applied = _prune(run_cli, units, "gfx942")
    reverted = run_cli("prune", "--revert", applied["prune"]["manifest"], "--format", "json", expect=1).report
    assert reverted["prune_revert"]["reinstall"] == ["python -m pip install --force-reinstall --no-deps mylib==1.0"]
    unowned = {f["path"] for f in reverted["findings"] if f["rule"] == "PRUNE006"}
    assert any(p.endswith("blas_lib_gfx90a.kpack") for p in unowned)  # no RECORD owns it, no backup holds it


def test_a_file_changed_after_the_journal_is_skipped(run_cli, units, monkeypatch):
    from rocm_audit.prune import apply as prune_apply

    victim = units / "mylib/kernels/Kernels_gfx90a.hsaco"
    real_append = prune_apply.append_records

    def append_then_touch(path, records):
        real_append(path, records)
        with open(victim, "r+b") as handle:  # same size, mtime put back: only the ctime tells
            data = handle.read()
            handle.seek(0)
            handle.write(data)
        st = victim.stat()
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))

    monkeypatch.setattr(prune_apply, "append_records", append_then_touch)
    report = _prune(run_cli, units, "gfx942", expect=1)
    skipped = [r for r in report["prune"]["removals"] if r["status"] == "skipped"]
    assert [os.path.relpath(r["path"], units) for r in skipped] == ["mylib/kernels/Kernels_gfx90a.hsaco"]
    assert victim.exists() and any(f["rule"] == "PRUNE003" for f in report["findings"])


def test_a_concurrent_run_is_refused(run_cli, units):
    fd = os.open(units / "_rocm_sdk_libraries", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        report = _prune(run_cli, units, "gfx942", expect=1)
    finally:
        os.close(fd)
    assert any(f["rule"] == "PRUNE005" for f in report["findings"])
    assert all(os.path.lexists(units / rel) for rel in REMOVED)


@pytest.mark.parametrize("mode", [[], ["--dry-run"], ["--fatbins"]])
def test_backup_inside_the_audited_tree_is_refused(run_cli, units, mode):
    """Refused alike by the run, its dry run (which tells before) and a slimming run."""
    result = run_cli("prune", "gfx942", *mode, "-p", str(units), "--backup", str(units / "bk"), expect=2)
    error, hint = result.output.splitlines()
    assert error == f"rocm-audit: error: --backup {units / 'bk'}: inside the audited tree {units}"
    assert hint.startswith("hint: give a directory outside every tree prune changes") and len(hint) <= 100
    assert not (units / "bk").exists()


@pytest.mark.parametrize("fatbins", [[], ["--fatbins"]])
def test_a_tree_without_device_code_says_there_is_nothing_to_prune(run_cli, tmp_path, fatbins):
    """No empty table under its header: one line says what was found."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "module.py").write_text("x = 1\n")
    out = run_cli("prune", "gfx942", "--dry-run", *fatbins, "-p", str(tmp_path), expect=0).stdout
    lines = out.splitlines()
    assert "nothing to prune: no GPU device code here (device wheels, code objects, fat binaries)" in lines
    assert not any(line.startswith("distribution") for line in lines) and max(map(len, lines)) <= 100


def test_check_adds_one_info_finding_with_the_totals(run_cli, units):
    report = run_cli("check", "gfx942", "-p", str(units), "--skip", "llvm", "--format", "json").report
    weight = [f for f in report["findings"] if f["rule"] == "PRUNE001"]
    assert len(weight) == 1 and weight[0]["severity"] == "info"
    assert weight[0]["data"]["removable_bytes"] == report["prune"]["totals"]["removable_bytes"] > 0
    assert report["prune"]["mode"] == "check" and "prune" in report["summary"]["checks"]


@pytest.mark.parametrize(
    ("target", "kept"), [("gfx1100", True), ("gfx1151", True), ("gfx1102", False), ("gfx1170", False)]
)
def test_family_folders_are_kept_for_what_their_archives_hold(run_cli, units, target, kept):
    """amd-gfx11xx holds code for gfx1100 and gfx1151 only: its name is no pattern."""
    report = _prune(run_cli, units, target, "--dry-run")
    removals = {r["path"]: r for r in report["prune"]["removals"]}
    planned = _rel(units, list(removals))
    assert ("mylib/lib/aotriton.images/amd-gfx11xx" not in planned) is kept
    assert "mylib/lib/aotriton.images/amd-gfx942" in planned
    if not kept:
        family = removals[str(units / "mylib/lib/aotriton.images/amd-gfx11xx")]
        assert family["arches"] == ["gfx1100", "gfx1151"]


HOSTILE = ["\nok      forged-line ", "\x1b[2K\rok ", "\u2028ok "]


@pytest.mark.parametrize("fmt", ["text", "github", "markdown"])
def test_hostile_unit_names_are_escaped_and_round_trip(run_cli, units, fmt, tmp_path):
    library = units / "mylib/lib/rocblas/library"
    names = [f"TensileLibrary_{tail}_gfx90a.dat" for tail in HOSTILE]
    for name in names:
        (library / name).write_bytes(b"\x81\xa4arch\xa6gfx90a")
    odd = os.fsencode(library) + b"/TensileLibrary_\xff\xfe_gfx90a.dat"
    with open(odd, "wb") as handle:
        handle.write(b"odd")
    result = run_cli("prune", "gfx942", "-p", str(units), "--dry-run", "--format", fmt)
    raw = result.stdout_bytes.decode("utf-8", "replace")
    pieces = [p for line in raw.replace("\r", "\n").replace("\u2028", "\n").split("\n") for p in line.split("\x1b[2K")]
    assert not [p for p in pieces if p.lstrip().startswith(("forged-line", "ok "))], raw
    assert "\x1b" not in raw
    if fmt == "text":
        assert "\\nok      forged-line" in raw and "\\xff\\xfe" in raw
        before = tree_state(units)
        applied = _prune(run_cli, units, "gfx942", "--backup", str(tmp_path / "bk"))
        assert not any(os.path.lexists(library / n) for n in names) and not os.path.lexists(odd)
        run_cli("prune", "--revert", applied["prune"]["manifest"], expect=0)
        assert tree_state(units) == before and os.path.exists(odd)


def test_manifest_option_chooses_the_journal(run_cli, units, tmp_path):
    manifest = tmp_path / "journal" / "prune.jsonl"
    applied = _prune(run_cli, units, "gfx942", "--manifest", str(manifest), "--backup", str(tmp_path / "bk"))
    assert applied["prune"]["manifest"] == str(manifest) and manifest.is_file()
    assert not (units / ".rocm-audit").exists()
    header = json.loads(manifest.read_text().splitlines()[0])
    assert header["rocm_audit_prune_manifest"] == 1 and header["kept"] == ["gfx942"]
    entries = [json.loads(line) for line in manifest.read_text().splitlines()[1:]]
    files = [e for e in entries if e.get("type") == "file"]
    assert files and all({"path", "sha256", "size", "mode", "backup"} <= set(e) for e in files)
    assert {e.get("owner") for e in files} == {"mylib", None}  # RECORD-owned, and unowned SDK files
    reverted = run_cli("prune", "--revert", str(manifest), "--format", "json", expect=0).report
    assert reverted["prune_revert"]["restored"]


def _aiter_layout(site: Path, tmp_path: Path) -> None:
    """aiter's shape: aiter_meta/hsa/<arch>/<group>/<kernel>.co with the kernel tables (.csv) that
    name them; gfx1100 has a kernel gfx942 lacks (clang-19 knows no gfx950)."""
    from support.therock.artifacts import amdgpu_code_object

    for value, arch in enumerate(("gfx90a", "gfx942", "gfx1100"), start=1):
        code = amdgpu_code_object(tmp_path / "objects" / arch, arch, "k.hsaco", value)
        folder = site / "aiter_meta" / "hsa" / arch
        (folder / "fmoe").mkdir(parents=True)
        (folder / "fmoe" / "fmoe_b16.co").write_bytes(code.read_bytes())
        (folder / "fmoe" / "fmoe_b16.csv").write_text(f"knl_name,co_name\nfmoe_b16,{arch}\n")
        # aiter runs hsa/<gfx>/<op>/codegen.py from the device's own folder (blob_gen_cmd)
        (folder / "fmoe" / "codegen.py").write_text("import glob\n")
        if arch == "gfx1100":
            (folder / "f4gemm.co").write_bytes(code.read_bytes())


def test_arch_folders_of_code_objects_are_pruned_whole(run_cli, tmp_path):
    site = tmp_path / "site-packages"
    _aiter_layout(site, tmp_path)
    # A folder named for an arch that is a package (importable by name), or holds code for
    # another arch, stays.
    (site / "other" / "gfx90a").mkdir(parents=True)
    (site / "other" / "gfx90a" / "__init__.py").write_text("")
    (site / "other" / "gfx90a" / "k.co").write_bytes((site / "aiter_meta/hsa/gfx90a/fmoe/fmoe_b16.co").read_bytes())
    (site / "mislaid" / "gfx90a").mkdir(parents=True)
    (site / "mislaid" / "gfx90a" / "k.co").write_bytes((site / "aiter_meta/hsa/gfx942/fmoe/fmoe_b16.co").read_bytes())
    before = tree_state(site)
    report = _prune(run_cli, site, "gfx942", "gfx1100", "--dry-run")
    removals = {os.path.relpath(r["path"], site): r for r in report["prune"]["removals"]}
    assert {rel: (r["kind"], r["arches"]) for rel, r in removals.items()} == {
        "aiter_meta/hsa/gfx90a": ("code-object-dir", ["gfx90a"]),
    }
    assert removals["aiter_meta/hsa/gfx90a"]["bytes"] == sum(
        len(state[1]) for rel, state in before.items() if rel.startswith("aiter_meta/hsa/gfx90a/")
    )
    assert tree_state(site) == before
    applied = _prune(run_cli, site, "gfx942", "gfx1100", "--backup", str(tmp_path / "backup"))
    assert not os.path.lexists(site / "aiter_meta/hsa/gfx90a")
    after = tree_state(site)
    assert {rel for rel in before if rel not in after} == {
        "aiter_meta/hsa/gfx90a/fmoe/fmoe_b16.co",
        "aiter_meta/hsa/gfx90a/fmoe/fmoe_b16.csv",
        "aiter_meta/hsa/gfx90a/fmoe/codegen.py",
    }
    assert all(before[rel] == after[rel] for rel in after)
    # what the kept arches load is untouched, and verify-arch still judges the folders one unit
    verdict = run_cli("verify-arch", "gfx942", "gfx1100", "-p", str(site / "aiter_meta"), "--format", "json").report
    assert [(c["kind"], c["missing"]) for c in verdict["carriers"]] == [("per-arch-folders", [])]
    run_cli("prune", "--revert", applied["prune"]["manifest"], "--format", "json", expect=0)
    assert tree_state(site) == before


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["gfx942"], "takes no targets"),
        (["--fatbins"], "--fatbins"),
        (["--keep-dist", "mylib"], "--keep-dist"),
        (["--backup", "/tmp/elsewhere"], "--backup"),
    ],
)
def test_revert_refuses_what_it_would_ignore(run_cli, units, tmp_path, extra, named):
    applied = _prune(run_cli, units, "gfx942", "--backup", str(tmp_path / "backup"))
    before = tree_state(units)
    done = run_cli("prune", "--revert", applied["prune"]["manifest"], *extra, expect=2)
    assert named in done.output
    assert tree_state(units) == before  # refused before anything was restored


@pytest.mark.parametrize("command", ["prune", "dedup"])
@pytest.mark.parametrize("content", [b"", b"hello\n", b"\xff\xfe\x00 binary", b'{"path": "x"}\n'])
def test_revert_of_a_file_that_is_no_manifest_is_an_error(run_cli, tmp_path, command, content):
    """A mistyped path (an empty file, a line of text, a binary file, a line with no run header)
    must not read as "nothing to restore": a CI step would pass having reverted nothing."""
    wrong = tmp_path / "manifest.jsonl"
    wrong.write_bytes(content)
    said = run_cli(command, "--revert", str(wrong), expect=2).stderr
    assert said.startswith(f"rocm-audit: error: {wrong}") and "manifest" in said and "Traceback" not in said


def test_without_backup_the_dry_run_and_the_run_say_undoing_needs_the_package_index(run_cli, units, tmp_path):
    """A build without network access cannot undo a prune that kept no backup: said before (dry
    run) and after (the run's closing lines), and not when --backup keeps the originals."""
    note = "no --backup: undoing this reinstalls what it changes from the package index (pip);"
    dry = run_cli("prune", "gfx942", "--dry-run", "-p", str(units), expect=0).stdout.splitlines()
    assert note in dry
    backed = run_cli("prune", "gfx942", "--dry-run", "-p", str(units), "--backup", str(tmp_path / "bk"), expect=0)
    assert note not in backed.stdout.splitlines()
    done = run_cli("prune", "gfx942", "-p", str(units), expect=0).stdout.splitlines()
    assert note in done and done.index(note) > done.index(next(line for line in done if line.startswith("prune: ")))
    assert len(note) <= 100 and len(done[done.index(note) + 1]) <= 100
    again = run_cli("prune", "gfx942", "--dry-run", "-p", str(units), expect=0).stdout.splitlines()
    assert note not in again  # nothing left to change
