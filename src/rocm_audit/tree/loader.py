"""A model of glibc's search for DT_NEEDED libraries, good enough to say which files one process
loads together (formats.md 4; glibc elf/dl-load.c ``_dl_map_object``).

Order for a name without ``/``: DT_RPATH of the object and then of its loaders (only while the
object has no DT_RUNPATH), LD_LIBRARY_PATH, DT_RUNPATH, ld.so.conf directories, then the default
directories. ``$ORIGIN`` is the directory of the path the object was loaded by, not of a symlink
target (formats.md 4, observed). Everything is resolved under ``sysroot`` so an unpacked image can
be modelled from outside.
"""

from __future__ import annotations

import glob
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rocm_audit.elf import read as elfread
from rocm_audit.errors import FormatError
from rocm_audit.tree.inventory import read_dynamic_info
from rocm_audit.tree.smallfile import read_small

DEFAULT_LIB = "lib/x86_64-linux-gnu"  # what $LIB expands to on Debian/Ubuntu x86_64
DEFAULT_PLATFORM = "x86_64"
DEFAULT_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")
MAX_LINKS = 40  # ELOOP limit of Linux path resolution
_DST = re.compile(r"\$(ORIGIN|LIB|PLATFORM)\b|\$\{(ORIGIN|LIB|PLATFORM)\}")


@dataclass(frozen=True, slots=True)
class Resolution:
    name: str
    path: str | None  # the path glibc would open (under sysroot), None when not found
    # "rpath", "ld_library_path", "runpath", "ld.so.conf", "default", "path", "not-found", or
    # "not-extracted": glibc would open a file the modelled system holds but the view does not
    via: str
    detail: str = ""  # why nothing was found ("not found", "not an ELF file: ...")


RELATIVE_NEEDED = "not found: a relative path is opened from the process's working directory"
NOT_EXTRACTED = "not extracted from the image: "


@dataclass(slots=True)
class HostView:
    """The modelled file system: paths under ``sysroot`` with symbolic links kept inside it."""

    sysroot: str = "/"
    # (EI_CLASS, e_machine) of files already classified (the inventory's walk), by (st_dev, st_ino):
    # looked up instead of opening the file again.
    known_elf_keys: Mapping[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    # Paths inside sysroot ("/opt/rocm/lib/libx.so.1") of regular files the system holds but the
    # view does not: an image audited without --full streams them past unwritten.
    unextracted: frozenset[str] = frozenset()
    _listing: dict[str, frozenset[str]] = field(default_factory=dict)
    _real: dict[str, str | None] = field(default_factory=dict)
    _elf_key: dict[str, tuple[int, int] | None] = field(default_factory=dict)

    def realpath(self, path: str) -> str | None:
        """Where ``path`` resolves, absolute link targets taken under sysroot; None if absent."""
        if path not in self._real:
            self._real[path] = self._resolve(path)
        return self._real[path]

    def not_extracted(self, directory: str, name: str) -> str | None:
        """The sysroot path of the unextracted file ``directory/name`` is (or, through a link the
        view holds, leads to), or None."""
        if not self.unextracted or self.sysroot in ("", "/"):
            return None
        if name in self.names_in(directory):
            located = self._resolve(os.path.join(directory, name), partial=True)
        else:  # the common miss: one cached lookup of the directory
            real = self.realpath(directory)
            located = os.path.join(real, name) if real else None
        if located is None:
            return None
        inside = "/" + os.path.relpath(located, os.path.realpath(self.sysroot))
        return inside if inside in self.unextracted else None

    def _resolve(self, path: str, partial: bool = False) -> str | None:
        """The real path, or None when absent; ``partial``: where an absent path would be (the
        part that exists resolved, the rest appended)."""
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
                return os.path.join(candidate, *pending) if partial and ".." not in pending else None
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
            identity = self.identity(path) if real is not None else None
            if identity is not None and identity in self.known_elf_keys:
                key = self.known_elf_keys[identity]
            elif real is not None:
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


@dataclass(slots=True)
class LoaderModel:
    sysroot: str = "/"
    lib: str = DEFAULT_LIB
    platform: str = DEFAULT_PLATFORM
    ld_library_path: tuple[str, ...] = ()
    default_dirs: tuple[str, ...] = DEFAULT_DIRS
    host: HostView | None = None  # the modelled file system; built from sysroot when not given
    _conf_dirs: tuple[str, ...] | None = field(default=None, repr=False)
    _dynamic_cache: dict[str, elfread.DynamicInfo | None] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.host is None:
            self.host = HostView(self.sysroot)

    @property
    def view(self) -> HostView:
        assert self.host is not None  # set in __post_init__
        return self.host

    def in_root(self, absolute: str) -> str:
        """Map an absolute path inside the modelled system to a host path."""
        if self.sysroot in ("", "/"):
            return absolute
        return os.path.join(self.sysroot, absolute.lstrip("/"))

    def needed_path(self, name: str, requester_path: str) -> str | None:
        """The file glibc opens for a DT_NEEDED name holding a '/': the name itself with its
        $ORIGIN/$LIB/$PLATFORM expanded (dl-load.c _dl_map_object: expand_dynamic_string_token),
        through the sysroot when absolute. A relative one is opened from the process's working
        directory, which no static audit knows: None."""
        return self.expand(name, os.path.dirname(requester_path))

    def expand(self, entry: str, origin_dir: str) -> str | None:
        """Expand $ORIGIN/$LIB/$PLATFORM in one search-path entry; origin_dir is a host path."""

        def substitute(match: re.Match[str]) -> str:
            token = match.group(1) or match.group(2)
            if token == "ORIGIN":
                return origin_dir
            return self.lib if token == "LIB" else self.platform

        expanded = _DST.sub(substitute, entry)
        if not expanded:
            return None
        if "$ORIGIN" in entry or "${ORIGIN}" in entry:
            return os.path.normpath(expanded)
        return os.path.normpath(self.in_root(expanded)) if os.path.isabs(expanded) else None

    def conf_dirs(self) -> tuple[str, ...]:
        """Directories from /etc/ld.so.conf (and its includes) under the sysroot."""
        if self._conf_dirs is None:
            found: list[str] = []
            self._read_conf(self.in_root("/etc/ld.so.conf"), found, depth=0)
            self._conf_dirs = tuple(found)
        return self._conf_dirs

    def _read_conf(self, path: str, found: list[str], depth: int) -> None:
        if depth > 8:
            return
        try:
            lines = read_small(path, 1 << 20).decode("utf-8", "replace").splitlines()
        except OSError:
            return
        for line in lines:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("include"):
                pattern = line.split(None, 1)[1] if " " in line or "\t" in line else ""
                if not os.path.isabs(pattern):
                    pattern = os.path.join("/etc", pattern)
                for included in sorted(glob.glob(self.in_root(pattern))):
                    self._read_conf(included, found, depth + 1)
            elif os.path.isabs(line):
                host = self.in_root(line)
                if host not in found:
                    found.append(host)

    def dynamic_of(self, path: str) -> elfread.DynamicInfo | None:
        if path not in self._dynamic_cache:
            # The loader follows links, as ld.so does, but a link's absolute target lies under
            # the sysroot; only regular files are opened.
            real = self.view.realpath(path)
            try:
                self._dynamic_cache[path] = (
                    read_dynamic_info(real, follow_symlinks=True)
                    if real is not None and self.view.identity(path)
                    else None
                )
            except (OSError, FormatError):
                self._dynamic_cache[path] = None
        return self._dynamic_cache[path]

    def search_order(
        self, path_used: str, dynamic: elfread.DynamicInfo, loader_chain: Sequence[tuple[str, elfread.DynamicInfo]] = ()
    ) -> list[tuple[str, str]]:
        """(directory, source) pairs in glibc's order for DT_NEEDED of the object at path_used."""
        order: list[tuple[str, str]] = []
        origin = os.path.dirname(path_used)
        if not dynamic.runpath:
            for owner_path, owner_dynamic in ((path_used, dynamic), *reversed(loader_chain)):
                if owner_dynamic.runpath:
                    # A DT_RUNPATH hides that object's own DT_RPATH, but the walk goes on up
                    # the loader chain (glibc get-dynamic-info.h, dl-load.c; observed).
                    continue
                owner_origin = os.path.dirname(owner_path)
                order.extend((d, "rpath") for d in self._expand_all(owner_dynamic.rpath, owner_origin))
        order.extend((d, "ld_library_path") for d in self._expand_all(self.ld_library_path, origin))
        order.extend((d, "runpath") for d in self._expand_all(dynamic.runpath, origin))
        order.extend((d, "ld.so.conf") for d in self.conf_dirs())
        order.extend((self.in_root(d), "default") for d in self.default_dirs)
        return order

    def _expand_all(self, entries: Iterable[str], origin: str) -> list[str]:
        return [d for d in (self.expand(e, origin) for e in entries) if d is not None]

    def find(
        self,
        name: str,
        path_used: str,
        dynamic: elfread.DynamicInfo,
        loader_chain: Sequence[tuple[str, elfread.DynamicInfo]] = (),
        want: tuple[int, int] | None = None,
    ) -> tuple[str, str] | str:
        """(path, source) of the file glibc maps for DT_NEEDED ``name`` of the object loaded as
        path_used, or why there is none. ``want`` is the requester's (EI_CLASS, e_machine):
        glibc skips a file of another class and searches on, but stops at a file that is no ELF
        at all (open_verify; observed, glibc 2.36). Every path is looked at through the sysroot:
        an absolute link inside it never resolves into the auditing host."""
        view = self.view
        if "/" in name:
            candidate = self.needed_path(name, path_used)
            if candidate is None:
                return RELATIVE_NEEDED
            if view.identity(candidate):
                return candidate, "path"
            absent = view.not_extracted(os.path.dirname(candidate), os.path.basename(candidate))
            return NOT_EXTRACTED + absent if absent else "not found"
        for directory, source in self.search_order(path_used, dynamic, loader_chain):
            candidate = os.path.join(directory, name)
            if name not in view.names_in(directory) or view.identity(candidate) is None:
                # glibc would stop at a file the image holds there; its class is not known here.
                absent = view.not_extracted(directory, name)
                if absent:
                    return NOT_EXTRACTED + absent
                continue
            key = view.elf_key(candidate)
            if key is None:
                return f"not an ELF file: {candidate}"
            if want is not None and key != want:
                continue
            return candidate, source
        return "not found"

    def resolve(
        self,
        name: str,
        path_used: str,
        dynamic: elfread.DynamicInfo,
        loader_chain: Sequence[tuple[str, elfread.DynamicInfo]] = (),
    ) -> Resolution:
        """Which file a DT_NEEDED ``name`` of the object loaded as path_used resolves to."""
        found = self.find(name, path_used, dynamic, loader_chain, self.view.elf_key(path_used))
        if isinstance(found, str):
            return Resolution(name, None, "not-extracted" if found.startswith(NOT_EXTRACTED) else "not-found", found)
        return Resolution(name, found[0], found[1])

    def resolve_all(self, path_used: str, dynamic: elfread.DynamicInfo) -> dict[str, Resolution]:
        return {name: self.resolve(name, path_used, dynamic) for name in dynamic.needed}
