"""Fixtures for verify-arch / scan --targets: real HIP libraries built once per session.

Toolchains: Debian clang-19 (clang++-19), lld-19 (ld.lld-19), clang-tools-19
(clang-offload-bundler-19), llvm-19 (llvm-objcopy-19); PyPI llvmlite (LLVM 22: gfx950 and
gfx9-4-generic code objects, newer than clang-19 knows). The vendor wheel jax-rocm7-plugin 0.12.0 is
downloaded once and pinned by sha256.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

from support.run import run_checked
from support.tools import require_tool
from support.vendor import bitsandbytes_wheel, jax_plugin_wheel

HIP_TU_1 = """\
// Own minimal HIP translation unit: no ROCm headers, only what clang's host stub needs.
struct dim3 { unsigned x, y, z; };
typedef struct ihipStream_t* hipStream_t;
extern "C" int hipLaunchKernel(const void*, dim3, dim3, void**, unsigned long, hipStream_t);
extern "C" __attribute__((global)) void %s(int* out) { *out = %d; }
"""

LLVM_IR = """\
target triple = "amdgcn-amd-amdhsa"
define amdgpu_kernel void @k(ptr addrspace(1) %p) {
  store i32 7, ptr addrspace(1) %p
  ret void
}
"""


HIP_FLAGS = ["-x", "hip", "-nogpulib", "-nogpuinc", "-no-hip-rt", "-fPIC"]


def _llvmlite_objects(out: Path, cpus: list[str]) -> None:
    """Compile one amdgpu_kernel per CPU with llvmlite in a child (its LLVM stays out of pytest)."""
    script = (
        "import sys, llvmlite.binding as llvm\n"
        "llvm.initialize_all_targets(); llvm.initialize_all_asmprinters()\n"
        f"ir = {LLVM_IR!r}\n"
        "for cpu in sys.argv[2:]:\n"
        "    target = llvm.Target.from_triple('amdgcn-amd-amdhsa')\n"
        "    tm = target.create_target_machine(cpu=cpu, opt=2, reloc='pic')\n"
        "    code = tm.emit_object(llvm.parse_assembly(ir))\n"
        "    open(f'{sys.argv[1]}/ll_{cpu}.o', 'wb').write(code)\n"
    )
    run_checked([sys.executable, "-c", script, str(out), *cpus], out)


@pytest.fixture(scope="session")
def tools() -> dict[str, str]:
    return {
        name: require_tool(name)
        for name in (
            "clang++-19",
            "clang-19",
            "ld.lld-19",
            "clang-offload-bundler-19",
            "llvm-objcopy-19",
            "llvm-readelf-19",
        )
    }


@pytest.fixture(scope="session")
def built(tmp_path_factory, tools) -> dict[str, Path]:
    """Every fixture binary, built once: name -> path."""
    out = tmp_path_factory.mktemp("arch-built")
    cxx = tools["clang++-19"]
    (out / "k1.hip").write_text(HIP_TU_1 % ("k1", 1))
    (out / "k2.hip").write_text(HIP_TU_1 % ("k2", 2))
    made: dict[str, Path] = {}

    def lib(name: str, *args: str, sources: tuple[str, ...] = ("k1.hip",)) -> None:
        run_checked([cxx, *HIP_FLAGS, "-shared", *args, *sources, "-o", name], out)
        made[name] = out / name

    lib("libplain.so", "--offload-arch=gfx942", "--offload-arch=gfx90a")
    lib("libccob.so", "--offload-arch=gfx942", "--offload-arch=gfx90a", "--offload-compress")
    lib(
        "librdc.so",
        "-fgpu-rdc",
        "--offload-arch=gfx942",
        "--offload-arch=gfx90a",
        sources=("k1.hip", "k2.hip"),
    )
    lib(
        "librdcc.so",
        "-fgpu-rdc",
        "--offload-compress",
        "--offload-arch=gfx942",
        sources=("k1.hip", "k2.hip"),
    )
    lib("libcov5.so", "-mcode-object-version=5", "--offload-arch=gfx942")
    lib(
        "libv6feat.so",
        "-mcode-object-version=6",
        "--offload-arch=gfx942:sramecc+:xnack-",
        "--offload-arch=gfx90a:xnack+",
        "--offload-arch=gfx9-generic",
        "--offload-arch=gfx1100",
    )
    lib("libxnackon.so", "--offload-arch=gfx942:xnack+")
    # Two translation units without -fgpu-rdc: two wrappers, two bundles; the second lacks gfx942.
    for compress, name in ((False, "libmulti.so"), (True, "libmultic.so")):
        extra = ["--offload-compress"] if compress else []
        run_checked(
            [
                cxx,
                *HIP_FLAGS,
                "-c",
                *extra,
                "--offload-arch=gfx942",
                "--offload-arch=gfx90a",
                "k1.hip",
                "-o",
                f"{name}.1.o",
            ],
            out,
        )
        run_checked(
            [cxx, *HIP_FLAGS, "-c", *extra, "--offload-arch=gfx90a", "k2.hip", "-o", f"{name}.2.o"],
            out,
        )
        run_checked([cxx, "-shared", f"{name}.1.o", f"{name}.2.o", "-o", name], out)
        made[name] = out / name
    # Relocatable object of the new offload driver: carries .llvm.offloading.
    run_checked(
        [
            cxx,
            "-x",
            "hip",
            "-nogpulib",
            "-nogpuinc",
            "-fPIC",
            "--offload-new-driver",
            "-fgpu-rdc",
            "-c",
            "--offload-arch=gfx942",
            "k1.hip",
            "-o",
            "knew.o",
        ],
        out,
    )
    made["knew.o"] = out / "knew.o"
    # Standalone raw code object from clang; gfx950 / gfx9-4-generic from llvmlite + ld.lld-19.
    run_checked(
        [
            cxx,
            "-x",
            "hip",
            "--offload-arch=gfx942",
            "-nogpulib",
            "-nogpuinc",
            "--cuda-device-only",
            "--no-gpu-bundle-output",
            "k1.hip",
            "-o",
            "k_gfx942.hsaco",
        ],
        out,
    )
    made["k_gfx942.hsaco"] = out / "k_gfx942.hsaco"
    _llvmlite_objects(out, ["gfx950", "gfx9-4-generic"])
    for cpu in ("gfx950", "gfx9-4-generic"):
        run_checked([tools["ld.lld-19"], "-shared", f"ll_{cpu}.o", "-o", f"ll_{cpu}.hsaco"], out)
        made[f"ll_{cpu}.hsaco"] = out / f"ll_{cpu}.hsaco"
    # Bundles made by clang-offload-bundler-19 (it writes the gfx950 id as "...--gfx950-"), then
    # embedded in a host library as its fat binary.
    bundler = tools["clang-offload-bundler-19"]
    specs = {
        "fat950": (["gfx942", "gfx950"], ["k_gfx942.hsaco", "ll_gfx950.hsaco"]),
        "fatgeneric": (["gfx9-4-generic"], ["ll_gfx9-4-generic.hsaco"]),
    }
    for stem, (arches, inputs) in specs.items():
        for compress in (False, True):
            name = f"{stem}{'c' if compress else ''}.hipfb"
            targets = ",".join(["host-x86_64-unknown-linux"] + [f"hipv4-amdgcn-amd-amdhsa--{a}" for a in arches])
            run_checked(
                [
                    bundler,
                    "-type=o",
                    "-bundle-align=4096",
                    *(["-compress"] if compress else []),
                    f"-targets={targets}",
                    "-input=/dev/null",
                    *[f"-input={i}" for i in inputs],
                    f"-output={name}",
                ],
                out,
            )
            made[name] = out / name
            lib_name = f"lib{stem}{'c' if compress else ''}.so"
            run_checked(
                [
                    cxx,
                    "-x",
                    "hip",
                    "--cuda-host-only",
                    "-Xclang",
                    "-fcuda-include-gpubinary",
                    "-Xclang",
                    name,
                    "-nogpulib",
                    "-nogpuinc",
                    "-no-hip-rt",
                    "-fPIC",
                    "-shared",
                    "k1.hip",
                    "-o",
                    lib_name,
                ],
                out,
            )
            made[lib_name] = out / lib_name
    # A host library that only contains the bundle magic as a string (like the HIP runtime).
    (out / "magic.c").write_text(
        'const char bundle_magic[] = "__CLANG_OFFLOAD_BUNDLE__";\nconst char *magic(void) { return bundle_magic; }\n'
    )
    run_checked([tools["clang-19"], "-fPIC", "-shared", "magic.c", "-o", "libmagic.so"], out)
    made["libmagic.so"] = out / "libmagic.so"
    # A runtime-like library with a raw gfx950 code object embedded in .rodata (no fat binary).
    (out / "embed.c").write_text(
        '__asm__(".section .rodata\\n.balign 256\\n.globl blob\\nblob:\\n"\n'
        '"  .incbin \\"ll_gfx950.hsaco\\"\\n.text\\n");\n'
        "extern const char blob[];\nconst char *get_blob(void) { return blob; }\n"
    )
    run_checked([tools["clang-19"], "-fPIC", "-shared", "embed.c", "-o", "libembedded.so"], out)
    made["libembedded.so"] = out / "libembedded.so"
    return made


# Ten GPUs, as a vendor build lists them: each TU's bundle inflates to about 7 MB, so its CCOB
# is read through the zstd index (payloads over 1 MiB), as real vendor bundles are.
MANY_ARCHES = ("gfx900", "gfx906", "gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx1030", "gfx1100", "gfx1200")
MANY_KERNEL = """\
extern "C" __attribute__((global)) void k%(n)d(float* a, const float* b, int n) {
  int t = __builtin_amdgcn_workitem_id_x();
  float acc = %(n)d.0f;
#pragma unroll 16
  for (int j = 0; j < n; ++j) acc = acc * b[(t + j * %(m)d) %% 1024] + a[j %% 512] * %(k)d.5f;
  a[t] = acc;
}
"""


@pytest.fixture(scope="session")
def many_arch_libs(tmp_path_factory, tools) -> Path:
    """Real clang++-19 --offload-compress libraries for ten GPUs: one TU of 200 kernels (CCOB v2,
    zstd, about 7 MB inflated from 56 KB)."""
    out = tmp_path_factory.mktemp("many-arch")
    source = HIP_TU_1 % ("k_base", 0) + "".join(MANY_KERNEL % {"n": n, "m": n + 1, "k": n % 7 + 1} for n in range(200))
    (out / "many.hip").write_text(source)
    arches = [f"--offload-arch={arch}" for arch in MANY_ARCHES]
    run_checked(
        [tools["clang++-19"], *HIP_FLAGS, "-shared", "--offload-compress", *arches, "many.hip", "-o", "libmanyc.so"],
        out,
    )
    (out / "many.hip").unlink()
    return out


@pytest.fixture(scope="session")
def jax_plugin(cache_dir) -> Path:
    """The real vendor wheel jax-rocm7-plugin 0.12.0 (CCOB v3, zstd, 27 targets), unpacked once."""
    wheel = jax_plugin_wheel(cache_dir)
    target = Path(cache_dir) / "jax_rocm7_plugin-0.12.0"
    if not (target / "jax_rocm7_plugin" / "_prng.so").exists():
        with zipfile.ZipFile(wheel) as archive:
            members = [m for m in archive.namelist() if m.startswith("jax_rocm7_plugin/") and m.endswith(".so")]
            archive.extractall(target, members)
    return target / "jax_rocm7_plugin"


# The ROCm 6.4 and 7.0 builds (CCOB v2), one 7.1+ build (v3) and one SYCL library.
BNB_LIBRARIES = ("rocm64", "rocm70", "rocm714", "xpu2026")


@pytest.fixture(scope="session")
def bitsandbytes_libs(cache_dir) -> Path:
    """Four libraries of the real bitsandbytes 0.50.2 wheel, unpacked once."""
    wheel = bitsandbytes_wheel(cache_dir)
    target = Path(cache_dir) / "bitsandbytes-0.50.2"
    members = [f"bitsandbytes/libbitsandbytes_{name}.so" for name in BNB_LIBRARIES]
    if not all((target / m).exists() for m in members):
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(target, members)
    return target / "bitsandbytes"


@pytest.fixture()
def sdk_tree(tmp_path) -> Path:
    """An empty TheRock-shaped site-packages dir."""
    for name in ("_rocm_sdk_core/lib", "_rocm_sdk_libraries/lib", "_rocm_sdk_core/share/therock"):
        (tmp_path / "site-packages" / name).mkdir(parents=True)
    return tmp_path / "site-packages"


# Device images a program loads itself with hipModuleLoadData: `hipcc --genco`-style device-only
# output (a bundle, or a CCOB with --offload-compress), pulled into .rodata with .incbin.
DEVICE_ONLY_FLAGS = ["-x", "hip", "-nogpulib", "-nogpuinc", "--cuda-device-only"]
EMBED_ASM = '\t.section .rodata\n{body}\t.section .note.GNU-stack,"",@progbits\n'


@pytest.fixture(scope="session")
def embedded_libs(tmp_path_factory, tools) -> dict[str, Path]:
    """Host libraries with device images in .rodata, built by clang++-19 / clang-19: name -> path."""
    out = tmp_path_factory.mktemp("arch-embedded")
    cxx, cc = tools["clang++-19"], tools["clang-19"]
    (out / "k1.hip").write_text(HIP_TU_1 % ("k1", 1))
    (out / "k3.hip").write_text(HIP_TU_1 % ("k3", 3))

    def device_only(name: str, arches: list[str], *extra: str) -> None:
        # hipcc --genco's output: device code only, as one bundle (a CCOB with --offload-compress)
        offload = [f"--offload-arch={a}" for a in arches]
        run_checked([cxx, *DEVICE_ONLY_FLAGS, "--gpu-bundle-output", *extra, *offload, "k3.hip", "-o", name], out)

    device_only("both.ccob", ["gfx942", "gfx90a"], "--offload-compress")
    device_only("both.hipfb", ["gfx942", "gfx90a"])
    device_only("only90a.hipfb", ["gfx90a"])
    # A CCOB whose header and zstd frame header are intact but whose first block is not.
    good = (out / "both.ccob").read_bytes()
    assert good[:4] == b"CCOB" and good[24:28] == b"\x28\xb5\x2f\xfd", good[:32]
    (out / "broken.ccob").write_bytes(good[:36] + b"\xa5" * 400 + good[436:])
    made: dict[str, Path] = {}

    def lib(name: str, images: list[str], *hip: str) -> None:
        body = "".join(f'\t.balign 4096\nimg{i}:\n\t.incbin "{image}"\n' for i, image in enumerate(images))
        (out / f"{name}.s").write_text(EMBED_ASM.format(body=body))
        run_checked([cc, "-c", f"{name}.s", "-o", f"{name}.o"], out)
        if hip:
            run_checked([cxx, *HIP_FLAGS, "-c", *hip, "k1.hip", "-o", f"{name}.hip.o"], out)
        objects = [f"{name}.o"] + ([f"{name}.hip.o"] if hip else [])
        run_checked([cxx, "-shared", *objects, "-o", name], out)
        made[name] = out / name

    lib("libembccob.so", ["both.ccob"])
    lib("libembplain.so", ["both.hipfb"])
    lib("libembfat.so", ["both.hipfb"], "--offload-arch=gfx942", "--offload-arch=gfx90a")
    lib("libembgap.so", ["only90a.hipfb"], "--offload-arch=gfx942", "--offload-arch=gfx90a")
    lib("libembbroken.so", ["broken.ccob", "both.hipfb", "only90a.hipfb"])
    # The magics as plain data, as parsers of these formats hold them: alone, before a count and
    # garbage, before a plausible-looking header whose sizes or payload give it away.
    (out / "strings.c").write_text(
        "#include <stdint.h>\n"
        'const char names[] = "__CLANG_OFFLOAD_BUNDLE__ CCOB \\x7f" "ELF";\n'
        'const char table[] = "__CLANG_OFFLOAD_BUNDLE__\\x02\\0\\0\\0\\0\\0\\0\\0" "garbage that is no entry table";\n'
        "const uint16_t ccob_words[] = {0x4343, 0x424f, 2, 1, 0xffff, 0xffff, 0x100, 0, 0, 0, 0, 0, 0x1234};\n"
        'const unsigned char ccob_text[] = "CCOB\\x02\\0\\x01\\0\\x40\\0\\0\\0\\x00\\x10\\0\\0" "12345678" '
        '"not a zstd frame at all, just text that follows a header of the right shape";\n'
        'const char ids[] = "__CLANG_OFFLOAD_BUNDLE__\\x01\\0\\0\\0\\0\\0\\0\\0" "\\0\\0\\0\\0\\0\\0\\0\\0"\n'
        '    "\\0\\0\\0\\0\\0\\0\\0\\0" "\\x05\\0\\0\\0\\0\\0\\0\\0" "hello";\n'
        "const char *use(int i) { return i ? names : i < 0 ? ids : table; }\n"
    )
    run_checked([cc, "-fPIC", "-shared", "strings.c", "-o", "libembstrings.so"], out)
    made["libembstrings.so"] = out / "libembstrings.so"
    return made
