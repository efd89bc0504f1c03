"""Placing fixture files into scenario trees."""

from __future__ import annotations

import os
from pathlib import Path


def copy_file(source: Path, target: Path, mode: int = 0o755) -> Path:
    """A new inode at target with source's bytes (never a link), parents created."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(source.read_bytes())
    os.chmod(target, mode)
    return target
