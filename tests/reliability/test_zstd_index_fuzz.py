"""A bounded libFuzzer run of the zstd frame index's C core under AddressSanitizer and UBSan, with
libzstd as the oracle (fuzz/zstd_index_fuzz.c): any read the index serves that differs from
libzstd's bytes, any memory error, any undefined behaviour aborts the run and fails the test.

Seeds are real frames made here: python-zstandard at several levels, with long-distance matching
and a wide window, checksummed and streamed frames, raw and RLE blocks, and the zstd CLI's
--long mode. The default suite fuzzes for ROCM_AUDIT_FUZZ_SECONDS (default 15;
docs/reliability.md records the long runs).
"""

from __future__ import annotations

import os
import random
import re
import subprocess
from pathlib import Path

import pytest
import zstandard

from support.memory import fresh_peak
from support.tools import require_tool

pytestmark = [pytest.mark.fuzz, pytest.mark.toolchain]  # a libFuzzer run, built with clang-19 here

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "fuzz" / "zstd_index_fuzz.c"
SECONDS = int(os.environ.get("ROCM_AUDIT_FUZZ_SECONDS", "600" if os.environ.get("ROCM_AUDIT_SLOW") == "1" else "15"))


def _seeds(directory: Path) -> None:
    directory.mkdir()
    rng = random.Random(17)
    words = [rng.randbytes(rng.randint(2, 9)) for _ in range(60)]
    texts = [b"".join(rng.choice(words) for _ in range(n)) for n in (10, 300, 5000, 40000)] + [
        b"\0" * 300000,
        rng.randbytes(150000),
        b"ab" * 70000,
        bytes(range(256)) * 600,
    ]
    count = 0
    for text in texts:
        for options in (
            {"level": 1},
            {"level": 19},
            {"level": 3, "write_checksum": True},
            {
                "compression_params": zstandard.ZstdCompressionParameters.from_level(
                    5, enable_ldm=True, window_log=27, write_content_size=True
                )
            },
        ):
            (directory / f"seed{count}.zst").write_bytes(zstandard.ZstdCompressor(**options).compress(text))
            count += 1
        writer = zstandard.ZstdCompressor(level=6).compressobj()
        (directory / f"seed{count}.zst").write_bytes(writer.compress(text) + writer.flush())  # no size
        count += 1
    plain = directory / "cli.txt"
    plain.write_bytes(texts[3] * 8)
    subprocess.run(["zstd", "-q", "-f", "--long=27", "-12", str(plain), "-o", str(directory / "cli.zst")], check=True)
    plain.unlink()


def test_the_index_under_sanitizers_against_libzstd(tmp_path):
    clang = require_tool("clang-19")
    require_tool("zstd")
    binary = tmp_path / "zstd_index_fuzz"
    built = subprocess.run(
        [
            clang,
            "-g",
            "-O1",
            "-fsanitize=fuzzer,address,undefined",
            "-fno-sanitize-recover=undefined",
            "-I",
            str(REPO / "src" / "rocm_audit" / "formats"),
            str(HARNESS),
            "-lzstd",
            "-o",
            str(binary),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    seeds, corpus = tmp_path / "seeds", tmp_path / "corpus"
    _seeds(seeds)
    corpus.mkdir()
    diverged = tmp_path / "diverged"  # the fuzzer keeps each frame the two disagree on here
    diverged.mkdir()
    done = subprocess.run(
        fresh_peak(
            [
                str(binary),
                f"-max_total_time={SECONDS}",
                "-rss_limit_mb=2048",
                "-timeout=10",
                "-max_len=131072",
                "-print_final_stats=1",
                f"-artifact_prefix={tmp_path}/",
                str(corpus),
                str(seeds),
            ]
        ),
        capture_output=True,
        text=True,
        timeout=SECONDS + 300,
        env=dict(os.environ, ZI_DIVERGE_DIR=str(diverged)),
    )
    log = done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "ERROR: AddressSanitizer" not in log and "runtime error" not in log and "MISMATCH" not in log
    runs = re.search(r"stat::number_of_executed_units:\s*(\d+)", log)
    assert runs and int(runs.group(1)) > len(list(seeds.iterdir())), log[-2000:]
    summary = re.search(r"zstd_index_fuzz: accept/reject (\d+), reject/accept (\d+)", log)
    assert summary, log[-2000:]
    # A frame the index accepts must be one libzstd accepts (the index would serve bytes libzstd
    # never makes). The other way round is allowed: a frame the index refuses is read by the stream
    # (docs/reliability.md lists the kinds).
    accepted_rejected = int(summary.group(1))
    notes = [line for line in log.splitlines() if line.startswith("NOTE index accepts")]
    assert accepted_rejected == 0, (notes[:10], sorted(str(p) for p in diverged.glob("acc-*")))
