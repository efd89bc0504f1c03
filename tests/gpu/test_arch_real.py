"""Real toolchain output and real vendor wheels, checked against clang-offload-bundler-19."""

from __future__ import annotations

import os
import struct
import subprocess
import zipfile
from pathlib import Path

import pytest
import zstandard

from rocm_audit.gpu.codeobjects import FileCodeObjects
from support.gpu.arch_writers import scan_path, section_bytes
from support.run import run_checked
from support.toolchain import gfx942_code_object
from support.vendor import aiter_wheel, cupy_rocm40_wheel

JAX_TARGETS = [
    "gfx900",
    "gfx906",
    "gfx908",
    "gfx90a",
    "gfx942",
    "gfx950",
    "gfx1010",
    "gfx1011",
    "gfx1012",
    "gfx1030",
    "gfx1031",
    "gfx1032",
    "gfx1033",
    "gfx1034",
    "gfx1035",
    "gfx1036",
    "gfx1100",
    "gfx1101",
    "gfx1102",
    "gfx1103",
    "gfx1150",
    "gfx1151",
    "gfx1152",
    "gfx1153",
    "gfx1200",
    "gfx1201",
    "gfx1250",
]


def bundler_list(tools: dict[str, str], data: bytes, tmp_path: Path, name: str) -> list[str]:
    path = tmp_path / name
    path.write_bytes(data)
    done = subprocess.run(
        [tools["clang-offload-bundler-19"], "--list", "--type=o", f"--input={path}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return sorted(line for line in done.stdout.splitlines() if line)


def inflate_ccob_test_side(data: bytes) -> bytes:
    """formats.md 2.4, independent of rocm_audit: header by version, then the whole payload."""
    version, method = struct.unpack_from("<HH", data, 4)
    header_size = {1: 20, 2: 24, 3: 32}[version]
    if version == 3:
        total, size = struct.unpack_from("<QQ", data, 8)
    elif version == 2:
        total, size = struct.unpack_from("<II", data, 8)
    else:
        total, size = len(data), struct.unpack_from("<I", data, 8)[0]
    body = data[header_size:total]
    if method == 1:
        return zstandard.ZstdDecompressor().decompress(body, max_output_size=size)
    import zlib

    return zlib.decompress(body)


def our_ids(result: FileCodeObjects, tu: int) -> list[str]:
    return sorted(obj.entry_id.rstrip("\0") for obj in result.code_objects if obj.tu == tu)


DIFFERENTIAL = [
    "libplain.so",
    "libccob.so",
    "librdc.so",
    "librdcc.so",
    "libcov5.so",
    "libv6feat.so",
    "libxnackon.so",
    "libmulti.so",
    "libmultic.so",
    "libfat950.so",
    "libfat950c.so",
    "libfatgeneric.so",
    "libfatgenericc.so",
    "fat950.hipfb",
    "fat950c.hipfb",
]


@pytest.mark.parametrize("name", DIFFERENTIAL)
def test_entry_lists_equal_clang_offload_bundler(built, tools, tmp_path, name):
    """Each bundle we find, cut out at the offsets we report, lists the same ids in the bundler."""
    result = scan_path(built[name])
    assert not result.findings, result.findings
    data = built[name].read_bytes()
    assert result.bundles, "no bundle found"
    for tu, (offset, size, kind) in enumerate(result.bundles):
        listed = bundler_list(tools, data[offset : offset + size], tmp_path, f"{name}.{tu}")
        assert our_ids(result, tu) == listed, (tu, kind)


def test_section_walk_agrees_with_pyelftools(built):
    """The fat binary is where pyelftools says .hip_fatbin is, and one bundle per wrapper."""
    for name in ("libmulti.so", "libmultic.so"):
        offset, data = section_bytes(built[name], ".hip_fatbin")
        result = scan_path(built[name])
        assert result.bundles[0][0] == offset and result.tu_count == result.wrappers == 2
        assert all(offset <= start < offset + len(data) for start, _, _ in result.bundles)


def test_what_each_build_flag_produces(built):
    facts = {name: scan_path(built[name]) for name in DIFFERENTIAL + ["k_gfx942.hsaco", "knew.o", "libembedded.so"]}
    device = {
        name: [
            (o.tu, o.target, o.target_source, o.code_object_version, o.generic_version)
            for o in r.code_objects
            if o.kind != "host"
        ]
        for name, r in facts.items()
    }
    assert facts["libplain.so"].containers == ["hip-fatbin", "offload-bundle"]
    assert facts["libccob.so"].containers == ["hip-fatbin", "ccob-v2-zstd"]
    assert device["libcov5.so"] == [(0, "gfx942", "e_flags", 5, None)]
    assert "gfx9-generic" in [t for _, t, *_ in device["libv6feat.so"]] and {
        c for *_, c, _ in device["libv6feat.so"]
    } == {6}
    assert (0, "gfx942:sramecc+:xnack-", "e_flags", 6, 0) in device["libv6feat.so"]
    assert device["libxnackon.so"] == [(0, "gfx942:xnack+", "e_flags", 5, None)]
    assert device["libmulti.so"] == [
        (0, "gfx90a", "e_flags", 5, None),
        (0, "gfx942", "e_flags", 5, None),
        (1, "gfx90a", "e_flags", 5, None),
    ]
    assert device["libmultic.so"] == device["libmulti.so"]
    # rdc: one device-linked bundle registered by each TU's wrapper, and no warning for it.
    assert facts["librdc.so"].wrappers == 2 and facts["librdc.so"].tu_count == 1
    # gfx950 from llvmlite, bundled by clang-offload-bundler-19 under the id "...--gfx950-".
    fat950 = [o for o in facts["libfat950.so"].code_objects if o.target == "gfx950"]
    assert fat950[0].entry_id == "hipv4-amdgcn-amd-amdhsa--gfx950-" and fat950[0].code_object_version == 6
    assert fat950[0].metadata_target == "gfx950" and fat950[0].kernels == 1
    assert device["libfatgenericc.so"] == [(0, "gfx9-4-generic", "e_flags", 6, 1)]
    assert device["k_gfx942.hsaco"] == [(0, "gfx942", "e_flags", 5, None)]
    assert facts["libembedded.so"].containers == ["embedded-elf"]
    assert device["libembedded.so"] == [(0, "gfx950", "e_flags", 6, 0)]
    offloading = facts["knew.o"].code_objects
    assert facts["knew.o"].containers == ["offload-binary"]
    assert [(o.kind, o.target, o.entry_id) for o in offloading] == [("hip", "gfx942", "amdgcn-amd-amdhsa")]


def test_a_library_with_only_the_magic_string_holds_no_code_object(built):
    assert b"__CLANG_OFFLOAD_BUNDLE__" in built["libmagic.so"].read_bytes()
    result = scan_path(built["libmagic.so"])
    assert result.code_objects == [] and result.findings == [] and result.tu_count == 0


def test_vendor_wheel_jax_rocm7_plugin(jax_plugin, tools, tmp_path):
    """CCOB v3 + zstd, 27 targets; bundler 19 cannot read v3, so it lists a test-side inflation."""
    prng = scan_path(jax_plugin / "_prng.so")
    assert not prng.findings
    assert prng.containers == ["hip-fatbin", "ccob-v3-zstd"]
    device = [o for o in prng.code_objects if o.kind != "host"]
    assert sorted(o.target for o in device) == sorted(JAX_TARGETS)
    assert {o.code_object_version for o in device} == {6} and {o.target_source for o in device} == {"e_flags"}
    assert [o.entry_id for o in prng.code_objects if o.kind == "host"] == ["host-x86_64-unknown-linux-gnu-"]
    solver = scan_path(jax_plugin / "_solver.so")
    assert solver.tu_count == solver.wrappers == 2 and len(solver.bundles) == 2
    for name in ("_prng.so", "_solver.so", "_linalg.so"):
        result = scan_path(jax_plugin / name)
        data = (jax_plugin / name).read_bytes()
        for tu, (offset, size, kind) in enumerate(result.bundles):
            assert kind == "ccob"
            inflated = inflate_ccob_test_side(data[offset : offset + size])
            assert our_ids(result, tu) == bundler_list(tools, inflated, tmp_path, f"{name}.{tu}")
    host_only = scan_path(jax_plugin / "_triton.so")
    assert host_only.code_objects == [] and host_only.tu_count == 0


def test_identity_disagreements_are_arch003(built, tools, tmp_path):
    """Bundle id vs e_flags (a mislabelled bundle); amdhsa.target vs e_flags (a patched header)."""
    mislabelled = tmp_path / "mislabelled.co"
    done = subprocess.run(
        [
            tools["clang-offload-bundler-19"],
            "-type=o",
            "-bundle-align=4096",
            "-targets=host-x86_64-unknown-linux,hipv4-amdgcn-amd-amdhsa--gfx90a",
            "-input=/dev/null",
            f"-input={built['k_gfx942.hsaco']}",
            f"-output={mislabelled}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = scan_path(mislabelled)
    assert [(f.rule, f.data["bundle_target"], f.data["e_flags_target"]) for f in result.findings] == [
        ("ARCH003", "gfx90a", "gfx942")
    ]
    # The runtime trusts e_flags: the object counts as gfx942, not gfx90a.
    assert [o.target for o in result.code_objects if o.kind != "host"] == ["gfx942"]
    patched = bytearray(built["ll_gfx950.hsaco"].read_bytes())
    assert patched[0x30] == 0x4F
    patched[0x30] = 0x4C  # EF_AMDGPU_MACH gfx950 -> gfx942; the metadata note still says gfx950
    (tmp_path / "patched.hsaco").write_bytes(bytes(patched))
    result = scan_path(tmp_path / "patched.hsaco")
    assert [(f.rule, f.data["metadata_target"], f.data["e_flags_target"]) for f in result.findings] == [
        ("ARCH003", "gfx950", "gfx942")
    ]


BNB_V2_TARGETS = ["gfx1030", "gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153"]
BNB_V2_TARGETS += ["gfx1200", "gfx1201", "gfx908", "gfx90a", "gfx942"]


@pytest.mark.parametrize(
    ("name", "container", "extra"),
    [
        ("rocm64", "ccob-v2-zstd", []),
        ("rocm70", "ccob-v2-zstd", ["gfx950"]),
        (
            "rocm714",
            "ccob-v3-zstd",
            ["gfx950", "gfx1250"] + [f"gfx101{n}" for n in "012"] + [f"gfx103{n}" for n in "123456"],
        ),
    ],
)
def test_vendor_wheel_bitsandbytes(bitsandbytes_libs, tools, tmp_path, name, container, extra):
    """Two compressed bundles per library, CCOB v2 or v3; each TU's ids equal the bundler's list of a
    test-side inflation, and every target comes from e_flags (code object v6)."""
    path = bitsandbytes_libs / f"libbitsandbytes_{name}.so"
    result = scan_path(path)
    assert not result.findings
    assert result.containers == ["hip-fatbin", container]
    assert result.tu_count == result.wrappers == 2 and [kind for *_, kind in result.bundles] == ["ccob", "ccob"]
    data = path.read_bytes()
    for tu, (offset, size, _kind) in enumerate(result.bundles):
        inflated = inflate_ccob_test_side(data[offset : offset + size])
        assert our_ids(result, tu) == bundler_list(tools, inflated, tmp_path, f"{name}.{tu}")
        device = [o for o in result.code_objects if o.tu == tu and o.kind != "host"]
        assert sorted(o.target for o in device) == sorted(BNB_V2_TARGETS + extra)
        assert {o.code_object_version for o in device} == {6} and {o.target_source for o in device} == {"e_flags"}


def test_a_sycl_library_holds_no_amd_code_object(bitsandbytes_libs):
    """Intel's SYCL offload wrapper names a section __CLANG_OFFLOAD_BUNDLE__: not a HIP carrier."""
    path = bitsandbytes_libs / "libbitsandbytes_xpu2026.so"
    assert b"__CLANG_OFFLOAD_BUNDLE__" in path.read_bytes()
    result = scan_path(path)
    assert result.code_objects == [] and result.findings == [] and result.tu_count == 0


# EF_AMDGPU_MACH (formats.md 2.7), read here without rocm_audit
AITER_MACH = {0x4C: "gfx942", 0x4F: "gfx950"}


@pytest.mark.slow  # a 40 MB download, 2,501 code objects
def test_vendor_wheel_amd_aiter_per_arch_folders_and_triton_kernels(cache_dir, run_cli, tmp_path):
    """aiter's hsa/<arch>/ folders are one unit serving gfx942 and gfx950 (every member's e_flags
    name the arch of its folder; 219 kernels exist for gfx942 only and 158 for gfx950 only, by
    design), and its 112 Triton AOT kernels (FP4 GEMMs, gfx950 per their metadata) are compiled at
    first use elsewhere: no error for the two arches aiter supports, one for an arch it has no
    folder for."""
    with zipfile.ZipFile(aiter_wheel(cache_dir)) as archive:
        members = [
            m
            for m in archive.namelist()
            if m.startswith("aiter_meta/hsa/") or "/triton/configs/gemm/aot/" in m and m.endswith((".hsaco", ".json"))
        ]
        archive.extractall(tmp_path, members)
    code = [m for m in members if m.endswith(".co")]
    assert len(code) == 2501
    per_arch: dict[str, set[str]] = {}
    for member in code:
        _, _, arch, rest = member.split("/", 3)
        assert AITER_MACH[(tmp_path / member).read_bytes()[0x30]] == arch
        per_arch.setdefault(rest, set()).add(arch)
    assert sorted(len(a) for a in per_arch.values()).count(1) == 377  # kernels of one arch only
    triton = [m for m in members if m.endswith(".hsaco")]
    assert len(triton) == 112
    assert {AITER_MACH[(tmp_path / m).read_bytes()[0x30]] for m in triton} == {"gfx950"}

    report = run_cli("verify-arch", "gfx942", "gfx950", "-p", str(tmp_path), "--format", "json").report
    carriers = {os.path.relpath(c["path"], tmp_path): c for c in report["carriers"]}
    assert {path: (c["kind"], c["missing"], len(c["members"])) for path, c in carriers.items()} == {
        "aiter_meta/hsa/gfx*": ("per-arch-folders", [], 2501),
        "aiter/ops/triton/configs/gemm/aot": ("triton-kernels", [], 112),
    }
    assert [(f["rule"], f["data"]["kernels"]) for f in report["findings"]] == [("ARCH009", {"gfx942": 112})]

    # prune for gfx942 drops the gfx950 folder whole, its codegen.py scripts and .csv tables too
    report = run_cli("prune", "gfx942", "-p", str(tmp_path), "--dry-run", "--format", "json").report
    removals = [(r["kind"], os.path.relpath(r["path"], tmp_path)) for r in report["prune"]["removals"]]
    assert removals == [("code-object-dir", "aiter_meta/hsa/gfx950")]
    folder = tmp_path / "aiter_meta" / "hsa" / "gfx950"
    assert report["prune"]["removals"][0]["bytes"] == sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())

    report = run_cli("verify-arch", "gfx90a", "-p", str(tmp_path), "--format", "json", expect=1).report
    assert sorted((f["rule"], os.path.relpath(f["path"], tmp_path)) for f in report["findings"]) == [
        ("ARCH008", "aiter_meta/hsa/gfx*"),
        ("ARCH009", "aiter/ops/triton/configs/gemm/aot"),
    ]


def _readelf_flags(tools: dict[str, str], data: bytes, tmp_path: Path, name: str) -> tuple[int, int]:
    """(EI_ABIVERSION, e_flags) of a code object, read by llvm-readelf, independent of rocm_audit."""
    path = tmp_path / name
    path.write_bytes(data)
    done = subprocess.run(
        [tools["llvm-readelf-19"], "-h", str(path)], capture_output=True, text=True, timeout=60, check=True
    )
    abi = int(next(line for line in done.stdout.splitlines() if "ABI Version:" in line).split(":")[1])
    flags = int(next(line for line in done.stdout.splitlines() if "Flags:" in line).split(":")[1].split(",")[0], 16)
    return abi, flags


@pytest.mark.vendor  # a real cupy wheel
def test_vendor_wheel_cupy_rocm_4_0_code_object_v3(cache_dir, tools, tmp_path, run_cli):
    """ROCm 4.0's clang (cupy-rocm-4-0 9.0.0): 3-field ``hip-amdgcn-amd-amdhsa-gfxN`` ids and code
    object V3, whose e_flags hold one bit per feature. A feature is named only for a processor that
    has it (CLR getTripleTargetIDFromCodeObject): gfx1010's object is gfx1010:xnack-, gfx803's plain
    gfx803 (not gfx1010:sramecc-:xnack-, which no device is). Entries and e_flags are checked
    against clang-offload-bundler-19 and llvm-readelf-19. And no entry loads anywhere today: comgr's
    lookup, which the HIP runtime asks, parses the id after its kind as a five-part ISA name, which
    the 3-field triple is not (test_arch_comgr asks a real comgr: every query comes back empty), so
    every target is ARCH001, saying why."""
    from rocm_audit.formats.amdgpu_elf import supported_features

    with zipfile.ZipFile(cupy_rocm40_wheel(cache_dir)) as archive:
        member = "cupy/cuda/cub.cpython-38-x86_64-linux-gnu.so"
        archive.extract(member, tmp_path)
    library = tmp_path / member
    result = scan_path(library)
    assert not result.findings and result.tu_count == 1
    ((offset, size, _),) = result.bundles
    data = library.read_bytes()[offset : offset + size]
    assert our_ids(result, 0) == bundler_list(tools, data, tmp_path, "cub.bundle")
    device = [o for o in result.code_objects if o.kind != "host"]
    assert {o.entry_id.split("-")[-1] for o in device} >= {"gfx1010", "gfx900", "gfx803", "gfx906", "gfx908"}
    for obj in device:
        processor = obj.entry_id.split("-")[-1]
        abi, flags = _readelf_flags(
            tools, data[obj.file_offset - offset : obj.file_offset - offset + obj.size], tmp_path, processor
        )
        assert abi == 1 and obj.code_object_version == 3  # V3
        expected = processor + "".join(
            f":{name}{'+' if flags & bit else '-'}"
            for name, bit in (("sramecc", 0x200), ("xnack", 0x100))
            if name in supported_features(processor)
        )
        assert obj.target == expected, (obj.entry_id, hex(flags))
    report = run_cli("verify-arch", "gfx1010", "gfx900", "gfx803", "-p", str(library), "--format", "json").report
    (finding,) = report["findings"]
    assert finding["rule"] == "ARCH001" and finding["data"]["missing"] == ["gfx803", "gfx900", "gfx1010"]
    assert "3-field" in finding["message"] and "hip-amdgcn-amd-amdhsa-gfx1010" in finding["data"]["unmatched_ids"]


_OLD_TU = """\
  .section .hip_fatbin,"a",@progbits
  .p2align 3
__hip_fatbin_{n}:
  .incbin "{bundle}"
  .section .hipFatBinSegment,"aw",@progbits
  .p2align 3
__hip_fatbin_wrapper_{n}:
  .long 0x48495046
  .long 1
  .quad __hip_fatbin_{n}
  .quad 0
"""


def _device_bundle(tools: dict[str, str], tmp_path: Path, name: str, arches: tuple[str, ...]) -> Path:
    """A raw bundle as clang's HIP driver makes one: a host entry from /dev/null and one linked code
    object per arch (clang-19, ld.lld-19), bundled by clang-offload-bundler-19."""
    inputs = ["-input=/dev/null"]
    for arch in arches:
        source = tmp_path / f"{name}_{arch}.c"
        source.write_text(f"void {name}(int *p) {{ *p = 1; }}\n")
        relocatable, linked = tmp_path / f"{name}_{arch}.o", tmp_path / f"{name}_{arch}.co"
        run_checked(
            [tools["clang-19"], "-target", "amdgcn-amd-amdhsa", f"-mcpu={arch}", "-nogpulib", "-c"]
            + ["-o", str(relocatable), str(source)],
            tmp_path,
        )
        run_checked([tools["ld.lld-19"], "-shared", "-o", str(linked), str(relocatable)], tmp_path)
        inputs.append(f"-input={linked}")
    targets = ",".join(["host-x86_64-unknown-linux", *(f"hip-amdgcn-amd-amdhsa-{a}" for a in arches)])
    bundle = tmp_path / f"{name}.bundle"
    run_checked(
        [tools["clang-offload-bundler-19"], "-type=o", f"-targets={targets}", *inputs, f"-output={bundle}"], tmp_path
    )
    return bundle


def test_bundles_of_8_aligned_tu_sections_are_every_one_read(tools, tmp_path, run_cli):
    """Before LLVM 12 each TU's ``.hip_fatbin`` was 8-aligned, not 4096 (tensorflow-rocm 2.2 and 2.4
    hold 216 and 229 bundles 8 bytes apart): the linker pads a bundle whose size is not a multiple
    of 8 with zeros before the next. Made as clang did: each TU's bundle (clang-offload-bundler-19)
    and wrapper in its own object, linked by ld.lld-19; the second TU has no gfx908 code."""
    objects = []
    for n, arches in ((1, ("gfx906", "gfx908")), (2, ("gfx906",))):
        bundle = _device_bundle(tools, tmp_path, f"tu{n}", arches)
        (tmp_path / f"tu{n}.s").write_text(_OLD_TU.format(n=n, bundle=bundle))
        run_checked([tools["clang-19"], "-c", str(tmp_path / f"tu{n}.s"), "-o", str(tmp_path / f"tu{n}.o")], tmp_path)
        objects.append(str(tmp_path / f"tu{n}.o"))
    library = tmp_path / "libold.so"
    run_checked([tools["ld.lld-19"], "-shared", *objects, "-o", str(library)], tmp_path)
    first = (tmp_path / "tu1.bundle").stat().st_size
    assert first % 8, "the first bundle must need padding for this test to mean anything"
    result = scan_path(library)
    assert not result.findings, result.findings
    assert result.tu_count == result.wrappers == 2
    start = result.bundles[0][0]
    assert [offset - start for offset, _, _ in result.bundles] == [0, first + -first % 8]
    data = library.read_bytes()
    for tu, (offset, size, _) in enumerate(result.bundles):
        assert our_ids(result, tu) == bundler_list(tools, data[offset : offset + size], tmp_path, f"listed{tu}")
    report = run_cli("verify-arch", "gfx906", "gfx908", "-p", str(library), "--format", "json").report
    assert [(f["rule"], "translation units without it: 1 of 2" in f["message"]) for f in report["findings"]] == [
        ("ARCH001", True)
    ], report["findings"]


def test_hcc_fat_binaries_in_a_kernel_section_are_listed_and_never_pass(tools, tmp_path, run_cli):
    """hcc (ROCm 3.x and older) kept a library's fat binaries in ``.kernel`` with hcc-amdgcn-amd-amdhsa
    ids for its own runtime (tensorflow-rocm 1.15's librccl.so: one bundle for gfx803-gfx908); the
    HIP runtime never registers them. Made the same way: a clang-offload-bundler-19 bundle whose ids
    are respelled hcc- (bundler 19 refuses that kind; the format is the same), in ``.kernel`` of a
    lld-linked library. Listed by scan; verify-arch fails it (ARCH010) even for a target it names,
    where it once found no GPU code at all and passed."""
    bundle = _device_bundle(tools, tmp_path, "hcc", ("gfx906", "gfx908"))
    respelled = bundle.read_bytes().replace(b"hip-amdgcn-amd-amdhsa-", b"hcc-amdgcn-amd-amdhsa-")
    bundle.write_bytes(respelled)
    # 8 bytes of padding first: hcc's section need not start with the bundle.
    (tmp_path / "hcc.s").write_text(f'  .section .kernel,"aw",@progbits\n  .zero 8\n  .incbin "{bundle}"\n')
    run_checked([tools["clang-19"], "-c", str(tmp_path / "hcc.s"), "-o", str(tmp_path / "hcc.o")], tmp_path)
    library = tmp_path / "libhcc.so"
    run_checked([tools["ld.lld-19"], "-shared", str(tmp_path / "hcc.o"), "-o", str(library)], tmp_path)
    result = scan_path(library)
    device = sorted((o.kind, o.target, o.container, o.tu) for o in result.code_objects if o.kind != "host")
    assert device == [("hcc", "gfx906", "hcc-kernel", None), ("hcc", "gfx908", "hcc-kernel", None)]
    assert result.tu_count == 0
    done = run_cli("verify-arch", "gfx906", "-p", str(library), "--format", "json")
    assert done.exit_code == 1 and [f["rule"] for f in done.report["findings"]] == ["ARCH010"]
    assert done.report["findings"][0]["data"]["targets"] == ["gfx906", "gfx908"]


_RDC_IN_DATA = """\
  .data
  .globl __hip_fatbin
  .p2align 4
__hip_fatbin:
  .incbin "{bundle}"
  .section .hipFatBinSegment,"aw",@progbits
  .p2align 3
{wrappers}
"""
_WRAPPER = "  .long 0x48495046\n  .long 1\n  .quad __hip_fatbin\n  .quad 0\n"


def test_wrappers_pointing_at_a_fat_binary_outside_hip_fatbin_register_it(tools, tmp_path, run_cli):
    """What the HIP runtime registers is what each wrapper points at, not the ``.hip_fatbin``
    section: tensorflow-rocm 2.4's librccl.so (ROCm 4.0, -fgpu-rdc) has no ``.hip_fatbin``; its six
    wrappers point, through R_X86_64_64 relocations against the global ``__hip_fatbin``, at one
    bundle in ``.data``. Made the same way with clang-19 and ld.lld-19 (three wrappers, one bundle
    for gfx906 and gfx908): one TU, judged by that bundle; no false "wrappers but .hip_fatbin is
    missing", and the bundle is not counted again as an embedded image."""
    bundle = _device_bundle(tools, tmp_path, "rdc", ("gfx906", "gfx908"))
    (tmp_path / "rdc.s").write_text(_RDC_IN_DATA.format(bundle=bundle, wrappers=_WRAPPER * 3))
    run_checked([tools["clang-19"], "-c", str(tmp_path / "rdc.s"), "-o", str(tmp_path / "rdc.o")], tmp_path)
    library = tmp_path / "librdcdata.so"
    run_checked([tools["ld.lld-19"], "-shared", str(tmp_path / "rdc.o"), "-o", str(library)], tmp_path)
    relocations = subprocess.run(
        [tools["llvm-readelf-19"], "-rW", str(library)], capture_output=True, text=True, check=True
    ).stdout
    assert relocations.count("R_X86_64_64") == 3 and "__hip_fatbin" in relocations
    result = scan_path(library)
    assert not result.findings, result.findings
    assert result.tu_count == 1 and result.wrappers == 3 and result.unit_places == {}
    assert {o.location.split()[0] for o in result.code_objects} == {".data+0x0"}
    report = run_cli("verify-arch", "gfx906", "gfx908", "-p", str(library), "--format", "json").report
    assert report["findings"] == [] and report["carriers"][0]["missing"] == []
    report = run_cli("verify-arch", "gfx90a", "-p", str(library), "--format", "json").report
    assert [f["rule"] for f in report["findings"]] == ["ARCH001"]


def test_a_wrapper_pointing_at_no_fat_binary_is_named_even_when_another_resolves(tools, tmp_path, run_cli):
    """Two wrappers, one at ``__hip_fatbin`` and one 8 bytes into it: the runtime would register
    whatever lies at the second address, so it is ARCH004 naming that wrapper and the address,
    not dropped while the first one's bundle passes."""
    bundle = _device_bundle(tools, tmp_path, "mix", ("gfx906",))
    wrappers = _WRAPPER + _WRAPPER.replace("__hip_fatbin\n", "__hip_fatbin + 8\n")
    (tmp_path / "mix.s").write_text(_RDC_IN_DATA.format(bundle=bundle, wrappers=wrappers))
    run_checked([tools["clang-19"], "-c", str(tmp_path / "mix.s"), "-o", str(tmp_path / "mix.o")], tmp_path)
    library = tmp_path / "libmix.so"
    run_checked([tools["ld.lld-19"], "-shared", str(tmp_path / "mix.o"), "-o", str(library)], tmp_path)
    result = scan_path(library)
    assert result.tu_count == 1
    (problem,) = [f for f in result.findings if f.rule == "ARCH004"]
    assert "1 of 2 HIPF wrappers point at no fat binary (wrapper 1" in problem.message
    report = run_cli("verify-arch", "gfx906", "-p", str(library), "--format", "json").report
    assert {f["rule"] for f in report["findings"]} == {"ARCH004"}


@pytest.mark.parametrize("compress", [False, True], ids=["bundle", "ccob"])
@pytest.mark.parametrize("kind", ["hip", "hipv4"])
def test_a_hip_kind_entry_serves_its_target_as_a_hipv4_one_does(tools, tmp_path, run_cli, kind, compress):
    """CLR asks comgr for ``hipv4-amdgcn-amd-amdhsa--<agent>`` (its unbundle action for a CCOB) or
    looks the ISA up (a plain bundle); LLVM's unbundler takes ``hip`` and ``hipv4`` as one kind.
    The oracle is clang-offload-bundler-19 unbundling the real gfx942 code object with CLR's id."""
    code_object = gfx942_code_object(tmp_path)
    host = tmp_path / "host.o"
    host.write_bytes(b"")
    image = tmp_path / f"{kind}.co"
    targets = f"-targets=host-x86_64-unknown-linux-gnu,{kind}-amdgcn-amd-amdhsa--gfx942"
    pack = [tools["clang-offload-bundler-19"], "-type=o", targets, f"-input={host}", f"-input={code_object}"]
    run_checked([*pack, f"-output={image}", *(["--compress"] * compress)], tmp_path)
    assert image.read_bytes().startswith(b"CCOB" if compress else b"__CLANG_OFFLOAD_BUNDLE__")
    unpacked = tmp_path / "unpacked.o"
    asked = "-targets=hipv4-amdgcn-amd-amdhsa--gfx942"
    unpack = [tools["clang-offload-bundler-19"], "-type=o", "-unbundle", asked, f"-input={image}"]
    run_checked([*unpack, f"-output={unpacked}"], tmp_path)
    assert unpacked.read_bytes() == code_object.read_bytes()
    report = run_cli("verify-arch", "gfx942", "-p", str(image), "--format", "json", expect=0).report
    assert report["findings"] == []
    assert (
        run_cli("verify-arch", "gfx90a", "-p", str(image), "--format", "json", expect=1).report["findings"][0]["rule"]
        == "ARCH001"
    )
