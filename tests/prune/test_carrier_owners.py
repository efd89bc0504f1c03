"""verify-arch counts carriers under what brought them: an SDK tree, else the wheel whose RECORD
lists them, or lists the members of a carrier that is a set of files (per-arch kernels, a kernel
database directory). The units tree holds a pip-installed `mylib` with all four kinds."""

from __future__ import annotations


def test_carriers_are_counted_under_the_wheel_that_shipped_them(run_cli, units):
    report = run_cli("verify-arch", "gfx942", "-p", str(units), "--format", "json").report
    by_path = {c["path"].removeprefix(f"{units}/"): c for c in report["carriers"]}
    assert {"mylib/libfat.so", "mylib/kernels/Kernels_gfx*.hsaco", "mylib/lib/rocblas/library"} <= set(by_path)
    for carrier in by_path.values():
        assert carrier["package"] is None
        assert (carrier["shipped_by"]["name"], carrier["shipped_by"]["version"]) == ("mylib", "1.0"), carrier["path"]
    text = run_cli("verify-arch", "gfx942", "-p", str(units)).stdout.splitlines()
    assert f"mylib 1.0: {len(by_path)} carriers, 1 missing a target" in text
    assert not any(line.startswith(("(outside SDK", "(files no distribution")) for line in text)
