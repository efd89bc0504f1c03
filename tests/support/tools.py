from __future__ import annotations

import shutil


def require_tool(name: str) -> str:
    """A tool scripts/test installs; missing means a broken set-up, which is a failure, not a skip."""
    path = shutil.which(name)
    assert path, f"{name} not found: run ./scripts/test, which installs the suite's Debian packages"
    return path
