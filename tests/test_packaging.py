"""The built wheel ships what an installed rocm-audit reads or promises: the rule catalogue, the
report schema, the type stub of the C extension and the py.typed marker (PEP 561: type checkers
read rocm_audit's annotations), never the C source."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.toolchain  # builds the package (and its C extension) in an isolated environment
def test_the_wheel_ships_its_data_and_the_typed_marker(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = tmp_path.glob("rocm_audit-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "rocm_audit/py.typed" in names
    assert "rocm_audit/schemas/report-v1.json" in names
    assert "rocm_audit/formats/_zstdindex.pyi" in names
    shipped_rules = {n for n in names if n.startswith("rocm_audit/rules/") and n.endswith(".toml")}
    assert shipped_rules == {f"rocm_audit/rules/{p.name}" for p in (REPO / "src/rocm_audit/rules").glob("*.toml")}
    assert not [n for n in names if n.endswith(".c")], names
