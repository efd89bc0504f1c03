"""Library tree test (TheRock rocm_sdk/tests/libraries_test.py): every .so loads after the standard preload."""

from __future__ import annotations

import importlib
import subprocess
import sys
import unittest

import rocm_sdk

from .. import _dist_info as di
from . import utils

libraries_mod = importlib.import_module(
    di.ALL_PACKAGES["libraries"].get_py_package_name(target_family=di.determine_target_family())
)
utils.assert_is_physical_package(libraries_mod)
so_paths = utils.get_module_shared_libraries(libraries_mod)

# What upstream preloads before each load (RTLD_GLOBAL); a devel comgr with its own inode trips on it.
PRELOAD_COMMAND = "import rocm_sdk; rocm_sdk.preload_libraries('amd_comgr', 'amdhip64', 'hiprtc', 'rocm_kpack');"


class ROCmLibrariesTest(unittest.TestCase):
    def testInstallationLayout(self) -> None:
        from pathlib import Path

        self.assertEqual(Path(rocm_sdk.__file__).parent.parent, Path(libraries_mod.__file__).parent.parent)

    def testSharedLibrariesLoad(self) -> None:
        self.assertTrue(so_paths, msg="Expected the libraries package to contain shared libraries")
        for so_path in so_paths:
            with self.subTest(msg="Check shared library loads", so_path=so_path):
                command = PRELOAD_COMMAND + " import ctypes; import sys; ctypes.CDLL(sys.argv[1])"
                subprocess.check_call([sys.executable, "-c", command, str(so_path)])
