"""Device images embedded in host data sections (what programs load with hipModuleLoadData):
offload bundles and CCOBs in .rodata, built by clang++-19 and pulled in with .incbin
(conftest.py ``embedded_libs``). Each image is one unit, judged as the runtime picks an entry from
it; findings name its place; the magics as plain data are nothing."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rocm_audit.gpu import verify
from support.gpu.arch_writers import section_bytes


def _verify(path: Path, *targets: str):
    outcome = verify.verify_arch([str(path)], list(targets), environ={})
    return outcome, outcome.sections["carriers"]


def _scan(path: Path):
    outcome = verify.list_targets([str(path)])
    return outcome, outcome.sections["code_object_files"], outcome.sections["code_objects"]


def _rodata_offset(path: Path) -> int:
    offset, _ = section_bytes(path, ".rodata")
    return offset


def test_a_library_whose_only_device_code_is_an_embedded_ccob_is_judged(embedded_libs):
    lib = embedded_libs["libembccob.so"]
    _, files, objects = _scan(lib)
    (listed,) = files
    assert "embedded-ccob" in listed["containers"] and listed["tu_count"] == 1
    assert sorted(o["target"] for o in objects if o["kind"] != "host") == ["gfx90a", "gfx942"]
    assert all(o["location"].startswith(".rodata+0x0 entry") and o["container"] == "ccob" for o in objects)

    outcome, (carrier,) = _verify(lib, "gfx942", "gfx90a:xnack-")
    assert not outcome.findings and carrier["missing"] == []
    assert carrier["kind"] == "library" and carrier["embedded_images"] == [{"tu": 0, "place": ".rodata+0x0"}]

    outcome, (carrier,) = _verify(lib, "gfx950")
    (finding,) = outcome.findings
    assert finding.rule == "ARCH001" and carrier["missing"] == ["gfx950"]
    assert "embedded images without it: .rodata+0x0 of 1" in finding.message
    assert finding.data["images_without"] == [".rodata+0x0"]


def test_code_objects_inside_an_embedded_plain_bundle_are_not_counted_again_as_raw_elfs(embedded_libs):
    lib = embedded_libs["libembplain.so"]
    _, (listed,), objects = _scan(lib)
    assert "embedded-elf" not in listed["containers"] and listed["tu_count"] == 1
    assert sorted((o["container"], o["kind"], o["target"] or "") for o in objects) == [
        ("offload-bundle", "hipv4", "gfx90a"),
        ("offload-bundle", "hipv4", "gfx942"),
        ("offload-bundle", "host", ""),
    ]
    # the entries' file offsets lie inside .rodata, where the bundle is
    start = _rodata_offset(lib)
    assert all(o["file_offset"] >= start for o in objects)
    outcome, _ = _verify(lib, "gfx942")
    assert not outcome.findings


def test_an_embedded_bundle_beside_a_fat_binary_is_one_more_unit(embedded_libs):
    outcome, (carrier,) = _verify(embedded_libs["libembfat.so"], "gfx942", "gfx90a:xnack-")
    assert not outcome.findings
    assert carrier["tu_count"] == 2 and carrier["embedded_images"] == [{"tu": 1, "place": ".rodata+0x0"}]
    assert sorted(carrier["containers"]) == ["embedded-offload-bundle", "hip-fatbin", "offload-bundle"]


def test_an_embedded_image_that_lacks_a_target_the_fat_binary_has_is_reported_by_place(embedded_libs):
    lib = embedded_libs["libembgap.so"]
    outcome, (carrier,) = _verify(lib, "gfx942")
    (finding,) = outcome.findings
    assert finding.rule == "ARCH001" and carrier["missing"] == ["gfx942"]
    # the fat binary's TU has gfx942: only the image is named, no TU
    assert "embedded images without it: .rodata+0x0 of 1" in finding.message
    assert "translation units" not in finding.message
    assert carrier["matches"][0]["tus_without"] == [1]
    outcome, _ = _verify(lib, "gfx90a")
    assert not outcome.findings


def test_the_magics_as_plain_data_are_no_code_object_and_no_finding(embedded_libs):
    lib = embedded_libs["libembstrings.so"]
    data = lib.read_bytes()
    assert data.count(b"__CLANG_OFFLOAD_BUNDLE__") >= 2 and data.count(b"CCOB") >= 3
    outcome, files, objects = _scan(lib)
    assert files == [] and objects == [] and not outcome.findings
    outcome, carriers = _verify(lib, "gfx942")
    assert carriers == [] and not outcome.findings


def test_a_corrupt_embedded_ccob_is_arch004_at_its_offset_and_the_later_images_are_judged(embedded_libs):
    lib = embedded_libs["libembbroken.so"]
    rodata = _rodata_offset(lib)
    outcome, (listed,), objects = _scan(lib)
    (broken,) = [f for f in outcome.findings if f.rule == "ARCH004"]
    assert len(outcome.findings) == 1
    assert "embedded image at .rodata+0x0" in broken.message and f"file offset {rodata:#x}" in broken.message
    assert listed["tu_count"] == 3
    places = sorted({o["location"].split(" entry")[0] for o in objects}, key=lambda p: int(p.split("+")[1], 16))
    # Where the assembler put the images (.balign 4096 before each): the bundles' sizes vary with
    # the toolchain and the build directory's name, so the places are computed, not written down.
    sizes = [(lib.parent / name).stat().st_size for name in ("broken.ccob", "both.hipfb")]
    second = -(-sizes[0] // 4096) * 4096
    third = -(-(second + sizes[1]) // 4096) * 4096
    assert places == [f".rodata+{second:#x}", f".rodata+{third:#x}"], places
    outcome, (carrier,) = _verify(lib, "gfx942")
    (missing,) = [f for f in outcome.findings if f.rule == "ARCH001"]
    assert missing.data["images_without"] == [".rodata+0x0", f".rodata+{third:#x}"]
    outcome, (carrier,) = _verify(lib, "gfx90a")
    (missing,) = [f for f in outcome.findings if f.rule == "ARCH001"]
    assert missing.data["images_without"] == [".rodata+0x0"]
    assert [m["tus_without"] for m in carrier["matches"]] == [[0]]


TF_WHEEL = "tensorflow_rocm-2.14.0.600-cp311-cp311-manylinux2014_x86_64.whl"
TF_SHA256 = "c9f3e6f81ea916d8a7481a3d59240867b36ead2ff5474e5ba233b2b598baf7fe"
TF_REQUIREMENT = "tensorflow-rocm==2.14.0.600"
TF_LIBRARY = "tensorflow/libtensorflow_cc.so.2"
TF_TARGETS = ["gfx1030", "gfx1100", "gfx900", "gfx906", "gfx908", "gfx90a"]


@pytest.mark.slow  # a 427 MB download, a 1.39 GB library
def test_tensorflows_1149_embedded_bundles_agree_with_its_fat_binary(cache_dir, tmp_path):
    """tensorflow-rocm 2.14.0.600: 241 bundles in .hip_fatbin, 1,149 MLIR-generated kernels'
    bundles in .rodata; both offer the same six targets, and a target they lack is one finding."""
    wheel = Path(cache_dir) / "bench" / TF_WHEEL
    if not wheel.exists():
        wheel.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(wheel.parent), TF_REQUIREMENT],
            check=True,
            capture_output=True,
            timeout=1800,
        )
    digest = hashlib.sha256()
    with open(wheel, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 24), b""):
            digest.update(block)
    assert digest.hexdigest() == TF_SHA256, f"{wheel} is not the pinned file"
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(TF_LIBRARY, tmp_path)
    lib = tmp_path / TF_LIBRARY
    _, (listed,), objects = _scan(lib)
    assert listed["tu_count"] == 241 + 1149 and listed["wrappers"] == 241
    by_section: dict[str, set[str]] = {}
    for obj in objects:
        if obj["target"]:
            by_section.setdefault(obj["location"].split("+")[0], set()).add(obj["target"])
    assert by_section == {".hip_fatbin": set(TF_TARGETS), ".rodata": set(TF_TARGETS)}
    outcome, (carrier,) = _verify(lib, *TF_TARGETS)
    assert not outcome.findings and len(carrier["embedded_images"]) == 1149
    outcome, (carrier,) = _verify(lib, "gfx942")
    (finding,) = outcome.findings
    assert finding.rule == "ARCH001" and len(finding.data["images_without"]) == 1149
    assert "(1149 in all) of 1149" in finding.message
    os.unlink(lib)


def test_an_embedded_ccob_entry_no_target_needs_is_never_inflated(embedded_libs):
    """As for .hip_fatbin CCOBs: judging gfx90a reads the gfx90a entry's ELF header; the gfx942
    entry keeps what its bundle id names. The full scan reads both."""
    from rocm_audit.gpu.codeobjects import scan_file
    from rocm_audit.tree.discovery import resolve_roots
    from rocm_audit.tree.inventory import build_inventory

    roots, _ = resolve_roots([str(embedded_libs["libembccob.so"])])
    (record,) = build_inventory(roots).files
    selection = verify.selection_for([verify.resolve_required("gfx90a")])
    lazy = {
        o.bundle_target: o.target_source for o in scan_file(record, None, selection).code_objects if o.bundle_target
    }
    full = {o.bundle_target: o.target_source for o in scan_file(record).code_objects if o.bundle_target}
    assert lazy == {"gfx90a": "e_flags", "gfx942": "bundle-id"}
    assert full == {"gfx90a": "e_flags", "gfx942": "e_flags"}


def test_a_section_of_chained_fake_tables_is_read_in_linear_time(tmp_path):
    """Each fake table's first record has an id that is the next fake table: parsed as a whole,
    every hit would read 200 records (8 million here). Records are checked as they are read, so
    each hit costs one record, and nothing is found."""
    import struct
    import time

    from support.gpu.arch_writers import host_elf, scan_path

    link = b"__CLANG_OFFLOAD_BUNDLE__" + struct.pack("<QQQQ", 200, 0, 0, 32)
    ccob_like = b"CCOB" + struct.pack("<HHIIQ", 2, 1, 1 << 20, 1 << 21, 0) + b"(\xb5/\xfd"
    rodata = link * 40000 + ccob_like * 1000
    path = tmp_path / "libchain.so"
    host_elf([(".rodata", 1, 2, rodata)], str(path))
    started = time.perf_counter()
    scanned = scan_path(path)
    elapsed = time.perf_counter() - started
    assert scanned.code_objects == [] and scanned.findings == [] and scanned.tu_count == 0
    assert elapsed < 5, elapsed


def test_the_cli_reports_validate_and_the_text_counts_tus_and_images_apart(run_cli, embedded_libs):
    gap = str(embedded_libs["libembgap.so"])
    result = run_cli("verify-arch", "gfx942", "-p", gap, "--format", "json", expect=1)  # schema-validated
    (carrier,) = result.report["carriers"]
    assert carrier["embedded_images"] == [{"tu": 1, "place": ".rodata+0x0"}]
    (finding,) = result.report["findings"]
    assert finding["rule"] == "ARCH001" and finding["data"]["images_without"] == [".rodata+0x0"]
    text = run_cli("verify-arch", "gfx942", "-p", gap, "-v", expect=1).output
    assert "1 TU, 1 embedded image]" in text and "embedded images without it: .rodata+0x0 of 1" in text
    result = run_cli("scan", "--targets", "-p", str(embedded_libs["libembbroken.so"]), "--format", "json", expect=1)
    (broken,) = result.report["findings"]
    assert broken["rule"] == "ARCH004" and ".rodata+0x0" in broken["message"]
