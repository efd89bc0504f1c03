"""`prune --fatbins` on CCOB v1 bundles (LLVM 18's format: no total size; its end is where the
compressed stream ends).

No toolchain here writes v1 (clang-offload-bundler-19 writes v2 and has no version option), so
the test writes it from real bundles, byte for byte as LLVM 18 does [llvm-project 18.x:
clang/lib/Driver/OffloadBundler.cpp, ``CompressedOffloadBundle::compress``: "CCOB", u16 version 1,
u16 method, u32 uncompressed size, u64 MD5 low half, then the compressed stream; formats.md 2.4]:
clang++-19 compiles each translation unit with ``--offload-compress`` (a v2 CCOB in the object's
``.hip_fatbin``), the test rewrites that section as v1 (the same zstd frame; for zlib the inflated
bundle compressed with zlib), ``objcopy --update-section`` puts it back, and the objects are
linked. Two translation units: two v1 bundles back to back, so the first one's end must be found
exactly, not guessed from the next magic.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import zstandard

from rocm_audit.errors import FormatError
from rocm_audit.formats import ccob
from rocm_audit.prune.fatbins.library import locate, slim_library
from rocm_audit.prune.fatbins.rewrite import selections
from rocm_audit.tree.targets import kept_target
from support import hip_host
from support.run import run_checked
from support.tools import require_tool

HIP_FLAGS = [*hip_host.HIP_FLAGS, "--offload-compress"]
TU = hip_host.TU


def _as_v1(v2: bytes, method: int) -> bytes:
    """A v2 CCOB rewritten as LLVM 18 writes v1 (see the module docstring)."""
    version, old_method, total, inflated_size = struct.unpack_from("<HHII", v2, 4)
    assert version == 2 and old_method == ccob.METHOD_ZSTD
    payload = v2[24:total]
    inflated = zstandard.ZstdDecompressor().decompress(payload)
    assert len(inflated) == inflated_size
    if method == ccob.METHOD_ZLIB:
        payload = zlib.compress(inflated, 6)
    digest = hashlib.md5(inflated).digest()[:8]
    return b"CCOB" + struct.pack("<HHI", 1, method, inflated_size) + digest + payload


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The libraries, and beside each (``NAME.v1``) the v1 bundles written into it, in order."""
    cxx = require_tool("clang++-19")
    objcopy = require_tool("objcopy")
    out = tmp_path_factory.mktemp("fatbins-v1")
    made = {}
    for method, name in ((ccob.METHOD_ZSTD, "libv1zstd.so"), (ccob.METHOD_ZLIB, "libv1zlib.so")):
        objects = []
        for index in (1, 2):
            (out / f"k{index}.hip").write_text(TU % (f"k{index}", index))
            obj = f"{name}.k{index}.o"
            run_checked(
                [cxx, *HIP_FLAGS, "-c", "--offload-arch=gfx942", "--offload-arch=gfx90a", f"k{index}.hip", "-o", obj],
                out,
            )
            section = out / f"{obj}.fatbin"
            run_checked([objcopy, "-O", "binary", "--only-section=.hip_fatbin", obj, str(section)], out)
            section.write_bytes(_as_v1(section.read_bytes(), method))
            (out / f"{name}.v1.{index}").write_bytes(section.read_bytes())
            run_checked([objcopy, f"--update-section=.hip_fatbin={section}", obj], out)
            objects.append(obj)
        run_checked([cxx, "-shared", *objects, "-o", name], out)
        made[name] = out / name
        made[f"{name}.v1"] = out
    return made


@pytest.mark.parametrize("name", ["libv1zstd.so", "libv1zlib.so"])
def test_v1_bundles_are_found_whole_and_slimmed(built, tmp_path, name):
    kept = [kept_target("gfx942")]
    path = built[name]
    fd = os.open(path, os.O_RDONLY)
    try:
        _section, places = locate(fd)
        bundles = [os.pread(fd, p.extent, p.offset) for p in places]
    finally:
        os.close(fd)
    method = "zstd" if "zstd" in name else "zlib"
    assert [p.format for p in places] == [f"ccob-v1-{method}"] * 2
    # each extent is exactly the v1 bundle written there: its stream's end, not the next
    # bundle's start nor the section's end
    assert bundles == [(built[f"{name}.v1"] / f"{name}.v1.{i}").read_bytes() for i in (1, 2)]
    assert places[0].offset + places[0].extent < places[1].offset
    for data in bundles:
        header = ccob.parse_header(data, 0, len(data))
        assert header.version == 1
        assert all(selections(data, kept).values())  # inflated: its size and hash match the header
    copy = tmp_path / name
    copy.write_bytes(path.read_bytes())
    out = os.open(copy, os.O_RDWR)
    try:
        result = slim_library(str(path), kept, out)
    finally:
        os.close(out)
    assert result.freed > 0 and result.removed_targets == ["gfx90a"]
    # read back from the slimmed file through its wrappers (whatever layout moved them)
    fd = os.open(copy, os.O_RDONLY)
    try:
        slimmed = [os.pread(fd, p.extent, p.offset) for p in locate(fd)[1]]
    finally:
        os.close(fd)
    assert [len(new) for new in slimmed] == [b.new_size for b in result.bundles]
    for new, original in zip(slimmed, bundles, strict=True):
        assert ccob.parse_header(new, 0, len(new)).version == 1
        assert selections(new, kept) == selections(original, kept)
        assert not any(selections(new, [kept_target("gfx90a")]).values())
    # the slimmed v1 bundles are found again by their streams' ends, and slim no further
    again = slim_library(str(copy), kept)
    assert [b.new_size for b in again.bundles] == [b.new_size for b in result.bundles] and again.freed == 0


def test_a_truncated_v1_stream_is_an_error_not_a_guess():
    inflated = b"\0" * 5000 + b"bundle"
    for method, payload in (
        (ccob.METHOD_ZSTD, zstandard.ZstdCompressor().compress(inflated)),
        (ccob.METHOD_ZLIB, zlib.compress(inflated)),
    ):
        whole = b"CCOB" + struct.pack("<HHI", 1, method, len(inflated)) + hashlib.md5(inflated).digest()[:8] + payload
        header = ccob.parse_header(whole, 0, len(whole))
        padded = whole + b"\0" * 100 + b"CCOB"
        assert ccob.v1_total_size(header, lambda at, size, d=padded: d[at : at + size], len(padded)) == len(whole)
        cut = whole[:-3]
        with pytest.raises(FormatError):
            ccob.v1_total_size(header, lambda at, size, d=cut: d[at : at + size], len(cut))


def test_prune_fatbins_dry_run_counts_v1_libraries(built, tmp_path):
    site = tmp_path / "site-packages"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "libv1zstd.so").write_bytes(built["libv1zstd.so"].read_bytes())
    done = subprocess.run(
        [sys.executable, "-m", "rocm_audit", "prune", "--fatbins", "--dry-run", "--backup", str(tmp_path / "b"),
         "-p", str(site), "gfx942", "--format", "json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    rows = json.loads(done.stdout)["prune_fatbins"]["libraries"]
    assert len(rows) == 1 and rows[0]["bytes"] > 0 and rows[0]["removed_targets"] == ["gfx90a"], rows
