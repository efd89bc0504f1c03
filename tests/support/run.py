"""The one way tests run a build step (a compiler, a packager, docker) and fail with its stderr."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from os import PathLike


def run_checked(
    argv: Sequence[str | PathLike[str]], cwd: str | PathLike[str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run argv; a non-zero exit fails the test naming the command and the tail of its stderr."""
    words = [str(word) for word in argv]
    done = subprocess.run(words, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{' '.join(words)} failed ({done.returncode}):\n{done.stderr[-3000:]}"
    return done
