"""Code objects of real vendor wheels (issue 17): `bench/run --only vendor [--baseline REV]`.

Inputs, pinned by sha256 and fetched with ``pip download --no-deps`` into the bench cache:

* ``jax_plugins/xla_rocm7/xla_rocm_plugin.so`` of jax-rocm7-pjrt 0.12.0 (459 MB; 45 CCOB v3 zstd
  bundles of 28 entries, 29 MB compressed, 2.4 GB inflated);
* ``onnxruntime/capi/libonnxruntime_providers_rocm.so`` of onnxruntime-rocm 1.22.2.post3 (513 MB of
  plain, uncompressed bundles);
* a site-packages unpacked from every pinned wheel (3.35 GB, 11 wheels: three jax PJRT plugins, onnxruntime-rocm,
  cupy-rocm-7-0, pytorch-triton-rocm, rocm-llvm-python, pyg-lib-rocm, mojolearn-amd, jax-rocm7-plugin).

* a second site-packages, "the LLVM site" (issue 36's memory figure): the same wheels with triton
  3.8.0 and llvmlite 0.50.0 in place of pytorch-triton-rocm 2.1.0 (11 wheels, 3.97 GB unpacked;
  libtriton.so and libllvmlite.so carry whole LLVMs with huge symbol and relocation tables).

Figures, each the median of ``--runs`` interleaved runs with a warm page cache, wall time including
interpreter start and peak RSS from ``wait4`` (rss_exec.c):

* ``verify-arch gfx950`` on the plugin against the zstd stream floor (``zstd_floor.py``: every
  bundle inflated with python-zstandard's stream reader, one context, nothing else, in-process
  seconds: no interpreter start) and against objcopy + split + ``clang-offload-bundler-19 --list``;
* ``scan --targets`` on the plugin against the same floor;
* both commands on the onnxruntime provider;
* ``check gfx942 gfx950`` over each site-packages;
* ``rocm-audit --help`` (start-up).

Each rocm-audit figure is also taken with ``ROCM_AUDIT_NO_ZSTD_INDEX=1`` ("current, streamed"): the
same code with every CCOB streamed through libzstd, as without the zstd frame index.

``--baseline REV`` runs the same commands with rocm-audit's sources at git revision REV (``git
archive`` into the work dir, the same interpreter and dependencies), interleaved with the current
code, for before/after figures.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (pip spec, wheel file, sha256, pip download options): pinned; a different file is refused.
WHEELS = [
    (
        "jax-rocm7-pjrt==0.12.0",
        "jax_rocm7_pjrt-0.12.0-py3-none-manylinux_2_27_x86_64.whl",
        "4551d0714523355f2946ca1958c3f584e95661e467a641d36b726f718a1c7934",
    ),
    (
        "onnxruntime-rocm==1.22.2.post3",
        "onnxruntime_rocm-1.22.2.post3-cp311-cp311-manylinux_2_34_x86_64.whl",
        "705596b48933446ae6766921c5c8a46ef42f0c735bf158b6eb44a60bf7f95230",
    ),
    (
        "cupy-rocm-7-0==14.2.0",
        "cupy_rocm_7_0-14.2.0-cp311-cp311-manylinux2014_x86_64.whl",
        "8e824c1c2fc386e72fe8ae69ab7c273326b17650160400f8f4ea2c932189ed1a",
    ),
    (
        "pytorch-triton-rocm==2.1.0",
        "pytorch_triton_rocm-2.1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "ec63623c16eebe356d40460a09374a2546591dd2b0cb2122622111fc4d0f7f25",
    ),
    (
        "rocm-llvm-python==7.2.2.562.46",
        "rocm_llvm_python-7.2.2.562.46-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        "e96118552366a135ff9c3d8b9d8dc2d5889eca1b457986f5546861f3e9a19762",
    ),
    (
        "pyg-lib-rocm==0.8.0.post2",
        "pyg_lib_rocm-0.8.0.post2-cp311-cp311-manylinux_2_32_x86_64.whl",
        "bc7fa711e601c924b534386bb2ecc9ea9ae3ef2934849a1558235c6b40b14d2a",
    ),
    (
        "mojolearn-amd==0.8.62",
        "mojolearn_amd-0.8.62-py3-none-manylinux_2_35_x86_64.whl",
        "bfd08ff89fa34b09006fd215b1c391585ae2ded73291c6607f1d16aaf3995f8f",
    ),
    (
        "jax-rocm10-pjrt==0.12.0",
        "jax_rocm10_pjrt-0.12.0-py3-none-manylinux_2_27_x86_64.whl",
        "45ee7b471b71a582ce165dd63069b10d1d8923d849b61b6fa8783f1d13294edb",
    ),
    (
        "jax-rocm60-pjrt==0.5.0",
        "jax_rocm60_pjrt-0.5.0-py3-none-manylinux_2_28_x86_64.whl",
        "e8097aa9dde2b759604e7b3f163e50dc83380968002e32fc770a8f91126d1b55",
    ),
    (
        "jax-rocm7-plugin==0.12.0",
        "jax_rocm7_plugin-0.12.0-cp312-cp312-manylinux_2_27_x86_64.whl",
        "56ea9cb8b20b2155307da1c7f81941d6811954d8ce3431ffe8d56aa251b725de",
    ),
]
# The LLVM site (issue 36's memory figure): the same wheels with today's LLVM-carrying ones in place
# of pytorch-triton-rocm 2.1.0: triton 3.8.0 (libtriton.so, a whole LLVM and MLIR) and llvmlite
# 0.50.0 (libllvmlite.so), both large ELF files with huge .dynsym, .dynstr and relocation tables.
LLVM_WHEELS = [
    (
        "triton==3.8.0",
        "triton-3.8.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        "68988ac85d5e7086baeda0ddc175af9667db7529b3c5e11a5c0601b8bef2200a",
    ),
    (
        "llvmlite==0.50.0",
        "llvmlite-0.50.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        "a6ffde00d4be8772a24e3e8b3af6bf86a79e7cf066d944ef56136b3957d707dc",
    ),
]
SITES = {
    "default": WHEELS,
    "llvm": [w for w in WHEELS if not w[0].startswith("pytorch-triton-rocm==")] + LLVM_WHEELS,
}
OPTIONAL_WHEELS: list[tuple[str, str, str | None]] = []  # (spec, file, None): fetched if pip can, sha recorded
PLUGIN = "jax_plugins/xla_rocm7/xla_rocm_plugin.so"
PROVIDER = "onnxruntime/capi/libonnxruntime_providers_rocm.so"
TARGETS = {
    "plugin_verify_wall_s": 0.5,
    "plugin_verify_rss_mb": 60,
    "plugin_scan_vs_floor": 1.6,
    "plugin_scan_rss_mb": 80,
    "site_check_wall_s": 3.0,
    "site_check_rss_mb": 100,
}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# The tests fetch their pinned wheel through tests/support/vendor.py; the bench keeps its own fetch
# (more wheels, its own cache, optional ones) because bench/ must not import tests/.
def fetch(cache: Path, log, site: str = "default") -> tuple[list[Path], list[str]]:
    """The pinned wheels of ``site`` (a key of SITES) in ``cache`` (downloaded when missing, checked
    by sha256)."""
    cache.mkdir(parents=True, exist_ok=True)
    found, notes = [], []
    for spec, name, digest in SITES[site] + OPTIONAL_WHEELS:
        wheel = cache / name
        if not wheel.exists():
            log(f"pip download {spec} ...")
            python_version = "3.12" if "cp312" in name else "3.11"
            platform = name.rsplit("-", 1)[1].removesuffix(".whl").split(".")[0]
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--python-version",
                    python_version,
                    "--platform",
                    platform,
                    "-d",
                    str(cache),
                    spec,
                ],
                capture_output=True,
                text=True,
                timeout=1800,
                check=False,
            )
        if not wheel.exists():
            if digest is None:
                notes.append(f"{spec}: not available from pip here; left out")
                continue
            raise SystemExit(f"bench vendor: cannot fetch {spec}")
        if digest is not None and sha256(wheel) != digest:
            raise SystemExit(f"bench vendor: {wheel} is not the pinned file (sha256 {digest})")
        if digest is None:
            notes.append(f"{name}: sha256 {sha256(wheel)} (optional, recorded here)")
        found.append(wheel)
    return found, notes


def unpack(wheels: list[Path], site: Path, log) -> int:
    """Every wheel into one site-packages (once; a marker names the wheels). Returns its bytes."""
    marker = site / ".bench-wheels"
    wanted = "\n".join(sorted(w.name for w in wheels))
    if not (marker.exists() and marker.read_text() == wanted):
        shutil.rmtree(site, ignore_errors=True)
        site.mkdir(parents=True)
        for wheel in wheels:
            log(f"unpacking {wheel.name} ...")
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(site)
        marker.write_text(wanted)
    return sum(f.stat().st_size for f in site.rglob("*") if f.is_file() and not f.is_symlink())


def baseline_command(rev: str, work: Path) -> tuple[list[str], str]:
    """rocm-audit as of git revision ``rev``: its sources unpacked under the work dir, and a note on
    its compiled zstd frame index (``git archive`` has sources only: the current build's extension
    is copied in when ``rev``'s C sources are the same, else the baseline runs without it)."""
    where = work / f"baseline-{rev}"
    if not (where / "src" / "rocm_audit").exists():
        where.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(HERE.parent), "archive", rev, "src"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    formats = Path("src/rocm_audit/formats")
    sources = [formats / "_zstdindex.c", formats / "_zstdindex_core.h"]
    built = sorted((HERE.parent / formats).glob("_zstdindex.*.so"))
    if not (where / sources[0]).exists():
        note = f"baseline {rev} has no zstd frame index (every CCOB streamed)"
    elif built and all(
        (HERE.parent / one).exists() and (HERE.parent / one).read_bytes() == (where / one).read_bytes()
        for one in sources
    ):
        for extension in built:
            shutil.copy2(extension, where / formats / extension.name)
        note = f"baseline {rev} runs with the current build of its (unchanged) zstd frame index"
    else:
        note = f"baseline {rev}: its zstd frame index is not built here, so every CCOB is streamed"
    command = [
        "env",
        f"PYTHONPATH={where / 'src'}",
        sys.executable,
        "-c",
        "import sys; from rocm_audit.cli.app import entry; sys.argv[0] = 'rocm-audit'; entry()",
    ]
    return command, note


def floor_seconds(library: Path) -> float:
    """In-process seconds to inflate every CCOB of ``library`` (zstd_floor.py, its own process)."""
    done = subprocess.run(
        [sys.executable, str(HERE / "zstd_floor.py"), str(library)], capture_output=True, text=True, check=True
    )
    return float(done.stdout.split(" in ")[1].split(" s")[0])


def bench_vendor(args, ra: list[str], work: Path, log, timed) -> dict:
    cache = Path(os.environ.get("ROCM_AUDIT_BENCH_CACHE", Path.home() / ".cache/rocm-audit-tests/bench"))
    wheels, notes = fetch(cache, log)
    site = work / "vendor-site"
    site_bytes = unpack(wheels, site, log)
    llvm_wheels, llvm_notes = fetch(cache, log, "llvm")
    notes += [n for n in llvm_notes if n not in notes]
    llvm_site = work / "vendor-site-llvm"
    llvm_site_bytes = unpack(llvm_wheels, llvm_site, log)
    plugin, provider = site / PLUGIN, site / PROVIDER
    commands = {"current": ra}
    # The same code reading every CCOB by streaming (no zstd index): the index's share of a figure.
    commands["current, streamed"] = ["env", "ROCM_AUDIT_NO_ZSTD_INDEX=1", *ra]
    if args.baseline:
        commands[f"baseline {args.baseline}"], baseline_note = baseline_command(args.baseline, work)
        notes.append(baseline_note)
    out = work / "out"
    out.mkdir(parents=True, exist_ok=True)
    figures = {
        "plugin verify-arch gfx950": ["verify-arch", "gfx950", "-q", "-p", str(plugin)],
        "plugin verify-arch gfx1010": ["verify-arch", "gfx1010", "-q", "-p", str(plugin)],
        "plugin scan --targets": ["scan", "--targets", "-q", "-p", str(plugin)],
        "provider verify-arch gfx950": ["verify-arch", "gfx950", "-q", "-p", str(provider)],
        "provider scan --targets": ["scan", "--targets", "-q", "-p", str(provider)],
        "site check gfx942 gfx950": ["check", "gfx942", "gfx950", "-q", "-p", str(site)],
        "LLVM site check gfx942 gfx950": ["check", "gfx942", "gfx950", "-q", "-p", str(llvm_site)],
        "--help": ["--help"],  # start-up: at most 0.1 s (issue 36)
    }
    series: dict[str, dict[str, list]] = {f"{who}: {fig}": [] for who in commands for fig in figures}
    series["zstd floor (plugin)"] = []
    series["objcopy + bundler route (plugin)"] = []
    route = work / "route"
    from codeobj import user_route_script

    subprocess.run(["cat", str(plugin), str(provider)], stdout=subprocess.DEVNULL, check=True)  # warm cache
    loads = []
    for run in range(args.runs):
        loads.append(f"{os.getloadavg()[0]:.2f}")
        log(f"vendor run {run + 1}/{args.runs} (load {loads[-1]})")
        for who, command in commands.items():
            for fig, argv in figures.items():
                sample = timed([*command, *argv], stdout=out / "vendor.txt")
                series[f"{who}: {fig}"].append((sample.wall, sample.rss_kb, sample.rc))
        series["zstd floor (plugin)"].append((floor_seconds(plugin), 0, 0))
        if run == 0 and shutil.which("clang-offload-bundler-19") and shutil.which("objcopy"):
            script = user_route_script(plugin, route)
            sample = timed(["bash", "-c", script], stdout=out / "route.txt")
            series["objcopy + bundler route (plugin)"].append((sample.wall, sample.rss_kb, sample.rc))
            shutil.rmtree(route, ignore_errors=True)
    summary = {}
    for name, samples in series.items():
        if not samples:
            continue
        summary[name] = {
            "median_s": round(statistics.median(s[0] for s in samples), 3),
            "walls_s": [round(s[0], 3) for s in samples],
            "rss_mb": round(max(s[1] for s in samples) / 1024, 1),
            "rc": [s[2] for s in samples],
        }
    return {
        "site_bytes": site_bytes,
        "wheels": [w.name for w in wheels],
        "llvm_site_bytes": llvm_site_bytes,
        "llvm_wheels": [w.name for w in llvm_wheels if w not in wheels],
        "llvm_left_out": [w.name for w in wheels if w not in llvm_wheels],
        "notes": [*notes, f"1-minute load average at the start of each run: {', '.join(loads)}"],
        "figures": summary,
        "floor_note": "zstd floor: in-process seconds, one decompression context, no interpreter start",
    }


def report(res: dict, path: Path, machine: dict, load: tuple[str, str]) -> str:
    figures = res["figures"]
    floor = figures.get("zstd floor (plugin)", {}).get("median_s")
    route = figures.get("objcopy + bundler route (plugin)", {}).get("median_s")
    lines = [
        "# rocm-audit vendor code-object benchmark (`bench/run --only vendor`)",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; machine: {machine}; load average at start/end: "
        f"{load[0]} / {load[1]}.",
        f"Site-packages: {res['site_bytes'] / 1e9:.2f} GB unpacked from {len(res['wheels'])} wheels: "
        + ", ".join(res["wheels"])
        + ".",
        f"LLVM site: {res['llvm_site_bytes'] / 1e9:.2f} GB, the same wheels with "
        + ", ".join(res["llvm_wheels"])
        + " in place of "
        + ", ".join(res["llvm_left_out"])
        + ".",
        "",
        "| figure | median wall (s) | runs (s) | peak RSS (MB) | vs zstd floor | vs route |",
        "|---|---|---|---|---|---|",
    ]
    for name, f in figures.items():
        ratio = f"{f['median_s'] / floor:.2f}x" if floor and "plugin" in name and "floor" not in name else ""
        vs_route = (
            f"{route / f['median_s']:.1f}x faster" if route and name.endswith("plugin verify-arch gfx950") else ""
        )
        lines.append(
            f"| {name} | {f['median_s']:.3f} | {', '.join(map(str, f['walls_s']))} | {f['rss_mb']} | "
            f"{ratio} | {vs_route} |"
        )
    lines += ["", *[f"- {n}" for n in [res["floor_note"], *res["notes"]]], ""]
    text = "\n".join(lines)
    path.write_text(text)
    return text
