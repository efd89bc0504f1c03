"""What `rocm-audit explain RULE` shows: one rule of the shipped catalogue, found by its id."""

from __future__ import annotations

import difflib
import re

from rocm_audit.errors import UsageError
from rocm_audit.rulebook.catalogue import Rule, shipped_catalogue


def find_rule(rule_id: str) -> Rule:
    """The shipped rule whose id is ``rule_id``, in any case (``llvm002``). Raises UsageError naming
    the closest ids when there is no such rule."""
    rules = shipped_catalogue().rules
    wanted = rule_id.strip().upper()
    if wanted in rules:
        return rules[wanted]
    # The number without its padding (dup1, llvm02, arch0001) names one rule; difflib rates every
    # DUP0xx alike for those, so it only answers for other typos (LVM002).
    numbered = re.fullmatch(r"([A-Z]+)0*([0-9]+)", wanted)
    padded = f"{numbered[1]}{int(numbered[2]):03d}" if numbered else ""
    family = sorted(r for r in rules if re.fullmatch(rf"{re.escape(wanted)}[0-9]+", r))
    if family:  # a family's name (ARCH): its rules, first to last
        span = family[0] if len(family) == 1 else f"{family[0]} to {family[-1]}"
        raise UsageError(f"no rule {rule_id!r}; the {wanted} rules are {span}", hint=_LISTS)
    close = [padded] if padded in rules else difflib.get_close_matches(wanted, sorted(rules), n=3, cutoff=0.6)
    said = f"no rule {rule_id!r}; did you mean {' or '.join(sorted(close))}?" if close else f"no rule {rule_id!r}"
    raise UsageError(said, hint=_LISTS)


_LISTS = "`rocm-audit rules` lists them all, with their titles"
