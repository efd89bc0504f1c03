"""Failing pairs that differ only by a byte-identical copy of one library: one finding for them all.

Wheels ship the same library twice under two names (triton 3.8.0: ``libMLIRDialectPlugin.so`` and
``libMLIRDialectPlugin.so.23.0git``, separate files of the same bytes). Every pair the model
judges with one copy it judges with the other, with the same verdict in every order and mode: a
person needs one finding that names the copy, not one per copy. Pairs fold only when their
verdicts are equal once each copy is read as its class (and, with probes, only when the probes
agree too); anything else keeps a finding of its own.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Sequence

from rocm_audit.findings import Finding
from rocm_audit.llvm.clash_findings import failing_modes
from rocm_audit.llvm.pairs import PairVerdicts
from rocm_audit.llvm.probes import ProbeResult

ClassOf = Callable[[str], str]  # a path -> the first path of its class of identical copies (itself if none)


def class_map(classes: Iterable[set[str]]) -> ClassOf:
    """``ClassOf`` for classes of byte-identical files (one path per inode)."""
    first = {path: min(members) for members in classes for path in members}
    return lambda path: first.get(path, path)


def signature(pair: PairVerdicts, class_of: ClassOf, probes: Sequence[ProbeResult] = ()) -> tuple[object, ...]:
    """What a pair's finding says, with each copy read as its class: its libraries, the worst
    verdict, each failing order and its modes, what the failure arrives through, the hosts, and
    the probes' verdicts in the order they ran."""
    failing = frozenset((class_of(a), class_of(b), modes) for a, b, modes in failing_modes(pair, probes))
    hosts = frozenset((class_of(lib), tuple(map(class_of, libs))) for lib, libs in pair.hosts.items())
    return (
        frozenset(map(class_of, pair.paths)),
        pair.worst.verdict,
        failing,
        tuple(map(class_of, pair.arrives_through())),
        hosts,
        tuple(p.verdict for p in probes),
    )


def fold(
    pairs: Sequence[PairVerdicts], class_of: ClassOf, probes_of: Callable[[PairVerdicts], Sequence[ProbeResult]]
) -> dict[tuple[str, str], list[PairVerdicts]]:
    """The pairs a finding stands for, by the paths of the pair that carries it (the first of each
    equal signature, in the order given): itself, then the pairs of copies it speaks for."""
    by_signature: dict[tuple[object, ...], list[PairVerdicts]] = {}
    for pair in pairs:
        by_signature.setdefault(signature(pair, class_of, probes_of(pair)), []).append(pair)
    return {members[0].paths: members for members in by_signature.values()}


def with_copies(finding: Finding, members: Sequence[PairVerdicts], class_of: ClassOf) -> Finding:
    """The finding of ``members[0]`` naming the copies the other members put in its place:
    ``...; the same with libB.so.1, an identical copy of libB.so``."""
    own = set(members[0].paths)
    copies = sorted({path for pair in members[1:] for path in pair.paths} - own)
    if not copies:
        return finding
    of = {copy: next((p for p in sorted(own) if class_of(p) == class_of(copy)), "") for copy in copies}
    paths = [*copies, *own]
    unique = len({os.path.basename(p) for p in paths}) == len(paths)
    name = os.path.basename if unique else str  # two share a file name: whole paths
    if len(copies) == 1:
        copy = copies[0]
        same = f"the same with {name(copy)}, an identical copy of {name(of[copy])}"
    else:
        same = "the same with identical copies " + ", ".join(f"{name(c)} (of {name(of[c])})" for c in copies)
    return dataclasses.replace(
        finding,
        message=f"{finding.message}; {same}",
        related_paths=tuple(sorted({*finding.related_paths, *copies})),
        data={**finding.data, "identical_copies": of},  # copy -> the library of the pair it copies
    )
