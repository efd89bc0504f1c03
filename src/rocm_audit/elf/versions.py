"""Symbol-version facts of host ELF files through pyelftools (the one adapter for its untyped API).

``.gnu.version_r`` says which versions a file needs from each DT_NEEDED library (``GLIBC_2.34``
from ``libc.so.6``); ``.gnu.version_d`` says which versions a library defines. glibc refuses to load
a file whose needed version its provider does not define ("version `GLIBC_2.39' not found").
pyelftools reads only the section headers and these two small sections, through the file object.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from rocm_audit.errors import FormatError


@dataclass(frozen=True, slots=True)
class VersionFacts:
    needed: dict[str, frozenset[str]]  # DT_NEEDED file name -> versions required from it
    defined: frozenset[str]  # version nodes this file defines (its own SONAME node included)


def read_versions(path: str, fd: int | None = None) -> VersionFacts:
    """Version needs and definitions of one ELF file (read from fd when given: the caller keeps it
    open and closes it). Raises FormatError or OSError."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection

    needed: dict[str, set[str]] = {}
    defined: set[str] = set()
    with open(path, "rb") if fd is None else os.fdopen(fd, "rb", closefd=False) as handle:
        handle.seek(0)
        try:
            elf = ELFFile(handle)
            for section in elf.iter_sections():
                if isinstance(section, GNUVerNeedSection):
                    for need, auxiliaries in section.iter_versions():
                        if need.name:  # a nameless entry names no library to look in
                            needed.setdefault(need.name, set()).update(a.name for a in auxiliaries)
                elif isinstance(section, GNUVerDefSection):
                    for _definition, auxiliaries in section.iter_versions():
                        defined.update(a.name for a in auxiliaries)
        except (ELFError, ValueError, KeyError, IndexError, UnicodeDecodeError) as exc:
            raise FormatError("ELF", handle.tell(), f"cannot read symbol versions: {exc}") from None
    return VersionFacts({k: frozenset(v) for k, v in needed.items()}, frozenset(defined))


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
