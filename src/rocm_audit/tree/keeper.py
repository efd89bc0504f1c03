"""The keeper rule: which copy of a set of byte-identical files stays a regular file.

One rule in one place. dedup keeps the copy this rule chooses and links the others to it; every
fix text that names a copy to keep (LLVM001, check) asks the same rule, so a report never promises
a keeper that dedup would not keep.

Order, lower first (rules/dedup.toml, ``[policy.dedup]``):
0. ownership: a file some distribution installed from its wheel (a RECORD row with a hash,
   tree/ownership.py) before any other, so the runtime copy is the keeper and an expansion
   (``rocm-sdk init``'s devel files, rows without hash) links to it, whatever the tree names.
1. owner rank: the position of the ``_rocm_sdk_*`` tree holding the file in ``owner_order``; an
   exact entry beats a pattern that also matches; trees not listed, and files outside any tree,
   come after the list. A tree renamed by TheRock's version nonce (``_rocm_sdk_core17154321``,
   ``_rocm_sdk_core_r7130``: ``PY_PACKAGE_SUFFIX_NONCE`` appended verbatim) ranks as the exact
   entry it extends, before any pattern. Runtime packages own their files (TheRock's devel tarball
   points its links at them: py_packaging.py ``_populate_devel_file``; PR 8137).
2. the ``tie_break`` steps in the order given: ``soname-name`` (a file named after its SONAME),
   ``shortest-path``, ``path-order`` (byte-wise). Byte-wise path order always closes the key, so
   the choice is total and never depends on walk order.
"""

from __future__ import annotations

import fnmatch
import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rocm_audit.rulebook.policy import policy

TIE_BREAK_STEPS = ("soname-name", "shortest-path", "path-order")


@dataclass(frozen=True, slots=True)
class KeeperRule:
    owner_order: tuple[str, ...]
    tie_break: tuple[str, ...] = TIE_BREAK_STEPS

    @classmethod
    def from_policy(cls) -> KeeperRule:
        """The rule in force: ``[policy.dedup]`` of the active policy (shipped defaults plus --rules)."""
        settings = policy("dedup")
        return cls(
            owner_order=tuple(settings.get("owner_order", ())),
            tie_break=tuple(settings.get("tie_break", TIE_BREAK_STEPS)),
        )

    def owner_rank(self, sdk_tree: str | None) -> int:
        """Position of the tree (a path or a directory name) in owner_order; len(owner_order) if none."""
        return _tree_rank(os.path.basename(sdk_tree or ""), self.owner_order)

    def sort_key(
        self, path: str, sdk_tree: str | None, soname: str | None, *, owned: bool = False
    ) -> tuple[object, ...]:
        """Lower is better; compare keys of files that hold the same bytes. ``owned``: a RECORD row
        with a hash installed this path (tree/ownership.py)."""
        key: list[object] = [0 if owned else 1, self.owner_rank(sdk_tree)]
        for step in self.tie_break:
            if step == "soname-name":
                key.append(0 if soname and os.path.basename(path) == soname else 1)
            elif step == "shortest-path":
                key.append(len(path))
            elif step == "path-order":
                key.append(os.fsencode(path))
        key.append(os.fsencode(path))
        return tuple(key)

    def needs_soname(self, sdk_trees: Sequence[str | None], owned: Sequence[bool] | None = None) -> bool:
        """Whether the SONAME can change the choice: only between files of one owner rank, and only
        when the tie-break uses it (reading it costs a dynamic-section read)."""
        if "soname-name" not in self.tie_break:
            return False
        flags = owned if owned is not None else [False] * len(sdk_trees)
        ranks = [(not flag, self.owner_rank(tree)) for tree, flag in zip(sdk_trees, flags, strict=True)]
        return len(set(ranks)) < len(ranks)

    def choose(
        self,
        paths: Sequence[str],
        sdk_tree_of: Callable[[str], str | None],
        soname: str | None = None,
        owned: Callable[[str], bool] | None = None,
    ) -> str:
        """The path to keep among ``paths`` (all holding the same bytes)."""
        return min(paths, key=lambda p: self.sort_key(p, sdk_tree_of(p), soname, owned=bool(owned and owned(p))))


@functools.lru_cache(maxsize=256)  # a plan ranks thousands of files from a handful of trees
def _tree_rank(tree_name: str, owner_order: tuple[str, ...]) -> int:
    if not tree_name:
        return len(owner_order)
    if tree_name in owner_order:
        return owner_order.index(tree_name)
    # A version nonce extends the name, verbatim (``_rocm_sdk_core17154321`` from TheRock CI's run id, or
    # ``_rocm_sdk_core_r7130``): the longest exact entry it extends ranks it.
    extended = [e for e in owner_order if not _is_pattern(e) and tree_name.startswith(e)]
    if extended:
        return owner_order.index(max(extended, key=len))
    for rank, pattern in enumerate(owner_order):
        if fnmatch.fnmatchcase(tree_name, pattern):
            return rank
    return len(owner_order)


def _is_pattern(entry: str) -> bool:
    return any(ch in entry for ch in "*?[")
