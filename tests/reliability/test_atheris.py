"""A bounded coverage-guided fuzzing run (atheris, libFuzzer) over every file reader.

Seeds are real and made here: a gcc-built host library, a clang-19 gfx942 code object, a plain
offload bundle of it, CCOB v1/v2/v3 with zlib and zstd, kpack archives in both schemes, and a host
ELF carrying a .hip_fatbin. The default suite fuzzes for ROCM_AUDIT_FUZZ_SECONDS (default 15);
docs/reliability.md records a longer run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from support.gpu.arch_writers import bundle, ccob, host_elf, kpack_archive
from support.memory import fresh_peak
from support.sdk_tree import build_library
from support.toolchain import gfx942_code_object

pytestmark = pytest.mark.fuzz  # a bounded atheris run

FUZZER = Path(__file__).resolve().parents[2] / "fuzz" / "fuzz_files.py"
SECONDS = int(os.environ.get("ROCM_AUDIT_FUZZ_SECONDS", "600" if os.environ.get("ROCM_AUDIT_SLOW") == "1" else "15"))


def make_seeds(directory: Path) -> None:
    directory.mkdir()
    code_object = gfx942_code_object(directory / "build").read_bytes()
    (directory / "host.so").write_bytes(build_library(directory / "build", "seed", "libseed.so.1").read_bytes())
    (directory / "raw.hsaco").write_bytes(code_object)
    plain = bundle([("host-x86_64-unknown-linux-gnu-", b""), ("hipv4-amdgcn-amd-amdhsa--gfx942", code_object)])
    (directory / "plain.co").write_bytes(plain)
    for version in (1, 2, 3):
        for method in (0, 1):
            (directory / f"ccob-v{version}-m{method}.co").write_bytes(ccob(plain, version=version, method=method))
    for scheme in ("none", "zstd-per-kernel"):
        (directory / f"{scheme}.kpack").write_bytes(
            kpack_archive([("lib/libk.so#0", "gfx942", code_object)], scheme=scheme, family="gfx942")
        )
    host_elf([(".hip_fatbin", 1, 2, plain)], str(directory / "fat.so"))
    for child in (directory / "build").iterdir():
        child.unlink()
    (directory / "build").rmdir()


def test_coverage_guided_fuzzing_finds_no_crash(tmp_path):
    seeds = tmp_path / "seeds"
    make_seeds(seeds)
    system_temp = Path(tempfile.gettempdir())
    before = set(system_temp.glob("rocm-audit-fuzz-*"))
    done = subprocess.run(
        fresh_peak(
            [
                sys.executable,
                str(FUZZER),
                str(seeds),
                f"-max_total_time={SECONDS}",
                "-rss_limit_mb=1024",
                "-timeout=20",
                "-print_final_stats=1",
                f"-artifact_prefix={tmp_path}/crash-",
            ]
        ),
        capture_output=True,
        text=True,
        timeout=SECONDS + 300,
        cwd=tmp_path,
        env={**os.environ, "ROCM_AUDIT_FUZZ_WORKDIR": str(tmp_path)},  # its files go with tmp_path
    )
    assert done.returncode == 0, done.stderr[-4000:]
    runs = int(re.search(r"Done (\d+) runs", done.stderr).group(1))
    assert runs > 1000, done.stderr[-2000:]
    assert not list(tmp_path.glob("crash-*"))
    assert set(system_temp.glob("rocm-audit-fuzz-*")) == before  # nothing left outside tmp_path


def test_the_fuzzers_peak_memory_is_its_own():
    """-rss_limit_mb reads ru_maxrss, which an exec'ed child inherits from a big parent (pytest is
    1 GB late in the full run): started through fresh_peak, the child's figure is its own."""
    probe = "import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    parent = (
        "import subprocess, sys\n"
        "from support.memory import fresh_peak\n"
        "big = bytearray(400 << 20)\n"
        "big[::4096] = b'x' * len(big[::4096])\n"
        f"child = [sys.executable, '-c', {probe!r}]\n"
        "print(subprocess.run(child, capture_output=True, text=True).stdout.strip())\n"
        "print(subprocess.run(fresh_peak(child), capture_output=True, text=True).stdout.strip())\n"
    )
    tests = str(Path(__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, "-c", parent],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": tests},
    )
    direct_kib, fresh_kib = (int(line) for line in done.stdout.split())
    assert direct_kib > 400 << 10  # the parent's 400 MB, inherited
    assert fresh_kib < 100 << 10
