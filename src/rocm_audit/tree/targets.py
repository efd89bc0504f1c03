"""Target IDs (``gfx942:sramecc+:xnack-``), processors, generic families, HIP-runtime matching.

Matching follows formats.md 2.8/2.9: comgr ``isCompatibleIsaName`` for native entries (same
processor; a feature the code object specifies must equal the agent's, an unspecified one matches
either), ROCr ``Isa::IsCompatible`` plus CLR ``TargetGenericMap`` for generic entries (code object
V6, generic version >= 1), and SPIR-V entries as a last, JIT-compiled resort.
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass

from rocm_audit.errors import UsageError
from rocm_audit.formats.amdgpu_elf import EF_AMDGPU_MACH_NAMES, FEATURES, supported_features

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
class RequiredTarget:
    """A target the user asked for: as spelled, and as the agent the runtime would see."""

    spelled: str
    agent: TargetId


def resolve_required(spelled: str) -> RequiredTarget:
    """Turn a user's target into a concrete agent. Raises UsageError for unknown names."""
    parsed = parse_target_id(spelled.strip())
    if parsed is not None and parsed.processor in GENERIC_PROCESSORS:
        served = sorted((p for p, g in GENERIC_OF.items() if g == parsed.processor), key=_processor_sort_key)
        raise UsageError(
            f"{spelled.strip()!r} is a generic code-object target, not a GPU: name the GPUs instead "
            f"({', '.join(served) or 'none is mapped to it'}); "
            f"code for {parsed.processor} counts for each GPU it serves"
        )
    if parsed is None or parsed.processor not in KNOWN_PROCESSORS:
        known = ", ".join(sorted(KNOWN_PROCESSORS, key=_processor_sort_key))
        raise UsageError(
            f"unknown GPU target {spelled!r}; known processors: {known} (features as gfx942:sramecc+:xnack-)"
        )
    values: dict[str, bool | None] = {}
    for name in FEATURES:
        given = parsed.feature(name)
        if name not in supported_features(parsed.processor):
            if given is not None:
                raise UsageError(f"target {spelled!r}: {parsed.processor} has no {name} feature")
            values[name] = None
        else:
            values[name] = _USUAL_FEATURES[name] if given is None else given
    agent = TargetId(parsed.processor, values["sramecc"], values["xnack"])
    return RequiredTarget(spelled.strip(), agent)


def split_target_args(args: list[str]) -> list[str]:
    """Split arguments and semicolon/comma/space lists (``"gfx942;gfx950"``) into target names."""
    names: list[str] = []
    for arg in args:
        for part in re.split(r"[;,\s]+", arg):
            if part and part not in names:
                names.append(part)
    return names


def _processor_sort_key(name: str) -> tuple[int, str]:
    digits = re.sub(r"\D", "", name)
    return (len(digits), name)


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
# What a kept target could load (prune): the same rules, with unspelled features left open.

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
    agent = resolve_required(spelled).agent  # validates the name and its features
    parsed = parse_target_id(spelled.strip())
    assert parsed is not None
    return TargetId(agent.processor, parsed.sramecc, parsed.xnack)


def serves_kept(
    code_target: str,
    kept: TargetId,
    *,
    code_object_version: int | None = None,
    generic_version: int | None = None,
) -> MatchKind | None:
    """How code for ``code_target`` (a target id, a generic or SPIR-V name, or a family name)
    could run on some device that ``kept`` names; None when no such device loads it.

    The HIP runtime's order (native, generic, SPIR-V; formats.md 2.9); a feature ``kept`` leaves
    unspecified matches either value. A name that cannot be parsed counts as serving: what
    rocm-audit cannot read, it never removes."""
    processor = code_target.split(":")[0]
    if is_family_name(processor):
        return MatchKind.NATIVE if family_covers(processor, kept.processor) else None
    code = parse_target_id(code_target)
    if code is None:
        return MatchKind.NATIVE
    if code.processor == SPIRV_PROCESSOR:
        return MatchKind.SPIRV
    for name in FEATURES:
        wanted, have = code.feature(name), kept.feature(name)
        if wanted is not None and have is not None and wanted != have:
            return None
    if code.processor == kept.processor:
        return MatchKind.NATIVE
    if code.processor in GENERIC_PROCESSORS and GENERIC_OF.get(kept.processor) == code.processor:
        if not generic_name_valid(kept.processor, code.processor):
            return None
        if code_object_version is not None and code_object_version < GENERIC_CODE_OBJECT_VERSION:
            return None
        if generic_version is not None and generic_version < MIN_GENERIC_VERSION:
            return None
        return MatchKind.GENERIC
    if code.processor not in KNOWN_PROCESSORS and code.processor not in GENERIC_PROCESSORS:
        return MatchKind.NATIVE  # a processor this release does not know: never removed
    return None


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
