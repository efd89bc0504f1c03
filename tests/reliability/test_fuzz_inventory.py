"""Property-based fuzzing (hypothesis) of the header-only ELF reader, the inventory, the dedup
manifest reader and the rules-file parser, seeded from a real gcc-built library.

Property: whatever the bytes, the inventory classifies the file or reports it as a finding
(SCAN001/SCAN002 with the offset) and goes on; the readers raise only their documented errors.
ROCM_AUDIT_SLOW=1 multiplies the number of examples.
"""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocm_audit.elf import read as elfread
from rocm_audit.errors import ConfigError, FormatError, UsageError
from rocm_audit.tree.discovery import AuditRoot
from rocm_audit.tree.inventory import build_inventory, read_dynamic_info
from support.sdk_tree import build_library

pytestmark = pytest.mark.fuzz  # hypothesis over mutated trees

EXAMPLES = 2000 if os.environ.get("ROCM_AUDIT_SLOW") == "1" else 150
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> bytes:
    directory = tmp_path_factory.mktemp("seed")
    return build_library(directory, "seed", "libseed.so.1", value=3, rpath="$ORIGIN/../lib").read_bytes()


def mutate(seed: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    data = bytearray(seed)
    for position, value in edits:
        data[position % len(data)] = value
    return bytes(data[:cut] if cut is not None else data)


# Edits concentrated on the parts the reader interprets: header, program headers, dynamic section.
EDITS = st.lists(st.tuples(st.one_of(st.integers(0, 0x400), st.integers(0, 1 << 16)), st.integers(0, 255)), max_size=24)


@FUZZ
@given(edits=EDITS, cut=st.one_of(st.none(), st.integers(0, 20000)))
def test_inventory_never_raises_on_mutated_elf(seed, tmp_path, edits, cut):
    target = tmp_path / "_rocm_sdk_core" / "libfuzz.so.1"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(mutate(seed, edits, cut))
    inventory = build_inventory([AuditRoot(str(tmp_path), str(tmp_path))])
    assert len(inventory.files) == 1
    for finding in inventory.findings:
        assert finding.rule in ("SCAN002",) and finding.path == str(target)
        assert isinstance(finding.data["offset"], int)
    try:
        read_dynamic_info(str(target))
    except FormatError as exc:
        assert exc.offset >= 0
    except OSError:
        pass


@FUZZ
@given(phnum=st.integers(0, 0xFFFF), phoff=st.integers(0, (1 << 64) - 1), phentsize=st.integers(0, 0xFFFF))
def test_absurd_program_header_fields_are_format_errors_not_allocations(seed, tmp_path, phnum, phoff, phentsize):
    data = bytearray(seed)
    struct.pack_into("<Q", data, 0x20, phoff)
    struct.pack_into("<HH", data, 0x36, phentsize, phnum)
    path = tmp_path / "lib.so"
    path.write_bytes(bytes(data))
    try:
        read_dynamic_info(str(path))
    except FormatError as exc:
        assert exc.reason


@FUZZ
@given(st.lists(st.text(max_size=200), max_size=6))
def test_manifest_reader_rejects_garbage_with_a_usage_error(tmp_path, lines):
    from rocm_audit.dedup.revert import revert_manifests

    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(lines), encoding="utf-8", errors="surrogateescape")
    try:
        outcome = revert_manifests([str(manifest)])
    except UsageError as exc:
        assert str(manifest) in exc.message
    else:
        assert outcome.sections["revert"]["restored"] == []


@FUZZ
@given(st.text(max_size=400))
def test_rules_parser_gives_config_errors_only(tmp_path, text):
    from rocm_audit.rulebook.policy import load_policy

    path = tmp_path / "rules.toml"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    try:
        load_policy([str(path)])
    except ConfigError as exc:
        assert exc.message.startswith(str(path))


def test_parse_header_rejects_every_truncation_of_a_real_header(seed):
    for length in range(0, 64):
        with pytest.raises(FormatError):
            elfread.parse_header(seed[:length]) if length >= 4 else elfread.parse_header(seed[:length] or b"x")
    assert elfread.parse_header(seed[:64]).e_type == elfread.ET_DYN
