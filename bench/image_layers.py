#!/usr/bin/env python3
"""Decompression floors of real gzip image layers, against `rocm-audit image --archive` (issue 39).

    python bench/image_layers.py [--wheels DIR] [--work DIR] [--layers N] [--runs 3] [--keep]
    python bench/image_layers.py --layer DIR:PREFIX[:NAME,NAME] --layer ... [--skip-floors]

Builds a `docker save` archive (gzip layers) whose layers are site-packages of real ROCm-carrying
wheels (the largest wheels of DIR, default ~/.cache/rocm-audit-tests, split over N layers), then
measures, each the median of interleaved runs with a warm page cache:
- decompressing every layer alone: `zcat`, Python's `gzip`, python-isal's igzip, zlib-ng
  (each absent library is reported, not faked);
- the same layers decompressed in parallel (one thread per layer, isal or zlib-ng);
- `rocm-audit check` on the same files unpacked (the checks' own time: the target is
  image <= 1.3 x (the igzip floor + this));
- `rocm-audit image --archive` on the archive (wall time), and in one run of its own its peak RSS
  (bench/rss_exec.c) and its scratch disk at its largest (the private work directory under a
  TMPDIR of its own, its allocated blocks polled every 0.2 s), with a digest of its findings so
  two builds can be compared on the same archive;
- with `--scratch-on DIR` (a tmpfs such as /dev/shm), the same `image` run with TMPDIR=DIR in the
  same rotation, and a probe of what the default scratch file system charges for new inodes:
  4,000 empty files created in a fresh directory there, then removed (on ext4, creating a file
  scans past inodes freed in the last minutes: an `image` run frees thousands when it removes its
  scratch, and the next run pays for them; docs/benchmarks.md).
`--layer DIR:PREFIX` (repeatable) builds one layer per option instead: every wheel of DIR (or only
the wheels whose names start with one of the comma-separated NAMEs) unpacked under PREFIX; the
same PREFIX in a later layer overwrites the files of the layer below (a reinstall).
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
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
import zlib
from pathlib import Path

CHUNK = 1 << 20


SITE = "usr/lib/python3/site-packages"


def round_robin(wheels: list[Path], layer_count: int) -> list[tuple[list[Path], str]]:
    """The wheels spread round-robin by size over ``layer_count`` layers, all under SITE."""
    groups: list[list[Path]] = [[] for _ in range(layer_count)]
    for i, wheel in enumerate(sorted(wheels, key=lambda p: -p.stat().st_size)):
        groups[i % layer_count].append(wheel)
    return [(group, SITE) for group in groups]


def from_specs(specs: list[str]) -> list[tuple[list[Path], str]]:
    """``DIR:PREFIX[:NAME,NAME]`` per layer: the wheels of DIR (those starting with a NAME) at PREFIX."""
    layers = []
    for spec in specs:
        folder, prefix, *names = spec.split(":")
        wanted = [n for n in (names[0].split(",") if names else []) if n]
        wheels = sorted(
            p for p in Path(folder).expanduser().glob("*.whl") if not wanted or p.name.startswith(tuple(wanted))
        )
        layers.append((wheels, prefix.strip("/")))
    return layers


def build(layers: list[tuple[list[Path], str]], work: Path) -> tuple[Path, list[Path]]:
    """A docker-save archive of one gzip layer (level 6) per entry of ``layers``."""
    work.mkdir(parents=True, exist_ok=True)
    archive = work / "image.tar"
    blobs = [work / f"layer{i}.tar.gz" for i in range(len(layers))]
    if archive.exists() and all(b.exists() for b in blobs):
        return archive, blobs
    for blob, (group, prefix) in zip(blobs, layers, strict=True):
        if blob.exists():
            continue  # a kept work directory: only the archive around the blobs is written again
        partial = blob.with_suffix(".partial")
        with gzip.open(partial, "wb", compresslevel=6) as raw, tarfile.open(fileobj=raw, mode="w|") as tar:
            for wheel in group:
                with zipfile.ZipFile(wheel) as zf:
                    for info in zf.infolist():
                        if info.is_dir():
                            continue
                        member = tarfile.TarInfo(f"{prefix}/{info.filename}")
                        member.size = info.file_size
                        member.mode = 0o755 if info.filename.endswith(".so") or ".so." in info.filename else 0o644
                        with zf.open(info) as data:
                            tar.addfile(member, data)
        partial.rename(blob)
    # The config's diff_ids (the uncompressed layers' digests) make it an archive `docker load` and
    # skopeo accept, so the same image can be pushed to a registry and audited from there.
    diff_ids = [f"sha256:{_sha256(blob, inflate=True)}" for blob in blobs]
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": ["PATH=/usr/bin"]},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
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


def _sha256(path: Path, inflate: bool = False) -> str:
    digest = hashlib.sha256()
    with gzip.open(path, "rb") if inflate else open(path, "rb") as handle:
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


def measure(
    archive: Path,
    blobs: list[Path],
    prefixes: list[str],
    runs: int,
    rocm_audit: str,
    floors: bool,
    baseline: str | None = None,
    scratch_on: Path | None = None,
) -> dict[str, list[float]]:
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
    sites = sorted({str(tree / prefix) for prefix in prefixes})
    jobs["rocm-audit check on the same files, unpacked (the checks' own time)"] = lambda: subprocess.run(
        [*shlex.split(rocm_audit), "check", *[w for site in sites for w in ("-p", site)]]
        + ["gfx942", "gfx950", "-q", "--format", "json"],
        stdout=subprocess.DEVNULL,
        check=False,
    )
    builds = {"rocm-audit image --archive": rocm_audit}
    if baseline:
        builds["rocm-audit image --archive (baseline build)"] = baseline
    if scratch_on is not None:
        builds[f"rocm-audit image --archive, TMPDIR={scratch_on}"] = (
            f"env TMPDIR={shlex.quote(str(scratch_on))} {rocm_audit}"
        )
        jobs["create and remove 4,000 files in the default TMPDIR (the inode probe)"] = _inode_probe
    for name, command in builds.items():
        image = [*shlex.split(command), "image", "--archive", str(archive), "-t", "gfx942", "-t", "gfx950"]
        jobs[name] = lambda image=image: subprocess.run(
            [*image, "-q", "--format", "json"], stdout=subprocess.DEVNULL, check=False
        )
    times: dict[str, list[float]] = {name: [] for name in jobs}
    names = list(jobs)
    for run in range(runs):
        for name in names[run % len(names) :] + names[: run % len(names)]:
            times[name].append(timed(jobs[name]))
    return times


def _inode_probe() -> None:
    """Create 4,000 empty files in 40 directories of a fresh directory under the default TMPDIR, as
    an image's scratch does, then remove them (timed as a whole)."""
    folder = Path(tempfile.mkdtemp(prefix="inode-probe-"))
    try:
        for d in range(40):
            (folder / str(d)).mkdir()
            for f in range(100):
                os.close(os.open(folder / str(d) / f"{f}.h", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    finally:
        shutil.rmtree(folder)


def _parallel(module: object, blobs: list[Path]) -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(blobs), os.cpu_count() or 1)) as pool:
        list(pool.map(lambda b: _inflate_with(module, b), blobs))


def footprint(archive: Path, rocm_audit: str, work: Path) -> dict[str, object]:
    """One `image --archive` run: peak RSS (rss_exec), scratch disk at its largest, findings digest."""
    rss_exec = work / "rss_exec"
    if not rss_exec.exists():
        subprocess.run(["gcc", "-O2", "-o", str(rss_exec), str(Path(__file__).parent / "rss_exec.c")], check=True)
    scratch = work / "scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    report = work / "report.json"
    rss_file = work / "rss.txt"
    command = [str(rss_exec), str(rss_file), *shlex.split(rocm_audit), "image", "--archive", str(archive)]
    command += ["-t", "gfx942", "-t", "gfx950", "-q", "--format", "json", "-o", str(report)]
    env = {**os.environ, "TMPDIR": str(scratch)}
    peak = 0
    with subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL) as process:
        while process.poll() is None:
            peak = max(peak, _allocated(scratch))
            time.sleep(0.2)
    # The private view's own path (in texts) and inode numbers differ from run to run: not compared.
    text = re.sub(r"[^\"\s]*/rocm-audit-image-[A-Za-z0-9_]+/rootfs", "", report.read_text())
    document = json.loads(text)
    findings = sorted(json.dumps(f, sort_keys=True) for f in document.get("findings", []))
    waste = (document.get("image") or {}).get("waste")
    return {
        "peak_rss_bytes": int(rss_file.read_text()) * 1024,
        "scratch_peak_bytes": peak,
        "findings": len(findings),
        "findings_digest": hashlib.sha256("\n".join(findings).encode()).hexdigest()[:16],
        "waste_digest": hashlib.sha256(json.dumps(waste, sort_keys=True).encode()).hexdigest()[:16],
    }


def _allocated(folder: Path) -> int:
    """Bytes of disk the files under ``folder`` occupy (allocated blocks: sparse files count what they hold)."""
    total = 0
    for directory, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
            except OSError:
                continue
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheels", type=Path, default=Path.home() / ".cache" / "rocm-audit-tests")
    parser.add_argument("--work", type=Path, default=Path(__file__).parent / "work" / "image_layers")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--count", type=int, default=4, help="how many of the largest wheels")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--layer", action="append", default=[], help="DIR:PREFIX[:NAME,...], one layer each")
    parser.add_argument(
        "--rocm-audit",
        default=shutil.which("rocm-audit") or "rocm-audit",
        help="the command to time (a shell word list: 'env PYTHONPATH=OLD/src python -m rocm_audit' for a baseline)",
    )
    parser.add_argument("--baseline", help="another build to time in the same rotation (a shell word list)")
    parser.add_argument("--skip-floors", action="store_true", help="time rocm-audit only")
    parser.add_argument(
        "--scratch-on", type=Path, help="also time image with TMPDIR here (a tmpfs), and the inode probe"
    )
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    wheels = sorted(args.wheels.glob("*.whl"), key=lambda p: -p.stat().st_size)[: args.count]
    layers = from_specs(args.layer) if args.layer else round_robin(wheels, args.layers)
    if not all(group for group, _ in layers):
        print("a layer without wheels (check --wheels or --layer)", file=sys.stderr)
        return 2
    archive, blobs = build(layers, args.work)
    sizes = {b.name: (b.stat().st_size, _inflate_with(zlib, b)) for b in blobs}
    prefixes = [prefix for _, prefix in layers]
    times = measure(
        archive, blobs, prefixes, args.runs, args.rocm_audit, not args.skip_floors, args.baseline, args.scratch_on
    )
    once = footprint(archive, args.rocm_audit, args.work)
    before = footprint(archive, args.baseline, args.work) if args.baseline else None
    rss = once["peak_rss_bytes"]
    figures = {
        "wheels": [w.name for group, _ in layers for w in group],
        "footprint": once,
        "baseline_footprint": before,
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
        tar_total = sum(tar for _, tar in sizes.values())
        scratch = once["scratch_peak_bytes"]
        print(f"\nrocm-audit image --archive peak RSS: {rss / 2**20:.0f} MiB; scratch disk at its largest")
        print(f"{scratch / 2**20:.0f} MiB ({100 * scratch / tar_total:.0f}% of {tar_total / 2**20:.0f} MiB of tar);")
        print(f"{once['findings']} findings, digest {once['findings_digest']}, waste digest {once['waste_digest']}")
        if before:
            rss_mib, scratch_mib = before["peak_rss_bytes"] / 2**20, before["scratch_peak_bytes"] / 2**20
            print(f"baseline: peak RSS {rss_mib:.0f} MiB, scratch {scratch_mib:.0f} MiB;")
            print(f"{before['findings']} findings, digest {before['findings_digest']}, waste {before['waste_digest']}")
    if not args.keep:
        shutil.rmtree(args.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
