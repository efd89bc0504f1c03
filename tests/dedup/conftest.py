from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from support.sdk_tree import SdkTree, build_sdk_tree


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
