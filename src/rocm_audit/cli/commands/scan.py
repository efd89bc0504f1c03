"""`rocm-audit scan`: what the audited trees hold; with --targets, every GPU code object."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from rocm_audit.cli.common import (
    ACTION_PANEL,
    PathsOption,
    PythonOption,
    Report,
    audited_paths,
    reporting_command,
)

if TYPE_CHECKING:
    from rocm_audit.outcome import CommandOutcome


@reporting_command()
def command(
    report: Report,
    paths: PathsOption = None,
    python: PythonOption = None,
    targets: Annotated[
        bool,
        typer.Option(
            "--targets",
            help="Every file that carries GPU code, a line each: its containers (bundles, CCOBs, "
            "kpack, raw and embedded ELFs, kernel databases) and the GPU targets of its code "
            "objects; -v lists each code object (clang-offload-bundler --list for every container).",
            rich_help_panel=ACTION_PANEL,
        ),
    ] = False,
) -> CommandOutcome:
    """Report what the trees hold: file kinds, or with --targets every GPU code object.

    \b
    Examples:
      rocm-audit scan --python /opt/venv/bin/python
      rocm-audit scan --targets -p /opt/venv/lib/python3.12/site-packages/_rocm_sdk_core
      rocm-audit scan --targets --format json -o code-objects.json
    """

    paths = audited_paths(paths, python)

    from rocm_audit.cli.progress import progress_line

    with progress_line("scan", report.quiet) as progress:
        if targets:
            from rocm_audit.gpu.verify import list_targets

            outcome = list_targets(paths, progress=progress)
        else:
            from rocm_audit.gpu.verify import inventory_summary

            outcome = inventory_summary(paths, progress=progress)
    return outcome
