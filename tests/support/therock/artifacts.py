"""TheRock-shaped build artifacts of tiny real files, compiled at test time (gcc, g++, clang-19).

An artifact is TheRock's ``<name>_<component>_<target_family>`` unit (build_tools/_therock_utils/artifacts.py):
a stage prefix such as ``math-libs/BLAS/rocBLAS/stage`` whose files are addressed by their relpath inside the
prefix (``lib/librocblas.so.5.0.0``). Libraries are versioned files with SONAME symlinks, as CMake installs them.
The kpack-split artifacts are already in the shape rocm-kpack's ArtifactSplitter leaves them [kpack-old:
python/rocm_kpack/artifact_splitter.py]: a host library whose ``.hipFatBinSegment`` wrapper has HIPK magic and
points at a ``.rocm_kpack_ref`` section, an empty (NOBITS) ``.hip_fatbin``, a ``.kpack/<artifact>.kpm`` manifest in
the generic artifact and one ``.kpack/<artifact>_<arch>.kpack`` per arch.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import struct
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import msgpack

from support.run import run_checked

# Debian's LLVM 15: libLLVM-15.so.1 (libllvm15) and the cl::opt headers (llvm-15-dev, tests/apt-packages.txt).
LLVM15_LIB_DIR = Path("/usr/lib/llvm-15/lib")
LLVM15_INCLUDE_DIR = Path("/usr/lib/llvm-15/include")

HIPK_MAGIC = 0x4B504948  # "HIPK" little-endian [formats.md 1.7; rocm-kpack elf_offload_kpacker.py]
KPACK_HEADER = "<4sIQ"  # magic, version, toc_offset [kpack-old: python/rocm_kpack/kpack.py]


@dataclass
class Artifact:
    """One build artifact: ``name_component_family`` plus the stage prefix its files live under."""

    name: str
    component: str
    target_family: str  # "generic" or a gfx arch
    prefix: str
    root: Path  # <artifacts dir>/<name>_<component>_<family>/<prefix>

    @property
    def full_name(self) -> str:
        return f"{self.name}_{self.component}_{self.target_family}"


@dataclass
class ArtifactTree:
    """All artifacts of one fake TheRock build, plus what the packager needs to know about them."""

    directory: Path
    arches: tuple[str, ...]
    artifacts: list[Artifact] = field(default_factory=list)

    def add(self, name: str, component: str, family: str, prefix: str) -> Artifact:
        root = self.directory / f"{name}_{component}_{family}" / prefix
        root.mkdir(parents=True, exist_ok=True)
        artifact = Artifact(name, component, family, prefix, root)
        self.artifacts.append(artifact)
        return artifact

    def write_manifests(self) -> None:
        """``artifact_manifest.txt`` per artifact dir, one stage prefix a line (what ArtifactCatalog reads)."""
        prefixes: dict[str, list[str]] = {}
        for artifact in self.artifacts:
            prefixes.setdefault(artifact.full_name, [])
            if artifact.prefix not in prefixes[artifact.full_name]:
                prefixes[artifact.full_name].append(artifact.prefix)
        for full_name, names in prefixes.items():
            (self.directory / full_name / "artifact_manifest.txt").write_text("".join(f"{n}\n" for n in names))


def _versioned_library(
    lib_dir: Path,
    stem: str,
    version: str,
    soname_version: str,
    source: str,
    *,
    cxx: bool = False,
    needed_dirs: tuple[Path, ...] = (),
    needed: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
) -> Path:
    """``lib<stem>.so.<version>`` with SONAME ``lib<stem>.so.<soname_version>`` and the two alias symlinks."""
    lib_dir.mkdir(parents=True, exist_ok=True)
    real_name = f"lib{stem}.so.{version}"
    soname = f"lib{stem}.so.{soname_version}"
    source_path = lib_dir / f".{stem}.{'cpp' if cxx else 'c'}"
    source_path.write_text(source)
    compiler = "g++" if cxx else "gcc"
    # CMake-installed ROCm libraries carry DT_RPATH $ORIGIN; py_packaging appends to it.
    argv = [
        compiler,
        "-shared",
        "-fPIC",
        "-O1",
        "-o",
        str(lib_dir / real_name),
        str(source_path),
        f"-Wl,-soname,{soname}",
        "-Wl,--disable-new-dtags,-rpath,$ORIGIN",
        *extra,
    ]
    argv += [f"-L{d}" for d in needed_dirs] + ["-Wl,--no-as-needed"] + [f"-l:{n}" for n in needed]
    run_checked(argv)
    source_path.unlink()
    (lib_dir / soname).symlink_to(real_name)
    (lib_dir / f"lib{stem}.so").symlink_to(soname)
    return lib_dir / real_name


def _executable(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    source_path = path.parent / f".{path.name}.c"
    source_path.write_text(source)
    run_checked(["gcc", "-O1", "-fPIE", "-pie", "-o", str(path), str(source_path)])
    source_path.unlink()
    return path


def amdgpu_code_object(directory: Path, arch: str, name: str, value: int) -> Path:
    """A real linked AMDGPU code object (clang-19 + ld.lld-19)."""
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / f".{name}.c"
    source.write_text(f"void k_{value}(int *p) {{ *p = {value}; }}\n")
    obj = directory / f".{name}.o"
    run_checked(
        [
            "clang-19",
            "-target",
            "amdgcn-amd-amdhsa",
            f"-mcpu={arch}",
            "-nogpulib",
            "-O1",
            "-c",
            "-o",
            str(obj),
            str(source),
        ]
    )
    output = directory / name
    run_checked(["ld.lld-19", "-shared", "-o", str(output), str(obj)])
    source.unlink()
    obj.unlink()
    return output


COMGR_SOURCE = """
// A comgr stand-in that registers a real LLVM command-line option into libLLVM-15's registry, as comgr 10.0.0's
// SPIR-V translator options did (TheRock #7818). Two inodes of this file in one process abort in LLVM.
#include "llvm/Support/CommandLine.h"
static llvm::cl::opt<bool> SpirvExpandStep("spirv-expand-step", llvm::cl::desc("fixture option"),
                                           llvm::cl::init(false));
extern "C" int amd_comgr_get_version(int *major, int *minor) { *major = 3; *minor = SpirvExpandStep ? 1 : 0;
  return 0; }
"""

PLAIN_LIBRARY_SOURCE = "int {symbol}(void) {{ return {value}; }}\n"

CLANG_SOURCE = """
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) { char self[4096]; ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  self[n < 0 ? 0 : n] = 0; printf("fixture clang %s\\n", self); return 0; }
"""


def kpack_ref_asm(search_paths: list[str], kernel_name: str, fatbin_size: int) -> str:
    """Top-level asm giving a host library the post-split kpack shape.

    ``.rocm_kpack_ref`` = MessagePack ``{kpack_search_paths, kernel_name}`` [kpack-old: binutils.py
    add_kpack_ref_marker], mapped read-only (an alloc section, so the linker puts it in a PT_LOAD);
    ``.hipFatBinSegment`` = the 24-byte ``__CudaFatBinaryWrapper`` {magic HIPK, version 1, pointer, reserved 0} whose
    pointer is an ``R_X86_64_RELATIVE`` to the reference [kpack-old: elf_offload_kpacker.py]; ``.hip_fatbin`` NOBITS
    (what kpack-old's verify_artifacts.py expects).
    """
    marker = msgpack.packb({"kpack_search_paths": search_paths, "kernel_name": kernel_name})
    marker_bytes = ",".join(str(b) for b in marker)
    return (
        '__asm__(".section .rocm_kpack_ref,\\"a\\"\\n"\n'
        f'        "__rocm_kpack_ref_start: .byte {marker_bytes}\\n"\n'
        '        ".section .hipFatBinSegment,\\"aw\\"\\n.balign 8\\n"\n'
        f'        ".long {HIPK_MAGIC}\\n.long 1\\n.quad __rocm_kpack_ref_start\\n.quad 0\\n"\n'
        '        ".section .hip_fatbin,\\"a\\",@nobits\\n.balign 4096\\n"\n'
        f'        ".skip {fatbin_size}\\n.text\\n");\n'
    )


def kpack_archive(group_name: str, arch: str, kernels: list[tuple[str, bytes]], prefix: str) -> bytes:
    """A ``.kpack`` as rocm-kpack's PackedKernelArchive writes it: header, pad to 64, blobs, msgpack TOC to EOF.

    TOC keys are ``<source prefix>/<relpath of the binary in its prefix>`` [observed in a kpack-old split; kpack-old
    artifact_splitter.py], each ``{arch: {type, ordinal, original_size, metadata: {target, source_prefix}}}``.
    """
    out = bytearray(64)
    blobs, toc = [], {}
    for ordinal, (key, data) in enumerate(kernels):
        blobs.append({"offset": len(out), "size": len(data)})
        out += data
        toc[key] = {
            arch: {
                "type": "hsaco",
                "ordinal": ordinal,
                "original_size": len(data),
                "metadata": {"target": f"hipv4-amdgcn-amd-amdhsa--{arch}", "source_prefix": prefix},
            }
        }
    toc_offset = len(out)
    out += msgpack.packb(
        {
            "format_version": 1,
            "group_name": group_name,
            "gfx_arch_family": arch,
            "gfx_arches": [arch],
            "toc": toc,
            "compression_scheme": "none",
            "blobs": blobs,
        }
    )
    out[:16] = struct.pack(KPACK_HEADER, b"KPAK", 1, toc_offset)
    return bytes(out)


def _kdb(path: Path, arch: str) -> None:
    """MIOpen kernel DBs are SQLite files; a tiny real one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE kern_db (id INTEGER PRIMARY KEY, kernel_name TEXT, kernel_blob BLOB)")
        db.execute("INSERT INTO kern_db (kernel_name, kernel_blob) VALUES (?, ?)", (f"conv_{arch}", arch.encode()))
    db.close()


def build_artifacts(
    directory: Path, arches: tuple[str, ...] = ("gfx90a", "gfx942"), *, kpack: bool = True, kpack_flow: str = "kpm"
) -> ArtifactTree:
    """Compile and lay out the artifacts of a small kpack-split TheRock build under ``directory``.

    ``kpack_flow`` picks the splitter whose output the kpack'd rocBLAS has: ``"kpm"`` (stellaraccident/rocm-kpack
    ae4f1c2: the reference names ``../.kpack/blas_lib.kpm``, TOC keys without an index) or ``"gfxarch"`` (the
    splitter TheRock builds from rocm-systems shared/kpack, artifact_splitter.py compute_kpack_search_pattern /
    process_fat_binaries / inject_kpack_references: the reference names ``<'../' per directory of the binary in its
    prefix>.kpack/<artifact>_@GFXARCH@.kpack`` and ``kernel_name = <prefix>/<build relpath>``, TOC keys append
    ``#<code object index>``, and no ``.kpm`` is written).
    """
    if kpack_flow not in ("kpm", "gfxarch"):
        raise ValueError(f"unknown kpack flow {kpack_flow!r}")
    if directory.exists():
        shutil.rmtree(directory)
    tree = ArtifactTree(directory, arches)

    # --- core: runtime, comgr, kpack runtime, sysdeps, host math, LLVM ---
    # comgr belongs to the amd-llvm artifact under its own stage prefix (compiler/artifact-amd-llvm.toml).
    comgr = tree.add("amd-llvm", "lib", "generic", "compiler/amd-comgr/stage")
    _versioned_library(
        comgr.root / "lib",
        "amd_comgr",
        "3.0.0",
        "3",
        COMGR_SOURCE,
        cxx=True,
        needed_dirs=(LLVM15_LIB_DIR,),
        needed=("libLLVM-15.so",),
        extra=(f"-I{LLVM15_INCLUDE_DIR}", "-std=c++17", "-O0"),
    )
    clr = tree.add("core-hip", "lib", "generic", "core/clr/stage")
    # libamdhip64 has DT_NEEDED libamd_comgr.so.3, found through $ORIGIN at run time, as upstream.
    _versioned_library(
        clr.root / "lib",
        "amdhip64",
        "7.1.0",
        "7",
        PLAIN_LIBRARY_SOURCE.format(symbol="hipRuntimeGetVersion", value=70100),
        needed_dirs=(comgr.root / "lib",),
        needed=("libamd_comgr.so.3",),
    )
    _versioned_library(
        clr.root / "lib", "hiprtc", "7.1.0", "7", PLAIN_LIBRARY_SOURCE.format(symbol="hiprtcVersion", value=70100)
    )
    kpack_rt = tree.add("core-kpack", "lib", "generic", "core/rocm-kpack/stage")  # core/artifact-core-kpack.toml
    _versioned_library(
        kpack_rt.root / "lib", "rocm_kpack", "0.1.0", "0", PLAIN_LIBRARY_SOURCE.format(symbol="kpack_open", value=1)
    )
    sysdeps = tree.add("sysdeps", "lib", "generic", "third-party/sysdeps/linux/xz/stage")
    _versioned_library(
        sysdeps.root / "lib/rocm_sysdeps/lib",
        "rocm_sysdeps_liblzma",
        "5.4.5",
        "5",
        PLAIN_LIBRARY_SOURCE.format(symbol="lzma_version_number", value=50040052),
    )
    host_math = tree.add("host-blas", "lib", "generic", "third-party/host-blas/stage")
    _versioned_library(
        host_math.root / "lib/host-math/lib",
        "rocm-openblas",
        "0.3.28",
        "0",
        PLAIN_LIBRARY_SOURCE.format(symbol="openblas_get_parallel", value=1),
    )
    llvm = tree.add("amd-llvm", "run", "generic", "compiler/amd-llvm/stage")
    _executable(llvm.root / "lib/llvm/bin/clang", CLANG_SOURCE)
    (llvm.root / "lib/llvm/bin/clang++").symlink_to("clang")
    (llvm.root / "bin").mkdir()
    # The seven LLVM wrappers _devel.py keeps as symlinks; in runtime wheels they become exec stubs.
    for wrapper in ("amdclang", "amdclang++", "amdclang-cl", "amdclang-cpp", "amdflang", "amdlld", "amdllvm"):
        (llvm.root / "bin" / wrapper).symlink_to("../lib/llvm/bin/clang")
    (llvm.root / "llvm").symlink_to("lib/llvm")  # root compatibility dir symlink (devel_test)
    # base/aux-overlay installs dist_info.json and therock_manifest.json (whose KPACK_SPLIT_ARTIFACTS flag
    # build_python_packages.py reads from base_lib_generic).
    base = tree.add("base", "lib", "generic", "base/aux-overlay/stage")
    (base.root / "share/therock").mkdir(parents=True)
    (base.root / "share/therock/dist_info.json").write_text(
        json.dumps({"dist_amdgpu_targets": ";".join(arches), "dist_amdgpu_families": ";".join(arches)}) + "\n"
    )
    (base.root / "share/therock/therock_manifest.json").write_text(
        json.dumps({"flags": {"KPACK_SPLIT_ARTIFACTS": kpack}}) + "\n"
    )
    # build_python_packages.py refuses a Linux build without profiler artifacts (the rocm-profiler wheel).
    profiler = tree.add("rocprofiler-compute", "lib", "generic", "profiler/rocprofiler-compute/stage")
    launcher = profiler.root / "libexec/rocprofiler-compute/rocprof-compute"
    launcher.parent.mkdir(parents=True)
    launcher.write_text("#!/bin/sh\necho rocprof-compute\n")
    launcher.chmod(0o755)
    (profiler.root / "bin").mkdir()
    (profiler.root / "bin/rocprof-compute").symlink_to("../libexec/rocprofiler-compute/rocprof-compute")
    hip_dev = tree.add("core-hip", "dev", "generic", "core/clr/stage")
    (hip_dev.root / "include/hip").mkdir(parents=True)
    (hip_dev.root / "include/hip/hip_runtime.h").write_text("#pragma once\n#define HIP_VERSION 70100\n")
    (hip_dev.root / "lib/cmake/hip").mkdir(parents=True)
    (hip_dev.root / "lib/cmake/hip/hip-config.cmake").write_text("set(HIP_FOUND TRUE)\n")

    # --- libraries: arch-neutral host libraries (rocBLAS kpack'd), per-arch device files ---
    blas_prefix = "math-libs/BLAS/rocBLAS/stage"
    blas = tree.add("blas", "lib", "generic", blas_prefix)
    rocblas_relpath = "lib/librocblas.so.5.0.0"
    code_objects = {
        arch: amdgpu_code_object(directory / ".device" / arch, arch, "kernel.hsaco", i + 1)
        for i, arch in enumerate(arches)
    }
    rocblas_source = PLAIN_LIBRARY_SOURCE.format(symbol="rocblas_get_version", value=5)
    if kpack and kpack_flow == "gfxarch":
        up = "../" * (len(PurePosixPath(rocblas_relpath).parts) - 1)
        rocblas_source += kpack_ref_asm(
            [f"{up}.kpack/blas_lib_@GFXARCH@.kpack"], f"{blas_prefix}/{rocblas_relpath}", 16384
        )
    elif kpack:
        # kpack-old: the reference names the generic .kpm (relative to the binary) and the component, not a path.
        rocblas_source += kpack_ref_asm(["../.kpack/blas_lib.kpm"], "blas_lib", 16384)
    _versioned_library(
        blas.root / "lib",
        "rocblas",
        "5.0.0",
        "5",
        rocblas_source,
        needed_dirs=(clr.root / "lib",),
        needed=("libamdhip64.so.7",),
    )
    (blas.root / "lib/rocblas/library").mkdir(parents=True)
    (blas.root / "lib/rocblas/library/TensileLibrary_lazy_fallback.dat").write_bytes(msgpack.packb({"fallback": True}))
    hipblas = tree.add("blas", "lib", "generic", "math-libs/BLAS/hipBLAS/stage")
    _versioned_library(
        hipblas.root / "lib",
        "hipblas",
        "3.0.0",
        "3",
        PLAIN_LIBRARY_SOURCE.format(symbol="hipblasGetVersion", value=3),
        needed_dirs=(blas.root / "lib", clr.root / "lib"),
        needed=("librocblas.so.5", "libamdhip64.so.7"),
    )
    miopen = tree.add("miopen", "lib", "generic", "ml-libs/MIOpen/stage")
    _versioned_library(
        miopen.root / "lib",
        "MIOpen",
        "1.0.0",
        "1",
        PLAIN_LIBRARY_SOURCE.format(symbol="miopenGetVersion", value=1),
        needed_dirs=(clr.root / "lib",),
        needed=("libamdhip64.so.7",),
    )

    kpack_files: dict[str, dict[str, object]] = {}
    for arch in arches:
        device_blas = tree.add("blas", "lib", arch, blas_prefix)
        library_dir = device_blas.root / "lib/rocblas/library"
        library_dir.mkdir(parents=True)
        shutil.copyfile(code_objects[arch], library_dir / f"TensileLibrary_{arch}.co")
        shutil.copyfile(code_objects[arch], library_dir / f"Kernels.so-000-{arch}.hsaco")
        (library_dir / f"TensileLibrary_lazy_{arch}.dat").write_bytes(msgpack.packb({"arch": arch}))
        if kpack:
            # rocBLAS is one TU: code object index 0 (the index the HIPK wrapper's reserved1 carries).
            key = f"{blas_prefix}/{rocblas_relpath}" + ("#0" if kpack_flow == "gfxarch" else "")
            archive = kpack_archive("blas_lib", arch, [(key, code_objects[arch].read_bytes())], blas_prefix)
            (device_blas.root / ".kpack").mkdir()
            (device_blas.root / f".kpack/blas_lib_{arch}.kpack").write_bytes(archive)
            kpack_files[arch] = {"file": f"blas_lib_{arch}.kpack", "size": len(archive), "kernel_count": 1}
        device_miopen = tree.add("miopen", "lib", arch, "ml-libs/MIOpen/stage")
        _versioned_library(
            device_miopen.root / "lib",
            f"MIOpenCKGroupedConv_{arch}",
            "1.0.0",
            "1",
            PLAIN_LIBRARY_SOURCE.format(symbol=f"ck_grouped_conv_{arch}", value=1),
            needed_dirs=(clr.root / "lib",),
            needed=("libamdhip64.so.7",),
        )
        # MIOpen's per-arch plugin ships as a plain libFoo_gfxNNN.so: keep only that name.
        lib_dir = device_miopen.root / "lib"
        for alias in (f"libMIOpenCKGroupedConv_{arch}.so", f"libMIOpenCKGroupedConv_{arch}.so.1"):
            (lib_dir / alias).unlink()
        real = lib_dir / f"libMIOpenCKGroupedConv_{arch}.so.1.0.0"
        run_checked(["patchelf", "--set-soname", f"libMIOpenCKGroupedConv_{arch}.so", str(real)])
        real.rename(lib_dir / f"libMIOpenCKGroupedConv_{arch}.so")
        _kdb(device_miopen.root / f"share/miopen/db/{arch}130.kdb", arch)
        (device_miopen.root / f"share/miopen/db/{arch}130.HIP.fdb.txt").write_text(
            f"1-1-1-1x1-1-1-1-fixture-{arch}=ConvDirectNaiveConvFwd:0.1,1\n"
        )
    if kpack and kpack_flow == "kpm":
        (blas.root / ".kpack").mkdir()
        (blas.root / ".kpack/blas_lib.kpm").write_bytes(
            msgpack.packb(
                {"format_version": 1, "component_name": "blas_lib", "prefix": blas_prefix, "kpack_files": kpack_files}
            )
        )
    shutil.rmtree(directory / ".device")
    tree.write_manifests()
    return tree
