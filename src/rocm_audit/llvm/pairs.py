"""Judge two libraries loaded into one process: both orders, three RTLD modes, whole closures.

Each load is modelled as a real process does it (formats.md 4, 6): ``dlopen`` maps the library
and its DT_NEEDED closure through the one loader model (tree/loader.py, sysroot-aware, inside or
outside the audited tree); a library whose own RUNPATH cannot find a needed library (a plugin) is
loaded after the host library a real process loads first, found by that SONAME in the audited tree
(of several, the one it ships with: the most leading folders in common).
verdicts.py then says what the sequence does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rocm_audit.llvm.closure import Closure, ProcessModel
from rocm_audit.llvm.linkage import Linkage
from rocm_audit.llvm.probes import PAIR_MODES
from rocm_audit.llvm.verdicts import CLEAN, Mapped, Prediction, Step, Verdict, simulate
from rocm_audit.report_types import PairJudged

ORDERS = ("forward", "reverse")
MAX_HOSTS = 4


@dataclass(frozen=True, slots=True)
class OrderVerdicts:
    first: str
    second: str
    modes: Mapping[str, Prediction]  # PAIR_MODES key -> prediction

    @property
    def worst(self) -> Prediction:
        return max(self.modes.values(), key=lambda p: p.verdict.rank, default=CLEAN)


@dataclass(frozen=True, slots=True)
class PairVerdicts:
    paths: tuple[str, str]
    orders: tuple[OrderVerdicts, OrderVerdicts]
    hosts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # library -> hosts loaded first

    @property
    def worst(self) -> Prediction:
        return max((o.worst for o in self.orders), key=lambda p: p.verdict.rank)

    @property
    def bad(self) -> bool:
        return self.worst.verdict.bad

    def failing_orders(self) -> list[OrderVerdicts]:
        return [o for o in self.orders if o.worst.verdict.bad]

    def arrives_through(self) -> list[str]:
        """Objects that go wrong that are neither of the pair: what the clash arrives through."""
        found = []
        for order in self.orders:
            for prediction in order.modes.values():
                if not prediction.verdict.bad:
                    continue
                for name in (prediction.culprit, prediction.other):
                    if name and name not in self.paths and name not in found:
                        found.append(name)
        return found

    def to_dict(self) -> PairJudged:
        return {
            "paths": list(self.paths),
            "verdict": self.worst.verdict.value,
            "hosts": {path: list(hosts) for path, hosts in self.hosts.items()},
            "arrives_through": self.arrives_through(),
            "orders": [
                {
                    "first": order.first,
                    "second": order.second,
                    "modes": {mode: p.to_dict() for mode, p in order.modes.items()},
                }
                for order in self.orders
            ],
        }


class PairJudge:
    """Closures and verdicts for pairs of libraries of one audited tree."""

    def __init__(
        self,
        new_process: Callable[[], ProcessModel],
        linkage_of: Callable[[str, tuple[int, int]], Linkage],
        by_soname: Mapping[str, Sequence[str]],
        preload: Sequence[str] = (),
    ) -> None:
        self.new_process = new_process
        self.linkage_of = linkage_of
        self.by_soname = by_soname
        self.preload = tuple(preload)
        self._hosts: dict[str, tuple[str, ...]] = {}
        self._linkage: dict[tuple[int, int], Linkage] = {}
        # paths loaded in turn -> each dlopen's closure: a process maps the same objects whatever
        # the RTLD_GLOBAL flags (glibc finds a loaded object by name in any scope), and the four
        # modes of a pair load one sequence of paths
        self._closures: dict[tuple[str, ...], tuple[tuple[Mapped, ...], ...]] = {}

    def _linkage_of(self, path: str, identity: tuple[int, int]) -> Linkage:
        found = self._linkage.get(identity)
        if found is None:
            found = self._linkage[identity] = self.linkage_of(path, identity)
        return found

    def hosts(self, path: str) -> tuple[str, ...]:
        """Libraries of the audited tree a process must load before path: the providers, by
        SONAME, of what path's own search cannot find."""
        if path not in self._hosts:
            closure = self.new_process().dlopen(path)
            found: list[str] = []
            for missing in closure.missing:
                candidates = [c for c in self.by_soname.get(missing.name, ()) if c != path]
                if candidates:
                    host = _nearest(path, candidates)
                    if host not in found:
                        found.append(host)
            self._hosts[path] = tuple(found[:MAX_HOSTS])
        return self._hosts[path]

    def _mapped(self, closure: Closure) -> tuple[Mapped, ...]:
        return tuple(
            Mapped(
                identity=o.identity,
                path=o.path,
                linkage=self._linkage_of(o.path, o.identity),
                family=o.soname or os.path.basename(o.path),
                reused=o.reused,
                needed_by=o.needed_by,
            )
            for o in closure.objects
        )

    def steps(self, sequence: Iterable[tuple[str, bool]]) -> list[Step]:
        loads = [(path, True) for path in self.preload] + list(sequence)
        paths = tuple(path for path, _ in loads)
        closures = self._closures.get(paths)
        if closures is None:
            process = self.new_process()
            closures = self._closures[paths] = tuple(self._mapped(process.dlopen(path)) for path in paths)
        return [Step(objects, rtld_global) for objects, (_, rtld_global) in zip(closures, loads, strict=True)]

    def load_sequence(self, first: str, second: str, mode: str) -> list[tuple[str, bool]]:
        """What a process loads for this pair and mode: each library after its hosts (GLOBAL)."""
        first_global, second_global = PAIR_MODES[mode]
        sequence: list[tuple[str, bool]] = []
        for path, rtld_global in ((first, first_global), (second, second_global)):
            for host in self.hosts(path):
                if all(host != loaded for loaded, _ in sequence):
                    sequence.append((host, True))
            sequence.append((path, rtld_global))
        return sequence

    def predict(self, sequence: Sequence[tuple[str, bool]]) -> Prediction:
        """The verdict of loading these (path, RTLD_GLOBAL) in turn, each after its hosts."""
        with_hosts: list[tuple[str, bool]] = []
        for path, rtld_global in sequence:
            for host in self.hosts(path):
                if all(host != loaded for loaded, _ in with_hosts):
                    with_hosts.append((host, True))
            with_hosts.append((path, rtld_global))
        return simulate(self.steps(with_hosts))

    def global_caution(self, a: str, b: str) -> str | None:
        """The library of the pair that, never loaded RTLD_GLOBAL, keeps both orders clean in
        every mode of the other, without a layout caveat; None when neither does."""
        for local, other in ((a, b), (b, a)):
            sequences = [
                [(local, False), (other, True)],
                [(local, False), (other, False)],
                [(other, True), (local, False)],
                [(other, False), (local, False)],
            ]
            predictions = [self.predict(s) for s in sequences]
            if all(not p.verdict.bad and not p.layout_dependent for p in predictions):
                return local
        return None

    def order(self, first: str, second: str) -> OrderVerdicts:
        modes = {mode: simulate(self.steps(self.load_sequence(first, second, mode))) for mode in PAIR_MODES}
        return OrderVerdicts(first, second, modes)

    def judge(self, a: str, b: str) -> PairVerdicts:
        hosts = {p: self.hosts(p) for p in (a, b) if self.hosts(p)}
        return PairVerdicts((a, b), (self.order(a, b), self.order(b, a)), hosts)


def _nearest(path: str, candidates: Sequence[str]) -> str:
    """The provider a plugin ships with: the one sharing the longest leading folders with it
    (triton/plugins/x.so is hosted by that triton's _C/libtriton.so, not another copy's), the
    first in path order among equals."""
    folders = path.split(os.sep)[:-1]

    def shared(candidate: str) -> int:
        return len(os.path.commonprefix([folders, candidate.split(os.sep)[:-1]]))

    return max(candidates, key=shared)  # max keeps the first of equal keys


def verdict_of(predictions: Iterable[Prediction]) -> Verdict:
    return max((p.verdict for p in predictions), key=lambda v: v.rank, default=Verdict.CLEAN)
