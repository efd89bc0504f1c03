"""TheRock-shaped test wheels built from real ELF files, and a PEP 503 index to serve them.

- ``rocm``: the meta package with the ``rocm_sdk`` module and a ``rocm-sdk`` console script whose
  ``init`` expands the devel tarball as TheRock's rocm_sdk/_devel.py does: file symlinks become
  hardlinks to their targets, directory symlinks stay (formats.md 1.4);
- ``rocm-sdk-core`` (``_rocm_sdk_core``): a real LLVM option registrant, Debian's
  libclang-cpp.so.15, in lib/llvm/lib, and share/therock/dist_info.json;
- ``rocm-sdk-libraries-gfx94X-dcgpu``: two HIP device-code carriers, one with gfx942 + gfx950,
  one with gfx942 only;
- ``rocm-sdk-devel``: ``rocm_sdk_devel/_devel.tar`` whose ``_rocm_sdk_devel`` files are relative
  symlinks to the runtime copies, as TheRock's packaging writes them.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import json
import os
import re
import shutil
import sys
import tarfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from support.run import run_checked

VERSION = "10.0.0"
FAMILY_TREE = "_rocm_sdk_libraries_gfx94X_dcgpu"
LIBCLANG_CPP15 = Path("/usr/lib/llvm-15/lib/libclang-cpp.so.15")  # Debian libclang-cpp15, 62 MB
REGISTRANT = "lib/llvm/lib/libclang-cpp.so.15"
CARRIER_ALL = "lib/librocblas.so.5"  # gfx942 + gfx950
CARRIER_942 = "lib/libhipblaslt.so.1"  # gfx942 only

HIP_TU = """\
struct dim3 { unsigned x, y, z; };
typedef struct ihipStream_t* hipStream_t;
extern "C" int hipLaunchKernel(const void*, dim3, dim3, void**, unsigned long, hipStream_t);
extern "C" __attribute__((global)) void %s(int* out) { *out = 7; }
"""
LLVM_IR = """\
target triple = "amdgcn-amd-amdhsa"
define amdgpu_kernel void @k(ptr addrspace(1) %p) {
  store i32 7, ptr addrspace(1) %p
  ret void
}
"""

ROCM_SDK_MAIN = (
    '''\
"""Test stand-in for TheRock's rocm-sdk CLI: `init` expands the devel tarball (formats.md 1.4)."""
import argparse
import os
import shutil
import sys
import tarfile
from pathlib import Path

SITE = Path(__file__).resolve().parent.parent


def init(quiet):
    devel = SITE / "_rocm_sdk_devel"
    tarball = SITE / "rocm_sdk_devel" / "_devel.tar"
    if (devel / "__init__.py").exists() and not tarball.exists():
        return 0
    file_links = []
    with tarfile.open(tarball) as archive:
        for member in archive.getmembers():
            dest = SITE / member.name
            if member.isdir():
                dest.mkdir(parents=True, exist_ok=True)
            elif member.issym():
                dest.parent.mkdir(parents=True, exist_ok=True)
                file_links.append((dest, member.linkname))
            elif member.isfile():
                dest.parent.mkdir(parents=True, exist_ok=True)
                with archive.extractfile(member) as source, open(dest, "wb") as target:
                    shutil.copyfileobj(source, target)
                os.chmod(dest, member.mode)
    for dest, linkname in file_links:
        if (dest.parent / linkname).is_dir():
            dest.symlink_to(linkname)  # directory symlinks stay symlinks
        else:
            # as rocm_sdk/_devel.py: a file symlink becomes a hardlink
            dest.hardlink_to(dest.parent / linkname)
    (devel / "__init__.py").touch()
    tarball.unlink()  # last: its absence marks a finished expansion
    if not quiet:
        print(f"Devel contents expanded to '{devel}'")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="rocm-sdk")
    commands = parser.add_subparsers(dest="command", required=True)
    init_parser = commands.add_parser("init")
    init_parser.add_argument("--quiet", action="store_true")
    commands.add_parser("version")
    args = parser.parse_args(argv)
    if args.command == "version":
        print("'''
    + VERSION
    + """")
        return 0
    return init(args.quiet)


if __name__ == "__main__":
    sys.exit(main())
"""
)


HIP_RUNTIME = "lib/libamdhip64.so.7"  # in _rocm_sdk_core, as TheRock installs it
# What clang's HIP host code calls: a stand-in runtime defines them, as libamdhip64 does, so that a
# carrier loads (RTLD_NOW) through its DT_NEEDED like a real TheRock library.
HIP_RUNTIME_SOURCE = """
void *__hipRegisterFatBinary(void *wrapper) { return wrapper; }
void __hipUnregisterFatBinary(void *handle) { (void)handle; }
void __hipRegisterFunction(void *h, const void *f, char *d, const char *n, int t, void *a, void *b,
                           void *c, void *e, int *s) { (void)h; (void)f; (void)d; (void)n; (void)t; (void)a;
                           (void)b; (void)c; (void)e; (void)s; }
int __hipPushCallConfiguration(void) { return 0; }
int __hipPopCallConfiguration(void) { return 0; }
int hipLaunchKernel(const void *f) { (void)f; return 0; }
"""


def build_carriers(out: Path) -> dict[str, Path]:
    """Two host libraries with HIP fat binaries: gfx942+gfx950 (bundled by hand) and gfx942 only,
    each needing the stand-in HIP runtime (``HIP_RUNTIME``, also returned) through its RUNPATH."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "k.hip").write_text(HIP_TU % "k")
    (out / "hip_runtime.c").write_text(HIP_RUNTIME_SOURCE)
    run_checked(
        ["gcc", "-shared", "-fPIC", "-o", "libamdhip64.so.7", "hip_runtime.c", "-Wl,-soname,libamdhip64.so.7"], out
    )
    cxx, lld, bundler = "clang++-19", "ld.lld-19", "clang-offload-bundler-19"
    for tool in (cxx, lld, bundler):
        assert shutil.which(tool), f"{tool} not found: scripts/test installs clang-19, lld-19, clang-tools-19"
    flags = ["-x", "hip", "-nogpulib", "-nogpuinc", "-no-hip-rt", "-fPIC"]
    runtime = ["-L.", "-l:libamdhip64.so.7", "-Wl,--enable-new-dtags,-rpath,$ORIGIN/../../_rocm_sdk_core/lib"]
    run_checked(
        [
            cxx,
            *flags,
            "-shared",
            "--offload-arch=gfx942",
            "k.hip",
            "-o",
            "libhipblaslt.so.1",
            "-Wl,-soname,libhipblaslt.so.1",
            *runtime,
        ],
        out,
    )
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
            "k.hip",
            "-o",
            "k_gfx942.hsaco",
        ],
        out,
    )
    # clang-19 does not know gfx950; llvmlite's newer LLVM emits it (in a child process).
    script = (
        "import sys, llvmlite.binding as llvm\n"
        "llvm.initialize_all_targets(); llvm.initialize_all_asmprinters()\n"
        "target = llvm.Target.from_triple('amdgcn-amd-amdhsa')\n"
        "tm = target.create_target_machine(cpu='gfx950', opt=2,"
        " reloc='pic')\n"
        f"open('ll_gfx950.o', 'wb').write(tm.emit_object(llvm.parse_assembly({LLVM_IR!r})))\n"
    )
    run_checked([sys.executable, "-c", script], out)
    run_checked([lld, "-shared", "ll_gfx950.o", "-o", "k_gfx950.hsaco"], out)
    run_checked(
        [
            bundler,
            "-type=o",
            "-bundle-align=4096",
            "-targets=host-x86_64-unknown-linux,hipv4-amdgcn-amd-amdhsa--gfx942,hipv4-amdgcn-amd-amdhsa--gfx950",
            "-input=/dev/null",
            "-input=k_gfx942.hsaco",
            "-input=k_gfx950.hsaco",
            "-output=all.hipfb",
        ],
        out,
    )
    run_checked(
        [
            cxx,
            *flags,
            "--cuda-host-only",
            "-Xclang",
            "-fcuda-include-gpubinary",
            "-Xclang",
            "all.hipfb",
            "-shared",
            "k.hip",
            "-o",
            "librocblas.so.5",
            "-Wl,-soname,librocblas.so.5",
            *runtime,
        ],
        out,
    )
    return {
        CARRIER_ALL: out / "librocblas.so.5",
        CARRIER_942: out / "libhipblaslt.so.1",
        HIP_RUNTIME: out / "libamdhip64.so.7",
    }


def _record_hash(data_path: Path | None, data: bytes | None) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    if data is not None:
        digest.update(data)
        size = len(data)
    else:
        assert data_path is not None
        with open(data_path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
    return "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode(), size


def make_wheel(
    out: Path,
    name: str,
    files: dict[str, bytes | Path],
    *,
    requires: Sequence[str] = (),
    extras: dict[str, list[str]] | None = None,
    scripts: dict[str, str] | None = None,
    platform: bool = True,
) -> Path:
    """A wheel written by hand (stored, not deflated: the payload is big and local)."""
    dist = re.sub(r"[-_.]+", "_", name)
    tag = "py3-none-linux_x86_64" if platform else "py3-none-any"
    path = out / f"{dist}-{VERSION}-{tag}.whl"
    info = f"{dist}-{VERSION}.dist-info"
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {VERSION}"]
    metadata += [f"Requires-Dist: {r}" for r in requires]
    for extra, needs in (extras or {}).items():
        metadata.append(f"Provides-Extra: {extra}")
        metadata += [f'Requires-Dist: {n}; extra == "{extra}"' for n in needs]
    meta_files: dict[str, bytes] = {
        f"{info}/METADATA": ("\n".join(metadata) + "\n").encode(),
        f"{info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: rocm-audit-tests\nRoot-Is-Purelib: "
            f"{'false' if platform else 'true'}\nTag: {tag}\n"
        ).encode(),
    }
    if scripts:
        meta_files[f"{info}/entry_points.txt"] = (
            "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())
        ).encode()
    records = []
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for arcname, payload in sorted({**files, **meta_files}.items()):
            if isinstance(payload, Path):
                info_entry = zipfile.ZipInfo(arcname, date_time=(2026, 1, 1, 0, 0, 0))
                info_entry.external_attr = (
                    0o100755 if os.access(payload, os.X_OK) or ".so" in arcname else 0o100644
                ) << 16
                with (
                    open(payload, "rb") as source,
                    archive.open(info_entry, "w", force_zip64=True) as target,
                ):
                    shutil.copyfileobj(source, target, 1 << 20)
                digest, size = _record_hash(payload, None)
            else:
                info_entry = zipfile.ZipInfo(arcname, date_time=(2026, 1, 1, 0, 0, 0))
                info_entry.external_attr = 0o100644 << 16
                archive.writestr(info_entry, payload)
                digest, size = _record_hash(None, payload)
            records.append(f"{arcname},{digest},{size}")
        records.append(f"{info}/RECORD,,")
        archive.writestr(f"{info}/RECORD", "\n".join(records) + "\n")
    return path


def devel_tarball(links: dict[str, str], files: dict[str, bytes]) -> bytes:
    """``_devel.tar``: relative symlinks to the runtime copies plus a few devel-only files."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        dirs = sorted({str(Path(p).parent) for p in [*links, *files]} | {"_rocm_sdk_devel"})
        expanded: set[str] = set()
        for directory in dirs:
            parts = Path(directory).parts
            for i in range(1, len(parts) + 1):
                expanded.add("/".join(parts[:i]))
        for directory in sorted(expanded):
            member = tarfile.TarInfo(directory)
            member.type, member.mode = tarfile.DIRTYPE, 0o755
            archive.addfile(member)
        for path, target in sorted(links.items()):
            member = tarfile.TarInfo(path)
            member.type, member.linkname = tarfile.SYMTYPE, target
            archive.addfile(member)
        for path, payload in sorted(files.items()):
            member = tarfile.TarInfo(path)
            member.size, member.mode = len(payload), 0o644
            archive.addfile(member, io.BytesIO(payload))
    return buffer.getvalue()


def relative_link(devel_rel: str, owner_tree: str) -> str:
    """TheRock's devel link: "../" * segments of relpath + owner tree + relpath (formats.md 1.4)."""
    return "../" * len(Path(devel_rel).parts) + f"{owner_tree}/{devel_rel}"


def build_sdk_wheels(out: Path, carriers: dict[str, Path]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    carriers = dict(carriers)
    hip_runtime = carriers.pop(HIP_RUNTIME)
    assert LIBCLANG_CPP15.is_file(), f"{LIBCLANG_CPP15} missing: scripts/test installs libclang-cpp15"
    dist_info = json.dumps({"dist_amdgpu_targets": "gfx942;gfx950", "dist_amdgpu_families": "gfx94X-dcgpu"})
    core = make_wheel(
        out,
        "rocm-sdk-core",
        {
            "_rocm_sdk_core/__init__.py": b"",
            f"_rocm_sdk_core/{REGISTRANT}": LIBCLANG_CPP15,
            f"_rocm_sdk_core/{HIP_RUNTIME}": hip_runtime,
            "_rocm_sdk_core/share/therock/dist_info.json": dist_info.encode(),
        },
    )
    libraries = make_wheel(
        out,
        "rocm-sdk-libraries-gfx94X-dcgpu",
        {
            f"{FAMILY_TREE}/__init__.py": b"",
            **{f"{FAMILY_TREE}/{rel}": path for rel, path in carriers.items()},
        },
    )
    links = {f"_rocm_sdk_devel/{REGISTRANT}": relative_link(REGISTRANT, "_rocm_sdk_core")}
    for rel in carriers:
        links[f"_rocm_sdk_devel/{rel}"] = relative_link(rel, FAMILY_TREE)
    tarball = devel_tarball(links, {"_rocm_sdk_devel/include/hip/hip_version.h": b"#define HIP_VERSION 1000\n"})
    devel = make_wheel(
        out,
        "rocm-sdk-devel",
        {"rocm_sdk_devel/__init__.py": b"", "rocm_sdk_devel/_devel.tar": tarball},
    )
    meta = make_wheel(
        out,
        "rocm",
        {
            "rocm_sdk/__init__.py": f'__version__ = "{VERSION}"\n'.encode(),
            "rocm_sdk/__main__.py": ROCM_SDK_MAIN.encode(),
        },
        requires=[f"rocm-sdk-core=={VERSION}"],
        extras={
            "libraries": [f"rocm-sdk-libraries-gfx94X-dcgpu=={VERSION}"],
            "devel": [f"rocm-sdk-devel=={VERSION}"],
        },
        scripts={"rocm-sdk": "rocm_sdk.__main__:main"},
        platform=False,
    )
    return [core, libraries, devel, meta]


def write_simple_index(root: Path, wheels: list[Path]) -> None:
    """A PEP 503 index: root/simple/<project>/index.html linking to root/files/<wheel>."""
    files = root / "files"
    files.mkdir(parents=True, exist_ok=True)
    projects: dict[str, list[Path]] = {}
    for wheel in wheels:
        target = files / wheel.name
        if not target.exists():
            try:
                os.link(wheel, target)
            except OSError:
                shutil.copyfile(wheel, target)
        project = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
        projects.setdefault(project, []).append(target)
    for project, members in projects.items():
        page = root / "simple" / project
        page.mkdir(parents=True, exist_ok=True)
        links = "".join(
            f'<a href="../../files/{html.escape(m.name)}">{html.escape(m.name)}</a>\n' for m in sorted(members)
        )
        (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    (root / "simple" / "index.html").write_text(
        "<!DOCTYPE html><html><body>\n"
        + "".join(f'<a href="{p}/">{p}</a>\n' for p in sorted(projects))
        + "</body></html>\n"
    )
