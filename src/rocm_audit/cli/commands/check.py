"""`rocm-audit check`: the whole audit (dedup check, verify-arch, llvm, post-build) in one pass."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from rocm_audit.cli.common import (
    ACTION_PANEL,
    PathsOption,
    PythonOption,
    Report,
    SkipOption,
    announce_products,
    audited_paths,
    reporting_command,
    sysroot_option,
    targets_argument,
)

if TYPE_CHECKING:
    from rocm_audit.outcome import CommandOutcome


@reporting_command()
def command(
    report: Report,
    targets: Annotated[
        list[str] | None,
        targets_argument(
            'GPU targets (gfx950, gfx942:sramecc+:xnack-, a product such as MI300X, or "gfx942;gfx950"). '
            "Default: $GPU_ARCH, else dist_info.json of _rocm_sdk_core (narrowed to the "
            "installed rocm-sdk-device-<gfx> wheels when there are any).",
        ),
    ] = None,
    paths: PathsOption = None,
    python: PythonOption = None,
    probe: Annotated[
        bool,
        typer.Option("--probe", help="Confirm LLVM clashes with sandboxed load probes.", rich_help_panel=ACTION_PANEL),
    ] = False,
    sysroot: Annotated[str, sysroot_option("Root of the system the files run on (an unpacked image).")] = "/",
    skip: SkipOption = None,
) -> CommandOutcome:
    """Run every check in one pass: dedup (check mode), verify-arch, llvm and post-build.

    One walk of the trees feeds every check; nothing is changed. --skip leaves a check out, and
    prune's weight of device code for other GPUs is added when the targets are known.

    \b
    Examples:
      rocm-audit check --python /opt/venv/bin/python gfx942 gfx950
      rocm-audit check --skip llvm --fail-on warning gfx950
      rocm-audit check --format sarif -o rocm-audit.sarif
    """

    paths = audited_paths(paths, python)
    announce_products(list(targets or []), report.quiet)

    from rocm_audit.audit.check import CheckOptions, checks_to_skip, run_check
    from rocm_audit.cli.progress import progress_line

    options = CheckOptions(
        targets=list(targets or []), sysroot=sysroot, probe=probe, python=python, skip=checks_to_skip(skip or [])
    )
    with progress_line("check", report.quiet) as progress:
        outcome = run_check(paths, options, progress)
    return outcome
