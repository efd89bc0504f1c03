"""kpack'd host libraries judged the way the kpack runtime resolves them: the key the
``.rocm_kpack_ref`` holds and the search paths it names, relative to the path the library is
installed under, not the name it had at build time.

TheRock's wheels materialise a library under its SONAME (``lib/librocblas.so.5``) while rocm-kpack
keyed its kernels by the build path (``math-libs/BLAS/rocBLAS/stage/lib/librocblas.so.5.0.0``,
older flow through a ``.kpm``) or by the relpath its reference names (``<relpath>#<co_index>``,
newer flow). The libraries are built by gcc with the post-split sections (HIPK wrapper,
``.rocm_kpack_ref``, NOBITS ``.hip_fatbin``); archives are written by the test.
"""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import msgpack
import pytest

from rocm_audit.gpu import verify
from support.gpu.arch_writers import amdgpu_header, kpack_archive
from support.therock.artifacts import kpack_ref_asm

GFX942_ANY = amdgpu_header(0x54C)
GFX90A_ANY = amdgpu_header(0x53F)
BUILD_PREFIX = "math-libs/BLAS/rocBLAS/stage"
BUILD_RELPATH = "lib/librocblas.so.5.0.0"


def _kpackd_library(path: Path, search_paths: list[str], kernel_name: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.parent / "kpackd.c"
    source.write_text("int rocblas_get_version(void) { return 5; }\n" + kpack_ref_asm(search_paths, kernel_name, 16384))
    subprocess.run(
        ["gcc", "-shared", "-fPIC", f"-Wl,-soname,{path.name}", str(source), "-o", str(path)],
        check=True,
        capture_output=True,
    )
    source.unlink()
    return path


def _older_flow(site: Path, *, key: str = f"{BUILD_PREFIX}/{BUILD_RELPATH}", scheme: str = "none") -> Path:
    """kpack-old's splitter: the reference names the component and the .kpm; TOC keys are build paths."""
    tree = site / "_rocm_sdk_libraries"
    library = _kpackd_library(tree / "lib/librocblas.so.5", ["../.kpack/blas_lib.kpm"], "blas_lib")
    files = {}
    for arch, code in (("gfx942", GFX942_ANY), ("gfx90a", GFX90A_ANY)):
        name = f"blas_lib_{arch}.kpack"
        (tree / ".kpack").mkdir(exist_ok=True)
        (tree / ".kpack" / name).write_bytes(kpack_archive([(key, arch, code)], scheme=scheme, family=arch))
        files[arch] = {"file": name, "size": 0, "kernel_count": 1}
    (tree / ".kpack/blas_lib.kpm").write_bytes(
        msgpack.packb({"format_version": 1, "component_name": "blas_lib", "prefix": BUILD_PREFIX, "kpack_files": files})
    )
    return library


def _newer_flow(site: Path) -> Path:
    """rocm-systems kpack: the reference holds the relpath; keys are "<relpath>#<co_index>"; the
    search path is an @GFXARCH@ pattern."""
    tree = site / "_rocm_sdk_libraries"
    library = _kpackd_library(tree / "lib/librocblas.so.5", ["../.kpack/blas_lib_@GFXARCH@.kpack"], BUILD_RELPATH)
    (tree / ".kpack").mkdir(exist_ok=True)
    for arch, code in (("gfx942", GFX942_ANY), ("gfx90a", GFX90A_ANY)):
        (tree / f".kpack/blas_lib_{arch}.kpack").write_bytes(kpack_archive([(f"{BUILD_RELPATH}#0", arch, code)]))
    return library


def _carrier(outcome, library: Path) -> dict:
    (found,) = [c for c in outcome.sections["carriers"] if c["path"] == str(library)]
    return found


@pytest.mark.parametrize("scheme", ["none", "zstd-per-kernel"])
def test_a_library_installed_under_its_soname_is_judged_by_its_build_key(tmp_path, scheme):
    library = _older_flow(tmp_path / "site", scheme=scheme)
    outcome = verify.verify_arch([str(tmp_path / "site")], ["gfx942"], environ={})
    carrier = _carrier(outcome, library)
    assert carrier["kind"] == "library" and "kpack" in carrier["containers"]
    assert carrier["targets"] == ["gfx90a", "gfx942"] and carrier["missing"] == []
    assert [m["how"] for m in carrier["matches"]] == ["native"]
    assert not [f for f in outcome.findings if f.rule.startswith("ARCH")], outcome.findings


def test_a_target_no_archive_holds_is_an_arch_finding_naming_the_library(tmp_path):
    library = _older_flow(tmp_path / "site")
    outcome = verify.verify_arch([str(tmp_path / "site")], ["gfx950"], environ={})
    named = [(f.rule, f.path) for f in outcome.findings]
    assert ("ARCH001", str(library)) in named, outcome.findings
    assert _carrier(outcome, library)["missing"] == ["gfx950"]


def test_the_newer_flow_is_found_by_the_key_the_reference_holds(tmp_path):
    library = _newer_flow(tmp_path / "site")
    outcome = verify.verify_arch([str(tmp_path / "site")], ["gfx90a:xnack-", "gfx942"], environ={})
    carrier = _carrier(outcome, library)
    assert carrier["missing"] == [] and [m["how"] for m in carrier["matches"]] == ["native", "native"]
    assert not [f for f in outcome.findings if f.rule.startswith("ARCH")], outcome.findings


def test_a_key_no_archive_holds_is_reported_not_skipped(tmp_path):
    """The archives exist, but none holds a key for this library (another build's TOC): the library
    is named by ARCH005 and, judged, by ARCH001; it is never silently 'no code objects'."""
    library = _older_flow(tmp_path / "site", key="math-libs/BLAS/hipBLASLt/stage/lib/libhipblaslt.so.1.0.0")
    outcome = verify.verify_arch([str(tmp_path / "site")], ["gfx942"], environ={})
    rules = {(f.rule, f.path) for f in outcome.findings}
    assert ("ARCH005", str(library)) in rules and ("ARCH001", str(library)) in rules, outcome.findings
    (reason,) = [f.message for f in outcome.findings if f.rule == "ARCH005"]
    assert "blas_lib" in reason


def test_lazy_judgement_reads_only_the_kernel_of_the_judged_arch(tmp_path):
    library = _older_flow(tmp_path / "site")
    from rocm_audit.tree.discovery import resolve_roots
    from rocm_audit.tree.inventory import build_inventory

    roots, _ = resolve_roots([str(library)])
    inventory = build_inventory(roots)
    required = [verify.resolve_required("gfx942")]
    (lazy,) = verify.scan_inventory(inventory, verify.selection_for(required))
    (full,) = verify.scan_inventory(inventory)
    assert sorted(o.bundle_target for o in full.code_objects if o.target_source == "e_flags") == ["gfx90a", "gfx942"]
    assert [o.bundle_target for o in lazy.code_objects if o.target_source == "e_flags"] == ["gfx942"]
    assert sorted(o.bundle_target for o in lazy.code_objects) == ["gfx90a", "gfx942"]


# e_flags: gfx942 (0x4c) with xnack on (0x300) / off (0x200), sramecc any (formats.md 2.8).
GFX942_XNACK_ON = amdgpu_header(0x34C)
GFX942_XNACK_OFF = amdgpu_header(0x24C)


def _split_with_features(site: Path) -> Path:
    """What kpack-old's real splitter writes for a library built with --offload-arch=gfx942:xnack+
    and gfx942:xnack- (observed running its split_artifacts on a clang-19 build): one archive per
    full target id, named for it, colon and all (``blas_lib_gfx942:xnack+.kpack``), each with
    ``gfx_arches`` = [that id]; the .kpm lists them by the same id."""
    tree = site / "_rocm_sdk_libraries"
    library = _kpackd_library(tree / "lib/libxn.so", ["../.kpack/blas_lib.kpm"], "blas_lib")
    (tree / ".kpack").mkdir(exist_ok=True)
    files = {}
    for arch, code in (("gfx942:xnack+", GFX942_XNACK_ON), ("gfx942:xnack-", GFX942_XNACK_OFF)):
        name = f"blas_lib_{arch}.kpack"
        archive = kpack_archive([(f"{BUILD_PREFIX}/lib/libxn.so", arch, code)], family=arch)
        (tree / ".kpack" / name).write_bytes(archive)
        files[arch] = {"file": name, "size": len(archive), "kernel_count": 1}
    (tree / ".kpack/blas_lib.kpm").write_bytes(
        msgpack.packb({"format_version": 1, "component_name": "blas_lib", "prefix": BUILD_PREFIX, "kpack_files": files})
    )
    return library


def test_archives_named_for_a_target_id_with_features_are_per_arch_units(tmp_path, run_cli):
    site = tmp_path / "site"
    library = _split_with_features(site)
    kpack_dir = site / "_rocm_sdk_libraries/.kpack"
    for target in ("gfx942", "gfx942:xnack+", "gfx942:xnack-"):
        carrier = _carrier(verify.verify_arch([str(site)], [target], environ={}), library)
        assert carrier["missing"] == [], target
    # keeping xnack+ lets the xnack- archive go (an xnack+ device never opens it), and the reverse;
    # a bare gfx942 keeps both settings
    for kept, gone in (("gfx942:xnack+", "gfx942:xnack-"), ("gfx942:xnack-", "gfx942:xnack+"), ("gfx942", None)):
        report = run_cli("prune", kept, "-p", str(site), "--dry-run", "--format", "json", expect=0).report
        removals = [r["path"] for r in report["prune"]["removals"]]
        assert removals == ([str(kpack_dir / f"blas_lib_{gone}.kpack")] if gone else []), kept
        weighed = {r["target"] for r in report["prune"]["weight"]}
        assert {"gfx942:xnack+", "gfx942:xnack-"} <= weighed, weighed


def test_a_corrupt_manifest_is_a_finding_naming_the_manifest_and_offset(tmp_path):
    library = _older_flow(tmp_path / "site")
    manifest = tmp_path / "site/_rocm_sdk_libraries/.kpack/blas_lib.kpm"
    manifest.write_bytes(b"\xc1" * 12)  # 0xc1 is never valid MessagePack
    outcome = verify.verify_arch([str(tmp_path / "site")], ["gfx942"], environ={})
    (broken,) = [f for f in outcome.findings if f.rule == "ARCH004"]
    assert broken.path == str(manifest) and "at file offset 0x0" in broken.message, broken
    assert "MessagePack" in broken.message
    assert ("ARCH001", str(library)) in {(f.rule, f.path) for f in outcome.findings}


def test_a_kernel_under_an_arch_gfx_arches_lacks_is_never_selected(tmp_path):
    """The kpack runtime indexes an archive by its gfx_arches and looks a kernel up only under an
    arch found there: a gfx942 entry of an archive whose list says gfx90a is never loaded."""
    library = _older_flow(tmp_path / "site")
    archive_path = tmp_path / "site/_rocm_sdk_libraries/.kpack/blas_lib_gfx942.kpack"
    data = bytearray(archive_path.read_bytes())
    (toc_offset,) = struct.unpack_from("<Q", data, 8)
    toc = msgpack.unpackb(bytes(data[toc_offset:]))
    toc["gfx_arches"] = ["gfx90a"]
    archive_path.write_bytes(bytes(data[:toc_offset]) + msgpack.packb(toc))
    outcome = verify.verify_arch([str(tmp_path / "site")], ["gfx942"], environ={})
    assert _carrier(outcome, library)["missing"] == ["gfx942"]
    hidden = [f for f in outcome.findings if f.rule == "ARCH004" and f.path == str(archive_path)]
    assert hidden and f"at file offset {toc_offset:#x}" in hidden[0].message, outcome.findings
    assert f"{BUILD_PREFIX}/{BUILD_RELPATH}@gfx942" in hidden[0].message


def test_a_library_of_another_prefix_of_the_artifact_is_found_under_its_own_prefix(tmp_path):
    """rocm-kpack's splitter on an artifact with two prefixes (rocBLAS and hipBLAS stage dirs): one
    archive per arch keyed by each library's own prefix, but one .kpm per prefix; the wheel's flat
    tree keeps one .kpm, whose prefix is the other library's."""
    site = tmp_path / "site"
    tree = site / "_rocm_sdk_libraries"
    rocblas = _kpackd_library(tree / "lib/librocblas.so.5", ["../.kpack/blas_lib.kpm"], "blas_lib")
    hipblas = _kpackd_library(tree / "lib/libhipblas.so.2", ["../.kpack/blas_lib.kpm"], "blas_lib")
    (tree / ".kpack").mkdir()
    files = {}
    for arch, code in (("gfx942", GFX942_ANY), ("gfx90a", GFX90A_ANY)):
        kernels = [
            (f"{BUILD_PREFIX}/{BUILD_RELPATH}", arch, code),
            ("math-libs/BLAS/hipBLAS/stage/lib/libhipblas.so.2.0", arch, code),
        ]
        (tree / f".kpack/blas_lib_{arch}.kpack").write_bytes(kpack_archive(kernels, family=arch))
        files[arch] = {"file": f"blas_lib_{arch}.kpack", "size": 0, "kernel_count": 2}
    (tree / ".kpack/blas_lib.kpm").write_bytes(
        msgpack.packb({"format_version": 1, "component_name": "blas_lib", "prefix": BUILD_PREFIX, "kpack_files": files})
    )
    outcome = verify.verify_arch([str(site)], ["gfx942", "gfx90a"], environ={})
    for library in (rocblas, hipblas):
        carrier = _carrier(outcome, library)
        assert carrier["missing"] == [] and carrier["targets"] == ["gfx90a", "gfx942"], library
    assert not [f for f in outcome.findings if f.rule.startswith("ARCH")], outcome.findings


def test_the_reference_is_read_as_the_runtime_reads_it(tmp_path):
    """The runtime unpacks the first MessagePack object at the section start and ignores what
    follows; search-path entries that are not strings are skipped. An empty list is malformed."""
    from rocm_audit.errors import FormatError
    from rocm_audit.formats import kpack

    marker = msgpack.packb({"kpack_search_paths": [7, "../.kpack/blas_lib.kpm"], "kernel_name": "blas_lib"})
    ref = kpack.parse_kpack_ref(marker + b"\x01\xc1 trailing bytes", 0x7000)
    assert ref.search_paths == ("../.kpack/blas_lib.kpm",) and ref.kernel_name == "blas_lib"
    big = kpack.parse_kpack_ref(marker + bytes(100_000), 0x7000)  # a section padded past 64 KiB
    assert big.kernel_name == "blas_lib"
    for broken in (msgpack.packb({"kpack_search_paths": [], "kernel_name": "x"}), marker[:-3], b"\xc1"):
        with pytest.raises(FormatError) as caught:
            kpack.parse_kpack_ref(broken, 0x7000)
        assert caught.value.offset == 0x7000


GFX950_ANY = amdgpu_header(0x54F)


def test_an_archive_is_opened_only_for_the_arch_its_name_gives_gfxarch(tmp_path):
    """Newer flow: the runtime puts the device's arch, its generic family and their feature subsets
    for @GFXARCH@, and selects kernels under those names: a gfx950 kernel in the gfx942 archive
    and anything in a family-named archive (gfx94X) are never loaded; a gfx942 kernel in the
    gfx9-4-generic archive is, on a gfx942."""
    tree = tmp_path / "site/_rocm_sdk_libraries"
    library = _kpackd_library(tree / "lib/librocblas.so.5", ["../.kpack/blas_lib_@GFXARCH@.kpack"], BUILD_RELPATH)
    (tree / ".kpack").mkdir()
    key = f"{BUILD_RELPATH}#0"
    layout = {
        "gfx942": [(key, "gfx950", GFX950_ANY)],
        "gfx94X": [(key, "gfx90a", GFX90A_ANY)],
        "gfx9-4-generic": [(key, "gfx942", GFX942_ANY)],
    }
    for named, kernels in layout.items():
        (tree / f".kpack/blas_lib_{named}.kpack").write_bytes(kpack_archive(kernels))
    outcome = verify.verify_arch([str(tmp_path / "site")], ["gfx942", "gfx950", "gfx90a"], environ={})
    carrier = _carrier(outcome, library)
    assert sorted(carrier["missing"]) == ["gfx90a", "gfx950"] and carrier["targets"] == ["gfx942"], carrier
    stray = {f.path for f in outcome.findings if f.rule == "ARCH004"}
    assert stray == {str(tree / ".kpack/blas_lib_gfx942.kpack"), str(tree / ".kpack/blas_lib_gfx94X.kpack")}


def test_which_archive_names_a_device_opens_for_which_kernel_arch():
    from rocm_audit.gpu.kpack import opened_for_its_arch

    opened = [
        ("gfx942", "gfx942:xnack+"),
        ("gfx9-4-generic", "gfx950"),
        ("gfx9-4-generic:sramecc+", "gfx942:xnack-"),
        ("gfx1250-strict", "gfx1250-strict"),
        ("gfx12-5-generic", "gfx1250"),
    ]
    never = [
        ("gfx942:xnack-", "gfx942:xnack+"),
        ("gfx1100:xnack+", "gfx1100"),
        ("gfx94X", "gfx942"),
        ("gfx942", "gfx950"),
        ("gfx1250", "gfx1250-strict"),
        ("gfx12-5-generic", "gfx1250-strict"),
    ]
    assert all(opened_for_its_arch(*pair) for pair in opened)
    assert not any(opened_for_its_arch(*pair) for pair in never)


def test_through_gfxarch_only_indexed_keys_are_looked_up(tmp_path):
    """The runtime that expands @GFXARCH@ looks up "<kernel_name>#<co_index>" only: a bare key is
    never found there (the library is ARCH005 + ARCH001), while a direct path keeps both spellings."""
    tree = tmp_path / "site/_rocm_sdk_libraries"
    library = _kpackd_library(tree / "lib/librocblas.so.5", ["../.kpack/blas_lib_@GFXARCH@.kpack"], BUILD_RELPATH)
    (tree / ".kpack").mkdir()
    (tree / ".kpack/blas_lib_gfx942.kpack").write_bytes(kpack_archive([(BUILD_RELPATH, "gfx942", GFX942_ANY)]))
    outcome = verify.verify_arch([str(tmp_path / "site")], ["gfx942"], environ={})
    assert _carrier(outcome, library)["missing"] == ["gfx942"]
    assert {"ARCH001", "ARCH005"} <= {f.rule for f in outcome.findings if f.path == str(library)}
    direct = _kpackd_library(tree / "lib/libdirect.so", ["../.kpack/blas_lib_gfx942.kpack"], BUILD_RELPATH)
    outcome = verify.verify_arch([str(direct)], ["gfx942"], environ={})
    assert _carrier(outcome, direct)["missing"] == []


def test_a_strict_stepping_archive_serves_its_own_device(tmp_path):
    """rocm-kpack names archives for the arch as the device reports it, gfx1250-strict included
    (artifact_splitter keeps the suffix; the loader puts the agent's ISA name for @GFXARCH@): such
    an archive is listed and serves gfx1250-strict, and the gfx1250 one serves gfx1250 only."""
    tree = tmp_path / "site/_rocm_sdk_libraries"
    library = _kpackd_library(tree / "lib/librocblas.so.5", ["../.kpack/blas_lib_@GFXARCH@.kpack"], BUILD_RELPATH)
    (tree / ".kpack").mkdir()
    key = f"{BUILD_RELPATH}#0"
    for named, e_flags in (("gfx1250", 0x049), ("gfx1250-strict", 0x0EB)):
        (tree / f".kpack/blas_lib_{named}.kpack").write_bytes(kpack_archive([(key, named, amdgpu_header(e_flags))]))
    outcome = verify.verify_arch([str(tmp_path / "site")], ["gfx1250", "gfx1250-strict"], environ={})
    carrier = _carrier(outcome, library)
    assert carrier["missing"] == [] and sorted(carrier["targets"]) == ["gfx1250", "gfx1250-strict"], carrier
    assert not [f for f in outcome.findings if f.rule in ("ARCH003", "ARCH004", "ARCH005")], outcome.findings
    (tree / ".kpack/blas_lib_gfx1250-strict.kpack").unlink()
    outcome = verify.verify_arch([str(tmp_path / "site")], ["gfx1250-strict"], environ={})
    assert _carrier(outcome, library)["missing"] == ["gfx1250-strict"]


def test_a_spirv_kernel_in_an_archive_serves_no_device(tmp_path):
    """CLR asks kpack for the device's own name and its generic only (hip_fatbin.cpp
    ExtractKpackBinary; upstream leaves SPIR-V for later): where a bundle's SPIR-V entry is a warning
    (ARCH002, compiled at load), a kpack'd library with only a SPIR-V kernel has no code (ARCH001)."""
    tree = tmp_path / "site" / "_rocm_sdk_libraries"
    library = _kpackd_library(tree / "lib/librocblas.so.5", ["../.kpack/blas_lib.kpm"], "blas_lib")
    (tree / ".kpack").mkdir()
    spirv = struct.pack("<5I", 0x07230203, 0x00010600, 0, 64, 0)
    key = f"{BUILD_PREFIX}/{BUILD_RELPATH}"
    (tree / ".kpack/blas_lib_amdgcnspirv.kpack").write_bytes(
        kpack_archive([(key, "amdgcnspirv", spirv)], family="amdgcnspirv")
    )
    files = {"amdgcnspirv": {"file": "blas_lib_amdgcnspirv.kpack", "size": 0, "kernel_count": 1}}
    (tree / ".kpack/blas_lib.kpm").write_bytes(
        msgpack.packb({"format_version": 1, "component_name": "blas_lib", "prefix": BUILD_PREFIX, "kpack_files": files})
    )
    outcome = verify.verify_arch([str(tmp_path / "site")], ["gfx942"], environ={})
    carrier = _carrier(outcome, library)
    assert carrier["missing"] == ["gfx942"], carrier
    rules = {f.rule for f in outcome.findings if f.path == str(library)}
    assert "ARCH001" in rules and "ARCH002" not in rules, outcome.findings
