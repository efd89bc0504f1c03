"""Basic installation test (TheRock rocm_sdk/tests/base_test.py)."""

from __future__ import annotations

import subprocess
import sys
import unittest

import rocm_sdk


class ROCmBaseTest(unittest.TestCase):
    def testCLIVersion(self) -> None:
        output = subprocess.check_output([sys.executable, "-m", "rocm_sdk", "version"]).decode().strip()
        self.assertEqual(output, rocm_sdk.__version__)

    def testCLITargets(self) -> None:
        output = subprocess.check_output([sys.executable, "-m", "rocm_sdk", "targets"]).decode().strip()
        self.assertTrue(output.startswith("gfx"), msg=output)
