"""`rocm-audit verify-arch` and `rocm-audit scan --targets` through the CLI, on SDK-shaped trees."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from support.aotriton import aks2
from support.files import copy_file as copy
from support.gpu.arch_writers import amdgpu_header, bundle, host_elf, kpack_archive, section_bytes
from support.memory import PEAK_RSS_KIB_EXPR
from support.therock.artifacts import amdgpu_code_object

SHT_PROGBITS, SHF_ALLOC = 1, 2


def carriers_by_name(report: dict) -> dict[str, dict]:
    return {os.path.basename(c["path"]): c for c in report["carriers"]}


@pytest.fixture()
def mixed_tree(sdk_tree, built) -> Path:
    core, libs = sdk_tree / "_rocm_sdk_core" / "lib", sdk_tree / "_rocm_sdk_libraries" / "lib"
    copy(built["libmagic.so"], core / "libamdhip64.so.7")  # runtime: only the magic string
    copy(built["libfat950.so"], libs / "libgood.so")
    copy(built["libfatgenericc.so"], libs / "libgeneric.so")
    copy(built["libplain.so"], libs / "libno950.so")
    copy(built["libmulti.so"], libs / "libmulti.so")
    return sdk_tree


def test_verify_arch_fails_carriers_without_the_target_and_names_them(run_cli, mixed_tree):
    result = run_cli("verify-arch", "gfx942;gfx950", "-p", str(mixed_tree), "--format", "json", expect=1)
    report = result.report
    carriers = carriers_by_name(report)
    assert sorted(carriers) == [
        "libgeneric.so",
        "libgood.so",
        "libmulti.so",
        "libno950.so",
    ]  # not the runtime
    assert carriers["libgood.so"]["missing"] == [] and carriers["libgeneric.so"]["missing"] == []
    assert carriers["libno950.so"]["missing"] == ["gfx950"]
    assert carriers["libmulti.so"]["missing"] == ["gfx942", "gfx950"]
    assert [m["how"] for m in carriers["libgeneric.so"]["matches"]] == ["generic", "generic"]
    assert [m["how"] for m in carriers["libgood.so"]["matches"]] == ["native", "native"]
    multi = {m["target"]: m for m in carriers["libmulti.so"]["matches"]}
    assert multi["gfx942"]["tus_without"] == [1] and carriers["libmulti.so"]["tu_count"] == 2
    assert carriers["libno950.so"]["targets"] == ["gfx90a", "gfx942"]
    assert carriers["libno950.so"]["package"] == "_rocm_sdk_libraries"
    errors = sorted((os.path.basename(f["path"]), f["rule"]) for f in report["findings"] if f["severity"] == "error")
    assert errors == [("libmulti.so", "ARCH001"), ("libno950.so", "ARCH001")]
    assert not any("libamdhip64" in f["path"] for f in report["findings"])
    assert report["targets"] == [
        {"target": "gfx942", "agent": "gfx942:sramecc+:xnack-"},
        {"target": "gfx950", "agent": "gfx950:sramecc+:xnack-"},
    ]


def test_text_output_is_grouped_by_sdk_package(run_cli, mixed_tree):
    text = run_cli("verify-arch", "gfx950", "-p", str(mixed_tree), "-v", expect=1).stdout
    assert "_rocm_sdk_libraries: 4 carriers, 2 missing a target" in text
    assert "MISSING lib/libno950.so" in text and "ok      lib/libgood.so" in text
    assert "translation units without it" not in text  # gfx950 is missing in both TUs:
    assert "no code object for gfx950 (none of its 2 translation units has it)" in " ".join(text.split())
    assert "ERROR ARCH001" in text


def test_passing_tree_exits_0(run_cli, sdk_tree, built):
    copy(built["libfat950c.so"], sdk_tree / "_rocm_sdk_libraries" / "lib" / "libgood.so")
    result = run_cli("verify-arch", "gfx950", "gfx942", "-p", str(sdk_tree), "--format", "json", expect=0)
    assert result.report["carriers"][0]["missing"] == []


def test_targets_from_gpu_arch_then_dist_info_then_usage_error(run_cli, sdk_tree, built, monkeypatch):
    copy(built["libplain.so"], sdk_tree / "_rocm_sdk_libraries" / "lib" / "libx.so")
    monkeypatch.delenv("GPU_ARCH", raising=False)
    missing = run_cli("verify-arch", "-p", str(sdk_tree), expect=2)
    assert "no GPU target: name them" in missing.output
    (sdk_tree / "_rocm_sdk_core" / "share" / "therock" / "dist_info.json").write_text(
        json.dumps({"dist_amdgpu_targets": "gfx942;gfx90a"})
    )
    from_dist = run_cli("verify-arch", "-p", str(sdk_tree), "--format", "json", expect=0)
    assert from_dist.report["targets_source"].endswith("dist_info.json")
    monkeypatch.setenv("GPU_ARCH", "gfx942;gfx950")
    from_env = run_cli("verify-arch", "-p", str(sdk_tree), "--format", "json", expect=1)
    assert from_env.report["targets_source"] == "$GPU_ARCH"
    assert from_env.report["carriers"][0]["missing"] == ["gfx950"]
    explicit = run_cli("verify-arch", "gfx90a", "-p", str(sdk_tree), "--format", "json", expect=0)
    assert [t["target"] for t in explicit.report["targets"]] == ["gfx90a"]
    # A dist_info.json nested past Python's recursion limit: a usage error naming it, no traceback.
    monkeypatch.delenv("GPU_ARCH")
    (sdk_tree / "_rocm_sdk_core" / "share" / "therock" / "dist_info.json").write_text("[" * 100_000)
    nested = run_cli("verify-arch", "-p", str(sdk_tree), expect=2)
    assert "dist_info.json: JSON nested too deeply" in nested.output and "Traceback" not in nested.output


def test_unknown_targets_are_usage_errors_listing_known_ones(run_cli, sdk_tree):
    result = run_cli("verify-arch", "gfx9500", "-p", str(sdk_tree), expect=2)
    assert "unknown GPU target 'gfx9500'" in result.output and "gfx950" in result.output
    assert "Traceback" not in result.output


def test_feature_qualified_targets(run_cli, sdk_tree, built):
    copy(built["libxnackon.so"], sdk_tree / "_rocm_sdk_libraries" / "lib" / "libxnack.so")
    copy(built["libv6feat.so"], sdk_tree / "_rocm_sdk_libraries" / "lib" / "libfeat.so")
    usual = run_cli("verify-arch", "gfx942", "-p", str(sdk_tree), "--format", "json", expect=1)
    assert carriers_by_name(usual.report)["libxnack.so"]["missing"] == ["gfx942"]
    assert carriers_by_name(usual.report)["libfeat.so"]["missing"] == []
    xnack_on = run_cli("verify-arch", "gfx942:xnack+", "-p", str(sdk_tree), "--format", "json", expect=1)
    assert carriers_by_name(xnack_on.report)["libxnack.so"]["missing"] == []
    assert carriers_by_name(xnack_on.report)["libfeat.so"]["missing"] == ["gfx942:xnack+"]
    generic = run_cli(
        "verify-arch",
        "gfx900",
        "gfx906",
        "gfx90a:xnack+",
        "-p",
        str(sdk_tree / "_rocm_sdk_libraries" / "lib" / "libfeat.so"),
        "--format",
        "json",
        expect=1,
    )
    # gfx9-generic serves gfx900, never gfx906 (CLR would ask for gfx9-generic:sramecc+:xnack-).
    assert [m["how"] for m in generic.report["carriers"][0]["matches"]] == ["generic", None, "native"]


def test_spirv_only_is_a_warning(run_cli, tmp_path):
    entries = [
        ("host-x86_64-unknown-linux--", b""),
        ("hipv4-spirv64-amd-amdhsa--amdgcnspirv", b"\x03\x02\x23\x07" * 8),
    ]
    segment = struct.pack("<IIQQ", 0x48495046, 1, 0, 0)
    host_elf(
        [
            (".hip_fatbin", SHT_PROGBITS, SHF_ALLOC, bundle(entries)),
            (".hipFatBinSegment", SHT_PROGBITS, SHF_ALLOC, segment),
        ],
        str(tmp_path / "libspirv.so"),
    )
    result = run_cli("verify-arch", "gfx950", "-p", str(tmp_path), "--format", "json", expect=0)
    assert [f["rule"] for f in result.report["findings"]] == ["ARCH002"]
    assert result.report["carriers"][0]["matches"][0]["how"] == "spirv"
    run_cli("verify-arch", "gfx950", "-p", str(tmp_path), "--fail-on", "warning", expect=1)


def _kpack_library(built, libs: Path) -> Path:
    """libplain.so made kpack'd as formats.md 1.7 describes: HIPK + .rocm_kpack_ref."""
    target = copy(built["libplain.so"], libs / "libk.so")
    ref = msgpack.packb({"kpack_search_paths": ["../.kpack/t_@GFXARCH@.kpack"], "kernel_name": "lib/libk.so"})
    (libs / "ref.bin").write_bytes(ref)
    done = subprocess.run(
        ["llvm-objcopy-19", f"--add-section=.rocm_kpack_ref={libs / 'ref.bin'}", str(target)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (libs / "ref.bin").unlink()
    offset, segment = section_bytes(target, ".hipFatBinSegment")
    data = bytearray(target.read_bytes())
    struct.pack_into("<I", data, offset, 0x4B504948)  # HIPF -> HIPK
    target.write_bytes(bytes(data))
    return target


def test_kpack_split_library_is_judged_through_its_archives(run_cli, sdk_tree, built):
    libs = sdk_tree / "_rocm_sdk_libraries" / "lib"
    _kpack_library(built, libs)
    kpack_dir = sdk_tree / "_rocm_sdk_libraries" / ".kpack"
    kpack_dir.mkdir()
    (kpack_dir / "t_gfx942.kpack").write_bytes(
        kpack_archive(
            [("lib/libk.so#0", "gfx942", built["k_gfx942.hsaco"].read_bytes())],
            scheme="none",
            family="gfx942",
        )
    )
    (kpack_dir / "t_gfx950.kpack").write_bytes(
        kpack_archive(
            [
                ("lib/libk.so#0", "gfx950", built["ll_gfx950.hsaco"].read_bytes()),
                ("lib/other.so#0", "gfx950", built["ll_gfx950.hsaco"].read_bytes()),
            ],
            scheme="zstd-per-kernel",
        )
    )
    both = run_cli("verify-arch", "gfx942;gfx950", "-p", str(sdk_tree), "--format", "json", expect=0)
    carrier = carriers_by_name(both.report)["libk.so"]
    assert carrier["containers"] == ["kpack"] and carrier["targets"] == ["gfx942", "gfx950"]
    assert {v["source"] for v in carrier["found_via"]} == {"e_flags"}
    listing = run_cli("scan", "--targets", "-p", str(sdk_tree), "--format", "json", expect=0)
    kinds = {(os.path.basename(o["path"]), o["container"]) for o in listing.report["code_objects"]}
    assert ("libk.so", "kpack") in kinds and ("t_gfx950.kpack", "kpack") in kinds
    (kpack_dir / "t_gfx950.kpack").unlink()
    one = run_cli("verify-arch", "gfx942;gfx950", "-p", str(sdk_tree), "--format", "json", expect=1)
    assert carriers_by_name(one.report)["libk.so"]["missing"] == ["gfx950"]
    (kpack_dir / "t_gfx942.kpack").unlink()
    none = run_cli("verify-arch", "gfx942", "-p", str(sdk_tree), "--format", "json", expect=1)
    assert {f["rule"] for f in none.report["findings"]} == {"ARCH001", "ARCH005"}


def test_kernel_databases_and_per_arch_libraries(run_cli, sdk_tree, built, tmp_path):
    libs = sdk_tree / "_rocm_sdk_libraries" / "lib"
    tensile = libs / "rocblas" / "library"
    tensile.mkdir(parents=True)
    for name in (
        "TensileLibrary_lazy_gfx942.dat",
        "TensileLibrary_fallback.dat",
        "Kernels_gfx942.co",
    ):
        (tensile / name).write_bytes(b"\x82\xa1a\x01\xa1b\x02")
    aotriton = libs / "aotriton.images" / "amd-gfx11xx" / "flash"
    aotriton.mkdir(parents=True)
    # an AOTriton family folder: the code objects inside name the processors (gfx1100, gfx1151)
    family = [
        (f"fwd--Arch_{arch}", amdgpu_code_object(tmp_path / arch, arch, "k.hsaco", 1).read_bytes())
        for arch in ("gfx1100", "gfx1151")
    ]
    (aotriton / "fwd.aks2").write_bytes(aks2(family))
    copy(built["libcov5.so"], libs / "libMIOpenCKconv_gfx942.so")
    (sdk_tree / "_rocm_sdk_core" / "share" / "miopen" / "db").mkdir(parents=True)
    (sdk_tree / "_rocm_sdk_core" / "share" / "miopen" / "db" / "gfx942130.kdb").write_bytes(b"SQLite format 3\0")
    result = run_cli("verify-arch", "gfx942", "gfx1100", "-p", str(sdk_tree), "--format", "json", expect=1)
    carriers = {c["kind"]: c for c in result.report["carriers"]}
    assert carriers["kernel-database:tensile"]["missing"] == ["gfx1100"]
    assert carriers["kernel-database:aotriton"]["missing"] == ["gfx942"]
    assert carriers["per-arch-files"]["path"].endswith("libMIOpenCKconv_gfx*.so")
    assert carriers["per-arch-files"]["missing"] == ["gfx1100"]
    assert {f["rule"] for f in result.report["findings"]} == {"ARCH008"}
    assert not any("miopen" in c["path"] for c in result.report["carriers"])  # listed, never judged
    gfx1102 = run_cli("verify-arch", "gfx1102", "-p", str(sdk_tree), "--format", "json", expect=1)
    assert {c["kind"]: c for c in gfx1102.report["carriers"]}["kernel-database:aotriton"]["missing"] == ["gfx1102"]
    (tensile / "TensileLibrary_lazy_gfx1100.dat").write_bytes(b"\x80")
    again = run_cli("verify-arch", "gfx942", "gfx1100", "-p", str(sdk_tree), "--format", "json", expect=1)
    assert {c["kind"]: c for c in again.report["carriers"]}["kernel-database:tensile"]["missing"] == []
    # Targets in the processors' numeric order (gfx942 before gfx1100), in data and in words
    other = run_cli("verify-arch", "gfx1201", "gfx950", "-p", str(sdk_tree), "--format", "json", expect=1).report
    assert [t["target"] for t in other["targets"]] == ["gfx950", "gfx1201"]  # the command line said 1201 first
    tensile = {c["kind"]: c for c in other["carriers"]}["kernel-database:tensile"]
    assert tensile["targets"] == ["gfx942", "gfx1100"] and tensile["missing"] == ["gfx950", "gfx1201"]
    (said,) = (f["message"] for f in other["findings"] if f["path"] == tensile["path"])
    assert said.startswith("no code object for gfx950, gfx1201") and said.endswith("found: gfx942, gfx1100")
    listing = run_cli("scan", "--targets", "-p", str(sdk_tree), "--format", "json", expect=0)
    assert ("gfx942130.kdb", "gfx942") in {
        (os.path.basename(o["path"]), o["target"]) for o in listing.report["code_objects"]
    }


def test_scan_targets_lists_every_code_object(run_cli, built, jax_plugin):
    result = run_cli("scan", "--targets", "-p", str(jax_plugin), "--format", "json", expect=0)
    files = {os.path.basename(f["path"]): f for f in result.report["code_object_files"]}
    assert sorted(files) == ["_linalg.so", "_prng.so", "_solver.so"]
    assert files["_solver.so"]["tu_count"] == 2 and files["_prng.so"]["code_objects"] == 28
    prng = [o for o in result.report["code_objects"] if o["path"].endswith("_prng.so")]
    assert {o["container"] for o in prng} == {"ccob"} and {o["code_object_version"] for o in prng} == {None, 6}
    text = " ".join(run_cli("scan", "--targets", "-p", str(built["libfat950.so"]), expect=0).stdout.split())
    # The bundle's host entry is listed with -v, never counted as a GPU code object
    assert "2 code objects for 2 targets: gfx942 gfx950" in text and "1 file, 2 GPU code objects" in text
    detail = run_cli("scan", "--targets", "-v", "-p", str(built["libfat950.so"]), expect=0).stdout
    assert "hipv4-amdgcn-amd-amdhsa--gfx950-" in detail and "cov6" in detail and "cov5" in detail
    assert "host  " in detail and "host-x86_64-unknown-linux-" in detail
    # A row per entry, its ID on that row: columns as wide as this file's values, within 100 columns.
    rows = [line for line in detail.splitlines() if line.startswith("    .")]
    assert len(rows) == 3 and all(row.split()[-1].startswith(("hipv4-", "host-")) for row in rows), rows
    assert max(map(len, detail.splitlines())) <= 100
    plain = run_cli("scan", "-p", str(built["libfat950.so"]), "--format", "json", expect=0)
    assert plain.report["file_kinds"]["shared-library"] == 1


def test_a_1_gib_hip_fatbin_is_listed_in_little_memory(tmp_path):
    """Sparse file: a bundle table, a 1 GiB code-object entry whose header is at its start."""
    code_object = amdgpu_header(0x54F) + b"\0" * 64
    entries = [
        ("host-x86_64-unknown-linux--", b""),
        ("hipv4-amdgcn-amd-amdhsa--gfx950", code_object),
    ]
    table = bytearray(bundle(entries))
    size = 1 << 30
    struct.pack_into("<Q", table, 32 + 24 + len(entries[0][0]) + 8, size)  # entry 1 size field
    section_size = 4096 + size
    path = tmp_path / "libhuge.so"
    segment = struct.pack("<IIQQ", 0x48495046, 1, 0, 0)
    host_elf(
        [
            (".hipFatBinSegment", SHT_PROGBITS, SHF_ALLOC, segment),
            (".hip_fatbin", SHT_PROGBITS, SHF_ALLOC, section_size),
        ],
        str(path),
    )
    offset, _ = section_bytes_header_only(path)
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(bytes(table))
    assert os.stat(path).st_blocks * 512 < 64 << 20  # sparse: the test itself stays small on disk
    probe = (
        "import sys\nfrom rocm_audit.cli.app import main\n"
        f"code = main(['scan', '--targets', '-q', '-p', {str(path)!r}, '--format', 'json', '-o', "
        f"{str(tmp_path / 'out.json')!r}])\n"
        f"print({PEAK_RSS_KIB_EXPR}, code)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    max_rss_kib, code = map(int, done.stdout.split())
    assert code == 0
    report = json.loads((tmp_path / "out.json").read_text())
    device = [o for o in report["code_objects"] if o["kind"] != "host"]
    assert [(o["target"], o["size"]) for o in device] == [("gfx950", size)]
    assert max_rss_kib < 100 * 1024, f"peak RSS {max_rss_kib} KiB"


def section_bytes_header_only(path: Path) -> tuple[int, int]:
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as handle:
        section = ELFFile(handle).get_section_by_name(".hip_fatbin")
        return section["sh_offset"], section["sh_size"]


def test_help_documents_targets_and_exit_codes(run_cli):
    text = run_cli("verify-arch", "--help", expect=0).stdout
    assert "GPU_ARCH" in text and "dist_info.json" in text
    # The exit codes are the same for every command: listed once, in `rocm-audit --help`.
    assert "Exit codes" not in text and "Exit codes" in run_cli("--help", expect=0).stdout
    assert "--targets" in run_cli("scan", "--help", expect=0).stdout


def test_missing_paths_are_usage_errors(run_cli, tmp_path):
    result = run_cli("verify-arch", "gfx950", "-p", str(tmp_path / "nope"), expect=2)
    assert "path does not exist" in result.output


def test_code_objects_below_folders_named_for_their_arch_are_one_unit(run_cli, tmp_path, built):
    """aiter's layout (hsa/<arch>/<group>/<kernel>.co, opened for the device's arch from the kernel
    tables of that arch's folder): the arch folders are one unit, which serves an arch when its
    folder holds code for it; a kernel that exists for one arch only (an FP4 GEMM) is by design."""
    hsa = tmp_path / "aiter_meta" / "hsa"
    for arch, source in (("gfx942", "k_gfx942.hsaco"), ("gfx950", "ll_gfx950.hsaco")):
        (hsa / arch / "fmoe").mkdir(parents=True)
        copy(built[source], hsa / arch / "fmoe" / "fmoe_b16.co")
        copy(built[source], hsa / arch / "flatmm_uk_gfx9_f16.co")  # a family in the name, not the arch
        (hsa / arch / "fmoe" / "fmoe_b16.csv").write_text("knl_name,co_name\n")
    copy(built["ll_gfx950.hsaco"], hsa / "gfx950" / "f4gemm.co")  # an FP4 kernel: gfx950 only
    copy(built["k_gfx942.hsaco"], hsa / "gfx950" / "mislaid.co")  # holds gfx942 code: judged as is
    (tmp_path / "lib" / "gfx942").mkdir(parents=True)
    copy(built["libcov5.so"], tmp_path / "lib" / "gfx942" / "libk.so")  # a library is loaded as is
    result = run_cli("verify-arch", "gfx942", "gfx950", "-p", str(tmp_path), "--format", "json", expect=1)
    carriers = {os.path.relpath(c["path"], tmp_path): c for c in result.report["carriers"]}
    assert {path: (c["kind"], c["missing"]) for path, c in carriers.items()} == {
        "aiter_meta/hsa/gfx*": ("per-arch-folders", []),
        "aiter_meta/hsa/gfx950/mislaid.co": ("code-object-file", ["gfx950"]),
        "lib/gfx942/libk.so": ("library", ["gfx950"]),
    }
    assert sorted(os.path.relpath(m, hsa) for m in carriers["aiter_meta/hsa/gfx*"]["members"]) == [
        "gfx942/flatmm_uk_gfx9_f16.co",
        "gfx942/fmoe/fmoe_b16.co",
        "gfx950/f4gemm.co",
        "gfx950/flatmm_uk_gfx9_f16.co",
        "gfx950/fmoe/fmoe_b16.co",
    ]
    rules = sorted((f["rule"], os.path.relpath(f["path"], tmp_path)) for f in result.report["findings"])
    assert rules == [
        ("ARCH001", "aiter_meta/hsa/gfx950/mislaid.co"),
        ("ARCH001", "lib/gfx942/libk.so"),
    ]
    # An arch no folder is for: the unit lacks it, once.
    result = run_cli("verify-arch", "gfx90a", "gfx942", "-p", str(hsa), "--format", "json", expect=1)
    found = sorted(
        (f["rule"], os.path.relpath(f["path"], hsa), f["data"]["missing"]) for f in result.report["findings"]
    )
    assert found == [("ARCH001", "gfx950/mislaid.co", ["gfx90a"]), ("ARCH008", "gfx*", ["gfx90a"])]


def _triton_kernel(folder: Path, code_object: Path, metadata: dict | str) -> Path:
    """A Triton kernel as Triton's cache and aiter's AOT folders hold it: <name>.hsaco + <name>.json."""
    folder.mkdir(parents=True)
    copy(code_object, folder / "_gemm_kernel.hsaco")
    text = metadata if isinstance(metadata, str) else json.dumps(metadata)
    (folder / "_gemm_kernel.json").write_text(text)
    return folder / "_gemm_kernel.hsaco"


def _triton_metadata(arch: str, backend: str = "hip") -> dict:
    # the shape Triton 3.x writes (and amd-aiter 0.1.7 ships): the target, then compile options
    return {"hash": "4971ef", "target": {"backend": backend, "arch": arch, "warp_size": 64}, "num_warps": 2}


def test_triton_kernels_serve_the_target_their_metadata_names(run_cli, tmp_path, built):
    """Triton launches a compiled kernel only on the GPU its metadata names (the cache key holds
    the target) and compiles it at first use elsewhere: no load failure, an ARCH009 note. Metadata
    that is not Triton's for HIP, or that disagrees with the code, leaves the file a plain code
    object."""
    aot = tmp_path / "aiter" / "ops" / "triton" / "configs" / "gemm" / "aot"
    for shape in ("M=1-N=1280-K=8192", "M=16-N=1280-K=8192"):
        _triton_kernel(aot / f"_gemm_kernel_{shape}", built["ll_gfx950.hsaco"], _triton_metadata("gfx950"))
    _triton_kernel(aot / "_gemm_kernel_M=32-N=1280-K=8192", built["k_gfx942.hsaco"], _triton_metadata("gfx942"))
    odd = tmp_path / "odd"
    cases = {
        "cuda": _triton_metadata("gfx950", backend="cuda"),
        "disagrees": _triton_metadata("gfx942"),  # the code is for gfx950
        "nested": "[" * 100_000 + "]" * 100_000,
        "not-json": "\x00\xff{",
    }
    for name, metadata in cases.items():
        _triton_kernel(odd / name, built["ll_gfx950.hsaco"], metadata)
    result = run_cli("verify-arch", "gfx942", "gfx950", "-p", str(tmp_path), "--format", "json", expect=1)
    carriers = {os.path.relpath(c["path"], tmp_path): c for c in result.report["carriers"]}
    triton = carriers.pop("aiter/ops/triton/configs/gemm/aot")
    assert (triton["kind"], triton["missing"], len(triton["members"])) == ("triton-kernels", [], 3)
    assert {m["target"]: (m["how"], len(m["tus_without"])) for m in triton["matches"]} == {
        "gfx942": ("jit", 2),
        "gfx950": ("jit", 1),
    }
    assert {path: (c["kind"], c["missing"]) for path, c in carriers.items()} == {
        f"odd/{name}/_gemm_kernel.hsaco": ("code-object-file", ["gfx942"]) for name in cases
    }
    notes = [f for f in result.report["findings"] if f["rule"] == "ARCH009"]
    assert [(os.path.relpath(f["path"], tmp_path), f["severity"], f["data"]["kernels"]) for f in notes] == [
        ("aiter/ops/triton/configs/gemm/aot", "info", {"gfx942": 2, "gfx950": 1})
    ]
    assert sorted(f["rule"] for f in result.report["findings"]) == ["ARCH001"] * 4 + ["ARCH009"]
    # Served everywhere it is asked: nothing to say.
    one = aot / "_gemm_kernel_M=1-N=1280-K=8192"
    result = run_cli("verify-arch", "gfx950", "-p", str(one), "--format", "json")
    assert [c["kind"] for c in result.report["carriers"]] == ["triton-kernels"]
    assert result.report["findings"] == []
    # The unit is named inside what was audited; a file audited alone has no metadata beside it.
    result = run_cli("verify-arch", "gfx942", "-p", str(one), "--format", "json")
    assert [(c["path"], c["members"]) for c in result.report["carriers"]] == [
        (str(one), [str(one / "_gemm_kernel.hsaco")])
    ]
    result = run_cli("verify-arch", "gfx942", "-p", str(one / "_gemm_kernel.hsaco"), "--format", "json", expect=1)
    assert [(c["kind"], c["missing"]) for c in result.report["carriers"]] == [("code-object-file", ["gfx942"])]


def test_a_code_object_for_another_os_abi_serves_no_gpu(run_cli, sdk_tree, built):
    """CLR takes an ELF image only with EI_OSABI = ELFOSABI_AMDGPU_HSA (hip_fatbin.cpp
    IsCodeObjectElf): the same gfx942 code object marked for PAL (65) is no code for a HIP device."""
    lib = sdk_tree / "_rocm_sdk_libraries" / "lib"
    hsa = lib / "kernels_hsa.hsaco"
    copy(built["k_gfx942.hsaco"], hsa)
    pal = lib / "kernels_pal.hsaco"
    data = bytearray(hsa.read_bytes())
    assert data[7] == 64  # ELFOSABI_AMDGPU_HSA
    data[7] = 65  # ELFOSABI_AMDGPU_PAL
    pal.write_bytes(bytes(data))
    for path, missing in ((hsa, []), (pal, ["gfx942"])):
        result = run_cli("verify-arch", "gfx942", "-p", str(path), "--format", "json", expect=1 if missing else 0)
        (carrier,) = result.report["carriers"]
        assert carrier["missing"] == missing, carrier
