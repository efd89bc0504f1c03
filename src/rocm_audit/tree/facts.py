"""Per-file facts of one run, each computed at most once per file and shared by every check.

A fact is whatever one reader derives from one file's bytes: its dynamic section, its code objects,
its LLVM role, its symbol versions. Readers take the file's view (elf/view.py: one open
descriptor and every ELF structure parsed from it, each parsed once), never a path, and this store
hands them one: during a fact pass (``holding``) the view opened for the first fact serves every
other fact of that file, so its header, section table and version tables are parsed once for all
checks, so `rocm-audit check` opens a host
library three times in all (the inventory's classification, the byte comparison when another file
shares its size, the fact pass), whatever the number of checks.

Facts are keyed by (st_dev, st_ino), which is also how glibc tells files apart (formats.md 4): two
paths of one inode are one file. Facts that name the path they were read through (code objects,
whose findings carry it) are keyed by path as well. A reader's exception (FormatError, OSError) is
remembered like a value and raised again for every later asker, so a malformed file is read once
and reported by each check that needed it.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

from rocm_audit.elf.view import ElfView
from rocm_audit.errors import FormatError

T = TypeVar("T")

OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class HasIdentity(Protocol):
    @property
    def path(self) -> str: ...

    @property
    def identity(self) -> tuple[int, int]: ...


def open_checked(path: str, identity: tuple[int, int]) -> int:
    """Open path (never through a link) and check it is still the inode the walk saw. Raises OSError."""
    fd = os.open(path, OPEN_FLAGS)
    try:
        opened = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if (opened.st_dev, opened.st_ino) != identity:
        os.close(fd)
        raise OSError(errno.ESTALE, "file was replaced while it was being read", path)
    return fd


class FileFacts:
    """The facts of one run (see the module docstring)."""

    def __init__(self) -> None:
        self._values: dict[tuple[object, ...], object] = {}
        self._failures: dict[tuple[object, ...], BaseException] = {}
        self._held: dict[tuple[int, int], ElfView] = {}
        self.opens = 0  # descriptors opened for facts: what the budget test counts from outside too

    def get(self, record: HasIdentity, name: str, read: Callable[[ElfView], T], *, per_path: bool = False) -> T:
        """The fact ``name`` of the file of ``record``: ``read(view)`` on first use, the cached value after."""
        key: tuple[object, ...] = (record.identity, name, record.path) if per_path else (record.identity, name)
        if key in self._values:
            return self._values[key]  # type: ignore[return-value]
        if key in self._failures:
            raise self._failures[key]
        try:
            view = self._held.get(record.identity)
            if view is not None:
                value = read(view)
            else:
                fd = open_checked(record.path, record.identity)
                self.opens += 1
                try:
                    value = read(ElfView(fd))
                finally:
                    os.close(fd)
        except (OSError, FormatError) as exc:  # remembered and raised again, unchanged, to every asker
            self._failures[key] = exc
            raise
        self._values[key] = value
        return value

    def preload(self, identity: tuple[int, int], name: str, value: object) -> None:
        """A fact read before this run from the same bytes by the same reader (image/trim.py reads
        a library's LLVM facts while its layer streams)."""
        self._values.setdefault((identity, name), value)

    def known(self, record: HasIdentity, name: str, *, per_path: bool = False) -> bool:
        key: tuple[object, ...] = (record.identity, name, record.path) if per_path else (record.identity, name)
        return key in self._values or key in self._failures

    def duplicate(self, record: HasIdentity) -> int | None:
        """A second descriptor of the file held for ``record`` (the caller closes it), so a fact
        can be read later, in a forked helper too, without opening the file again; None when
        nothing is held."""
        view = self._held.get(record.identity)
        return os.dup(view.fd) if view is not None else None

    @contextlib.contextmanager
    def holding(self, record: HasIdentity) -> Iterator[None]:
        """Keep one view of record's file (one descriptor) open while the facts of that file are read.

        A file that cannot be opened holds nothing: each fact then reports the error itself."""
        if record.identity in self._held:
            yield
            return
        try:
            fd = open_checked(record.path, record.identity)
        except OSError:
            yield
            return
        self.opens += 1
        self._held[record.identity] = ElfView(fd)
        try:
            yield
        finally:
            del self._held[record.identity]
            os.close(fd)
