"""A real vendor library with CCOB v3 (zstd) fat binaries for 27 GPU targets is weighed, never touched."""

from __future__ import annotations

import hashlib

import pytest

from support.vendor import install_members, jax_plugin_wheel

pytestmark = pytest.mark.vendor  # a real vendor wheel


def test_vendor_fat_binaries_are_weighed_per_target_and_left_alone(run_cli, cache_dir, tmp_path):
    site = tmp_path / "site-packages"
    libraries = install_members(jax_plugin_wheel(cache_dir), site)
    prng = next(p for p in libraries if p.name == "_prng.so")
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in libraries}
    report = run_cli("prune", "gfx942", "gfx950", "-p", str(prng), "--format", "json", expect=0).report
    section = report["prune"]
    assert section["removals"] == [] and section["totals"]["removable_bytes"] == 0
    rows = {r["target"]: r for r in section["weight"]}
    assert len(rows) == 27 and rows["gfx942"]["needed"] and rows["gfx950"]["needed"]
    assert not rows["gfx1100"]["needed"] and rows["gfx1100"]["compressed_bytes"] == rows["gfx1100"]["bytes"] > 0
    totals = section["totals"]
    # every byte of the .hip_fatbin's compressed bundle is shared out among its entries
    assert totals["compressed_bytes"] == totals["device_bytes"] <= prng.stat().st_size
    assert totals["inflated_bytes"] > 10 * totals["compressed_bytes"]
    assert totals["unused_in_host_libraries_bytes"] == totals["unused_bytes"] > 0
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in libraries} == before
