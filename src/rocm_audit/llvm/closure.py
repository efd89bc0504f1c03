"""Load closures: which files one process maps when it dlopens a library (formats.md 4).

A model of glibc's ``_dl_map_object_deps`` (elf/dl-deps.c) on top of the search order of
``loader.LoaderModel``: the dependencies of a dlopened object are mapped breadth first, each
DT_NEEDED entry in order; a request is first matched by name against every object already in the
namespace (the names it was requested by and its SONAME), then searched for, opened, and matched by
(st_dev, st_ino); only a file with a new identity becomes a new object (``_dl_map_object``,
``_dl_map_object_from_fd``). ``$ORIGIN`` is the directory of the path the object was found at.

Not modelled: the calling program's own DT_RPATH (glibc also searches the executable's RPATH),
ld.so.cache beyond the ld.so.conf directories, hwcaps subdirectories, LD_PRELOAD, dlmopen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rocm_audit.elf import read as elfread
from rocm_audit.errors import FormatError
from rocm_audit.tree.inventory import read_dynamic_info
from rocm_audit.tree.loader import RELATIVE_NEEDED, HostView, LoaderModel

__all__ = ["Closure", "HostView", "LoadedObject", "Missing", "ProcessModel", "load_closure"]

MAX_OBJECTS = 4096  # a closure larger than this is cut short and says so


@dataclass(frozen=True, slots=True)
class LoadedObject:
    path: str  # where the loader found it (a host path; may be a symlink, $ORIGIN uses it)
    identity: tuple[int, int]  # (st_dev, st_ino) of the file it maps
    soname: str | None
    request: str  # the DT_NEEDED entry or dlopen argument that mapped it
    via: str  # "dlopen", "rpath", "ld_library_path", "runpath", "ld.so.conf", "default", "path"
    needed_by: str | None  # path of the object whose DT_NEEDED first brought it in
    depth: int
    reused: bool  # already in the process before this dlopen


@dataclass(frozen=True, slots=True)
class Missing:
    needed_by: str
    name: str
    detail: str = "not found"


@dataclass(frozen=True, slots=True)
class Closure:
    """The objects one dlopen makes visible, in glibc's breadth-first search-list order."""

    root: str
    objects: tuple[LoadedObject, ...]
    missing: tuple[Missing, ...]
    truncated: bool = False

    def paths(self) -> list[str]:
        return [o.path for o in self.objects]


@dataclass(slots=True)
class _Mapped:
    path: str
    identity: tuple[int, int]
    dynamic: elfread.DynamicInfo
    names: set[str]
    loader: _Mapped | None


def _read_dynamic(path: str) -> elfread.DynamicInfo | None:
    try:
        return read_dynamic_info(path)
    except (OSError, FormatError):
        return None


class ProcessModel:
    """One process (one link-map namespace) into which libraries are dlopened in turn."""

    def __init__(
        self,
        loader: LoaderModel,
        dynamic_of: Callable[[str], elfread.DynamicInfo | None] | None = None,
        host: HostView | None = None,
    ) -> None:
        self.loader = loader
        self.host = host or loader.view
        self._dynamic_of = dynamic_of or _read_dynamic
        self._dynamic_cache: dict[str, elfread.DynamicInfo] = {}
        self._loaded: list[_Mapped] = []

    def _dynamic(self, path: str) -> elfread.DynamicInfo:
        cached = self._dynamic_cache.get(path)
        if cached is None:
            real = self.host.realpath(path) or path
            cached = self._dynamic_of(real) or elfread.EMPTY_DYNAMIC
            self._dynamic_cache[path] = cached
        return cached

    def _match_name(self, name: str) -> _Mapped | None:
        for mapped in self._loaded:
            if name in mapped.names or (mapped.dynamic.soname == name and "/" not in name):
                mapped.names.add(name)
                return mapped
        return None

    def _match_identity(self, identity: tuple[int, int], name: str) -> _Mapped | None:
        for mapped in self._loaded:
            if mapped.identity == identity:
                mapped.names.add(name)
                return mapped
        return None

    def _search(self, name: str, requester: _Mapped, want: tuple[int, int] | None) -> tuple[str, str] | str:
        """(path, source) of the file glibc would map, or why there is none: the one search of
        tree/loader.py, walked with the loader chain of this process."""
        chain: list[tuple[str, elfread.DynamicInfo]] = []
        owner = requester.loader
        while owner is not None:
            chain.append((owner.path, owner.dynamic))
            owner = owner.loader
        chain.reverse()  # LoaderModel.search_order wants the outermost loader first
        return self.loader.find(name, requester.path, requester.dynamic, chain, want)

    def dlopen(self, path: str) -> Closure:
        """Map ``path`` (a host path, as given to dlopen) and its dependencies: its closure."""
        before = {id(m) for m in self._loaded}
        missing: list[Missing] = []
        root = self._match_name(path)
        via_root = "dlopen"
        if root is None:
            identity = self.host.identity(path)
            if identity is None:
                return Closure(path, (), (Missing("", path),))
            root = self._match_identity(identity, path) or self._new(path, identity, path, None)
        want = self.host.elf_key(root.path)
        order: list[_Mapped] = [root]
        info: dict[int, tuple[str, str, str | None, int]] = {id(root): (path, via_root, None, 0)}
        truncated = False
        index = 0
        while index < len(order):
            requester = order[index]
            index += 1
            depth = info[id(requester)][3]
            for name in requester.dynamic.needed:
                dependency = self._map(name, requester, want)
                if isinstance(dependency, str):
                    missing.append(Missing(requester.path, name, dependency))
                    continue
                mapped, via = dependency
                if id(mapped) in info:
                    continue
                if len(order) >= MAX_OBJECTS:
                    truncated = True
                    break
                info[id(mapped)] = (name, via, requester.path, depth + 1)
                order.append(mapped)
        objects = tuple(
            LoadedObject(
                path=m.path,
                identity=m.identity,
                soname=m.dynamic.soname,
                request=info[id(m)][0],
                via=info[id(m)][1],
                needed_by=info[id(m)][2],
                depth=info[id(m)][3],
                reused=id(m) in before,
            )
            for m in order
        )
        return Closure(path, objects, tuple(missing), truncated)

    def _map(self, name: str, requester: _Mapped, want: tuple[int, int] | None) -> tuple[_Mapped, str] | str:
        """The object a DT_NEEDED name maps to and how it was found, or why nothing was."""
        matched = self._match_name(name)
        if matched is not None:
            return matched, "loaded"
        if "/" in name:
            candidate = self.loader.needed_path(name, requester.path)
            found: tuple[str, str] | str = RELATIVE_NEEDED
            if candidate is not None:
                found = (candidate, "path") if self.host.identity(candidate) else "not found"
        else:
            found = self._search(name, requester, want)
        if isinstance(found, str):
            return found
        candidate, via = found
        identity = self.host.identity(candidate)
        if identity is None:
            return "not found"
        reused = self._match_identity(identity, name)
        if reused is not None:
            return reused, via
        return self._new(candidate, identity, name, requester), via

    def _new(self, path: str, identity: tuple[int, int], name: str, loader: _Mapped | None) -> _Mapped:
        mapped = _Mapped(path, identity, self._dynamic(path), {name, path}, loader)
        self._loaded.append(mapped)
        return mapped


def load_closure(
    loader: LoaderModel,
    path: str,
    dynamic_of: Callable[[str], elfread.DynamicInfo | None] | None = None,
    host: HostView | None = None,
) -> Closure:
    """The closure of ``path`` dlopened into a fresh process."""
    return ProcessModel(loader, dynamic_of, host).dlopen(path)
