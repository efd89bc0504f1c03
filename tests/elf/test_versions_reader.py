"""The symbol-version reader (elf/versions.py) against pyelftools on real libraries: the Debian
libraries of this machine and gcc-built ones with version scripts; malformed input is a FormatError."""

from __future__ import annotations

import glob
import os
import subprocess

import pytest

from rocm_audit.elf.versions import VersionFacts, read_versions
from rocm_audit.errors import FormatError


def read_versions_pyelftools(path: str) -> VersionFacts:
    """The same facts through pyelftools."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection

    needed: dict[str, set[str]] = {}
    defined: set[str] = set()
    with open(path, "rb") as handle:
        for section in ELFFile(handle).iter_sections():
            if isinstance(section, GNUVerNeedSection):
                for need, auxiliaries in section.iter_versions():
                    if need.name:
                        needed.setdefault(need.name, set()).update(a.name for a in auxiliaries)
            elif isinstance(section, GNUVerDefSection):
                for _definition, auxiliaries in section.iter_versions():
                    defined.update(a.name for a in auxiliaries)
    return VersionFacts({k: frozenset(v) for k, v in needed.items()}, frozenset(defined))


def _real_libraries() -> list[str]:
    found = []
    for path in sorted(glob.glob("/usr/lib/x86_64-linux-gnu/*.so*") + glob.glob("/lib/x86_64-linux-gnu/*.so*")):
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as handle:
                if handle.read(4) == b"\x7fELF":
                    found.append(path)
    return found[:400]


def test_the_reader_agrees_with_pyelftools_on_real_libraries():
    libraries = _real_libraries()
    assert len(libraries) > 20, "too few system libraries to compare"
    with_versions = 0
    for path in libraries:
        ours = read_versions(path)
        assert ours == read_versions_pyelftools(path), path
        with_versions += bool(ours.needed or ours.defined)
    assert with_versions > 20


def test_a_version_script_library(tmp_path):
    (tmp_path / "v.map").write_text("LIBV_1.0 { global: f1; local: *; };\nLIBV_2.0 { global: f2; } LIBV_1.0;\n")
    (tmp_path / "v.c").write_text("int f1(void) { return 1; }\nint f2(void) { return 2; }\n")
    lib = tmp_path / "libv.so.1"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-Wl,--version-script=v.map", "-Wl,-soname,libv.so.1", "v.c", "-o", str(lib)],
        cwd=tmp_path,
        check=True,
    )
    facts = read_versions(str(lib))
    assert {"LIBV_1.0", "LIBV_2.0", "libv.so.1"} <= facts.defined
    assert facts == read_versions_pyelftools(str(lib))


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.9])
def test_truncated_and_corrupted_version_sections_are_format_errors(tmp_path, cut):
    source = _real_libraries()[0]
    data = bytearray(open(source, "rb").read())
    from rocm_audit.elf.read import parse_header
    from rocm_audit.elf.sections import read_sections

    fd = os.open(source, os.O_RDONLY)
    try:
        sections = read_sections(fd, parse_header(bytes(data[:64])), len(data))
    finally:
        os.close(fd)
    for section in sections:
        if section.sh_type in (0x6FFFFFFD, 0x6FFFFFFE) and section.size:
            at = section.offset + int(section.size * cut)
            data[at : at + 16] = b"\xff" * 16
    broken = tmp_path / "libbroken.so"
    broken.write_bytes(bytes(data))
    try:
        read_versions(str(broken))
    except FormatError:
        pass
