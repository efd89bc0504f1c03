"""Other Python interpreters on this machine, for audits of an application venv that is not ours
(pyenv's versions directory, ``pyenv prefix``, PATH), found at test time."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess


def _answers_as(candidate: str, version: str) -> bool:
    """True when ``candidate`` runs and is Python ``version`` ("3.12"); a pyenv shim that refuses
    to run is not."""
    try:
        done = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and done.stdout.strip() == version


def find_python(version: str) -> str | None:
    """A Python ``version`` ("3.12") that actually runs: pyenv's versions directory, ``pyenv prefix``,
    ``python<version>`` on PATH, /usr/bin, /usr/local/bin. None when there is none."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = sorted(
        glob.glob(os.path.join(glob.escape(root), "versions", f"{version}*", "bin", f"python{version}"))
    )
    candidates.reverse()  # the newest patch release first
    pyenv = shutil.which("pyenv")
    if pyenv is not None:
        try:
            done = subprocess.run([pyenv, "prefix", version], capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired):
            done = None
        if done is not None and done.returncode == 0:
            candidates += [
                os.path.join(p, "bin", f"python{version}") for p in done.stdout.split(os.pathsep) if p.strip()
            ]
    on_path = shutil.which(f"python{version}")
    if on_path is not None:
        candidates.append(on_path)
    candidates += [f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"]
    return next((one for one in candidates if os.path.isfile(one) and _answers_as(one, version)), None)


def python312() -> str | None:
    """A CPython 3.12 that runs (pyenv's shims on PATH may refuse to), else None."""
    return find_python("3.12")
