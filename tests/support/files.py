"""Placing fixture files into scenario trees."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def copy_file(source: Path, target: Path, mode: int = 0o755) -> Path:
    """A new inode at target with source's bytes (never a link), parents created."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(source.read_bytes())
    os.chmod(target, mode)
    return target


@contextmanager
def scratch_dir(factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """A directory for a module-scoped fixture, removed when the fixture ends.

    pytest removes a passing test's `tmp_path` (tmp_path_retention_policy in pyproject.toml) but keeps
    what `tmp_path_factory` made until the session ends; a fixture of gigabytes (real LLVM carriers, a
    venv of real wheels) would hold its disk through every later module.
    """
    path = factory.mktemp(name)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
