"""`rocm-audit prune`: weigh device code per distribution and target; remove whole per-arch units for other GPUs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from rocm_audit.cli.common import (
    ACTION_PANEL,
    PathsOption,
    PythonOption,
    Report,
    announce_products,
    audited_paths,
    change_mode,
    check_option,
    dry_run_option,
    manifest_option,
    reporting_command,
    revert_option,
    targets_argument,
)

if TYPE_CHECKING:
    from rocm_audit.outcome import CommandOutcome

_TargetsArgument = Annotated[
    list[str] | None,
    targets_argument(
        'GPU targets to keep: gfx950, gfx942:xnack+, a product (MI300X), or one list "gfx942;gfx950". '
        "Default: $GPU_ARCH, else dist_amdgpu_targets of _rocm_sdk_core/share/therock/dist_info.json."
    ),
]

_ManifestOption = Annotated[
    str | None,
    manifest_option("Revert manifest to append to. Default: .rocm-audit/prune-manifest.jsonl beside the SDK trees."),
]

_BackupOption = Annotated[
    str | None,
    typer.Option(
        "--backup",
        metavar="DIR",
        help="Move removed files into DIR (outside the audited trees) instead of deleting.",
        rich_help_panel=ACTION_PANEL,
    ),
]

_FatbinsOption = Annotated[
    bool,
    typer.Option(
        "--fatbins",
        help="Also slim the fat binaries inside host libraries to the kept targets' code; the "
        "files shrink on disk, every address kept (where no layout allows it, the bytes are zeroed).",
        rich_help_panel=ACTION_PANEL,
    ),
]

_KeepDistOption = Annotated[
    list[str] | None,
    typer.Option(
        "--keep-dist",
        metavar="NAME",
        help=(
            "Leave this distribution whole: none of its units removed, none of its libraries slimmed "
            "by --fatbins; repeatable (in a rules file: [policy.prune] keep_dist)."
        ),
        rich_help_panel=ACTION_PANEL,
    ),
]

_RevertOption = Annotated[
    list[str] | None,
    revert_option("Restore what MANIFEST recorded (from the backup, else print the pip reinstall lines); repeatable."),
]


@reporting_command()
def command(
    report: Report,
    targets: _TargetsArgument = None,
    paths: PathsOption = None,
    python: PythonOption = None,
    dry_run: Annotated[bool, dry_run_option("Print the weight table and the plan; change nothing.")] = False,
    check: Annotated[bool, check_option("Change nothing; exit 1 if anything could be pruned (CI gate).")] = False,
    manifest: _ManifestOption = None,
    backup: _BackupOption = None,
    fatbins: _FatbinsOption = False,
    keep_dist: _KeepDistOption = None,
    revert: _RevertOption = None,
) -> CommandOutcome:
    """Weigh device code for GPUs outside the kept targets and remove what can go safely.

    Whole per-arch units only: kpack archives, Tensile/MIOpen/AOTriton per-arch files and folders,
    and device distributions (rocm-sdk-device-gfxNNN, uninstalled with pip). Never a file a kept
    target could load (native, generic or SPIR-V). Fat binaries inside host libraries are weighed;
    with --fatbins each bundle keeps only the entries the HIP runtime can select for a kept target
    (packed together, the freed bytes given back on disk: no virtual address moves). A bare
    target (gfx942) keeps code for both xnack settings. Device distributions are uninstalled by
    the pip of --python, else of the interpreter that owns the site-packages.

    \b
    Examples:
      rocm-audit prune --dry-run gfx942
      rocm-audit prune --backup /var/tmp/pruned gfx942 gfx950
      rocm-audit prune --check --python /opt/venv/bin/python gfx950
      rocm-audit prune --fatbins --dry-run gfx942
    """
    mode = change_mode(dry_run, check, revert)
    from rocm_audit.cli.progress import progress_line

    if revert:
        _revert_alone(targets, paths, manifest=manifest, backup=backup, fatbins=fatbins, keep_dist=keep_dist)
        from rocm_audit.audit.pruning import revert_prune

        with progress_line("prune", report.quiet) as progress:
            return revert_prune(revert, progress, python=python)
    from rocm_audit.audit.pruning import run_prune

    paths = audited_paths(paths, python)  # --python: its site-packages, and its pip uninstalls
    announce_products(list(targets or []), report.quiet)
    with progress_line("prune", report.quiet) as progress:
        return run_prune(
            paths,
            list(targets or []),
            mode=mode,
            manifest_path=manifest,
            backup_dir=backup,
            python=python,
            progress=progress,
            fatbins=fatbins,
            keep_dists=list(keep_dist or []),
        )


def _revert_alone(targets: list[str] | None, paths: list[str] | None, **options: object) -> None:
    """--revert restores what its manifests journalled, nothing else: targets, paths and the
    options of an applying run would be ignored, so they are refused. Raises UsageError."""
    from rocm_audit.errors import UsageError

    if targets:
        said = " ".join(targets)
        raise UsageError(f"--revert takes no targets (got {said}): it restores what the manifest journalled")
    given = ["-p/--path"] if paths else []
    given += [f"--{name.replace('_', '-')}" for name, value in options.items() if value]
    if given:
        raise UsageError(f"--revert excludes {', '.join(given)}: it restores what the manifest journalled")
