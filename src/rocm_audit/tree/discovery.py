"""Which directories to audit: the -p/--path arguments, or the interpreter's site-packages."""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from rocm_audit.errors import UsageError
from rocm_audit.tree.smallfile import read_head

SDK_TREE_PREFIX = "_rocm_sdk_"
# The rocm-profiler wheel's platform tree: its dist name is not rocm-sdk-* (rocm_sdk/_dist_info.py
# PackageEntry "profiler"), so its directory is _rocm_profiler (plus the version nonce).
PROFILER_TREE = "_rocm_profiler"


def is_sdk_tree_name(name: str) -> bool:
    """``_rocm_sdk_core``, ``_rocm_sdk_libraries[_<family>]``, ``_rocm_sdk_devel`` ... (formats.md 1.2),
    and ``_rocm_profiler``: the platform trees of TheRock's wheels."""
    return (name.startswith(SDK_TREE_PREFIX) and len(name) > len(SDK_TREE_PREFIX)) or name.startswith(PROFILER_TREE)


def is_tree_of(name: str, logical: str) -> bool:
    """``_rocm_sdk_<logical>`` (core, devel ...), also renamed by TheRock's version nonce.

    The nonce is appended verbatim, with no separator of its own (rocm_sdk/_dist_info.py
    get_py_package_name: ``"_" + dist_name + PY_PACKAGE_SUFFIX_NONCE``), and TheRock's CI passes the
    bare run id (``--version-suffix ${ARTIFACT_RUN_ID}``): ``_rocm_sdk_core17154321`` as well as
    ``_rocm_sdk_core_r7130``. No logical name is a prefix of another (core, libraries, devel, device)."""
    return name.startswith(SDK_TREE_PREFIX + logical)


@dataclass(frozen=True, slots=True)
class AuditRoot:
    """One audited path. ``path`` is absolute and resolved; links inside are never followed out of it.

    ``single_file`` is set when the user named a file rather than a directory. ``sdk_only`` limits
    classification to files inside ``_rocm_sdk_*`` trees (dedup needs nothing else).
    """

    path: str
    given: str
    single_file: bool = False
    sdk_only: bool = False


def default_site_packages() -> list[str]:
    """Every site-packages directory of the running interpreter, venv-aware, that exists."""
    candidates: list[str] = []
    try:
        candidates.extend(site.getsitepackages())
    except AttributeError:  # pragma: no cover - old virtualenv's site.py
        pass
    for key in ("purelib", "platlib"):
        candidates.append(sysconfig.get_paths()[key])
    if site.ENABLE_USER_SITE and sys.prefix == sys.base_prefix:
        candidates.append(site.getusersitepackages())
    return _existing(candidates)


# Run by the interpreter named with --python: the same candidates as default_site_packages, as JSON.
_SITE_DIRS_SCRIPT = """\
import json, site, sys, sysconfig
dirs = []
try:
    dirs.extend(site.getsitepackages())
except AttributeError:
    pass
dirs.extend(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
if site.ENABLE_USER_SITE and sys.prefix == sys.base_prefix:
    dirs.append(site.getusersitepackages())
print(json.dumps({"executable": sys.executable, "prefix": sys.prefix, "site_dirs": dirs}))
"""


def site_packages_of(python: str, timeout_s: float = 60.0) -> list[str]:
    """Every existing site-packages directory of another interpreter (a venv's python too), as that
    interpreter reports them: run in a subprocess from ``/`` (so no module of the caller's working
    directory shadows the stdlib), without PYTHONPATH/PYTHONHOME of this process. Raises UsageError."""
    import json
    import shutil
    import subprocess

    executable = python if os.sep in python else shutil.which(python)
    if not executable or not os.path.isfile(executable) or not os.access(executable, os.X_OK):
        raise UsageError(f"--python {python}: not an executable interpreter")
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    try:
        done = subprocess.run(
            [executable, "-c", _SITE_DIRS_SCRIPT],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd="/",
            env=environment,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--python {python}: cannot run it: {exc}") from None
    try:
        dirs = json.loads(done.stdout.strip().splitlines()[-1])["site_dirs"] if done.returncode == 0 else None
    except (ValueError, IndexError, KeyError, TypeError):
        dirs = None
    if not isinstance(dirs, list) or not all(isinstance(d, str) for d in dirs):
        detail = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise UsageError(f"--python {python}: did not report its site directories ({detail[0]})")
    return _existing(dirs)


def _existing(candidates: list[str]) -> list[str]:
    seen: list[str] = []
    for one in candidates:
        resolved = os.path.realpath(one)
        if os.path.isdir(resolved) and resolved not in seen:
            seen.append(resolved)
    return seen


def enclosing_sdk_tree(path: str) -> str | None:
    """The nearest ancestor (or the path itself) named ``_rocm_sdk_*``, or None."""
    current = Path(path)
    for candidate in (current, *current.parents):
        if is_sdk_tree_name(candidate.name):
            return str(candidate)
    return None


def _is_zip(path: str) -> bool:
    try:
        return read_head(path, 4) == b"PK\x03\x04"
    except OSError:
        return False


def resolve_roots(paths: list[str] | None, *, for_dedup: bool = False) -> tuple[list[AuditRoot], list[str]]:
    """Turn -p arguments into audit roots. Returns (roots, where_we_looked). Raises UsageError.

    For dedup, a path inside an SDK tree widens to the directory holding the trees, because the
    runtime copy that a devel duplicate must link to lives in a sibling tree.
    """
    given = list(paths) if paths else default_site_packages()
    looked = [os.path.abspath(p) for p in given]
    roots: list[AuditRoot] = []
    for raw in given:
        if not os.path.lexists(raw):
            raise UsageError(f"path does not exist: {raw}")
        resolved = os.path.realpath(raw)
        if not os.path.exists(resolved):
            raise UsageError(f"path is a dangling link: {raw}")
        single = not os.path.isdir(resolved)
        if single and _is_zip(resolved):
            # Read as a file it holds no ELF header, so every check would pass it silently.
            raise UsageError(
                f"{raw} is a zip archive (a wheel?): rocm-audit reads installed files; install it "
                f"(pip install --no-deps --target DIR {raw}) or unpack it (python -m zipfile -e {raw} DIR) "
                "and pass DIR"
            )
        if for_dedup:
            tree = enclosing_sdk_tree(resolved)
            if tree is not None:
                resolved, single = os.path.dirname(tree), False
            roots.append(AuditRoot(resolved, raw, single_file=single, sdk_only=True))
        else:
            roots.append(AuditRoot(resolved, raw, single_file=single))
    unique: dict[str, AuditRoot] = {}
    for root in roots:
        unique.setdefault(root.path, root)
    # A root nested in another would be walked twice; keep the outer one.
    kept = [
        r
        for r in unique.values()
        if not any(
            o.path != r.path and not o.single_file and r.path.startswith(o.path.rstrip("/") + "/")
            for o in unique.values()
        )
    ]
    return sorted(kept, key=lambda r: r.path), looked
