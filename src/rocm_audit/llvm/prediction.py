"""What a pair or closure of LLVM libraries is expected to do when loaded together: the clash
record (kind, risk, reason, paths, fix) and the predictions from ELF facts (formats.md 3.2, 3.4)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from rocm_audit.findings import Finding
from rocm_audit.llvm.pairs import PairVerdicts
from rocm_audit.llvm.probes import (
    CLOSURE_MODES,
    PAIR_MODES,
    ProbeOutcome,
    ProbeResult,
    ProbeVerdict,
)
from rocm_audit.llvm.roles import ClFacts, Role
from rocm_audit.llvm.verdicts import Prediction, Verdict


class Expect(str, enum.Enum):
    """What a load in one mode is predicted to do."""

    ABORT = "abort"  # double registration: LLVM prints the message and aborts
    UNSAFE = "unsafe"  # other llvm::cl data interposed, registry not: crash possible (e.g. at exit)
    CLEAN = "clean"


class Risk(str, enum.Enum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


class Reason(str, enum.Enum):
    DUPLICATE_EXPORTER = "duplicate-exporter"
    DUPLICATE_REGISTRANT = "duplicate-registrant"
    INTERPOSABLE_EXPORTERS = "interposable-exporters"
    CLOSURE_INTERPOSITION = "closure-interposition"
    CLOSURE_TWO_LLVMS = "closure-two-llvms"


# Each rule's catalogue severity matches the clash risk (high: error, medium: warning), so a
# rules file can override it like any other rule's.
RULE_OF_REASON = {
    Reason.DUPLICATE_EXPORTER: "LLVM001",
    Reason.DUPLICATE_REGISTRANT: "LLVM001",
    Reason.INTERPOSABLE_EXPORTERS: "LLVM002",
    Reason.CLOSURE_INTERPOSITION: "LLVM003",
    Reason.CLOSURE_TWO_LLVMS: "LLVM004",
}


@dataclass(slots=True)
class Clash:
    reason: Reason
    risk: Risk
    paths: tuple[str, ...]
    predictions: dict[str, Expect]  # probe mode -> expectation
    fix: str
    soname: str | None = None
    version_node: str | None = None
    identical: bool | None = None  # duplicates: every copy has the same bytes
    via: tuple[str, ...] = ()  # closure clashes: roots whose closure holds the pair
    via_count: int = 0
    probe_root: str | None = None  # closure clashes: the root a probe dlopens (a library if any)
    probes: list[ProbeResult] = field(default_factory=list)
    judged: PairVerdicts | None = None  # both orders, three modes, whole closures (pairs.py)
    probe_expect: list[Verdict] = field(default_factory=list)  # judged: the static verdict of each probe
    closure_judged: dict[str, Prediction] = field(default_factory=dict)  # closure clashes: mode -> model
    finding: Finding | None = None  # the clash's own finding (a probe verdict rewrites it)

    @property
    def mode(self) -> str:
        """When the clash fires: "any", "first-global", "both-global" or "none"."""
        return mode_of(self.predictions)

    @property
    def kind(self) -> str:
        return "closure" if self.reason in (Reason.CLOSURE_INTERPOSITION, Reason.CLOSURE_TWO_LLVMS) else "pair"

    @property
    def confirmed(self) -> bool | None:
        """True: a probe saw the double registration; False: probes ran, none saw it; None."""
        if any(p.outcome is ProbeOutcome.CONFIRMED for p in self.probes):
            return True
        if any(p.outcome in (ProbeOutcome.CLEAN, ProbeOutcome.CRASH_AT_EXIT) for p in self.probes):
            return False
        return None

    @property
    def option(self) -> str | None:
        return next((p.option for p in self.probes if p.option), None)

    def sort_key(self) -> tuple[tuple[str, ...], str]:
        return (self.paths, self.reason.value)


# ---------------------------------------------------------------------------------------------
# Predictions (formats.md 3.2 and 4): pure functions of ClFacts, shared by detection and tests.


def binds_data(consumer: ClFacts, provider: ClFacts) -> bool:
    """Whether consumer's references to llvm::cl data resolve to provider's definitions when
    provider comes first in consumer's lookup scope (glibc ``check_match``: an unversioned side
    matches anything, otherwise the version names must agree)."""
    if consumer.role is not Role.EXPORTER or provider.role is not Role.EXPORTER or consumer.symbolic:
        return False
    return (
        consumer.version_node is None or provider.version_node is None or consumer.version_node == provider.version_node
    )


def _interposed(consumer: ClFacts) -> Expect:
    # TopLevelSubCommand through a GLOB_DAT slot shares the registry itself (abort, observed with
    # LLVM 14-16); without it only other data is shared (LLVM 19 copies: SIGSEGV at exit).
    return Expect.ABORT if consumer.interposable_registry else Expect.UNSAFE


def predict_pair(
    first: ClFacts,
    second: ClFacts,
    *,
    same_file: bool,
    same_library: bool,
    preloaded: tuple[bool, bool] = (False, False),
) -> dict[str, Expect]:
    """Expected outcome of loading first, then second, in each of probes.PAIR_MODES.

    same_file: one (st_dev, st_ino), so glibc maps it once. same_library: one SONAME or the same
    bytes, so two registrants bind to one registry. preloaded: the file (or another path to it)
    is preloaded RTLD_GLOBAL before both, as rocm_sdk.preload_libraries does.
    """
    clean = {mode: Expect.CLEAN for mode in PAIR_MODES}
    if same_file:
        return clean
    if first.role is Role.REGISTRANT and second.role is Role.REGISTRANT and same_library:
        # Both import addArgument from the one libLLVM the process has: any RTLD mode (7818).
        return {mode: Expect.ABORT for mode in PAIR_MODES}
    if preloaded[1] and not preloaded[0]:
        first, second = second, first  # the preloaded one is mapped first, whatever the steps say
    if binds_data(second, first):
        expect = _interposed(second)
        # The second binds to the first only when the first is in the global scope.
        return {
            mode: (expect if first_global or any(preloaded) else Expect.CLEAN)
            for mode, (first_global, _second_global) in PAIR_MODES.items()
        }
    return clean


def predict_closure(earlier: ClFacts, later: ClFacts) -> dict[str, Expect]:
    """Expected outcome of dlopening a root whose closure maps earlier before later (BFS order).

    Objects of one dlopen share its local scope, so later binds to earlier whatever the flags.
    """
    expect = _interposed(later) if binds_data(later, earlier) else Expect.CLEAN
    return {mode: expect for mode in CLOSURE_MODES}


def mode_of(predictions: dict[str, Expect]) -> str:
    firing = {mode for mode, expect in predictions.items() if expect is not Expect.CLEAN}
    if not firing:
        return "none"
    if firing == set(predictions):
        return "any"
    if firing == {"global-global", "global-local"}:
        return "first-global"
    if firing == {"global-global"}:
        return "both-global"
    return ",".join(sorted(firing))


def agrees(expect: Expect, outcome: ProbeOutcome) -> bool | None:
    """Whether a probe outcome matches the prediction; None when the probe says nothing."""
    if outcome in (ProbeOutcome.INCONCLUSIVE, ProbeOutcome.LOAD_ERROR):
        return None
    if expect is Expect.ABORT:
        return outcome is ProbeOutcome.CONFIRMED
    if expect is Expect.UNSAFE:
        return outcome in (ProbeOutcome.CONFIRMED, ProbeOutcome.CRASH_AT_EXIT)
    return outcome is ProbeOutcome.CLEAN


def probe_mode_text(mode: str) -> str:
    """``global-local`` as a person reads it: ``loaded RTLD_GLOBAL, then RTLD_LOCAL``."""
    flags = [f"RTLD_{part.upper()}" for part in mode.split("-") if part in ("global", "local")]
    return "loaded " + ", then ".join(flags) if flags else mode


def probe_decided(probes: Sequence[ProbeResult]) -> Verdict | None:
    """The verdict conclusive probes give (the worst seen), None when none was conclusive."""
    conclusive = [p.verdict for p in probes if p.verdict.conclusive]
    if not conclusive:
        return None
    if ProbeVerdict.ABORT in conclusive:
        return Verdict.ABORT
    if ProbeVerdict.CRASH in conclusive:
        return Verdict.CRASH
    if ProbeVerdict.HANG in conclusive:
        return Verdict.HANG
    return Verdict.CLEAN
