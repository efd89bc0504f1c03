"""The fixture's ``rocm_sdk``: the parts of TheRock's rocm_sdk/__init__.py that tests rely on."""

from __future__ import annotations

import ctypes
import importlib
from pathlib import Path

from ._dist_info import __version__

__all__ = ["__version__", "find_libraries", "preload_libraries"]

_ALL_CDLLS: dict[str, ctypes.CDLL] = {}


def find_libraries(*shortnames: str) -> list[Path]:
    """Absolute paths by short name: glob the entry's pattern in its package, take the first sorted match."""
    from . import _dist_info

    paths: list[Path] = []
    for shortname in shortnames:
        try:
            entry = _dist_info.ALL_LIBRARIES[shortname]
        except KeyError:
            raise ModuleNotFoundError(f"Unknown rocm library '{shortname}'") from None
        family = _dist_info.determine_target_family() if entry.package.is_target_specific else None
        module = importlib.import_module(entry.package.get_py_package_name(family))
        root = Path(module.__file__).parent / entry.posix_relpath
        matches = sorted(root.glob(entry.so_pattern))
        if not matches:
            raise FileNotFoundError(f"Could not find rocm library '{shortname}' at '{root}' ({entry.so_pattern})")
        paths.append(matches[0])
    return paths


def preload_libraries(*shortnames: str, rtld_global: bool = True) -> None:
    """ctypes.CDLL each library by absolute path (RTLD_GLOBAL by default), caching handles, as upstream."""
    mode = ctypes.RTLD_GLOBAL if rtld_global else ctypes.RTLD_LOCAL
    for shortname in shortnames:
        if shortname in _ALL_CDLLS:
            continue
        for path in find_libraries(shortname):
            _ALL_CDLLS[shortname] = ctypes.CDLL(str(path), mode=mode)
