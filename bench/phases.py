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
from rocm_audit import (
    cli,  # noqa: E402
    dedup,  # noqa: E402
)

imported = time.perf_counter() - started
spent: dict[str, float] = {}


def wrap(module, name: str, label: str | None = None) -> None:
    original = getattr(module, name, None)
    if original is None:
        return

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            key = label or name
            spent[key] = spent.get(key, 0.0) + time.perf_counter() - t

    setattr(module, name, timed)


def main() -> None:
    mode, site = sys.argv[1], sys.argv[2]
    for name in (
        "build_inventory",
        "make_plan",
        "partition_identical",
        "_group_from",
        "_needed_before",
        "_apply_groups",
        "_look_before",
        "_link",
        "_journal",
        "same_bytes",
        "_verify",
        "check_mode_findings",
    ):
        wrap(dedup, name)
    wrap(dedup.os, "replace", "os.replace (rename over the duplicate)")
    wrap(dedup.os, "symlink", "os.symlink")
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
