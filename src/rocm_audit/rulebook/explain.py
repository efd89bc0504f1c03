"""What `rocm-audit explain RULE` shows: one rule of the shipped catalogue, found by its id."""

from __future__ import annotations

import difflib

from rocm_audit.errors import UsageError
from rocm_audit.rulebook.catalogue import Rule, shipped_catalogue


def find_rule(rule_id: str) -> Rule:
    """The shipped rule whose id is ``rule_id``, in any case (``llvm002``). Raises UsageError naming
    the closest ids when there is no such rule."""
    rules = shipped_catalogue().rules
    wanted = rule_id.strip().upper()
    if wanted in rules:
        return rules[wanted]
    close = difflib.get_close_matches(wanted, sorted(rules), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise UsageError(f"no rule {rule_id!r}; {hint}`rocm-audit rules` lists them all")
