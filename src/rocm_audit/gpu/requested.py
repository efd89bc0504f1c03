"""Which GPU targets to judge: the command line, $GPU_ARCH, the rules file, what an image records,
or TheRock's dist_info.json (narrowed to the installed device wheels)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rocm_audit.errors import UsageError
from rocm_audit.report_types import TargetsOrigin
from rocm_audit.tree.discovery import enclosing_sdk_tree, is_tree_of
from rocm_audit.tree.smallfile import read_small
from rocm_audit.tree.targets import RequiredTarget, processor_sort_key, resolve_required, split_target_args

CORE_TREE = "_rocm_sdk_core"
DIST_INFO_IN_TREE = os.path.join("share", "therock", "dist_info.json")
MAX_DIST_INFO_BYTES = 1 << 20  # TheRock writes a few hundred bytes
DIST_INFO = os.path.join(CORE_TREE, DIST_INFO_IN_TREE)


@dataclass(frozen=True, slots=True)
class TargetCandidate:
    """A target list found outside the command line, environment and rules file (an image's Env or
    build history), with a label for people (``source``) and one for programs (``origin``)."""

    value: str
    source: str
    origin: TargetsOrigin


@dataclass(frozen=True, slots=True)
class TargetChoice:
    targets: list[RequiredTarget]
    source: str  # for people: "command line", "$GPU_ARCH", a dist_info.json path ...
    origin: TargetsOrigin  # the JSON ``targets_origin``: kind, and variable / path / history_index


def requested_targets(
    args: list[str], roots: Iterable[str], environ: dict[str, str]
) -> tuple[list[RequiredTarget], str]:
    """(targets, source) of :func:`choose_targets` for prune (never narrowed to the installed
    device wheels). Raises UsageError."""
    choice = choose_targets(args, roots, environ, narrow_to_device_wheels=False, command="prune")
    return choice.targets, choice.source


def choose_targets(
    args: list[str],
    roots: Iterable[str],
    environ: Mapping[str, str],
    recorded: Sequence[TargetCandidate] = (),
    environ_label: str = "$GPU_ARCH",
    *,
    narrow_to_device_wheels: bool = True,
    command: str = "verify-arch",
) -> TargetChoice:
    """The first of: arguments; $GPU_ARCH; the policy's ``targets``; ``recorded`` (what an image
    says, in order); ``dist_amdgpu_targets`` of dist_info.json; plus the policy's
    ``extra_targets`` (``--rules``). Raises UsageError when none gives a target.

    dist_info.json lists every target of the build, while a kpack-split install holds the device
    wheels its user chose (``rocm[libraries,device-gfx942]``, as TheRock's docs advise): with
    ``narrow_to_device_wheels`` and at least one ``rocm-sdk-device-<gfx>`` installed beside the core
    tree, only the listed targets with an installed device wheel are judged. With none installed
    every listed target is (the libraries then have no kernels at all). prune passes False: what
    it keeps is never narrower than the build. ``command`` is named in the error when no target
    is given, as an example of passing them."""
    from rocm_audit.rulebook.policy import policy  # noqa: PLC0415 - the rules file is read only here

    settings = policy("verify-arch")
    names = split_target_args(args)
    source = "command line"
    origin: TargetsOrigin = {"kind": "command-line"}
    if not names and environ.get("GPU_ARCH", "").strip():
        names = split_target_args([environ["GPU_ARCH"]])
        source, origin = environ_label, {"kind": "environment", "variable": "GPU_ARCH"}
    if not names and settings.get("targets"):
        names = split_target_args(list(settings["targets"]))
        source, origin = "rules file (policy.verify-arch.targets)", {"kind": "rules-file"}
    for candidate in recorded:
        if names:
            break
        names = split_target_args([candidate.value])
        source, origin = candidate.source, candidate.origin.copy()
    if not names:
        for path in dist_info_candidates(roots):
            names = _targets_from_dist_info(path)
            if names:
                source, origin = path, {"kind": "dist-info", "path": path}
                if narrow_to_device_wheels:
                    names, source = _narrowed_to_device_wheels(names, path, source, origin)
                break
    extra = [n for n in split_target_args(list(settings.get("extra_targets", []))) if n not in names]
    if extra:
        names = names + extra
        source += " + rules file (policy.verify-arch.extra_targets)"
        origin["extra_targets"] = extra
    if not names:
        raise UsageError(
            f"no GPU target: name them (rocm-audit {command} gfx942 gfx950) or set GPU_ARCH",
            hint=f"or audit a tree whose {DIST_INFO} names them",
        )
    origin["value"] = ";".join(names)
    required: list[RequiredTarget] = []
    for name in names:  # MI300X and gfx942 are one target
        target = resolve_required(name)
        if all(target.spelled != seen.spelled for seen in required):
            required.append(target)
    required.sort(key=lambda t: processor_sort_key(t.spelled))  # every list a report shows: gfx942 before gfx1100
    return TargetChoice(required, source, origin)


def dist_info_candidates(roots: Iterable[str]) -> list[str]:
    """dist_info.json of every ``_rocm_sdk_core`` tree beside or above the roots; TheRock's version
    nonce renames the tree (``_rocm_sdk_core17154321``, ``_rocm_sdk_core_r7130``; formats.md 1.2), so
    every spelling counts (tree/discovery.py is_tree_of)."""
    found = []
    for root in roots:
        tree = enclosing_sdk_tree(root)
        base = os.path.dirname(tree) if tree else root
        try:
            names = sorted(os.listdir(base))
        except OSError:
            continue
        for name in names:
            if is_tree_of(name, "core"):
                candidate = os.path.join(base, name, DIST_INFO_IN_TREE)
                if os.path.isfile(candidate) and candidate not in found:
                    found.append(candidate)
    return found


# The dist-info dir pip writes for TheRock's rocm-sdk-device-<gfx> wheel (build_python_packages.py
# _run_kpack_split; xnack variants share one wheel per base target).
_DEVICE_WHEEL_DIST_INFO = re.compile(r"^rocm_sdk_device_(gfx[0-9a-z]+)-[^/]*\.dist-info$")


def installed_device_wheel_targets(site_dir: str) -> list[str]:
    """Base targets of the ``rocm-sdk-device-<gfx>`` distributions installed in ``site_dir``."""
    try:
        names = os.listdir(site_dir)
    except OSError:
        return []
    return sorted({m.group(1) for name in names if (m := _DEVICE_WHEEL_DIST_INFO.match(name))})


# The dist-info dir pip writes for a legacy per-family libraries wheel (build_python_packages.py
# _run_legacy: rocm-sdk-libraries-gfx94X-dcgpu, rocm-sdk-libraries-gfx1151, ...). A family name
# ending in X stands for every processor of that prefix (cmake/therock_amdgpu_targets.cmake:
# gfx94X-dcgpu = gfx942, gfx90X-dcgpu = gfx908 + gfx90a, gfx110X-all = gfx1100..gfx1103).
_FAMILY_WHEEL_DIST_INFO = re.compile(r"^rocm_sdk_libraries_(gfx[0-9a-z]+(?:_[a-z]+)*)-[^/]*\.dist-info$", re.IGNORECASE)


def installed_library_families(site_dir: str) -> list[str]:
    """Families (``gfx94X-dcgpu``, ``gfx1151``) of the legacy per-family libraries wheels in ``site_dir``."""
    try:
        names = os.listdir(site_dir)
    except OSError:
        return []
    return sorted({m.group(1).replace("_", "-") for name in names if (m := _FAMILY_WHEEL_DIST_INFO.match(name))})


def in_family(target: str, family: str) -> bool:
    family = family.split("-")[0].lower()
    if family.endswith("x"):
        return len(target) == len(family) and target.startswith(family[:-1])
    return target == family


def _narrowed_to_device_wheels(
    names: list[str], dist_info_path: str, source: str, origin: TargetsOrigin
) -> tuple[list[str], str]:
    """dist_info.json lists the build's targets; an install holds the device code its user chose:
    the rocm-sdk-device-<gfx> wheels of a kpack split, or the per-family libraries wheels of the
    legacy flow. Only the listed targets that some installed wheel is for are judged."""
    # <site>/_rocm_sdk_core*/share/therock/dist_info.json
    site_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(dist_info_path))))
    installed = installed_device_wheel_targets(site_dir)
    if installed:
        kept = [n for n in names if n.split(":")[0] in installed]
        if not kept or kept == names:
            return names, source
        origin["device_wheels"] = installed
        wheels = ", ".join(f"rocm-sdk-device-{t}" for t in installed)
        return kept, f"{source}, narrowed to the installed device wheels ({wheels})"
    families = installed_library_families(site_dir)
    kept = [n for n in names if any(in_family(n.split(":")[0], f) for f in families)]
    if not kept or kept == names:
        return names, source
    origin["library_families"] = families
    wheels = ", ".join(f"rocm-sdk-libraries-{f}" for f in families)
    return kept, f"{source}, narrowed to the installed per-family libraries ({wheels})"


def _targets_from_dist_info(path: str) -> list[str]:

    import json  # noqa: PLC0415 - only when dist_info.json is read

    try:
        document = json.loads(read_small(path, MAX_DIST_INFO_BYTES))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    except RecursionError:  # "[[[[...": Python's parser recurses per level
        raise UsageError(f"cannot read {path}: JSON nested too deeply") from None
    value = document.get("dist_amdgpu_targets") if isinstance(document, dict) else None
    if isinstance(value, str):
        return split_target_args([value])
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return split_target_args(value)
    return []
