"""Where a `rocm-audit dedup` run spends its time: one in-process run with the phases wrapped.

    python bench/phases.py check SITE      # or: apply SITE (changes SITE: use a copy)

Prints one JSON object: seconds per phase (imports, inventory, plan = compare + groups, apply steps,
verification, rendering). Wrapping costs microseconds per call; names that a newer rocm-audit no
longer has are skipped, so the breakdown degrades instead of failing.
"""

from __future__ import annotations

import json
import os
import sys
import time

started = time.perf_counter()
from rocm_audit.cli import common as cli
from rocm_audit.dedup import run as dedup

imported = time.perf_counter() - started
spent: dict[str, float] = {}


def wrap(name: str, label: str | None = None) -> None:
    """Time every call of the rocm_audit function called ``name``, in each module that holds it
    (modules import functions by name, so each namespace gets the wrapper)."""
    holders = [
        m
        for m_name, m in list(sys.modules.items())
        if m_name.startswith("rocm_audit") and callable(getattr(m, name, None))
    ]
    if not holders:
        return
    original = getattr(holders[0], name)

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            key = label or name
            spent[key] = spent.get(key, 0.0) + time.perf_counter() - t

    for module in holders:
        if getattr(module, name) is original:
            setattr(module, name, timed)


def wrap_os(name: str, label: str) -> None:
    original = getattr(os, name)

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - t

    setattr(os, name, timed)


def main() -> None:
    mode, site = sys.argv[1], sys.argv[2]
    # load every module whose functions are timed
    import rocm_audit.dedup.apply
    import rocm_audit.dedup.link
    import rocm_audit.dedup.manifest
    import rocm_audit.dedup.verify  # noqa: F401

    for name in (
        "build_inventory",
        "make_plan",
        "partition_identical",
        "_group_from",
        "needed_before",
        "_apply_groups",
        "look_before",
        "replace_with_link",
        "journal_changes",
        "same_bytes",
        "verify_applied",
        "check_mode_findings",
    ):
        wrap(name)
    wrap_os("replace", "os.replace (rename over the duplicate)")
    wrap_os("symlink", "os.symlink")
    try:
        from rocm_audit.rulebook.policy import load_policy, using_policy

        context = using_policy(load_policy([]))
    except ImportError:  # an older rocm-audit without policies
        import contextlib

        context = contextlib.nullcontext()
    with context:
        t = time.perf_counter()
        outcome = dedup.run_dedup([site], mode=mode)
        total = time.perf_counter() - t
        t = time.perf_counter()
        stdout, sys.stdout = sys.stdout, open(os.devnull, "w")
        try:
            cli.emit(outcome, cli.OutputFormat.text, None, cli.FailOn.error)
        finally:
            sys.stdout.close()
            sys.stdout = stdout
        rendered = time.perf_counter() - t
    result = {
        "mode": mode,
        "import rocm_audit.cli.app + dedup": round(imported, 4),
        "run_dedup": round(total, 4),
        "render text": round(rendered, 4),
    }
    result.update({k: round(v, 4) for k, v in spent.items()})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
