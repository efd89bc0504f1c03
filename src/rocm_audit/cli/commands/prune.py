"""`rocm-audit prune`: weigh device code per distribution and target; remove whole per-arch units for other GPUs."""

from __future__ import annotations

from typing import Annotated

import typer

from rocm_audit.cli.common import PathsOption, PythonOption, Report, audited_paths, reporting_command
from rocm_audit.outcome import CommandOutcome


@reporting_command()
def command(
    report: Report,
    targets: Annotated[
        list[str] | None,
        typer.Argument(  # noqa: UP045
            metavar="TARGET",
            help='GPU targets to keep: gfx950, gfx942:xnack+, or one list "gfx942;gfx950". Default: $GPU_ARCH, '
            "else dist_amdgpu_targets of _rocm_sdk_core/share/therock/dist_info.json.",
        ),
    ] = None,
    paths: PathsOption = None,
    python: PythonOption = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the weight table and the plan; change nothing.")
    ] = False,
    check: Annotated[
        bool, typer.Option("--check", help="Change nothing; exit 1 if anything could be pruned (CI gate).")
    ] = False,
    manifest: Annotated[
        str | None,
        typer.Option(  # noqa: UP045
            "--manifest",
            metavar="FILE",
            help="Revert manifest to append to. Default: .rocm-audit/prune-manifest.jsonl beside the SDK trees.",
        ),
    ] = None,
    backup: Annotated[
        str | None,
        typer.Option(  # noqa: UP045
            "--backup",
            metavar="DIR",
            help="Move removed files into DIR (outside the audited trees) instead of deleting.",
        ),
    ] = None,
    revert: Annotated[
        list[str] | None,
        typer.Option(  # noqa: UP045
            "--revert",
            metavar="MANIFEST",
            help="Restore what MANIFEST recorded (from the backup, else print the pip reinstall lines); repeatable.",
        ),
    ] = None,
) -> CommandOutcome:
    """Weigh device code for GPUs outside the kept targets, and remove what can go safely.

    Whole per-arch units only: kpack archives, Tensile/MIOpen/AOTriton per-arch files and folders,
    and device distributions (rocm-sdk-device-gfxNNN, uninstalled with pip). Never a file a kept
    target could load (native, generic or SPIR-V); fat binaries inside host libraries are weighed,
    not touched. A bare target (gfx942) keeps code for both xnack settings. Device distributions
    are uninstalled by the pip of --python, else of the interpreter that owns the site-packages.
    """
    from rocm_audit.errors import UsageError

    if sum(bool(x) for x in (dry_run, check, revert)) > 1:
        raise UsageError("--dry-run, --check and --revert exclude each other")
    if revert:
        from rocm_audit.audit.pruning import revert_prune

        return revert_prune(revert)
    from rocm_audit.audit.pruning import run_prune
    from rocm_audit.cli.progress import progress_line

    mode = "check" if check else "dry-run" if dry_run else "apply"
    paths = audited_paths(paths, python)  # --python: its site-packages, and its pip uninstalls
    with progress_line("prune: scanning", report.quiet) as progress:
        return run_prune(
            paths,
            list(targets or []),
            mode=mode,
            manifest_path=manifest,
            backup_dir=backup,
            python=python,
            progress=progress,
        )
