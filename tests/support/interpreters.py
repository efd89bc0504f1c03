"""Other Python interpreters on this machine, for audits of an application venv that is not ours."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess


def python312() -> str | None:
    """A CPython 3.12 that runs (pyenv's shims on PATH may refuse to), else None."""
    candidates = [shutil.which("python3.12") or ""]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")), reverse=True)
    candidates += ["/usr/bin/python3.12", "/usr/local/bin/python3.12"]
    for candidate in candidates:
        if not candidate or not os.access(candidate, os.X_OK):
            continue
        done = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info[:2] == (3, 12))"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode == 0 and done.stdout.strip() == "True":
            return candidate
    return None
