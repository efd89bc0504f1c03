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

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field

from rocm_audit.elf import read as elfread
from rocm_audit.errors import FormatError
from rocm_audit.tree.inventory import read_dynamic_info
from rocm_audit.tree.loader import LoaderModel

MAX_LINKS = 40  # ELOOP limit of Linux path resolution
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


@dataclass(slots=True)
class HostView:
    """The modelled file system: paths under ``sysroot`` with symbolic links kept inside it."""

    sysroot: str = "/"
    _listing: dict[str, frozenset[str]] = field(default_factory=dict)
    _real: dict[str, str | None] = field(default_factory=dict)
    _elf_key: dict[str, tuple[int, int] | None] = field(default_factory=dict)

    def realpath(self, path: str) -> str | None:
        """Where ``path`` resolves, absolute link targets taken under sysroot; None if absent."""
        if path not in self._real:
            self._real[path] = self._resolve(path)
        return self._real[path]

    def _resolve(self, path: str) -> str | None:
        if self.sysroot in ("", "/"):
            real = os.path.realpath(path)
            return real if os.path.exists(real) else None
        root = os.path.realpath(self.sysroot)
        relative = os.path.relpath(path, root)
        if relative == ".." or relative.startswith("../"):
            return None
        pending = [p for p in relative.split(os.sep) if p not in ("", ".")]
        current = root
        followed = 0
        while pending:
            part = pending.pop(0)
            if part == "..":
                current = os.path.dirname(current) if current != root else root
                continue
            candidate = os.path.join(current, part)
            try:
                st = os.lstat(candidate)
            except OSError:
                return None
            if stat.S_ISLNK(st.st_mode):
                followed += 1
                if followed > MAX_LINKS:
                    return None
                target = os.readlink(candidate)
                if os.path.isabs(target):
                    current = root
                pending[:0] = [p for p in target.split("/") if p not in ("", ".")]
            else:
                current = candidate
        return current

    def names_in(self, directory: str) -> frozenset[str]:
        """Entry names of a directory (cached: one listing per directory and model)."""
        if directory not in self._listing:
            real = self.realpath(directory)
            try:
                names = frozenset(os.listdir(real)) if real else frozenset()
            except OSError:
                names = frozenset()
            self._listing[directory] = names
        return self._listing[directory]

    def identity(self, path: str) -> tuple[int, int] | None:
        real = self.realpath(path)
        if real is None:
            return None
        try:
            st = os.stat(real)
        except OSError:
            return None
        return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None

    def elf_key(self, path: str) -> tuple[int, int] | None:
        """(EI_CLASS, e_machine) of an ELF file, or None: glibc skips files of another class."""
        if path not in self._elf_key:
            key = None
            real = self.realpath(path)
            if real is not None:
                try:
                    fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                    try:
                        head = os.pread(fd, 64, 0)
                    finally:
                        os.close(fd)
                    header = elfread.parse_header(head)
                    key = (header.elf_class, header.e_machine)
                except (OSError, FormatError):
                    key = None
            self._elf_key[path] = key
        return self._elf_key[path]


class ProcessModel:
    """One process (one link-map namespace) into which libraries are dlopened in turn."""

    def __init__(
        self,
        loader: LoaderModel,
        dynamic_of: Callable[[str], elfread.DynamicInfo | None] | None = None,
        host: HostView | None = None,
    ) -> None:
        self.loader = loader
        self.host = host or HostView(loader.sysroot)
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

    def _search(
        self, name: str, requester: _Mapped, want: tuple[int, int] | None
    ) -> tuple[str, str] | str:
        """(path, source) of the file glibc would map, or why there is none."""
        chain: list[tuple[str, elfread.DynamicInfo]] = []
        owner = requester.loader
        while owner is not None:
            chain.append((owner.path, owner.dynamic))
            owner = owner.loader
        chain.reverse()  # LoaderModel.search_order wants the outermost loader first
        for directory, source in self.loader.search_order(requester.path, requester.dynamic, chain):
            if name not in self.host.names_in(directory):
                continue
            candidate = os.path.join(directory, name)
            if self.host.identity(candidate) is None:
                continue
            key = self.host.elf_key(candidate)
            if key is None:
                # open_verify fails ("invalid ELF header", "file too short") and open_path stops
                # there: glibc searches on only after ENOENT/EACCES (observed, glibc 2.36).
                return f"not an ELF file: {candidate}"
            if want is not None and key != want:
                continue  # another ELF class or machine: glibc skips it and searches on
            return candidate, source
        return "not found"

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

    def _map(
        self, name: str, requester: _Mapped, want: tuple[int, int] | None
    ) -> tuple[_Mapped, str] | str:
        """The object a DT_NEEDED name maps to and how it was found, or why nothing was."""
        matched = self._match_name(name)
        if matched is not None:
            return matched, "loaded"
        if "/" in name:
            candidate = (
                name if os.path.isabs(name) else os.path.join(os.path.dirname(requester.path), name)
            )
            found: tuple[str, str] | str = (
                (candidate, "path") if self.host.identity(candidate) else "not found"
            )
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

    def _new(
        self, path: str, identity: tuple[int, int], name: str, loader: _Mapped | None
    ) -> _Mapped:
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
