"""Which entries of one offload bundle a kept target can make the HIP runtime select.

The rule is the runtime's (formats.md 2.9 and 8.1), taken from tree/targets.py, never restated:
for each device a kept target names, on each of its settings (every xnack and sramecc value the
target leaves open), CLR asks comgr for the native entry, then the generic one, then SPIR-V, and
comgr takes the first compatible entry in bundle order; an entry of size 0 counts as absent
(``choose_entry``, asked for every device ``agents_of`` names). An entry is kept when that
choice falls on it for some device, and always when it is:

- the host entry (the bundler and comgr expect one; it is usually empty);
- SPIR-V: ``HIP_FORCE_SPIRV_CODEOBJECT`` makes the runtime load it on every device, whatever
  native code sits beside it;
- in doubt: an id that names no target rocm-audit can read, a processor this release does not
  know, an offload kind or triple comgr does not look up (Tensile's ``-unknown-`` spelling,
  ``openmp``), unless the broad rule (``serves_kept``) says no kept target can ever run it.

Pure functions: no file is read here.
"""

from __future__ import annotations

from collections.abc import Sequence

from rocm_audit.formats.offload_bundle import COMGR_KINDS, EntryId, comgr_selectable, parse_entry_id
from rocm_audit.tree.targets import (
    GENERIC_PROCESSORS,
    KNOWN_PROCESSORS,
    SPIRV_PROCESSOR,
    TargetId,
    agents_of,
    choose_entry,
    parse_target_id,
    serves_kept,
)


def _selectable_target(entry: EntryId, size: int) -> str | None:
    """The target an entry offers to comgr's lookup, or None when the lookup never picks it."""
    if size == 0 or not comgr_selectable(entry) or entry.target is None:
        return None
    return entry.target


def _in_doubt(entry: EntryId) -> bool:
    """An entry the runtime might load that the rule cannot place: kept unless proved useless."""
    if entry.is_host:
        return False
    if entry.target is None or parse_target_id(entry.target) is None:
        return True
    processor = entry.target.split(":")[0]
    if processor not in KNOWN_PROCESSORS and processor not in GENERIC_PROCESSORS and processor != SPIRV_PROCESSOR:
        return True
    return entry.kind not in COMGR_KINDS or not comgr_selectable(entry)


def entries_to_keep(entries: Sequence[tuple[str, int]], kept: Sequence[TargetId]) -> list[int]:
    """Indices (in bundle order) of the entries to keep, of a bundle whose entries are given as
    (raw id, size) in order, for the kept targets (tree/targets.kept_target patterns)."""
    parsed = [parse_entry_id(raw) for raw, _size in entries]
    keep: set[int] = set()
    for index, entry in enumerate(parsed):
        if entry.is_host:
            keep.add(index)
        elif entry.target is not None and entry.target.split(":")[0] == SPIRV_PROCESSOR:
            keep.add(index)
        elif _in_doubt(entry):
            target = entry.target
            if target is None or any(serves_kept(target, k) is not None for k in kept):
                keep.add(index)
    named = [_selectable_target(entry, size) for entry, (_raw, size) in zip(parsed, entries, strict=True)]
    for agent in (agent for k in kept for agent in agents_of(k)):
        chosen = choose_entry(named, agent)
        if chosen is not None:
            keep.add(chosen[0])
    return sorted(keep)


def selected(entries: Sequence[tuple[str, int]], agent: TargetId) -> int | None:
    """The index of the entry the runtime selects for one concrete device, or None."""
    named = [_selectable_target(parse_entry_id(raw), size) for raw, size in entries]
    chosen = choose_entry(named, agent)
    return chosen[0] if chosen is not None else None
