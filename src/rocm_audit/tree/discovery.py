"""Which directories to audit: the -p/--path arguments, or the interpreter's site-packages."""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
import re
import site
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rocm_audit.errors import UsageError
from rocm_audit.tree.smallfile import read_head
from rocm_audit.units import clip

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


# Run by the interpreter named with --python: the same candidates as default_site_packages, and
# its version, as JSON after a marker (a banner a wrapper prints cannot pass for the answer). Old
# syntax only: it runs under Python 2.7 too, so an old interpreter is named by its version.
_SITE_DIRS_SCRIPT = """\
import json, site, sys, sysconfig
dirs = []
try:
    dirs.extend(site.getsitepackages())
except AttributeError:
    pass
dirs.extend(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
if site.ENABLE_USER_SITE and sys.prefix == getattr(sys, "base_prefix", sys.prefix):
    dirs.append(site.getusersitepackages())
version = ".".join(str(part) for part in sys.version_info[:3])
answer = {"executable": sys.executable, "prefix": sys.prefix, "version": version, "site_dirs": dirs}
answer["libpython"] = [sysconfig.get_config_var(key) or "" for key in ("LIBDIR", "INSTSONAME", "Py_ENABLE_SHARED")]
print("rocm-audit-interpreter " + json.dumps(answer))
"""
_ANSWER_MARKER = "rocm-audit-interpreter "
# A shell's "cannot execute" and "command not found" (POSIX 2.8.2); a pyenv shim exits 127 too.
_DID_NOT_RUN = (126, 127)


PROBE_MINIMUM = (3, 6)  # the oldest the probe child (probes.py _CHILD) is tested under


class ChosenBy(str, enum.Enum):
    """Why an interpreter runs the children that load audited code (load probes)."""

    OPTION = "--python"  # named on the command line
    OWNER = "owner"  # owns the audited site-packages (a venv's bin/python, <prefix>/bin/pythonX.Y)
    OWN = "rocm-audit"  # rocm-audit's own: nothing better was found


@dataclass(frozen=True, slots=True)
class Interpreter:
    """A Python interpreter that answered: ``executable`` as the user spelled it, made absolute but
    not resolved (a venv's bin/python is a link to the base interpreter; resolving it would lose
    the venv's site-packages)."""

    executable: str
    version: str  # "3.12.1"
    site_dirs: tuple[str, ...]  # existing, resolved
    chosen_by: ChosenBy = ChosenBy.OPTION
    reason: str = ""  # for people: why this one
    # The file its process runs (sys.executable) and its shared libpython (LIBDIR/INSTSONAME when
    # Py_ENABLE_SHARED), "" when it has none: the first objects of every load scope.
    running: str = ""
    libpython: str = ""


def _first_line(text: str, limit: int = 200) -> str:
    line = next((one.strip() for one in text.splitlines() if one.strip()), "")
    return clip(line, limit)


def _quotes_script(text: str) -> bool:
    return any(len(line.strip()) > 6 and line.strip() in text for line in _SITE_DIRS_SCRIPT.splitlines())


def _executable_of(python: str, option: str) -> str:
    """The absolute path of ``python`` (a path, relative to the working directory, or a name on
    PATH), links kept. Raises UsageError."""
    import shutil

    if os.sep in python:
        executable = os.path.abspath(python)
        if not os.path.lexists(executable):
            raise UsageError(f"{option} {python}: no such file")
    else:
        found = shutil.which(python)
        if found is None:
            raise UsageError(f"{option} {python}: no such command on PATH")
        executable = os.path.abspath(found)
    if not os.path.isfile(executable) or not os.access(executable, os.X_OK):
        raise UsageError(f"{option} {python}: not an executable file")
    return executable


def inspect_interpreter(python: str, *, option: str = "--python", timeout_s: float = 60.0) -> Interpreter:
    """Run ``python`` once and ask its version and site-packages directories; in a subprocess from
    ``/`` (so no module of the caller's working directory shadows the stdlib), without
    PYTHONPATH/PYTHONHOME of this process. Raises UsageError with one line that says what went
    wrong (never the helper script: ``ls -c SCRIPT`` would print it back)."""
    executable = _executable_of(python, option)
    return _inspect(executable, python, option, timeout_s)


@functools.lru_cache(maxsize=32)
def _inspect(executable: str, python: str, option: str, timeout_s: float) -> Interpreter:
    import json
    import subprocess

    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    try:
        done = subprocess.run(
            [executable, "-c", _SITE_DIRS_SCRIPT],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            cwd="/",
            env=environment,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise UsageError(f"{option} {python}: it did not answer within {timeout_s:g} s") from None
    except OSError as exc:
        raise UsageError(f"{option} {python}: it did not run ({exc.strerror or exc})") from None
    answer = next((line for line in done.stdout.splitlines() if line.startswith(_ANSWER_MARKER)), None)
    if done.returncode in _DID_NOT_RUN and answer is None:
        said = _first_line(done.stderr) or _first_line(done.stdout)
        if not said or _quotes_script(said):  # never show rocm-audit's own helper
            said = f"exit {done.returncode}"
        raise UsageError(f"{option} {python}: it did not run ({said})")
    dirs: object = None
    version: object = None
    running, libpython = "", ""
    if answer is not None and done.returncode == 0:
        try:
            reported = json.loads(answer[len(_ANSWER_MARKER) :])
        except ValueError:
            reported = None
        if isinstance(reported, dict):
            dirs, version = reported.get("site_dirs"), reported.get("version")
            running, libpython = _running_files(reported)
    if not isinstance(dirs, list) or not all(isinstance(d, str) for d in dirs) or not isinstance(version, str):
        if "Traceback (most recent call last)" in done.stderr:
            last = _first_line(done.stderr.strip().splitlines()[-1])
            raise UsageError(f"{option} {python}: it failed to report its site directories ({last})")
        raise UsageError(
            f"{option} {python}: not a Python interpreter "
            f"(it exited {done.returncode} without reporting a Python version)"
        )
    return Interpreter(executable, version, tuple(_existing(dirs)), running=running, libpython=libpython)


def _running_files(reported: dict[str, object]) -> tuple[str, str]:
    """(sys.executable, its shared libpython or "") as the interpreter reported them."""
    running = reported.get("executable")
    parts = reported.get("libpython")
    libpython = ""
    if isinstance(parts, list) and len(parts) == 3 and all(isinstance(p, (str, int)) for p in parts):
        libdir, soname, shared = parts
        if shared and libdir and soname:
            libpython = os.path.join(str(libdir), str(soname))
    return (running if isinstance(running, str) else ""), libpython


def site_packages_of(python: str, timeout_s: float = 60.0) -> list[str]:
    """Every existing site-packages directory of another interpreter (a venv's python too), as that
    interpreter reports them (inspect_interpreter). Raises UsageError."""
    return list(inspect_interpreter(python, timeout_s=timeout_s).site_dirs)


_SITE_DIR = re.compile(r"^(?P<prefix>.*)/lib(?:64)?/python(?P<version>\d+\.\d+|3)t?/(?:site|dist)-packages$")


def _owner_candidates(directory: str) -> list[str]:
    """Interpreters that may own ``directory``, most likely first: a venv's bin/python (the nearest
    ancestor with a pyvenv.cfg), then <prefix>/bin/pythonX.Y of a <prefix>/lib/pythonX.Y/site-packages."""
    current = Path(directory)
    ancestors = (current, *current.parents)
    venv = next((one for one in ancestors if (one / "pyvenv.cfg").is_file()), None)
    found = [str(venv / "bin" / name) for name in ("python", "python3")] if venv is not None else []
    for ancestor in ancestors:
        matched = _SITE_DIR.match(str(ancestor))
        if matched:
            prefix, version = matched.group("prefix"), matched.group("version")
            found += [f"{prefix or ''}/bin/python{version}", f"{prefix or ''}/bin/python3"]
    return [one for one in dict.fromkeys(found) if os.path.isfile(one) and os.access(one, os.X_OK)]


def owning_interpreter(directory: str) -> Interpreter | None:
    """The interpreter whose site-packages holds ``directory`` (asked by running it), or None."""
    resolved = os.path.realpath(directory)
    for candidate in _owner_candidates(resolved):
        try:
            found = inspect_interpreter(candidate)
        except UsageError:
            continue
        if any(resolved == d or resolved.startswith(d.rstrip("/") + "/") for d in found.site_dirs):
            return found
    return None


def _can_probe(interpreter: Interpreter) -> bool:
    try:
        return tuple(int(part) for part in interpreter.version.split(".")[:2]) >= PROBE_MINIMUM
    except ValueError:
        return False


def own_interpreter(reason: str) -> Interpreter:
    """rocm-audit's own interpreter (sys.executable)."""
    version = ".".join(str(part) for part in sys.version_info[:3])
    parts = [sysconfig.get_config_var(key) or "" for key in ("LIBDIR", "INSTSONAME", "Py_ENABLE_SHARED")]
    running, libpython = _running_files({"executable": sys.executable, "libpython": parts})
    return Interpreter(
        sys.executable, version, tuple(default_site_packages()), ChosenBy.OWN, reason, running, libpython
    )


def interpreter_for(python: str | None, directories: Sequence[str]) -> Interpreter:
    """The interpreter the children that load audited code run under: ``python`` (--python) when
    given; else the one that owns the audited directories; else rocm-audit's own. Each carries the
    reason it was chosen. Raises UsageError for a ``python`` that does not answer."""
    if python is not None:
        named = inspect_interpreter(python)
        if not _can_probe(named):
            raise UsageError(
                f"--python {python}: Python {named.version} cannot run the load probes "
                f"(they need Python {'.'.join(map(str, PROBE_MINIMUM))} or newer)"
            )
        return dataclasses.replace(named, chosen_by=ChosenBy.OPTION, reason="named by --python")
    owners: dict[str, tuple[Interpreter, list[str]]] = {}
    too_old: list[str] = []
    for directory in directories:
        owner = owning_interpreter(directory)
        if owner is not None and not _can_probe(owner):
            too_old.append(f"{owner.executable} is Python {owner.version}")
        elif owner is not None:
            owners.setdefault(owner.executable, (owner, []))[1].append(directory)
    if not owners and too_old:
        return own_interpreter(f"rocm-audit's own: the owner of the audited directories is too old ({too_old[0]})")
    if not owners:
        return own_interpreter("rocm-audit's own: no interpreter found that owns the audited directories")
    first, owned = next(iter(owners.values()))
    reason = f"owns {owned[0]}" + (f" and {len(owned) - 1} more audited directories" if len(owned) > 1 else "")
    others = [name for name in owners if name != first.executable]
    if others:
        reason += f"; other audited directories belong to {', '.join(others)}"
    return dataclasses.replace(first, chosen_by=ChosenBy.OWNER, reason=reason)


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
