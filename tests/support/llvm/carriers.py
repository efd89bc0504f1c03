"""Real LLVM carriers from PyPI wheels and Debian packages, pinned by sha256, and a tree of them.

Twenty-four packages that ship LLVM, MLIR or clang in the shapes formats.md 6 describes: Debian's
libLLVM 14/15/16/19 (versioned exporters, -Bsymbolic-functions), libclang-cpp 15/16/19 (registrants
through JUMP_SLOT, DT_NEEDED on the system libLLVM) and libMLIR 16 (MLIR's pass options registered
through libLLVM-16's versioned cl:: entry points, no LLVM of its own), rocm-llvm-python's
DT_SYMBOLIC librocmllvm.so, three llvmlite versions (hidden copies), triton's libtriton (hidden) and
its LLVM pass plugin libPrintLoadStoreMemSpaces.so (an unversioned exporter that is not
-Bsymbolic-functions: its addArgument goes through its own PLT), triton 3.6.0's builds of the
same three libraries (a second version of one library under one SONAME) and triton 3.8.0's
libtriton with its instrumentation test library (its own copy of LLVM Support and Core, exported
unversioned) and two MLIR plugins in triton/plugins (DT_NEEDED on libtriton.so, which their
RUNPATH does not find: their own triton's libtriton is loaded first); rocm-bindings-compiler's
libLLVM.so (DT_SYMBOLIC, unversioned, SONAME libLLVM.so, DT_NEEDED on TheRock's
librocm_sysdeps_z/zstd, whose symbols it requires under AMDROCM_SYSDEPS_1.0), flydsl 0.4.2's
embedded MLIR (libFlyPythonCAPI under its own FLYDSL_0.1 node and two dialect modules that share
STB_GNU_UNIQUE mlir:: objects) and 0.5.0's (the same SONAME and node: constant-initialised TypeIDs
shared; its ROCDL module is left out: after 0.4.2's CAPI its DT_NEEDED reuses that CAPI by SONAME
and dlopen fails on an undefined symbol, a load error, not an LLVM clash), rocm-llvm-python 6.2's
librocmllvm.so (neither DT_SYMBOLIC nor versioned, no SONAME: every llvm::cl symbol interposable),
torch-mlir's libTorchMLIRAggregateCAPI.so (LLVM and MLIR exported unversioned, not -Bsymbolic),
iree-compiler 20241104's libIREECompiler.so (LLVM exported under its own IREE_API_0.0 node, its own
calls through the PLT), the PyPI libclang wheel's libclang.so and iree-base-compiler's
libIREECompiler.so (hidden copies with a C API under a version node). Downloads go to
ROCM_AUDIT_TEST_CACHE (default ~/.cache/rocm-audit-tests) with the ordinary clients (pip download,
apt-get download) and are checked against the pins before anything is unpacked; a missing or
mismatching file fails the test (a broken set-up), it never skips.

TheRock's sysdeps libraries come from _rocm_sdk_core, which is not on PyPI: stand-ins are built
here (``sysdeps``) the way TheRock's third-party/sysdeps does it, Debian's libz.a and libzstd.a
linked whole into a shared library with TheRock's SONAME and a version script that puts every
exported symbol under AMDROCM_SYSDEPS_1.0, and laid out where TheRock installs them
(_rocm_sdk_core/lib/rocm_sysdeps/lib), so rocm-audit finds them as the host a real process loads
first.

``build_tree`` lays the libraries out as an audited tree, with deliberate duplicates: second
inodes holding the same bytes (a copy instead of a symlink), as `cp -r` or a wheel's copied alias
makes them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Carrier:
    name: str  # a short name for the tree
    kind: str  # "wheel" or "deb"
    spec: str  # pip requirement or apt package=version
    filename: str
    sha256: str
    members: tuple[str, ...]  # files to take, inside the unpacked package
    support: tuple[str, ...] = ()  # files the members need to load, placed but not paired
    standins: tuple[str, ...] = ()  # stand-in libraries (SYSDEPS) a real install provides


CARRIERS = (
    Carrier(
        "llvm14",
        "deb",
        "libllvm14=1:14.0.6-12",
        "libllvm14_1%3a14.0.6-12_amd64.deb",
        "cd986403cfe53f47c41b80667f6b344c40fe35de4c5081dad9358b4c77cf64a8",
        ("usr/lib/x86_64-linux-gnu/libLLVM-14.so.1",),
    ),
    Carrier(
        "llvm15",
        "deb",
        "libllvm15=1:15.0.6-4+b1",
        "libllvm15_1%3a15.0.6-4+b1_amd64.deb",
        "9f0751109ba89e65b1313a4f3e34a29977a0db6fa30ed475e2c6bd555fa9e866",
        ("usr/lib/x86_64-linux-gnu/libLLVM-15.so.1",),
    ),
    Carrier(
        "llvm16",
        "deb",
        "libllvm16=1:16.0.6-15~deb12u1",
        "libllvm16_1%3a16.0.6-15~deb12u1_amd64.deb",
        "ba0b6f4a348373d82e8c180c8f94ea5e9f0227afe4e01c78e5a66ec71fd2df1e",
        ("usr/lib/x86_64-linux-gnu/libLLVM-16.so.1",),
    ),
    Carrier(
        "llvm19",
        "deb",
        "libllvm19=1:19.1.7-3~deb12u1",
        "libllvm19_1%3a19.1.7-3~deb12u1_amd64.deb",
        "6edf3a8b28495cdba883d9760e0dca1a81983fc497a5f989dc64d0d96d23b4aa",
        ("usr/lib/x86_64-linux-gnu/libLLVM.so.19.1",),
    ),
    Carrier(
        "clang15",
        "deb",
        "libclang-cpp15=1:15.0.6-4+b1",
        "libclang-cpp15_1%3a15.0.6-4+b1_amd64.deb",
        "1fd391c424c91b885280163727aa1b079db583f5e2ebdd350336a12de68f5448",
        ("usr/lib/llvm-15/lib/libclang-cpp.so.15",),
    ),
    Carrier(
        "clang19",
        "deb",
        "libclang-cpp19=1:19.1.7-3~deb12u1",
        "libclang-cpp19_1%3a19.1.7-3~deb12u1_amd64.deb",
        "5daa784e1d747db320c16604729ffa805e6bfd72d3ac0b7cb0ee5f1a7ebc8aae",
        ("usr/lib/x86_64-linux-gnu/libclang-cpp.so.19.1",),
    ),
    Carrier(
        "clang16",
        "deb",
        "libclang-cpp16=1:16.0.6-15~deb12u1",
        "libclang-cpp16_1%3a16.0.6-15~deb12u1_amd64.deb",
        "da5ed3c4619ed5f811f8b70ef12ca53cf3074b03cfbff3dd0e33d429b14f800b",
        ("usr/lib/llvm-16/lib/libclang-cpp.so.16",),
    ),
    Carrier(
        "mlir16",
        "deb",
        "libmlir-16=1:16.0.6-15~deb12u1",
        "libmlir-16_1%3a16.0.6-15~deb12u1_amd64.deb",
        "326f89ab592da5fba6b6e7bbe20326f11e734cde5e61dd09604de0f986270f8b",
        ("usr/lib/llvm-16/lib/libMLIR.so.16",),
    ),
    Carrier(
        "llvmlite044",
        "wheel",
        "llvmlite==0.44.0",
        "llvmlite-0.44.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "c5d22c3bfc842668168a786af4205ec8e3ad29fb1bc03fd11fd48460d0df64c1",
        ("llvmlite/binding/libllvmlite.so",),
    ),
    Carrier(
        "llvmlite043",
        "wheel",
        "llvmlite==0.43.0",
        "llvmlite-0.43.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "977525a1e5f4059316b183fb4fd34fa858c9eade31f165427a3977c95e3ee749",
        ("llvmlite/binding/libllvmlite.so",),
    ),
    Carrier(
        "llvmlite050",
        "wheel",
        "llvmlite==0.50.0",
        "llvmlite-0.50.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        "a6ffde00d4be8772a24e3e8b3af6bf86a79e7cf066d944ef56136b3957d707dc",
        ("llvmlite/binding/libllvmlite.so",),
    ),
    Carrier(
        "rocmllvm",
        "wheel",
        "rocm-llvm-python==7.2.2.562.46",
        "rocm_llvm_python-7.2.2.562.46-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        "e96118552366a135ff9c3d8b9d8dc2d5889eca1b457986f5546861f3e9a19762",
        ("rocm/llvm/librocmllvm.so",),
    ),
    Carrier(
        "triton",
        "wheel",
        "triton==3.5.1",
        "triton-3.5.1-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        "61413522a48add32302353fdbaaf92daaaab06f6b5e3229940d21b5207f47579",
        (
            "triton/_C/libtriton.so",
            "triton/instrumentation/libPrintLoadStoreMemSpaces.so",
            "triton/instrumentation/libGPUInstrumentationTestLib.so",
        ),
    ),
    Carrier(
        "triton36",
        "wheel",
        "triton==3.6.0",
        "triton-3.6.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        "e8e323d608e3a9bfcc2d9efcc90ceefb764a82b99dea12a86d643c72539ad5d3",
        (
            "triton/_C/libtriton.so",
            "triton/instrumentation/libPrintLoadStoreMemSpaces.so",
            "triton/instrumentation/libGPUInstrumentationTestLib.so",
        ),
    ),
    Carrier(
        "triton38",
        "wheel",
        "triton==3.8.0",
        "triton-3.8.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        "68988ac85d5e7086baeda0ddc175af9667db7529b3c5e11a5c0601b8bef2200a",
        (
            "triton/_C/libtriton.so",
            "triton/instrumentation/libGPUInstrumentationTestLib.so",
            "triton/plugins/libMLIRDialectPlugin.so",
            "triton/plugins/libTritonPluginsTestLib.so",
        ),
    ),
    Carrier(
        "rbllvm",
        "wheel",
        "rocm-bindings-compiler==10.0.0.0.1.2",
        "rocm_bindings_compiler-10.0.0.0.1.2-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        "f5cdc392fd65602a94ed2ae896280f39068769a47b122a5de00e5900a096a7a8",
        ("rocm/bindings/llvm/libLLVM.so",),
        standins=("librocm_sysdeps_z.so.1", "librocm_sysdeps_zstd.so.1"),
    ),
    Carrier(
        "flydsl",
        "wheel",
        "flydsl==0.4.2",
        "flydsl-0.4.2-cp311-cp311-manylinux_2_27_x86_64.whl",
        "a035a9518cb44652b118b31874e809644d87bf1e677dec87b844e79960464c99",
        (
            "flydsl/_mlir/_mlir_libs/libFlyPythonCAPI.so.24.0git",
            "flydsl/_mlir/_mlir_libs/_mlirDialectsFly.cpython-311-x86_64-linux-gnu.so",
            "flydsl/_mlir/_mlir_libs/_mlirDialectsFlyROCDL.cpython-311-x86_64-linux-gnu.so",
        ),
        support=(
            "flydsl/_mlir/_mlir_libs/libMLIRPythonSupport-mlir.so",
            "flydsl/_mlir/_mlir_libs/libnanobind-mlir.so",
            "flydsl.libs/libzstd-76b78bac.so.1.4.4",
        ),
    ),
    Carrier(
        "flydsl050",
        "wheel",
        "flydsl==0.5.0",
        "flydsl-0.5.0-cp311-cp311-manylinux_2_27_x86_64.whl",
        "e8152bff6d02269236a2d7522592d97d856f7712e8a3c6b91136df4bc4221e22",
        (
            "flydsl/_mlir/_mlir_libs/libFlyPythonCAPI.so.24.0git",
            "flydsl/_mlir/_mlir_libs/_mlirDialectsFly.cpython-311-x86_64-linux-gnu.so",
        ),
        support=(
            "flydsl/_mlir/_mlir_libs/libMLIRPythonSupport-mlir.so",
            "flydsl/_mlir/_mlir_libs/libnanobind-mlir.so",
            "flydsl.libs/libzstd-76b78bac.so.1.4.4",
        ),
    ),
    Carrier(
        "rocmllvm62",
        "wheel",
        "rocm-llvm-python==6.2.0.500.22",
        "rocm_llvm_python-6.2.0.500.22-cp311-cp311-manylinux_2_17_x86_64.whl",
        "b30f29bf2446d114bf276fb4046eb0877cf7b16f27d97ef8427da8d0e388280d",
        ("rocm/llvm/librocmllvm.so",),
    ),
    Carrier(
        "torchmlir",
        "wheel",
        "torch-mlir==20261001",
        "torch_mlir-20261001-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        "3fb6cc11d248f1ece7149cf21cc40f528b9c6f45424464678485db2c83c199af",
        ("torch_mlir/_mlir_libs/libTorchMLIRAggregateCAPI.so",),
    ),
    Carrier(
        "iree2024",
        "wheel",
        "iree-compiler==20241104.1068",
        "iree_compiler-20241104.1068-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        "aeac74cc2e3eb34a453427df2c5ddbe85e9d8ee942dc97eae42ead6fc8f24fa8",
        ("iree/compiler/_mlir_libs/libIREECompiler.so",),
    ),
    Carrier(
        "libclang18",
        "wheel",
        "libclang==18.1.1",
        "libclang-18.1.1-py2.py3-none-manylinux2010_x86_64.whl",
        "c533091d8a3bbf7460a00cb6c1a71da93bffe148f172c7d03b1c31fbf8aa2a0b",
        ("libclang-18.1.1.data/platlib/clang/native/libclang.so",),
    ),
    Carrier(
        "iree",
        "wheel",
        "iree-base-compiler==3.13.0",
        "iree_base_compiler-3.13.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        "6e1f83dc404f5dcdd76354a869cbbb389bd3f93b4623096de3195799ceb323a7",
        ("iree/compiler/_mlir_libs/libIREECompiler.so",),
    ),
)

# Deliberate duplicates: a second inode with the same bytes, next to the first in another folder.
DUPLICATES = ("llvm15", "llvm19", "clang15", "rocmllvm", "triton/libPrintLoadStoreMemSpaces.so", "rbllvm")


def cache_dir() -> Path:
    base = os.environ.get("ROCM_AUDIT_TEST_CACHE") or os.path.expanduser("~/.cache/rocm-audit-tests")
    path = Path(base) / "llvm-carriers"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download(carrier: Carrier, into: Path) -> None:
    if carrier.kind == "wheel":
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q"]
        command += ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"]
        for platform in (
            "manylinux_2_28_x86_64",
            "manylinux_2_27_x86_64",
            "manylinux_2_17_x86_64",
            "manylinux2010_x86_64",
        ):
            command += ["--platform", platform]
        subprocess.run([*command, "-d", str(into), carrier.spec], check=True, timeout=1800)
        return
    download = ["apt-get", "download", carrier.spec]
    if subprocess.run(download, cwd=into, check=False, timeout=1800).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], check=True, timeout=1800)
        subprocess.run(download, cwd=into, check=True, timeout=1800)


def fetch(carrier: Carrier) -> Path:
    """The pinned package file, downloaded once and checked."""
    target = cache_dir() / carrier.filename
    if not target.exists() or _sha256(target) != carrier.sha256:
        _download(carrier, cache_dir())
    digest = _sha256(target)
    assert digest == carrier.sha256, f"{carrier.filename}: sha256 {digest}, pinned {carrier.sha256}"
    return target


def unpacked(carrier: Carrier) -> Path:
    """The carrier's member files, unpacked once into the cache (read-only from then on)."""
    root = cache_dir() / "unpacked" / carrier.name / carrier.sha256[:16]
    done = root / ".complete"
    if done.exists():
        return root
    package = fetch(carrier)
    scratch = root.with_name(root.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    if carrier.kind == "wheel":
        with zipfile.ZipFile(package) as archive:
            for member in (*carrier.members, *carrier.support):
                archive.extract(member, scratch)
    else:
        subprocess.run(["dpkg-deb", "-x", str(package), str(scratch)], check=True, timeout=600)
    for member in (*carrier.members, *carrier.support):
        assert (scratch / member).is_file(), f"{carrier.name}: {member} is not in {carrier.filename}"
    shutil.rmtree(root, ignore_errors=True)
    scratch.rename(root)
    done.touch()
    return root


# TheRock's sysdeps (third-party/sysdeps/common/{zlib,zstd}): the upstream library built shared,
# its SONAME made private by patchelf and every exported symbol put under one version node by a
# version script. Here: the same symbols from Debian's static archives (zlib1g-dev, libzstd-dev).
SYSDEPS_DIR = Path("_rocm_sdk_core/lib/rocm_sysdeps/lib")  # where TheRock's wheels install them
SYSDEPS_NODE = "AMDROCM_SYSDEPS_1.0"
SYSDEPS = {
    "librocm_sysdeps_z.so.1": Path("/usr/lib/x86_64-linux-gnu/libz.a"),
    "librocm_sysdeps_zstd.so.1": Path("/usr/lib/x86_64-linux-gnu/libzstd.a"),
}


def sysdeps(soname: str) -> Path:
    """A stand-in for one of TheRock's sysdeps libraries, built once into the cache with gcc."""
    archive = SYSDEPS[soname]
    assert archive.is_file(), f"{archive} missing: install zlib1g-dev and libzstd-dev (tests/apt-packages.txt)"
    key = hashlib.sha256(archive.read_bytes() + SYSDEPS_NODE.encode()).hexdigest()[:16]
    output = cache_dir() / "sysdeps" / key / soname
    if output.exists():
        return output
    scratch = output.parent / (soname + ".objects")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    subprocess.run(["ar", "x", str(archive)], cwd=scratch, check=True, timeout=300)
    objects = sorted(p for p in scratch.iterdir() if p.suffix == ".o")
    # Debian builds these archives -fPIE: -Bsymbolic lets ld bind their PC-relative references
    # to the library's own symbols. An object that reads libc's data directly (zstd's dictionary
    # trainer prints to stderr, a copy relocation in an executable) cannot go into a shared
    # object at all; it is left out (ZDICT_*, which no LLVM imports).
    keep = []
    for obj in objects:
        undefined = subprocess.run(["nm", "-u", str(obj)], capture_output=True, text=True, check=True).stdout
        if not any(line.split()[-1].split("@")[0] in ("stderr", "stdout") for line in undefined.splitlines()):
            keep.append(str(obj))
    script = scratch / "version.lds"
    script.write_text(f"{SYSDEPS_NODE} {{ global: *; }};\n")
    partial = output.with_suffix(".partial")
    subprocess.run(
        ["gcc", "-shared", "-o", str(partial), f"-Wl,-soname,{soname}", "-Wl,-Bsymbolic"]
        + [f"-Wl,--version-script={script}", *keep],
        check=True,
        timeout=300,
    )
    partial.rename(output)
    shutil.rmtree(scratch)
    return output


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system than the cache's
        shutil.copyfile(source, target)


@dataclass(frozen=True)
class CarrierTree:
    root: Path
    libraries: dict[str, Path]  # short name -> path in the tree ("llvm15", "llvm15-copy", ...)


def build_tree(root: Path, names: tuple[str, ...] | None = None) -> CarrierTree:
    """Hardlink the unpacked carriers into root (one inode with the cache: cheap), then add the
    deliberate duplicates as real copies (new inodes)."""
    libraries: dict[str, Path] = {}
    for carrier in CARRIERS:
        if names is not None and not any(n == carrier.name or n.startswith(carrier.name + "/") for n in names):
            continue
        source_root = unpacked(carrier)
        for member in carrier.support:
            target = root / carrier.name / member
            target.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(source_root / member, target)
        for soname in carrier.standins:
            target = root / SYSDEPS_DIR / soname
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                _link_or_copy(sysdeps(soname), target)
        for member in carrier.members:
            key = carrier.name if len(carrier.members) == 1 else f"{carrier.name}/{Path(member).name}"
            target = root / carrier.name / member
            target.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(source_root / member, target)  # an unnamed member may be a named one's dependency
            if names is not None and key not in names and carrier.name not in names:
                continue
            libraries[key] = target
            if key in DUPLICATES:
                copy = root / f"{carrier.name}-copy" / member
                copy.parent.mkdir(parents=True, exist_ok=True)
                copies = cache_dir() / "copies" / carrier.sha256[:16] / member
                if not copies.exists():  # one real copy in the cache, hardlinked per tree
                    copies.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(source_root / member, copies.with_suffix(".partial"))
                    copies.with_suffix(".partial").rename(copies)
                _link_or_copy(copies, copy)
                libraries[f"{key}-copy"] = copy
    return CarrierTree(root, libraries)
