"""Fix texts that work where they are suggested (issue 16; a test applies each one and reloads).

- ``rocm-audit dedup`` only where dedup acts: every copy inside a ``_rocm_sdk_*`` tree.
- Elsewhere, byte-identical copies: the exact ``ln -sfr KEEPER COPY`` commands (a symlink maps the
  keeper's inode, so glibc loads it once, formats.md 4).
- Different builds: load only one of them.
- "Do not load X RTLD_GLOBAL" only when that alone keeps both orders clean (the caller checks it
  with the model and says so).

The keeper is dedup's keeper rule (tree/keeper.py, a wheel's own copy first); outside SDK trees,
where dedup does not act, a copy any ``*.dist-info/RECORD`` lists counts as owned too (a stray copy
is the one to replace).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Sequence

from rocm_audit.tree.keeper import KeeperRule

MAX_RECORD_BYTES = 16 << 20


def _site_root(path: str) -> str | None:
    """The nearest ancestor directory holding a ``*.dist-info`` directory (a site-packages)."""
    directory = os.path.dirname(path)
    for _ in range(12):
        try:
            if any(name.endswith(".dist-info") for name in os.listdir(directory)):
                return directory
        except OSError:
            pass
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent
    return None


def record_owned(path: str) -> bool:
    """Whether a ``*.dist-info/RECORD`` next to an ancestor of path lists it."""
    root = _site_root(path)
    if root is None:
        return False
    relative = os.path.relpath(path, root)
    try:
        names = [n for n in os.listdir(root) if n.endswith(".dist-info")]
    except OSError:
        return False
    for name in names:
        record = os.path.join(root, name, "RECORD")
        try:
            with open(record, encoding="utf-8", errors="replace") as stream:
                text = stream.read(MAX_RECORD_BYTES)
        except OSError:
            continue
        if any(line.split(",", 1)[0] == relative for line in text.splitlines()):
            return True
    return False


def choose_keeper(
    paths: Sequence[str],
    sdk_tree_of: Callable[[str], str | None],
    soname: str | None,
    rule: KeeperRule | None = None,
    owned: Callable[[str], bool] | None = None,
) -> str:
    """dedup's keeper (its ownership says which copy a wheel installed); outside SDK trees, where
    dedup does not act, a copy some ``*.dist-info/RECORD`` lists counts as owned too."""
    rule = rule or KeeperRule.from_policy()

    def owned_here(path: str) -> bool:
        return bool(owned and owned(path)) or (sdk_tree_of(path) is None and record_owned(path))

    return rule.choose(paths, sdk_tree_of, soname, owned_here)


def symlink_commands(keeper: str, others: Sequence[str]) -> list[str]:
    return [f"ln -sfr {shlex.quote(keeper)} {shlex.quote(other)}" for other in others]


def duplicate_fix(
    paths: Sequence[str],
    identical: bool,
    keeper: str,
    in_sdk_trees: bool,
    shared: str,
) -> str:
    others = [p for p in paths if p != keeper]
    if identical and in_sdk_trees:
        return (
            f"Identical copies: run `rocm-audit dedup` (keeps {keeper}, links the others to it), "
            f"or replace {', '.join(others)} by a symlink to {keeper}."
        )
    if identical:
        return (
            "Identical copies outside an SDK tree (where dedup does not act): make all but one a symlink: "
            + "; ".join(f"`{c}`" for c in symlink_commands(keeper, others))
            + "."
        )
    return (
        f"Different builds share one {shared}: load only one of them (keep {keeper}, delete "
        f"{', '.join(others)}), or give each build its own SONAME and symbol version node."
    )


def pair_fix(first: str, second: str, global_caution: str | None, through: Sequence[str]) -> str:
    """The fix of two different libraries that fail together in some order."""
    arrives = f" (it arrives through {', '.join(through)})" if through else ""
    if global_caution is not None:
        return (
            f"Never load {global_caution} RTLD_GLOBAL (nor preload it): that alone keeps both "
            f"orders clean{arrives}. Better: rebuild one with its own symbol version node "
            "(LLVM_VERSION_SUFFIX with LLVM_ENABLE_SYMBOL_VERSIONING) or hidden LLVM symbols."
        )
    return (
        f"Load only one of {first} and {second} into one process{arrives}: no RTLD mode keeps "
        "both orders clean. Otherwise rebuild one with its own symbol version node or hidden LLVM "
        "symbols (static link, -fvisibility=hidden, version script `local: *;`)."
    )
