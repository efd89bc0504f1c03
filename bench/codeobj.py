"""Code-object inputs of the benchmark and the route a user has without rocm-audit.

* ``fetch_librocsparse``: Debian bookworm ``librocsparse0`` 5.3.0 (``apt-get download`` +
  ``dpkg-deb -x``): a 1.3 GB ``.hip_fatbin`` of 111 uncompressed offload bundles.
* ``build_ccob_library``: a shared library made of many compressed offload bundles (CCOB v2), one per
  translation unit, from clang-19 ``--offload-compress`` with ``-x hip -nogpulib -nogpuinc`` and no
  ROCm headers (../shared/corpus/REBUILD.md). Each TU holds a per-architecture table of random bytes
  (``#embed``), so the compressed bundles stay as large as the device code they carry.
* ``user_route_script``: ``objcopy --dump-section .hip_fatbin``, split at bundle boundaries
  (``split_fatbin.py``), ``clang-offload-bundler-19 --list --type=o`` per bundle, with ``zstd -d``
  of the payload where LLVM 19 cannot read a CCOB header (v3).
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROCSPARSE_PACKAGE = "librocsparse0"
ROCSPARSE_VERSION = "5.3.0+dfsg-2"
ROCSPARSE_MEMBER = "usr/lib/x86_64-linux-gnu/librocsparse.so.0.1"
CCOB_ARCHS = ("gfx942", "gfx90a", "gfx1100")

TU_SOURCE = """\
// bench TU {i}: no ROCm headers; one kernel reading a per-architecture table of random bytes
struct dim3 {{ unsigned x, y, z; }};
typedef struct ihipStream_t* hipStream_t;
extern "C" int hipLaunchKernel(const void*, dim3, dim3, void**, unsigned long, hipStream_t);
__attribute__((device)) const signed char tab{i}[] = {{
{tables}
}};
extern "C" __attribute__((global)) void k{i}(signed char* o, int n) {{ o[n] = tab{i}[n % sizeof(tab{i})]; }}
"""


def fetch_librocsparse(cache: Path, into: Path) -> tuple[Path | None, str]:
    """(path of librocsparse.so.0.1, note). The .deb stays in cache; the library goes to ``into``."""
    cache.mkdir(parents=True, exist_ok=True)
    debs = sorted(cache.glob(f"{ROCSPARSE_PACKAGE}_*.deb"))
    if not debs:
        if not shutil.which("apt-get"):
            return None, "apt-get not available"
        for spec in (f"{ROCSPARSE_PACKAGE}={ROCSPARSE_VERSION}", ROCSPARSE_PACKAGE):
            done = subprocess.run(["apt-get", "download", spec], cwd=cache, capture_output=True, text=True)
            if done.returncode == 0:
                break
        debs = sorted(cache.glob(f"{ROCSPARSE_PACKAGE}_*.deb"))
        if not debs:
            return None, f"apt-get download {ROCSPARSE_PACKAGE} failed: {done.stderr.strip()[-300:]}"
    target = into / ROCSPARSE_MEMBER
    if not target.exists():
        into.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(into)], check=True)
    return target, debs[-1].name


def build_ccob_library(work: Path, tus: int, table_bytes: int, jobs: int, seed: int = 7) -> Path:
    """Compile ``tus`` HIP TUs with --offload-compress for CCOB_ARCHS and link them into one .so."""
    out = work / f"libbench_ccob_{tus}x{table_bytes}.so"
    if out.exists():
        return out
    src = work / "src"
    src.mkdir(parents=True, exist_ok=True)
    clang = shutil.which("clang++-19") or "clang++-19"

    def one(i: int) -> Path:
        # deterministic random tables (os.urandom would do; a seed makes rebuilds identical)
        import random

        rng = random.Random(seed * 1_000_003 + i)
        branches = []
        for n, arch in enumerate(CCOB_ARCHS):
            table = src / f"t{i}_{arch}.bin"
            table.write_bytes(rng.randbytes(table_bytes))
            branches.append(f'#{"if" if n == 0 else "elif"} defined(__{arch}__)\n#embed "{table.name}"')
        branches.append("#else\n0\n#endif")
        source = src / f"tu{i}.hip"
        source.write_text(TU_SOURCE.format(i=i, tables="\n".join(branches)))
        obj = src / f"tu{i}.o"
        argv = [
            clang,
            "-x",
            "hip",
            "-nogpulib",
            "-nogpuinc",
            "-Wno-c23-extensions",
            "-fPIC",
            "-O1",
            "--offload-compress",
            f"-cuid=bench{i}",
            *(f"--offload-arch={a}" for a in CCOB_ARCHS),
            "-c",
            source.name,
            "-o",
            obj.name,
        ]
        subprocess.run(argv, cwd=src, check=True, capture_output=True, timeout=600)
        for table in src.glob(f"t{i}_*.bin"):
            table.unlink()
        return obj

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        objects = list(pool.map(one, range(tus)))
    subprocess.run(
        ["gcc", "-shared", "-Wl,-soname,libbench_ccob.so", "-o", str(out), *map(str, objects)],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(src)
    return out


def user_route_script(library: Path, scratch: Path) -> str:
    """The shell a user runs today to list the targets of every bundle in a library."""
    split = HERE / "split_fatbin.py"
    python = shlex.quote(os.environ.get("BENCH_PYTHON", "python3"))
    s = shlex.quote(str(scratch))
    return f"""set -e
rm -rf {s}; mkdir -p {s}; cd {s}
objcopy --dump-section .hip_fatbin=fatbin.bin {shlex.quote(str(library))} /dev/null
{python} {shlex.quote(str(split))} fatbin.bin parts
rm -f fatbin.bin
for part in parts/*.bundle; do
  echo "== $part"
  if ! clang-offload-bundler-19 --list --type=o --input="$part" 2>/dev/null; then
    # CCOB newer than LLVM 19 reads: skip the header, inflate, list the plain bundle
    hdr=$(cat "${{part%.bundle}}.hdr")
    tail -c +$((hdr + 1)) "$part" | zstd -dq > "$part.plain"
    clang-offload-bundler-19 --list --type=o --input="$part.plain"
  fi
done
"""


def parse_user_route(output: str) -> list[list[str]]:
    """Entry ids per bundle, in bundle order, from the route's stdout."""
    bundles: list[list[str]] = []
    for line in output.splitlines():
        if line.startswith("== "):
            bundles.append([])
        elif line.strip() and bundles:
            bundles[-1].append(line.strip())
    return bundles


def normalize_id(entry_id: str) -> str:
    """LLVM 19's bundler prints empty trailing components ("host-x86_64-unknown-linux--",
    "hipv4-amdgcn-amd-amdhsa--gfx950-"); a feature setting ("gfx900:xnack-") keeps its sign."""
    if entry_id.endswith("--"):
        return entry_id[:-2]
    last = entry_id.rsplit("--", 1)[-1]
    if entry_id.endswith("-") and ":" not in last:
        return entry_id[:-1]
    return entry_id


def cleanup(paths: list[Path]) -> None:
    for path in paths:
        for one in glob.glob(str(path)):
            shutil.rmtree(one, ignore_errors=True) if os.path.isdir(one) else os.unlink(one)
