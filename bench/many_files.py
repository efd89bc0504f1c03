#!/usr/bin/env python3
"""`rocm-audit image` and `check` on a tree of many small files: the cost per file.

    python bench/many_files.py [--files 300000] [--runs 3] [--work DIR]
        [--rocm-audit COMMAND] [--baseline 'env PYTHONPATH=OLD/src python -m rocm_audit']

Real images hold hundreds of thousands of files (a Python environment's modules, headers, data),
most of them small and none of them device code; what `image` and `check` spend on each is what
such an image costs beyond its large libraries. Builds a one-layer `docker save` archive of
``--files`` Python modules under site-packages (1,000 to a package, 7-30 bytes each), times
`image --archive` on it and `check` on the same files unpacked, medians of interleaved runs, with
TMPDIR on /dev/shm when it exists (what the file system charges per file is a matter of its own:
docs/benchmarks.md, "The scratch's file system"). Peak RSS from /usr/bin/time when it is there.
"""

from __future__ import annotations

import argparse
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
from pathlib import Path

SITE = "usr/lib/python3/site-packages"
# This checkout's sources under this interpreter (a bare `python` may be one without rocm-audit's
# dependencies: every run would fail at once and be timed as a result).
THIS_BUILD = f"env PYTHONPATH={Path(__file__).resolve().parent.parent / 'src'} {sys.executable} -m rocm_audit"


def build(work: Path, count: int) -> tuple[Path, Path]:
    """The archive (one gzip layer of ``count`` modules) and the same tree unpacked."""
    work.mkdir(parents=True, exist_ok=True)
    archive, tree = work / f"many-{count}.tar", work / f"many-{count}"
    if archive.exists() and tree.exists():
        return archive, tree
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as layer:
        for i in range(count):
            data = b"x = %d\n" % i * (1 + i % 3)
            info = tarfile.TarInfo(f"{SITE}/pkg{i // 1000}/sub/module_{i:07d}_with_a_longer_name.py")
            info.size = len(data)
            layer.addfile(info, io.BytesIO(data))
    tar = raw.getvalue()
    diff_id = "sha256:" + hashlib.sha256(tar).hexdigest()
    config = {"architecture": "amd64", "os": "linux", "config": {}, "rootfs": {"type": "layers", "diff_ids": [diff_id]}}
    manifest = [{"Config": "config.json", "RepoTags": ["many:1"], "Layers": ["layer.tar.gz"]}]
    with tarfile.open(archive, "w") as out:
        for name, data in (
            ("manifest.json", json.dumps(manifest).encode()),
            ("config.json", json.dumps(config).encode()),
            ("layer.tar.gz", gzip.compress(tar, 1)),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir()
    with tarfile.open(fileobj=io.BytesIO(tar)) as layer:
        layer.extractall(tree, filter="data")
    return archive, tree


def timed(command: list[str], env: dict[str, str]) -> tuple[float, int | None]:
    """Wall seconds and peak RSS in KiB (None without /usr/bin/time)."""
    wrapper = ["/usr/bin/time", "-f", "%M"] if os.path.exists("/usr/bin/time") else []
    start = time.perf_counter()
    done = subprocess.run([*wrapper, *command], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1):  # 1: findings; anything else is a run that did not audit
        raise SystemExit(f"{shlex.join(command)} exited {done.returncode}:\n{done.stderr}")
    lines = done.stderr.strip().splitlines()
    return elapsed, int(lines[-1]) if wrapper and lines and lines[-1].isdigit() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path(__file__).parent / "work" / "many")
    parser.add_argument("--rocm-audit", default=THIS_BUILD)
    parser.add_argument("--baseline")
    args = parser.parse_args()
    archive, tree = build(args.work, args.files)
    env = {**os.environ, **({"TMPDIR": "/dev/shm"} if os.path.isdir("/dev/shm") else {})}
    builds = {"this build": args.rocm_audit, **({"baseline": args.baseline} if args.baseline else {})}
    jobs = {}
    for label, command in builds.items():
        jobs[f"image --archive ({label})"] = [*shlex.split(command), "image", "--archive", str(archive), "gfx942"]
        jobs[f"check on the tree ({label})"] = [*shlex.split(command), "check", "-p", str(tree / SITE), "gfx942"]
    results: dict[str, list[tuple[float, int | None]]] = {name: [] for name in jobs}
    names = list(jobs)
    for run in range(args.runs):
        for name in names[run % len(names) :] + names[: run % len(names)]:
            results[name].append(timed([*jobs[name], "-q", "--format", "json"], env))
    print(f"| {args.files:,} files | median wall | per file | peak RSS |\n|---|---|---|---|")
    for name, runs in results.items():
        wall = statistics.median(r[0] for r in runs)
        rss = max((r[1] for r in runs if r[1] is not None), default=None)
        print(f"| {name} | {wall:.2f} s | {wall / args.files * 1e6:.0f} µs | {f'{rss >> 10} MiB' if rss else '-'} |")


if __name__ == "__main__":
    main()
