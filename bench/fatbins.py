#!/usr/bin/env python3
"""`prune --fatbins` on real vendor wheels pinned by sha256 (issue 38, item 4).

    python bench/fatbins.py [--work DIR] [--targets gfx942 gfx950] [--out bench/FATBINS_RESULTS.md]

Wheels (bench/vendor.py pins them; fetched with ``pip download --no-deps`` into the bench cache):
onnxruntime-rocm 1.22.2.post3 (plain bundles, `.hip_fatbin` ends its segment), cupy-rocm-7-0
14.2.0 and pyg-lib-rocm 0.8.0.post2 (plain bundles mid-segment), jax-rocm7-pjrt 0.12.0 (CCOB v3
zstd). Each is unpacked into a fresh site-packages of its own, then:

1. ``prune --fatbins --dry-run`` (JSON): the device bytes no kept target can use, per library;
2. ``verify-arch`` JSON for the kept targets, before;
3. ``prune --fatbins --backup`` (wall time and peak RSS of the process and its children, from
   rss_exec.c's ``wait4``);
4. per slimmed library: bytes on disk and ``gzip -6`` bytes (Go's and Docker's default level for
   layers), before and after;
5. ``verify-arch`` JSON after (the kept targets' verdicts must be unchanged) and for one removed
   target (it must be reported missing).

Seconds per GB: the apply's wall time over the bytes of the libraries it read (plain bundles) or
the inflated bytes of their CCOBs (``prune`` JSON ``totals.inflated_bytes``), whichever is larger.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import vendor

WHEELS = ("onnxruntime-rocm==", "cupy-rocm-7-0==", "pyg-lib-rocm==", "jax-rocm7-pjrt==")
REMOVED_PROBE = "gfx90a"  # a target every one of these wheels carries and the kept set does not
CHUNK = 1 << 20


def gzip6(path: Path) -> int:
    """Bytes of ``path`` compressed as a Docker layer compresses it (gzip, level 6)."""
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)
    size = 0
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            size += len(packer.compress(block))
    return size + len(packer.flush())


def rss_exec(work: Path) -> list[str]:
    binary = work / "rss_exec"
    if not binary.exists():
        subprocess.run(["gcc", "-O2", "-o", str(binary), str(HERE / "rss_exec.c")], check=True)
    return [str(binary), str(work / "rss_exec.out")]


def run_json(rocm_audit: list[str], argv: list[str], out: Path, measure: list[str] | None = None) -> dict:
    """Run one rocm-audit command writing JSON to ``out``; adds ``_wall_s``, ``_rss_mb``, ``_rc``."""
    start = time.perf_counter()
    done = subprocess.run(
        [*(measure or []), *rocm_audit, *argv, "--format", "json", "-o", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    if not out.exists():
        raise SystemExit(f"bench fatbins: {' '.join(argv)} wrote no report: {done.stderr[-2000:]}")
    report = json.loads(out.read_text())
    report["_wall_s"], report["_rc"] = wall, done.returncode
    if measure:
        report["_rss_mb"] = int(Path(measure[1]).read_text()) / 1024
    return report


def verdicts(report: dict) -> dict[str, object]:
    """verify-arch's verdict per carrier and target (how it is served, the translation units
    without it, what is missing), keyed by the path inside site-packages."""
    return {
        carrier["path"].split("site-packages/")[-1]: (carrier["matches"], carrier["missing"])
        for carrier in report.get("carriers", [])
    }


def missing_everywhere(report: dict, target: str) -> bool:
    """Every carrier reports ``target`` missing."""
    carriers = report.get("carriers", [])
    return bool(carriers) and all(target in carrier["missing"] for carrier in carriers)


CORE = r"""
import os, sys, time
from rocm_audit.prune.fatbins.library import prove_file, slim_library
from rocm_audit.tree.targets import kept_target
kept = [kept_target(t) for t in sys.argv[2].split(",")]
out = sys.argv[1] + ".bench-slim"
start = time.perf_counter()
with open(sys.argv[1], "rb") as src, open(out, "w+b") as dst:
    os.copy_file_range(src.fileno(), dst.fileno(), os.fstat(src.fileno()).st_size, 0, 0)
    workers = int(sys.argv[3]) if sys.argv[3] else None
    result = slim_library(sys.argv[1], kept, dst.fileno(), spool_dir=os.path.dirname(out), workers=workers)
    assert prove_file(src.fileno(), dst.fileno(), result) is None
print(time.perf_counter() - start)
os.unlink(out)
"""


def core_seconds(library: Path, targets: list[str], measure: list[str], workers: int | None) -> tuple[float, float]:
    """In-process seconds and peak RSS (MB) of the slimming itself on one library: the copy, every
    bundle slimmed and written, the layout, the proof; no walk, journal, backup, hash or fsync.
    ``workers``: bundles slimmed at once (None: as prune decides)."""
    done = subprocess.run(
        [*measure, sys.executable, "-c", CORE, str(library), ",".join(targets), str(workers or "")],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout.split()[-1]), int(Path(measure[1]).read_text()) / 1024


def bench_wheel(
    wheel: Path, work: Path, rocm_audit: list[str], measure: list[str], targets: list[str], workers: int | None
) -> dict:
    site = work / f"site-{wheel.name.split('-')[0]}" / "site-packages"
    shutil.rmtree(site.parent, ignore_errors=True)
    site.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    out = work / "out"
    out.mkdir(exist_ok=True)
    tag = site.parent.name
    dry = run_json(rocm_audit, ["prune", "--fatbins", "--dry-run", "-p", str(site), *targets], out / f"{tag}.dry.json")
    libraries = [Path(row["path"]) for row in dry["prune_fatbins"]["libraries"] if row["status"] == "planned"]
    unused = sum(row["unused_bytes"] for row in dry["prune"]["weight"])
    before = {lib: (lib.stat().st_size, gzip6(lib)) for lib in libraries}
    core = [core_seconds(lib, targets, measure, workers) for lib in libraries]
    arch_before = run_json(rocm_audit, ["verify-arch", "-p", str(site), *targets], out / f"{tag}.arch0.json")
    applied = run_json(
        rocm_audit,
        ["prune", "--fatbins", "-p", str(site), "--backup", str(work / f"{tag}.backup"), *targets],
        out / f"{tag}.apply.json",
        measure,
    )
    after = {lib: (lib.stat().st_size, gzip6(lib)) for lib in libraries}
    arch_after = run_json(rocm_audit, ["verify-arch", "-p", str(site), *targets], out / f"{tag}.arch1.json")
    removed = run_json(rocm_audit, ["verify-arch", "-p", str(site), REMOVED_PROBE], out / f"{tag}.arch2.json")
    read_bytes = sum(size for size, _ in before.values())
    inflated = dry["prune"]["totals"].get("inflated_bytes", 0)
    shutil.rmtree(work / f"{tag}.backup", ignore_errors=True)
    return {
        "wheel": wheel.name,
        "libraries": len(libraries),
        "disk_before": read_bytes,
        "disk_after": sum(size for size, _ in after.values()),
        "gzip_before": sum(g for _, g in before.values()),
        "gzip_after": sum(g for _, g in after.values()),
        "unused_device_bytes": unused,
        "inflated_bytes": inflated,
        "wall_s": applied["_wall_s"],
        "rss_mb": applied["_rss_mb"],
        "rc": applied["_rc"],
        "layouts": sorted({row.get("layout", "?") for row in applied["prune_fatbins"]["libraries"]}),
        "s_per_gb": applied["_wall_s"] / (max(read_bytes, inflated) / 1e9) if read_bytes else 0.0,
        "core_s": sum(c[0] for c in core),
        "core_rss_mb": max((c[1] for c in core), default=0.0),
        "core_s_per_gb": sum(c[0] for c in core) / (max(read_bytes, inflated) / 1e9) if read_bytes else 0.0,
        "verdicts_unchanged": verdicts(arch_before) == verdicts(arch_after),
        "removed_reported_missing": missing_everywhere(removed, REMOVED_PROBE),
    }


def mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f}"


def table(rows: list[dict], targets: list[str], load: str) -> str:
    lines = [
        "# `prune --fatbins` on real vendor wheels (`python bench/fatbins.py`)",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M %Z')}; kept {' '.join(targets)}; 1-minute load average at"
        f" start {load}; each wheel in a site-packages of its own.",
        "",
        "| wheel | libraries | on disk MiB before -> after | removed / unused device bytes | gzip -6 MiB"
        " before -> after | wall s | s/GB | peak RSS MB | slimming s, s/GB, MB | layouts | kept verdicts same | "
        f"{REMOVED_PROBE} missing after |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        removed = row["disk_before"] - row["disk_after"]
        share = f"{100 * removed / row['unused_device_bytes']:.0f}%" if row["unused_device_bytes"] else "-"
        lines.append(
            f"| {row['wheel'].split('-manylinux')[0]} | {row['libraries']} | {mib(row['disk_before'])} -> "
            f"{mib(row['disk_after'])} | {share} | {mib(row['gzip_before'])} -> {mib(row['gzip_after'])} | "
            f"{row['wall_s']:.1f} | {row['s_per_gb']:.2f} | {row['rss_mb']:.0f} | {row['core_s']:.1f}, "
            f"{row['core_s_per_gb']:.2f}, {row['core_rss_mb']:.0f} | {', '.join(row['layouts'])} | "
            f"{'yes' if row['verdicts_unchanged'] else 'NO'} | {'yes' if row['removed_reported_missing'] else 'NO'} |"
        )
    lines += [
        "",
        "Removed / unused: bytes freed on disk over the device bytes `prune --dry-run` weighs as usable by",
        "no kept target (for CCOBs that weight is of the inflated code, so the share understates the",
        "compressed bytes removed; over 100% means the alignment padding between entries went too).",
        "s/GB: wall time over the larger of the libraries' bytes and the inflated bytes of their CCOBs.",
        "wall s, peak RSS: the whole `prune --fatbins --backup` command (interpreter start, walk, plan,",
        "journal with each library's sha256, each library slimmed once and proved, backup copy, fsync,",
        "RECORD). Slimming: the same library",
        "slimmed in one process by `slim_library` and proved by `prove_file` (copy, bundles, layout,",
        "proof), no walk, journal, backup, hash or fsync.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=HERE / "work" / "fatbins")
    parser.add_argument("--targets", nargs="+", default=["gfx942", "gfx950"])
    parser.add_argument("--out", type=Path, default=HERE / "FATBINS_RESULTS.md")
    parser.add_argument("--only", default=None, help="only the wheels whose file name starts with this")
    parser.add_argument("--rocm-audit", default=None, help="the command to measure (default: this interpreter's)")
    parser.add_argument(
        "--workers", type=int, default=None, help="threads of the slimming-alone column (default: as prune decides)"
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    cache = Path(os.environ.get("ROCM_AUDIT_BENCH_CACHE", Path.home() / ".cache/rocm-audit-tests/bench"))
    wheels, _notes = vendor.fetch(cache, lambda m: print(m, file=sys.stderr), "default")
    chosen = [
        w for prefix in WHEELS for w in wheels if any(s.startswith(prefix) for s, n, _ in vendor.WHEELS if n == w.name)
    ]
    chosen = [w for w in chosen if args.only is None or w.name.startswith(args.only)]
    rocm_audit = args.rocm_audit.split() if args.rocm_audit else [sys.executable, "-m", "rocm_audit"]
    load = f"{os.getloadavg()[0]:.2f}"
    rows = []
    for wheel in chosen:
        print(f"bench fatbins: {wheel.name} ...", file=sys.stderr)
        rows.append(bench_wheel(wheel, args.work, rocm_audit, rss_exec(args.work), args.targets, args.workers))
    text = table(rows, args.targets, load)
    args.out.write_text(text)
    (args.work / "fatbins.json").write_text(json.dumps(rows, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
