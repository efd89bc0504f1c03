"""Symbol-version facts of host ELF files: ``.gnu.version_r`` and ``.gnu.version_d``, read directly.

``.gnu.version_r`` says which versions a file needs from each DT_NEEDED library (``GLIBC_2.34``
from ``libc.so.6``); ``.gnu.version_d`` says which versions a library defines. glibc refuses to load
a file whose needed version its provider does not define ("version `GLIBC_2.39' not found").

Parsed by the file's view (elf/view.py, shared with the other facts of the pass), which reads
the two sections with their string table by ``pread``: pyelftools did the same through a file object, but
building an ``ELFFile`` and its section objects cost 15 ms per library (2.5 s of a 12 s ``check``
over 3.4 GB of vendor wheels). pyelftools stays the oracle: tests/test_versions_reader.py compares
both on real libraries.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from rocm_audit.elf.view import ElfView, open_view


@dataclass(frozen=True, slots=True)
class VersionFacts:
    needed: dict[str, frozenset[str]]  # DT_NEEDED file name -> versions required from it
    defined: frozenset[str]  # version nodes this file defines (its own SONAME node included)


def version_facts(view: ElfView) -> VersionFacts:
    """Version needs and definitions of the file of a view. Raises FormatError or OSError."""
    needed: dict[str, set[str]] = {}
    for need in view.version_needs:
        if need.file:  # a nameless entry names no library to look in
            needed.setdefault(need.file, set()).update(name for _index, name in need.versions)
    defined = {name for definition in view.version_definitions for name in definition.names}
    return VersionFacts({k: frozenset(v) for k, v in needed.items()}, frozenset(defined))


def read_versions(path: str, view: ElfView | None = None) -> VersionFacts:
    """Version needs and definitions of one ELF file (from its view when given). Raises
    FormatError or OSError."""
    if view is not None:
        return version_facts(view)
    fd, view = open_view(path, follow_symlinks=True)
    try:
        return version_facts(view)
    finally:
        os.close(fd)


_VERSION = re.compile(r"^([A-Z][A-Z_]*?)_(\d+(?:\.\d+)*)$")


def split_version(name: str) -> tuple[str, tuple[int, ...]] | None:
    """``GLIBC_2.34`` -> ("GLIBC", (2, 34)); None for names without a numeric version."""
    match = _VERSION.match(name)
    if not match:
        return None
    return match.group(1), tuple(int(x) for x in match.group(2).split("."))


def newest(defined: frozenset[str], family: str) -> tuple[int, ...] | None:
    versions = [v for f, v in filter(None, map(split_version, defined)) if f == family]
    return max(versions) if versions else None


def format_version(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))
