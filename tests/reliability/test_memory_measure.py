"""The peak-RSS measurement the memory tests rely on can see an allocation (so they can fail)."""

from __future__ import annotations

import subprocess
import sys

from support.memory import PEAK_RSS_KIB_EXPR, peak_rss_kib, reset_peak_rss


def test_in_process_peak_sees_a_fresh_allocation_after_reset():
    before = reset_peak_rss()
    block = bytearray(96 << 20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    assert peak_rss_kib() - before > 80 * 1024
    del block


def test_a_child_reports_its_own_peak_not_its_parents():
    ballast = bytearray(200 << 20)
    ballast[::4096] = b"y" * len(ballast[::4096])
    done = subprocess.run(
        [sys.executable, "-c", f"print({PEAK_RSS_KIB_EXPR})"], capture_output=True, text=True, check=True, timeout=60
    )
    assert int(done.stdout) < 100 * 1024
    del ballast
