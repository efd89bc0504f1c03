"""Fixtures shared by every test area: report validation and the CLI runner."""

from __future__ import annotations

import os
import shutil

import jsonschema
import pytest

from support import cli
from support.sdk_tree import SdkTree, build_sdk_tree

# Fixtures that take seconds to set up, and the marker every test that asks for one gets, so a new
# test that uses them is left out of `scripts/test --fast` without marking it by hand.
SLOW_FIXTURES = {
    # clang-19 HIP builds, llvmlite-made code objects (tests/gpu/conftest.py)
    "built": "toolchain",
    "many_arch_libs": "toolchain",
    "embedded_libs": "toolchain",
    "hip_objects": "toolchain",  # tests/prune/test_fatbins_layout.py
    # real vendor wheels, sha256-pinned (tests/support/vendor.py)
    "jax_plugin": "vendor",
    "bitsandbytes_libs": "vendor",
}


@pytest.hookimpl(tryfirst=True)  # before -m selects on the markers added here
def pytest_collection_modifyitems(config, items):
    """Tests that use a slow fixture get its marker (SLOW_FIXTURES). Tests marked slow (whole
    sweeps, big downloads) are deselected unless ROCM_AUDIT_SLOW=1; the first-contact journey
    (marked journey) unless ROCM_AUDIT_JOURNEY=1 and the long integration variants (marked long)
    unless ROCM_AUDIT_LONG=1 (scripts/test sets both in CI)."""
    for item in items:
        for fixture, marker in SLOW_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)
    wanted = {name: os.environ.get(f"ROCM_AUDIT_{name.upper()}") == "1" for name in ("slow", "journey", "long")}
    if config.getoption("-m"):
        return  # an explicit marker expression decides
    slow = [item for item in items if any(item.get_closest_marker(m) for m, on in wanted.items() if not on)]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item not in slow]


@pytest.fixture(scope="session")
def report_validator() -> jsonschema.Draft202012Validator:
    return cli.report_validator()


@pytest.fixture()
def run_cli(report_validator):
    """Run the CLI in-process; JSON output is parsed and validated against the shipped schema."""

    def invoke(*args: str, expect: int | None = None):
        return cli.invoke_cli(report_validator, args, expect)

    return invoke


@pytest.fixture(scope="session")
def cache_dir() -> str:
    path = os.environ.get("ROCM_AUDIT_TEST_CACHE", os.path.expanduser("~/.cache/rocm-audit-tests"))
    os.makedirs(path, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def pristine_tree(tmp_path_factory) -> SdkTree:
    return build_sdk_tree(tmp_path_factory.mktemp("pristine") / "site-packages")


@pytest.fixture()
def sdk(pristine_tree, tmp_path) -> SdkTree:
    """A fresh copy of the SDK-shaped site-packages; hardlinks and symlinks are preserved."""
    site = tmp_path / "site-packages"
    shutil.copytree(pristine_tree.site, site, symlinks=True)
    # copytree splits hardlinks; restore the one hardlinked pair the fixture promises.
    devel_hard = site / "_rocm_sdk_devel" / "lib" / "libhard.so.1"
    devel_hard.unlink()
    os.link(site / "_rocm_sdk_core" / "lib" / "libhard.so.1", devel_hard)
    return SdkTree(site, site / "_rocm_sdk_core", site / "_rocm_sdk_libraries_gfx94X_dcgpu", site / "_rocm_sdk_devel")
