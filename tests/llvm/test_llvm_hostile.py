"""Malformed and hostile ELF files: a finding naming the file and the offset, never a traceback."""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import struct

import pytest

from rocm_audit.errors import FormatError
from rocm_audit.llvm.roles import classify
from rocm_audit.tree.inventory import read_dynamic_info
from support.llvm.llvm_builders import FAKE_LLVM, cc_shared

SHDR = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr


def sections(path) -> dict[str, int]:
    """Section name -> file offset of its section header."""
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as stream:
        elf = ELFFile(stream)
        return {s.name: elf["e_shoff"] + i * elf["e_shentsize"] for i, s in enumerate(elf.iter_sections())}


def patch_shdr(path, name: str, **fields: int) -> int:
    offset = sections(path)[name]
    with open(path, "r+b") as stream:
        stream.seek(offset)
        values = list(SHDR.unpack(stream.read(SHDR.size)))
        keys = [
            "sh_name",
            "sh_type",
            "sh_flags",
            "sh_addr",
            "sh_offset",
            "sh_size",
            "sh_link",
            "sh_info",
            "sh_addralign",
            "sh_entsize",
        ]
        for key, value in fields.items():
            values[keys.index(key)] = value
        stream.seek(offset)
        stream.write(SHDR.pack(*values))
    return offset


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    (root / "node.map").write_text("FAKE_1 { global: *; };\n")
    return cc_shared(root / "libfake.so", FAKE_LLVM, f"-Wl,--version-script={root / 'node.map'}")


@pytest.fixture()
def victim(pristine, tmp_path):
    target = tmp_path / "libvictim.so"
    shutil.copyfile(pristine, target)
    return target


def classify_path(path):
    return classify(str(path), read_dynamic_info(str(path)))


@pytest.mark.parametrize(
    ("section", "fields", "reason"),
    [
        (".dynsym", {"sh_size": 24 << 36}, "runs past the end of the file"),
        (".dynstr", {"sh_offset": 1 << 33}, "runs past the end of the file"),
    ],
)
def test_hostile_sizes_and_counts_are_refused_before_any_read(victim, section, fields, reason):
    offset = patch_shdr(victim, section, **fields)
    with pytest.raises(FormatError) as raised:
        classify_path(victim)
    assert reason in raised.value.reason
    assert raised.value.offset == offset  # the section header that holds the bad field


def test_a_hostile_version_count_is_not_walked(pristine, victim):
    """sh_info of .gnu.version_d claims four billion definitions: the view follows vd_next
    (bounded by the section's size) and never counts on sh_info, so the facts do not change."""
    expected = classify_path(pristine)
    assert expected.version_node == "FAKE_1"
    patch_shdr(victim, ".gnu.version_d", sh_info=0xFFFFFFFF)
    assert classify_path(victim) == dataclasses.replace(expected, path=str(victim))


@pytest.mark.parametrize(
    ("section", "fields"),
    [
        (".dynsym", {"sh_entsize": 7}),
        (".dynsym", {"sh_link": 999}),
        (".rela.dyn", {"sh_entsize": 16}),
    ],
)
def test_inconsistent_section_headers_are_format_errors_in_the_header_table(victim, section, fields):
    table = sorted(sections(victim).values())
    patch_shdr(victim, section, **fields)
    with pytest.raises(FormatError) as raised:
        classify_path(victim)
    # pyelftools checks these while building the section (or one that links to it).
    assert table[0] <= raised.value.offset <= table[-1] and raised.value.reason


def test_random_corruption_never_escapes_as_another_exception(pristine, tmp_path):
    """300 corruptions of the ELF and section headers: a result or FormatError, nothing else."""
    data = bytearray(pristine.read_bytes())
    e_shoff = struct.unpack_from("<Q", data, 0x28)[0]
    spots = list(range(0x10, 0x40)) + list(range(e_shoff, len(data)))
    rng = random.Random(4)
    target = tmp_path / "libfuzz.so"
    for _ in range(300):
        mutated = bytearray(data)
        for _flip in range(rng.randint(1, 4)):
            mutated[rng.choice(spots)] = rng.randrange(256)
        target.write_bytes(mutated)
        try:
            classify(str(target), read_dynamic_info(str(target)))
        except (FormatError, OSError):
            pass


def test_cli_reports_truncated_and_hostile_libraries_without_a_traceback(llvm_cli, victim, dup_llvm15, tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    with open(dup_llvm15.paths["core"], "rb") as source:
        (tree / "libLLVM-15.so.1").write_bytes(source.read(3 << 20))  # a truncated copy
    dynsym_header = patch_shdr(victim, ".dynsym", sh_size=24 << 36)
    shutil.copyfile(victim, tree / "libvictim.so")
    result = llvm_cli("-p", str(tree), "--format", "json", "--fail-on", "never", expect=0)
    by_path = {}
    for finding in result.report["findings"]:
        by_path.setdefault(os.path.basename(finding["path"]), []).append(finding)
    victim_finding = next(f for f in by_path["libvictim.so"] if f["rule"] == "LLVM009")
    assert victim_finding["data"]["offset"] == dynsym_header
    truncated = by_path["libLLVM-15.so.1"]
    assert any(f["rule"] in ("LLVM009", "SCAN002") and "offset" in f["data"] for f in truncated)
    roles = {os.path.basename(lib["path"]): lib["role"] for lib in result.report["libraries"]}
    assert roles["libvictim.so"] == "unknown"
    assert "Traceback" not in result.output
