#!/usr/bin/env python3
"""Decompression floors of real gzip image layers, against `rocm-audit image --archive` (issue 39).

    python bench/image_layers.py [--wheels DIR] [--work DIR] [--layers N] [--runs 3] [--keep]

Builds a `docker save` archive (gzip layers) whose layers are site-packages of real ROCm-carrying
wheels (the largest wheels of DIR, default ~/.cache/rocm-audit-tests, split over N layers), then
measures, each the median of interleaved runs with a warm page cache:
- decompressing every layer alone: `zcat`, Python's `gzip`, python-isal's igzip, zlib-ng
  (each absent library is reported, not faked);
- the same layers decompressed in parallel (one thread per layer, isal or zlib-ng);
- `rocm-audit check` on the same files unpacked (the checks' own time: the target is
  image <= 1.3 x (the igzip floor + this));
- `rocm-audit image --archive` on the archive (wall and peak RSS from /usr/bin/time when present).
Prints a Markdown table; `--json` prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import hashlib
import io
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import zipfile
import zlib
from pathlib import Path

CHUNK = 1 << 20


def build(wheels: list[Path], work: Path, layer_count: int) -> tuple[Path, list[Path]]:
    """A docker-save archive of ``layer_count`` gzip layers; wheels spread round-robin by size."""
    work.mkdir(parents=True, exist_ok=True)
    archive = work / "image.tar"
    blobs = [work / f"layer{i}.tar.gz" for i in range(layer_count)]
    if archive.exists() and all(b.exists() for b in blobs):
        return archive, blobs
    groups: list[list[Path]] = [[] for _ in range(layer_count)]
    for i, wheel in enumerate(sorted(wheels, key=lambda p: -p.stat().st_size)):
        groups[i % layer_count].append(wheel)
    digests = []
    for blob, group in zip(blobs, groups, strict=True):
        with gzip.open(blob, "wb", compresslevel=6) as raw, tarfile.open(fileobj=raw, mode="w|") as tar:
            for wheel in group:
                with zipfile.ZipFile(wheel) as zf:
                    for info in zf.infolist():
                        if info.is_dir():
                            continue
                        member = tarfile.TarInfo(f"usr/lib/python3/site-packages/{info.filename}")
                        member.size = info.file_size
                        member.mode = 0o755 if info.filename.endswith(".so") or ".so." in info.filename else 0o644
                        with zf.open(info) as data:
                            tar.addfile(member, data)
        digests.append(_sha256(blob))
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": ["PATH=/usr/bin"]},
            "rootfs": {"type": "layers", "diff_ids": []},
        }
    ).encode()
    manifest = [{"Config": "config.json", "RepoTags": ["bench:layers"], "Layers": [b.name for b in blobs]}]
    with tarfile.open(archive, "w") as tar:
        for name, data in (("manifest.json", json.dumps(manifest).encode()), ("config.json", config)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for blob in blobs:
            tar.add(blob, arcname=blob.name)
    return archive, blobs


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while piece := handle.read(CHUNK):
            digest.update(piece)
    return digest.hexdigest()


def _inflate_with(module: object, path: Path) -> int:
    inflater = module.decompressobj(16 + 15)  # type: ignore[attr-defined]
    total = 0
    with open(path, "rb") as handle:
        while piece := handle.read(CHUNK):
            total += len(inflater.decompress(piece))
    return total


def _python_gzip(path: Path) -> int:
    total = 0
    with gzip.open(path, "rb") as handle:
        while piece := handle.read(CHUNK):
            total += len(piece)
    return total


def deciders() -> dict[str, object]:
    found: dict[str, object] = {"zlib": zlib}
    try:
        from isal import isal_zlib

        found["isal"] = isal_zlib
    except ImportError:
        pass
    try:
        from zlib_ng import zlib_ng

        found["zlib-ng"] = zlib_ng
    except ImportError:
        pass
    return found


def timed(action) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def measure(archive: Path, blobs: list[Path], runs: int, rocm_audit: str, floors: bool) -> dict[str, list[float]]:
    libs = deciders() if floors else {}
    jobs = (
        {}
        if not floors
        else {
            "zcat (all layers, one after another)": lambda: [
                subprocess.run(["zcat", str(b)], stdout=subprocess.DEVNULL, check=True) for b in blobs
            ],
            "Python gzip (one after another)": lambda: [_python_gzip(b) for b in blobs],
        }
    )
    for name, module in libs.items():
        jobs[f"{name} decompressobj (one after another)"] = lambda m=module: [_inflate_with(m, b) for b in blobs]
        if name != "zlib":
            jobs[f"{name} decompressobj (a thread per layer)"] = lambda m=module: _parallel(m, blobs)
    tree = archive.parent / "tree"
    if not tree.exists():
        tree.mkdir()
        for blob in blobs:
            subprocess.run(["tar", "-xzf", str(blob), "-C", str(tree)], check=True)
    jobs["rocm-audit check on the same files, unpacked (the checks' own time)"] = lambda: subprocess.run(
        [*shlex.split(rocm_audit), "check", "-p", str(tree / "usr/lib/python3/site-packages")]
        + ["gfx942", "gfx950", "-q", "--format", "json"],
        stdout=subprocess.DEVNULL,
        check=False,
    )
    jobs["rocm-audit image --archive"] = lambda: subprocess.run(
        [
            *shlex.split(rocm_audit),
            "image",
            "--archive",
            str(archive),
            "-t",
            "gfx942",
            "-t",
            "gfx950",
            "-q",
            "--format",
            "json",
        ],
        stdout=subprocess.DEVNULL,
        check=False,
    )
    times: dict[str, list[float]] = {name: [] for name in jobs}
    names = list(jobs)
    for run in range(runs):
        for name in names[run % len(names) :] + names[: run % len(names)]:
            times[name].append(timed(jobs[name]))
    return times


def _parallel(module: object, blobs: list[Path]) -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(blobs), os.cpu_count() or 1)) as pool:
        list(pool.map(lambda b: _inflate_with(module, b), blobs))


def peak_rss(archive: Path, rocm_audit: str) -> int | None:
    if not shutil.which("/usr/bin/time") and not os.path.exists("/usr/bin/time"):
        return None
    done = subprocess.run(
        [
            "/usr/bin/time",
            "-f",
            "%M",
            *shlex.split(rocm_audit),
            "image",
            "--archive",
            str(archive),
            "-q",
            "--format",
            "json",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    last = done.stderr.strip().splitlines()[-1:] or [""]
    return int(last[0]) * 1024 if last[0].isdigit() else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheels", type=Path, default=Path.home() / ".cache" / "rocm-audit-tests")
    parser.add_argument("--work", type=Path, default=Path(__file__).parent / "work" / "image_layers")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--count", type=int, default=4, help="how many of the largest wheels")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--rocm-audit",
        default=shutil.which("rocm-audit") or "rocm-audit",
        help="the command to time (a shell word list: 'env PYTHONPATH=OLD/src python -m rocm_audit' for a baseline)",
    )
    parser.add_argument("--skip-floors", action="store_true", help="time rocm-audit only")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    wheels = sorted(args.wheels.glob("*.whl"), key=lambda p: -p.stat().st_size)[: args.count]
    if not wheels:
        print(f"no wheels in {args.wheels}", file=sys.stderr)
        return 2
    archive, blobs = build(wheels, args.work, args.layers)
    sizes = {b.name: (b.stat().st_size, _inflate_with(zlib, b)) for b in blobs}
    times = measure(archive, blobs, args.runs, args.rocm_audit, not args.skip_floors)
    rss = peak_rss(archive, args.rocm_audit)
    figures = {
        "wheels": [w.name for w in wheels],
        "layers": {name: {"gzip_bytes": gz, "tar_bytes": tar} for name, (gz, tar) in sizes.items()},
        "median_seconds": {name: round(statistics.median(v), 2) for name, v in times.items()},
        "rocm_audit_peak_rss_bytes": rss,
        "cpus": os.cpu_count(),
        "load": os.getloadavg()[0],
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(f"wheels: {', '.join(figures['wheels'])}; load {figures['load']:.1f}, {figures['cpus']} CPUs")
        for name, (gz, tar) in sizes.items():
            print(f"- {name}: {gz / 2**20:.0f} MiB gzip, {tar / 2**20:.0f} MiB tar")
        print("\n| what | median s |\n|---|---|")
        for name, value in figures["median_seconds"].items():
            print(f"| {name} | {value} |")
        if rss:
            print(f"\nrocm-audit image --archive peak RSS: {rss / 2**20:.0f} MiB")
    if not args.keep:
        shutil.rmtree(args.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
