"""`rocm-audit scan`: what the audited trees hold; with --targets, every GPU code object."""

from __future__ import annotations

from typing import Annotated

import typer

from rocm_audit.cli import (
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
        from rocm_audit.progress import ProgressLine, progress_enabled

        progress = ProgressLine("scan") if progress_enabled(quiet) else None
        try:
            if targets:
                from rocm_audit.archcheck import list_targets

                outcome = list_targets(paths, progress=progress)
            else:
                from rocm_audit.archcheck import inventory_summary

                outcome = inventory_summary(paths, progress=progress)
        finally:
            if progress is not None:
                progress.close()
        code = emit(outcome, fmt, output, fail_on)
        if not quiet and (fmt is not OutputFormat.text or output) and outcome.summary:
            typer.echo(outcome.summary, err=True)
        return code

    run(body, rules)
