"""Helpers of the fixture's installation tests (TheRock rocm_sdk/tests/utils.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import ModuleType


def run_command(args: list[str], capture: bool = False) -> bytes:
    if capture:
        return subprocess.check_output(args, stdin=subprocess.DEVNULL)
    subprocess.check_call(args, stdin=subprocess.DEVNULL)
    return b""


def assert_is_physical_package(module: ModuleType) -> None:
    assert module.__file__ is not None, f"`{module.__name__}` is a namespace package"
    assert Path(module.__file__).name == "__init__.py", f"`{module.__name__}` is not a package"


def get_module_shared_libraries(module: ModuleType) -> list[Path]:
    root = Path(module.__file__).parent
    return [p for p in root.glob("**/*.so.*") if p.is_file()] + [p for p in root.glob("**/*.so") if p.is_file()]
