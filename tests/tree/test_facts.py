"""The per-run fact store: one open per file for all facts, errors remembered, replaced files refused."""

from __future__ import annotations

import os

import pytest

from rocm_audit.elf.view import ElfView
from rocm_audit.errors import FormatError
from rocm_audit.tree.discovery import resolve_roots
from rocm_audit.tree.inventory import build_inventory, dynamic_info_of
from support.sdk_tree import build_library


def _record(tmp_path, name="libx.so.1"):
    build_library(tmp_path / "lib", "x", name)
    inventory = build_inventory(resolve_roots([str(tmp_path / "lib")])[0])
    (record,) = inventory.files
    return inventory, record


def test_facts_of_one_file_share_one_view(tmp_path):
    inventory, record = _record(tmp_path)
    seen: list[ElfView] = []
    with inventory.facts.holding(record):
        inventory.facts.get(record, "a", lambda view: seen.append(view) or 1)
        inventory.facts.get(record, "b", lambda view: seen.append(view) or 2)
        assert inventory.dynamic(record).soname == "libx.so.1"
        assert seen[0].sections is seen[1].sections  # the section table is parsed once per file
    assert len({id(view) for view in seen}) == 1 and inventory.facts.opens == 1
    assert inventory.facts.get(record, "a", lambda view: 99) == 1  # cached: not read again
    assert inventory.facts.opens == 1


def test_an_unreadable_fact_is_read_once_and_raised_to_every_asker(tmp_path):
    inventory, record = _record(tmp_path)
    calls = []

    def broken(view: ElfView) -> None:
        calls.append(view)
        raise FormatError("ELF", 0x40, "bad program header")

    for _ in range(3):
        with pytest.raises(FormatError, match="bad program header"):
            inventory.facts.get(record, "broken", broken)
    assert len(calls) == 1 and inventory.facts.opens == 1


def test_a_file_replaced_since_the_walk_is_not_read(tmp_path):
    inventory, record = _record(tmp_path)
    os.rename(record.path, record.path + ".old")
    build_library(tmp_path / "lib", "y", "libx.so.1", value=2)
    with pytest.raises(OSError, match="replaced"):
        inventory.facts.get(record, "dynamic", dynamic_info_of)
