"""Target IDs (``gfx942:sramecc+:xnack-``), processors, generic families, HIP-runtime matching.

Matching follows formats.md 2.8/2.9: comgr ``isCompatibleIsaName`` for native entries (same
processor; a feature the code object specifies must equal the agent's, an unspecified one matches
either), ROCr ``Isa::IsCompatible`` plus CLR ``TargetGenericMap`` for generic entries (code object
V6, generic version >= 1), and SPIR-V entries as a last, JIT-compiled resort.
"""

from __future__ import annotations

import enum
import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rocm_audit.errors import UsageError
from rocm_audit.formats.amdgpu_elf import EF_AMDGPU_MACH_NAMES, FEATURES, supported_features
from rocm_audit.tree.products import GPU_PRODUCTS, PRODUCTS_BY_KEY, GpuProduct, find_product, product_key

GENERIC_PROCESSORS = frozenset(name for name in EF_AMDGPU_MACH_NAMES.values() if name.endswith("-generic"))
KNOWN_PROCESSORS = frozenset(name for name in EF_AMDGPU_MACH_NAMES.values() if name not in GENERIC_PROCESSORS)

# CLR TargetGenericMap [rocm-systems: projects/clr/hipamd/src/hip_fatbin.cpp, the 2026 snapshot
# with kpack support], formats.md 2.8. gfx908, gfx90a, gfx1251, gfx1250-strict and the gfx117x
# parts have no generic fallback there.
GENERIC_OF: dict[str, str] = {
    **{p: "gfx9-generic" for p in ("gfx900", "gfx902", "gfx904", "gfx906", "gfx909", "gfx90c")},
    **{p: "gfx9-4-generic" for p in ("gfx942", "gfx950")},
    **{p: "gfx10-1-generic" for p in ("gfx1010", "gfx1011", "gfx1012", "gfx1013")},
    **{p: "gfx10-3-generic" for p in ("gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036")},
    **{
        p: "gfx11-generic"
        for p in (
            "gfx1100",
            "gfx1101",
            "gfx1102",
            "gfx1103",
            "gfx1150",
            "gfx1151",
            "gfx1152",
            "gfx1153",
        )
    },
    **{p: "gfx12-generic" for p in ("gfx1200", "gfx1201")},
    "gfx1250": "gfx12-5-generic",
}
MIN_GENERIC_VERSION = 1  # ROCr registry minimum for every generic family today
GENERIC_CODE_OBJECT_VERSION = 6

SPIRV_PROCESSOR = "amdgcnspirv"


# The usual device configuration for a bare processor name (README, "Targets"): data-centre parts
# run with SRAM ECC on and XNACK off unless HSA_XNACK=1; consumer parts have no SRAM ECC.
_USUAL_FEATURES: dict[str, bool] = {"sramecc": True, "xnack": False}

_TARGET_RE = re.compile(r"^(gfx[0-9a-z]+(?:-[0-9]+)*(?:-generic|-strict)?|amdgcnspirv)((?::(?:sramecc|xnack)[+-])*)$")


@dataclass(frozen=True, slots=True)
class TargetId:
    """A processor with features; ``None`` means the feature is unspecified (Any)."""

    processor: str
    sramecc: bool | None = None
    xnack: bool | None = None

    def feature(self, name: str) -> bool | None:
        return self.sramecc if name == "sramecc" else self.xnack

    def __str__(self) -> str:
        text = self.processor
        for name in FEATURES:
            value = self.feature(name)
            if value is not None:
                text += f":{name}{'+' if value else '-'}"
        return text


@functools.lru_cache(maxsize=4096)  # a judgement parses the same few names for every entry and target
def parse_target_id(text: str) -> TargetId | None:
    """Parse ``gfx942``, ``gfx942:sramecc+:xnack-``, ``gfx9-4-generic``; None if malformed."""
    match = _TARGET_RE.match(text)
    if match is None:
        return None
    values: dict[str, bool] = {}
    for part in filter(None, match.group(2).split(":")):
        name, sign = part[:-1], part[-1]
        if name in values and values[name] != (sign == "+"):
            return None
        values[name] = sign == "+"
    return TargetId(match.group(1), values.get("sramecc"), values.get("xnack"))


@dataclass(frozen=True, slots=True)
class UserTarget:
    """A target as a user typed it, read: ``text`` is its spelling with the processor's name in
    lower case (a product name replaced by its processor) and the features as given; ``target``
    leaves a feature the user did not spell unspecified; ``product`` is the product named, if any."""

    text: str
    target: TargetId
    product: GpuProduct | None = None


@dataclass(frozen=True, slots=True)
class RequiredTarget:
    """A target the user asked for: as spelled (lower case, a product name as its processor), and
    as the agent the runtime would see."""

    spelled: str
    agent: TargetId
    product: GpuProduct | None = None


LIST_TARGETS_HINT = "all: rocm-audit verify-arch --list-targets"
ERROR_PREFIX, HINT_PREFIX = "rocm-audit: error: ", "hint: "  # how the CLI starts both lines (cli/common.py run)


def read_user_target(spelled: str) -> UserTarget:
    """Read a target a user typed: ``gfx942``, ``GFX942:SRAMECC+``, ``gfx942:xnack-``, or a product
    name (``MI300X``, ``Instinct MI300X``, ``rx7900xtx``, ``MI300X:xnack+``). Raises UsageError,
    naming what is wrong and the nearest known names, for anything else."""
    text = spelled.strip()
    head, *features = text.split(":")
    processor, product = head.lower(), None
    if processor in GENERIC_PROCESSORS:
        served = sorted((p for p, g in GENERIC_OF.items() if g == processor), key=processor_sort_key)
        raise UsageError(
            f"{text!r} is a generic code-object target, not a GPU: name GPUs instead",
            hint=f"it serves {', '.join(served)}, and its code counts for each of them"
            if served
            else "no GPU is mapped to it",
        )
    if processor not in KNOWN_PROCESSORS:
        product = find_product(head)
        if product is None:
            raise _unknown_target(text, head)
        processor = product.processor
    values: dict[str, bool] = {}
    for raw in features:
        part = raw.strip().lower()
        name, sign = (part[:-1], part[-1]) if part[-1:] in ("+", "-") else (part, "")
        if name not in FEATURES:
            raise UsageError(
                f"GPU target {text!r}: {raw.strip() or 'an empty name'} is not a feature; "
                f"the features are sramecc and xnack, each with + or - ({processor}:sramecc+:xnack-)"
            )
        if not sign:
            raise UsageError(f"GPU target {text!r}: a feature needs + or -: {processor}:{name}+ or {processor}:{name}-")
        if name not in supported_features(processor):
            has = supported_features(processor)
            raise UsageError(
                f"GPU target {text!r}: {processor} has no {name} feature; "
                + (f"its features: {', '.join(has)}" if has else f"write {processor} alone")
            )
        if values.get(name, sign == "+") != (sign == "+"):
            raise UsageError(f"GPU target {text!r}: {name} is given both + and -")
        values[name] = sign == "+"
    canonical = ":".join([processor, *(f.strip().lower() for f in features)])
    return UserTarget(canonical, TargetId(processor, values.get("sramecc"), values.get("xnack")), product)


def resolve_required(spelled: str) -> RequiredTarget:
    """Turn a user's target into a concrete agent: a feature left unspelled takes the usual device
    setting. Raises UsageError for unknown names (read_user_target)."""
    read = read_user_target(spelled)
    values: dict[str, bool | None] = {}
    for name in FEATURES:
        given = read.target.feature(name)
        if name not in supported_features(read.target.processor):
            values[name] = None
        else:
            values[name] = _USUAL_FEATURES[name] if given is None else given
    agent = TargetId(read.target.processor, values["sramecc"], values["xnack"])
    return RequiredTarget(read.text, agent, read.product)


# A product name may hold spaces (Radeon RX 7900 XTX): the longest run of words naming a product
# is one target, whether it came as one quoted argument or as several.
_MAX_PRODUCT_WORDS = 5


def split_target_args(args: list[str]) -> list[str]:
    """Split arguments and semicolon/comma/space lists (``"gfx942;gfx950"``) into target names;
    words that together name a product (``RX 7900 XTX``) stay one name."""
    names: list[str] = []
    for chunk in re.split(r"[;,]+", " ".join(args)):
        for name in _joined_product_words(chunk.split()):
            if name not in names:
                names.append(name)
    return names


def _joined_product_words(words: list[str]) -> list[str]:
    joined: list[str] = []
    index = 0
    while index < len(words):
        for span in range(min(_MAX_PRODUCT_WORDS, len(words) - index), 1, -1):
            candidate = " ".join(words[index : index + span])
            if find_product(candidate.split(":")[0]) is not None:
                joined.append(candidate)
                index += span
                break
        else:
            joined.append(words[index])
            index += 1
    return joined


def named_products(args: list[str]) -> list[tuple[str, GpuProduct]]:
    """(name as given, product) for each product name among the targets ``args`` give, in order,
    once each; a name that is no target at all is left to resolve_required to report."""
    found: list[tuple[str, GpuProduct]] = []
    for name in split_target_args(args):
        head = name.split(":")[0]
        product = None if head.lower() in KNOWN_PROCESSORS else find_product(head)
        if product is not None and all(product != seen for _, seen in found):
            found.append((head.strip(), product))
    return found


_TARGET_HEAD = re.compile(r"^gfx[0-9][0-9a-z]*(?:-[0-9a-z]+)*$", re.IGNORECASE)
_FEATURE_PART = re.compile(r"^[a-z]+[+-]$", re.IGNORECASE)


def looks_like_target(word: str) -> bool:
    """Whether a command-line word is meant as GPU targets rather than, say, an image name: each of
    its ``;``/``,`` parts is a gfx name or a product name, with ``:`` features (a part without + or
    - counts only when it is sramecc or xnack). ``gfx9500`` and ``gfx942:xnack`` look like targets
    (and are then reported as wrong ones); ``rocm/pytorch:latest`` and ``img`` do not."""
    parts = [p for p in re.split(r"[;,]+", word) if p.strip()]
    if not parts:
        return False
    for part in parts:
        head, *features = part.strip().split(":")
        if not (_TARGET_HEAD.match(head) or head.lower() == SPIRV_PROCESSOR or find_product(head)):
            return False
        if not all(_FEATURE_PART.match(f) or f.lower() in FEATURES for f in features):
            return False
    return True


def separate_targets(words: list[str]) -> tuple[list[str], list[str]]:
    """(targets, other words) of command-line words, in order: words that look like targets
    (``looks_like_target``; several words naming one product, ``RX 7900 XTX``, count as one)."""
    targets: list[str] = []
    others: list[str] = []
    for word in _joined_product_words(words):
        (targets if looks_like_target(word) else others).append(word)
    return targets, others


def processor_sort_key(name: str) -> tuple[int, int, int, str]:
    """Numeric order of processor names: gfx803 < gfx900 < gfx90a < gfx942 < gfx1010 < gfx1100 <
    gfx1250-strict (major version, then minor and stepping, each one hex digit: the gfx naming)."""
    match = re.match(r"^gfx(\d+)([0-9a-f])([0-9a-f])(.*)$", name)
    if match is not None:
        return (int(match.group(1)), int(match.group(2), 16), int(match.group(3), 16), match.group(4))
    numbers = [int(n) for n in re.findall(r"\d+", name)] + [0, 0, 0]  # gfx9-4-generic: 9, 4, 0
    return (numbers[0] if numbers else 1 << 30, numbers[1], numbers[2], name)


def known_targets() -> list[tuple[str, tuple[str, ...], list[str]]]:
    """(processor, its features, the product names that are it) for every known processor, in
    numeric order: what ``verify-arch --list-targets`` shows."""
    return [
        (
            processor,
            supported_features(processor),
            [p.name for p in GPU_PRODUCTS if p.processor == processor],
        )
        for processor in sorted(KNOWN_PROCESSORS, key=processor_sort_key)
    ]


_CLOSE_ENOUGH = 0.75  # difflib ratio for "did you mean": gfx9500 -> gfx950 is 0.92, mi300 -> MI300X 0.91
_NEARLY = 0.06  # ratios this close to the best are as good a guess
_SOMEWHAT_CLOSE = 0.5  # below it nothing is near enough to list
_NEAREST_SHOWN = 5


_Ranked = list[tuple[float, int, str]]  # (similarity ratio, shared prefix length, the name shown)


def _ranked(query: str, pool: dict[str, str]) -> _Ranked:
    """(ratio, length of the common prefix, shown name) for each (comparable form, shown name) of
    ``pool``, best first; the prefix breaks ties (gfx9500 is nearer gfx950 than gfx900)."""
    import difflib  # noqa: PLC0415 - only when a target is unknown

    ranked: dict[str, tuple[float, int, str]] = {}
    for form, shown in pool.items():
        ratio = difflib.SequenceMatcher(None, query, form).ratio()
        prefix = len(os.path.commonprefix([query, form]))
        if shown not in ranked or (ratio, prefix) > ranked[shown][:2]:
            ranked[shown] = (ratio, prefix, shown)
    return sorted(ranked.values(), key=lambda r: (-r[0], -r[1], r[2]))


def _unknown_target(text: str, head: str) -> UsageError:
    query = head.strip().lower()
    if query == SPIRV_PROCESSOR:
        return UsageError(
            f"{text!r} names SPIR-V code, compiled for the GPU at load time, not a GPU: name the GPUs "
            "(gfx942, MI300X); SPIR-V code counts for each of them",
            hint=LIST_TARGETS_HINT,
        )
    if _CUDA_ARCH.match(query):
        return UsageError(
            f"{text!r} is an NVIDIA CUDA architecture: rocm-audit checks code for AMD GPUs",
            hint=f"name AMD GPUs (gfx942, MI300X); {LIST_TARGETS_HINT}",
        )
    by_processor, by_product, ranked = _rankings(query, head)
    message = f"unknown GPU target {text!r}"
    guesses = _best(ranked)
    while guesses:  # as many guesses as fit on one line of 100 columns
        said = either(guesses)
        if len(guesses) == 1 or len(f"{ERROR_PREFIX}{message}; did you mean {said}?") <= 100:
            message += f"; did you mean {said}?"
            break
        guesses.pop()
    if ranked[0][0] < _SOMEWHAT_CLOSE:  # nothing near: say what a target looks like
        return UsageError(
            message,
            hint=f"targets are gfx names (gfx942) or products (MI300X); {LIST_TARGETS_HINT}",
        )
    if query.startswith("gfx") or ranked[0] in by_processor:
        nearest = [r[2] for r in by_processor[:_NEAREST_SHOWN]]
        sort_key: Callable[[str], Any] = processor_sort_key
    else:
        nearest, sort_key = [r[2] for r in by_product[:_NEAREST_SHOWN]], _natural_key
    while True:  # as many of the nearest as fit on one line of 100 columns
        hint = f"nearest: {', '.join(sorted(nearest, key=sort_key))}; {LIST_TARGETS_HINT}"
        if len(nearest) == 1 or len(HINT_PREFIX + hint) <= 100:
            return UsageError(message, hint=hint)
        nearest.pop()


_CUDA_ARCH = re.compile(r"^(sm|compute|lto)_\d{2,3}[a-z]?$")  # nvcc -arch names: sm_90, sm_90a, compute_80


def _natural_key(text: str) -> list[tuple[int, str]]:
    return [(int(part), "") if part.isdigit() else (0, part) for part in re.split(r"(\d+)", text.lower()) if part]


class MatchKind(str, enum.Enum):
    """How a requested target is served by a translation unit (best first)."""

    NATIVE = "native"
    GENERIC = "generic"
    SPIRV = "spirv"


def features_compatible(code: TargetId, agent: TargetId) -> bool:
    """comgr isCompatibleIsaName feature rule: a specified feature must equal the agent's."""
    for name in FEATURES:
        wanted = code.feature(name)
        if wanted is not None and wanted != agent.feature(name):
            return False
    return True


def match_code_object(
    code: TargetId, agent: TargetId, *, code_object_version: int | None, generic_version: int | None
) -> MatchKind | None:
    """How (and whether) a code object for ``code`` runs on ``agent``.

    ``generic_version`` None means unknown (only a bundle id was seen): a generic entry then
    counts when its code-object version is unknown too, because the bundler only writes generic
    ids for V6 objects.
    """
    if code.processor == SPIRV_PROCESSOR:
        return MatchKind.SPIRV
    if not features_compatible(code, agent):
        return None
    if code.processor == agent.processor:
        return MatchKind.NATIVE
    if code.processor in GENERIC_PROCESSORS and GENERIC_OF.get(agent.processor) == code.processor:
        if not generic_name_valid(agent.processor, code.processor):
            return None
        if code_object_version is not None and code_object_version < GENERIC_CODE_OBJECT_VERSION:
            return None
        if generic_version is not None and generic_version < MIN_GENERIC_VERSION:
            return None
        return MatchKind.GENERIC
    return None


def generic_name_valid(processor: str, generic: str) -> bool:
    """CLR asks for the generic entry under the device's own features (TargetToGeneric re-appends
    the agent's sramecc and xnack, which a device reports for every feature it has): a feature the
    generic processor does not have makes a name comgr and clang reject as a target id, so nothing
    matches. gfx906 has sramecc, gfx9-generic has not: a gfx906 never loads gfx9-generic code."""
    return set(supported_features(processor)) <= set(supported_features(generic))


def best_match(kinds: list[MatchKind | None]) -> MatchKind | None:
    order = {MatchKind.NATIVE: 0, MatchKind.GENERIC: 1, MatchKind.SPIRV: 2}
    present = [k for k in kinds if k is not None]
    return min(present, key=order.__getitem__) if present else None


_ARCH_TOKEN_RE = re.compile(r"gfx\d+[a-z]*(?:-\d+)*(?:-generic)?(?:-strict)?(?:[-:_](?:xnack|sramecc)[+-])*")


def arch_tokens(text: str) -> list[str]:
    """Arch names in a file or directory name (Tensile/MIOpen/AOTriton spellings), canonicalised."""
    found = []
    for raw in _ARCH_TOKEN_RE.findall(text):
        token = re.sub(r"[-_](xnack|sramecc)", r":\1", raw)
        if token not in found:
            found.append(token)
    return found


# ---------------------------------------------------------------------------------------------
# What a kept target could load (prune): the same rule, asked of every device a kept target names.

# A family name stands for several processors: AOTriton's amd-gfx11xx / amd-gfx110x folders,
# TheRock's gfx94X / gfx110X families. Each x stands for one character of the processor name.
_FAMILY_RE = re.compile(r"^gfx[0-9a-f]*[xX]+$")


def is_family_name(name: str) -> bool:
    return bool(_FAMILY_RE.match(name))


def family_covers(family: str, processor: str) -> bool:
    """Whether a family name (``gfx11xx``, ``gfx94X``) stands for ``processor``."""
    pattern = "".join("[0-9a-z]" if c in "xX" else re.escape(c) for c in family)
    return re.fullmatch(pattern, processor) is not None


def kept_target(spelled: str) -> TargetId:
    """A target as the user spelled it, features not spelled left unspecified (either setting).

    verify-arch reads a bare ``gfx942`` as the usual device (sramecc+, xnack-); prune must not
    remove what another setting of that device loads (``HSA_XNACK=1`` selects xnack+ code), so a
    bare name keeps code for both settings. Raises UsageError for unknown names."""
    return read_user_target(spelled).target


def agents_of(kept: TargetId) -> list[TargetId]:
    """Every device ``kept`` names, as the runtime sees it: a feature ``kept`` sets keeps its
    setting; one it leaves open takes each setting when the processor has the feature (an
    ``HSA_XNACK=1`` process, a card with SRAM ECC off), and none when it has not."""
    settings: dict[str, tuple[bool | None, ...]] = {}
    for name in FEATURES:
        given = kept.feature(name)
        if given is not None:
            settings[name] = (given,)
        elif name in supported_features(kept.processor):
            settings[name] = (False, True)
        else:
            settings[name] = (None,)
    return [TargetId(kept.processor, sramecc, xnack) for sramecc in settings["sramecc"] for xnack in settings["xnack"]]


def serves_kept(
    code_target: str,
    kept: TargetId,
    *,
    code_object_version: int | None = None,
    generic_version: int | None = None,
) -> MatchKind | None:
    """How code for ``code_target`` (a target id, a generic or SPIR-V name, or a family name)
    could run on some device that ``kept`` names; None when no such device loads it.

    verify-arch's rule (``match_code_object``) asked of every device ``agents_of(kept)`` names, so
    whatever verify-arch selects for any setting of a kept target's open features is kept. On top
    of it, prune keeps on purpose what it cannot judge:
    - a family name (TheRock's gfx94X) that covers the kept processor: verify-arch judges no family
      name (it names no processor), prune never removes what one might be for;
    - a name that cannot be parsed (what rocm-audit cannot read, it never removes);
    - a processor this release does not know, whenever its features fit some such device;
    - a feature the kept processor does not have, left open by ``kept``: not compared (no compiler
      writes such a name; verify-arch would reject it, prune keeps it)."""
    processor = code_target.split(":")[0]
    agents = agents_of(kept)
    if is_family_name(processor):
        return MatchKind.NATIVE if family_covers(processor, kept.processor) else None
    code = parse_target_id(code_target)
    if code is None:
        return MatchKind.NATIVE
    absent = {
        name for name in FEATURES if kept.feature(name) is None and name not in supported_features(kept.processor)
    }
    if absent:
        code = TargetId(
            code.processor,
            None if "sramecc" in absent else code.sramecc,
            None if "xnack" in absent else code.xnack,
        )
    kind = best_match(
        [
            match_code_object(code, agent, code_object_version=code_object_version, generic_version=generic_version)
            for agent in agents
        ]
    )
    unknown = code.processor not in KNOWN_PROCESSORS and code.processor not in GENERIC_PROCESSORS
    if kind is None and unknown and any(features_compatible(code, agent) for agent in agents):
        return MatchKind.NATIVE  # a processor this release does not know: never removed
    return kind


# ---------------------------------------------------------------------------------------------
# Which entry the runtime picks


def choose_entry(named_targets: list[str | None], agent: TargetId) -> tuple[int, MatchKind] | None:
    """The entry the HIP runtime selects for ``agent`` among one translation unit's entries, by
    the target each entry's bundle id (or kpack TOC) names: the best match kind (native, then
    generic, then SPIR-V: CLR queries each and prefers them in that order), and among equals the
    first in file order, as comgr's lookup takes the first compatible entry for each query
    (comgr-metadata.cpp lookUpCodeObject). None entries (no id names a target) take no part.

    The choice reads names only: a generic entry counts here whatever its code-object version,
    which is checked afterwards on the chosen entry's ELF header (``judge``). Both the lazy scan
    (which inflates only the chosen entries) and the judgement call this, so they agree."""
    order = {MatchKind.NATIVE: 0, MatchKind.GENERIC: 1, MatchKind.SPIRV: 2}
    best: tuple[int, int] | None = None
    chosen: tuple[int, MatchKind] | None = None
    for index, name in enumerate(named_targets):
        code = parse_target_id(name) if name else None
        if code is None:
            continue
        kind = match_code_object(code, agent, code_object_version=None, generic_version=None)
        if kind is None:
            continue
        rank = (order[kind], index)
        if best is None or rank < best:
            best, chosen = rank, (index, kind)
    return chosen


@dataclass(frozen=True, slots=True)
class TargetSelection:
    """The agents a judgement needs, handed to the code-object scan so that it inflates only the
    entries the runtime would select for them (``choose_entry``) and stops reading a compressed
    bundle after the last of those. ``None`` instead of a selection means every entry (``scan``)."""

    agents: tuple[TargetId, ...]

    @property
    def key(self) -> str:
        """Names the fact a scan with this selection produces (tree/facts.py)."""
        return ",".join(sorted(str(agent) for agent in self.agents))

    def wanted(self, named_targets: list[str | None]) -> set[int]:
        """Indices of the entries to read: each agent's choice, plus every entry whose id names
        no target (only its ELF header can say what it is)."""
        picked = {index for index, name in enumerate(named_targets) if not name or parse_target_id(name) is None}
        for agent in self.agents:
            chosen = choose_entry(named_targets, agent)
            if chosen is not None:
                picked.add(chosen[0])
        return picked


def _rankings(query: str, head: str) -> tuple[_Ranked, _Ranked, _Ranked]:
    """The known processors and products by nearness to ``query``: each alone, and both together."""
    processors = {p: p for p in KNOWN_PROCESSORS}
    products = {key: product.name for key, product in PRODUCTS_BY_KEY.items()}
    by_processor, by_product = _ranked(query, processors), _ranked(product_key(head), products)
    return by_processor, by_product, sorted(by_processor + by_product, key=lambda r: (-r[0], -r[1], r[2]))


def _best(ranked: _Ranked) -> list[str]:
    """The best, and any nearly as close that shares as long a prefix (RX 7900 XTZ: XT and XTX; but
    gfx9500: gfx950, not gfx900, which is as similar by ratio); at most three."""
    top_ratio, top_prefix = ranked[0][:2]
    return [r[2] for r in ranked if r[0] >= max(_CLOSE_ENOUGH, top_ratio - _NEARLY) and r[1] >= top_prefix][:3]


def either(names: list[str]) -> str:
    """``MI300A or MI300X``; ``gfx942, gfx950 or gfx1100``."""
    return " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def target_guesses(word: str) -> list[str]:
    """The GPU targets ``word`` nearly names (``MI300``: MI300A, MI300X); none for a word that is
    no near miss (an image reference such as ``rocm/pytorch:latest``)."""
    head = word.strip().split(":")[0]
    if not head or "/" in word:
        return []
    return _best(_rankings(head.lower(), head)[2])
