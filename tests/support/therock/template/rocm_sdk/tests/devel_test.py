"""Devel tree test (TheRock rocm_sdk/tests/devel_test.py), the tests that do not need real ROCm tools."""

from __future__ import annotations

import importlib
import subprocess
import sys
import unittest
from pathlib import Path
from types import ModuleType

import rocm_sdk

from .. import _dist_info as di
from . import utils


def _cli_path(flag: str) -> Path:
    return Path(utils.run_command([sys.executable, "-m", "rocm_sdk", "path", flag], capture=True).decode().strip())


def _platform_dir(module: ModuleType) -> Path:
    if module.__file__ is not None:
        return Path(module.__file__).parent
    return Path(next(iter(module.__path__)))


class ROCmDevelTest(unittest.TestCase):
    def testInstallationLayout(self) -> None:
        import rocm_sdk_devel

        self.assertEqual(Path(rocm_sdk.__file__).parent.parent, Path(rocm_sdk_devel.__file__).parent.parent)

    def testCLIPathBin(self) -> None:
        self.assertTrue(_cli_path("--bin").exists())

    def testCLIPathCMake(self) -> None:
        self.assertTrue((_cli_path("--cmake") / "hip" / "hip-config.cmake").exists())

    def testCLIPathRoot(self) -> None:
        self.assertTrue((_cli_path("--root") / "bin").exists())

    def testRootLLVMSymlinkExists(self) -> None:
        self.assertTrue((_cli_path("--root") / "llvm" / "bin" / "clang++").exists())

    def testSharedLibrariesLoad(self) -> None:
        _cli_path("--root")
        module = importlib.import_module(di.ALL_PACKAGES["devel"].get_py_package_name())
        utils.assert_is_physical_package(module)
        so_paths = utils.get_module_shared_libraries(module)
        self.assertTrue(so_paths)
        for so_path in so_paths:
            with self.subTest(msg="Check shared library loads", so_path=so_path):
                subprocess.check_call(
                    [sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1])", str(so_path)]
                )

    def testLibrariesMirroredIntoDevel(self) -> None:
        """Every file of the libraries tree is in devel as the same inode (a symlink resolving to it passes)."""
        family = di.determine_target_family()
        try:
            libraries = importlib.import_module(di.ALL_PACKAGES["libraries"].get_py_package_name(family))
        except ModuleNotFoundError:
            self.skipTest("rocm-sdk-libraries is not installed")
        _cli_path("--root")
        devel = importlib.import_module(di.ALL_PACKAGES["devel"].get_py_package_name(family))
        libraries_dir, devel_dir = _platform_dir(libraries), _platform_dir(devel)
        missing: list[Path] = []
        not_hardlinked: list[Path] = []
        for libs_file in libraries_dir.rglob("*"):
            if not libs_file.is_file():
                continue
            rel = libs_file.relative_to(libraries_dir)
            if rel == Path("__init__.py") or "__pycache__" in rel.parts or rel.parts[0] == ".devel_links":
                continue
            devel_file = devel_dir / rel
            if not devel_file.is_file():
                missing.append(rel)
            elif not devel_file.samefile(libs_file):
                not_hardlinked.append(rel)
        self.assertFalse(missing, msg=f"{len(missing)} libraries file(s) missing from devel: {sorted(missing)}")
        self.assertFalse(
            not_hardlinked,
            msg=f"{len(not_hardlinked)} libraries file(s) present in devel but not "
            f"hardlinked (different inode): {sorted(map(str, not_hardlinked))}",
        )
