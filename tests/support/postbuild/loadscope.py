"""The static load verdict (postbuild/symbols.py) against real RTLD_NOW loads in child processes of
the audited interpreter, two at a time, each bounded in time."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from rocm_audit.postbuild.symbols import Resolver, Verdict

LOAD_TIMEOUT_S = 60.0
MAX_LOADS = 600
# What a real load does: ctypes.CDLL(path, RTLD_NOW), as Python imports an extension module
# (dynload_shlib.c: RTLD_NOW | RTLD_LOCAL by default) after its preloads (paths loaded first).
_CHILD = """\
import ctypes, os, sys
for one in sys.argv[2:]:
    ctypes.CDLL(one, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
try:
    ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW)
except OSError as exc:
    print("FAIL " + str(exc))
    raise SystemExit(0)
print("LOADS")
"""
_UNDEFINED = re.compile(r"undefined symbol: ([^,\s]+)")
_NO_LIBRARY = re.compile(r"([^\s:]+): cannot open shared object file")


@dataclass(frozen=True, slots=True)
class RealLoad:
    path: str
    loads: bool
    message: str

    @property
    def named(self) -> str | None:
        """The symbol or library the loader's message names."""
        for pattern in (_UNDEFINED, _NO_LIBRARY):
            found = pattern.search(self.message)
            if found:
                return found.group(1)
        return None


def real_load(interpreter: str, path: str, preloads: Sequence[str] = (), library_path: str | None = None) -> RealLoad:
    done = subprocess.run(
        [interpreter, "-c", _CHILD, path, *preloads],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=LOAD_TIMEOUT_S,
        cwd="/",
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
        | ({"LD_LIBRARY_PATH": library_path} if library_path else {}),
        check=False,
    )
    line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else f"exit {done.returncode}"
    return RealLoad(path, line == "LOADS", line.removeprefix("FAIL "))


def real_loads(
    interpreter: str, paths: Sequence[str], preloads: Sequence[str] = (), library_path: str | None = None
) -> dict[str, RealLoad]:
    """Every path loaded alone in its own child, two children at a time."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        bounded = list(paths[:MAX_LOADS])
        return dict(
            zip(bounded, pool.map(lambda p: real_load(interpreter, p, preloads, library_path), bounded), strict=True)
        )


@dataclass(slots=True)
class Figures:
    elfs: int = 0
    loads: int = 0  # real loads that succeeded
    fails: int = 0  # real loads that failed
    agree: int = 0
    false_errors: list[str] = field(default_factory=list)  # static says fails, real loads
    unreported: list[str] = field(default_factory=list)  # static says loads, real fails
    other_reason: list[str] = field(default_factory=list)  # both fail, naming different things
    failing: dict[str, str] = field(default_factory=dict)  # path -> what the real load named

    def line(self) -> str:
        return (
            f"{self.elfs} ELFs: {self.loads} load, {self.fails} fail; {self.agree} agree; "
            f"{len(self.false_errors)} false error(s), {len(self.unreported)} unreported, "
            f"{len(self.other_reason)} for another reason"
        )


def static_names(verdict: Verdict) -> set[str]:
    return set(verdict.missing_libraries) | {ref.name for _path, ref in verdict.missing_symbols}


def compare(
    resolver: Resolver,
    interpreter: str,
    paths: Sequence[str],
    preloads: Sequence[str] = (),
    library_path: str | None = None,
) -> Figures:
    """Static verdict of each path against its real load (``library_path``: LD_LIBRARY_PATH of
    the child, which the resolver's loader model must hold too)."""
    resolver.prepare(paths)
    real = real_loads(interpreter, list(paths), preloads, library_path)
    figures = Figures()
    for path in paths[:MAX_LOADS]:
        verdict, load = resolver.verdict(path), real[path]
        figures.elfs += 1
        figures.loads += load.loads
        figures.fails += not load.loads
        if not load.loads:
            figures.failing[path] = load.named or load.message
        if verdict.loads and load.loads:
            figures.agree += 1
        elif load.loads:
            figures.false_errors.append(f"{path}: static {sorted(static_names(verdict))[:5]}")
        elif verdict.loads:
            figures.unreported.append(f"{path}: {load.message}")
        elif load.named in static_names(verdict):
            figures.agree += 1
        else:
            figures.other_reason.append(f"{path}: real {load.message}; static {sorted(static_names(verdict))[:5]}")
    return figures
