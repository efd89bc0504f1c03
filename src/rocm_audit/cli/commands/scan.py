"""`rocm-audit scan`: what the audited trees hold; with --targets, every GPU code object."""

from __future__ import annotations

from typing import Annotated

import typer

from rocm_audit.cli.common import (
    FailOn,
    FailOnOption,
    FormatOption,
    OutputFormat,
    OutputOption,
    PathsOption,
    QuietOption,
    RulesOption,
    emit,
    run,
)


def command(
    paths: PathsOption = None,
    targets: Annotated[
        bool,
        typer.Option(
            "--targets",
            help="List every GPU code object per file (bundles, CCOBs, kpack, raw and embedded "
            "ELFs, kernel databases), like clang-offload-bundler --list for all containers.",
        ),
    ] = False,
    fmt: FormatOption = OutputFormat.text,
    output: OutputOption = None,
    fail_on: FailOnOption = FailOn.error,
    quiet: QuietOption = False,
    rules: RulesOption = None,
) -> None:
    """Report what the trees hold: file kinds, or with --targets every GPU code object per file."""

    def body() -> int:
        from rocm_audit.cli.progress import progress_line

        with progress_line("scan", quiet) as progress:
            if targets:
                from rocm_audit.gpu.verify import list_targets

                outcome = list_targets(paths, progress=progress)
            else:
                from rocm_audit.gpu.verify import inventory_summary

                outcome = inventory_summary(paths, progress=progress)
        return emit(outcome, fmt, output, fail_on, quiet)

    run(body, rules)
