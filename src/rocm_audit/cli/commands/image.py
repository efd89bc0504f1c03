"""`rocm-audit image`: audit a finished image from outside, from a Docker daemon, a registry or an archive."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated

import typer

from rocm_audit.cli.common import (
    AUDIT_PANEL,
    Report,
    SkipOption,
    announce_products,
    reporting_command,
    targets_argument,
)

if TYPE_CHECKING:
    from rocm_audit.outcome import CommandOutcome

_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``64G``, ``500MiB``, ``1048576`` -> bytes (binary multiples). Raises UsageError."""
    from rocm_audit.errors import UsageError

    match = _SIZE.match(text)
    if not match:
        raise UsageError(f"--max-bytes takes a size such as 64G or 500M, not {text!r}")
    unit = (match.group(2) or "B")[0].upper()
    return int(match.group(1)) << {"B": 0, "K": 10, "M": 20, "G": 30, "T": 40}[unit]


_WordsArgument = Annotated[
    list[str] | None,
    targets_argument(
        "The image (REF): in the Docker daemon (name:tag or id); registry://HOST[:PORT]/REPO[:TAG|@DIGEST] "
        "to read it from a registry without a daemon; with --archive, which image of a multi-image archive. "
        "Words that are GPU targets (gfx942, gfx942:xnack+, MI300X) are "
        "targets, as with -t; every other word is REF, and there is at most one.",
        metavar="[REF] [TARGET]...",
    ),
]

_ArchiveOption = Annotated[
    str | None,
    typer.Option(
        "--archive",
        metavar="FILE",
        help="No daemon: a `docker save` tarball (legacy or OCI, optionally "
        "gzip/zstd) or an OCI image layout (directory or tar).",
        rich_help_panel=AUDIT_PANEL,
    ),
]

_TargetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--target",
        "-t",
        metavar="TARGET",
        help='GPU targets for verify-arch (gfx950, MI300X or "gfx942;gfx950"), as the words after REF; '
        "repeatable. Default, the first that is set: $GPU_ARCH of this host; GPU_ARCH, then "
        "PYTORCH_ROCM_ARCH in the image's Env; the build args GPU_ARCH, PYTORCH_ROCM_ARCH, "
        "GPU_ARCHS, AMDGPU_TARGETS its history records; its dist_info.json.",
        rich_help_panel=AUDIT_PANEL,
    ),
]

_LayersOption = Annotated[
    bool,
    typer.Option(
        "--layers",
        help="With REF: read the layers (docker save, streamed) instead of a container export, "
        "for the layer-aware waste analysis.",
        rich_help_panel=AUDIT_PANEL,
    ),
]

_PlatformOption = Annotated[
    str | None,
    typer.Option(
        "--platform",
        metavar="OS/ARCH[/VARIANT]",
        help="With registry://: which image of a multi-platform index (default linux/amd64); an image "
        "of another platform is refused.",
        rich_help_panel=AUDIT_PANEL,
    ),
]

_InsecureRegistryOption = Annotated[
    list[str] | None,
    typer.Option(
        "--insecure-registry",
        metavar="HOST[:PORT]",
        help="With registry://: talk to this registry over plain HTTP, or HTTPS without checking its "
        "certificate (private and local registries); repeatable.",
        rich_help_panel=AUDIT_PANEL,
    ),
]

_FullOption = Annotated[
    bool,
    typer.Option(
        "--full",
        help="Write every byte of every file, not only site-packages and the loader's directories "
        "and the parts of them the checks read.",
        rich_help_panel=AUDIT_PANEL,
    ),
]

_MaxBytesOption = Annotated[
    str,
    typer.Option(
        "--max-bytes",
        metavar="SIZE",
        help="Refuse images whose layers hold more than SIZE bytes.",
        rich_help_panel=AUDIT_PANEL,
    ),
]

_MaxEntriesOption = Annotated[
    int,
    typer.Option(
        "--max-entries",
        metavar="N",
        min=1,
        help="Refuse images whose layers hold more than N entries.",
        rich_help_panel=AUDIT_PANEL,
    ),
]


@reporting_command()
def command(
    report: Report,
    words: _WordsArgument = None,
    archive: _ArchiveOption = None,
    targets: _TargetOption = None,
    layers: _LayersOption = False,
    platform: _PlatformOption = None,
    insecure_registry: _InsecureRegistryOption = None,
    full: _FullOption = False,
    max_bytes: _MaxBytesOption = "256G",
    max_entries: _MaxEntriesOption = 4_000_000,
    skip: SkipOption = None,
) -> CommandOutcome:
    """Audit an image without running it: from a daemon, a registry or an archive.

    Merges its layers (whiteouts applied) in a private dir, runs every check of `rocm-audit check`
    on its site-packages, and shows which layer holds each copy of duplicated content.
    REF: create a container without starting it, stream its files out, remove it (needs the
    `docker` extra). registry://HOST/REPO:TAG and --archive FILE: no daemon at all.

    \b
    Examples:
      rocm-audit image --target gfx942 rocm/jax:latest
      rocm-audit image --archive img.tar gfx942
      rocm-audit image registry://ghcr.io/org/app:1.0 gfx942
      rocm-audit image --layers --format json -o image.json rocm/jax:latest
    """

    import os

    from rocm_audit.audit.check import CheckOptions, checks_to_skip
    from rocm_audit.errors import UsageError
    from rocm_audit.image.audit import ImageOptions, audit_archive

    ref, word_targets = _reference_and_targets(words)
    targets = [*(targets or []), *word_targets]
    _check_targets(targets)  # before the image is read: a typo must not cost a whole read
    announce_products(targets, report.quiet)
    from_registry = _from_registry(ref, archive, layers)
    if platform is not None and not from_registry:
        raise UsageError("--platform is for registry://... (an archive or a daemon image holds one platform)")
    if insecure_registry and not from_registry:
        raise UsageError("--insecure-registry is for registry://HOST/REPO:TAG, which reads the registry itself")
    options = ImageOptions(
        check=CheckOptions(
            targets=targets,
            targets_example="rocm-audit image REF gfx942 gfx950",
            # Only GPU_ARCH of this host: nothing else of its environment describes the image.
            environ={k: v for k, v in os.environ.items() if k == "GPU_ARCH"},
            environ_label="$GPU_ARCH of the auditing host",
            skip=checks_to_skip(skip or []),
        ),
        ref=ref if archive is not None else None,
        max_bytes=parse_size(max_bytes),
        max_entries=max_entries,
        full=full,
    )
    from rocm_audit.cli.progress import progress_line

    with progress_line("image", report.quiet) as progress:
        if archive is not None:
            if not os.path.exists(archive):
                raise UsageError(f"archive does not exist: {archive}")
            outcome = audit_archive(archive, options, progress)
        elif from_registry:
            from rocm_audit.image.audit import audit_registry
            from rocm_audit.image.registry import insecure_host

            insecure = frozenset(insecure_host(value) for value in insecure_registry or [])
            outcome = audit_registry(ref or "", options, platform, insecure, progress)
        else:
            from rocm_audit.image.daemon import audit_daemon_image

            outcome = audit_daemon_image(ref or "", options, layers=layers, progress=progress)
    return outcome


def _reference_and_targets(words: list[str] | None) -> tuple[str | None, list[str]]:
    """The image reference among the words (at most one), and the words that are GPU targets.
    Raises UsageError."""
    from rocm_audit.errors import UsageError
    from rocm_audit.tree.targets import separate_targets

    word_targets, refs = separate_targets(list(words or []))
    if len(refs) > 1:
        named = " and ".join(repr(r) for r in refs) if len(refs) == 2 else f"{len(refs)}: " + ", ".join(map(repr, refs))
        raise UsageError(
            f"image takes one image reference, not {named}; "
            + ("neither" if len(refs) == 2 else "none")
            + " is a GPU target (gfx942, MI300X)"
        )
    return (refs[0] if refs else None), word_targets


def _check_targets(targets: list[str]) -> None:
    """Raise UsageError for a target named on the command line that is not one (the targets the
    image records can only be checked once it is read)."""
    from rocm_audit.tree.targets import resolve_required, split_target_args

    for name in split_target_args(targets):
        resolve_required(name)


def _from_registry(ref: str | None, archive: str | None, layers: bool) -> bool:
    """Whether the image comes from a registry (registry://...); checks that one source is named
    and that --layers goes with a daemon REF. Raises UsageError."""
    from rocm_audit.errors import UsageError

    if archive is None and ref is None:
        raise UsageError("name an image (rocm-audit image REF) or an archive (rocm-audit image --archive FILE)")
    if layers and archive is not None:
        raise UsageError("--layers is for REF (an archive is always read layer by layer)")
    from rocm_audit.image.registry import is_registry_ref

    from_registry = ref is not None and is_registry_ref(ref)
    if from_registry and archive is not None:
        raise UsageError("name a registry image (registry://...) or an archive (--archive FILE), not both")
    if from_registry and layers:
        raise UsageError("--layers is for a daemon REF (a registry image is always read layer by layer)")
    return from_registry
