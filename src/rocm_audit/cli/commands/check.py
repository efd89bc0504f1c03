"""`rocm-audit check`: the whole audit (dedup check, verify-arch, llvm, post-build) in one pass."""

from __future__ import annotations

from typing import Annotated, Optional

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
    targets: Annotated[Optional[list[str]], typer.Argument(  # noqa: UP045
        metavar="[TARGET]...", help="GPU targets (gfx950, gfx942:sramecc+:xnack-, or \"gfx942;gfx950\"). "
                                    "Default: $GPU_ARCH, else dist_info.json of _rocm_sdk_core.")] = None,
    paths: PathsOption = None,
    probe: Annotated[bool, typer.Option("--probe", help="Confirm LLVM clashes with sandboxed load probes.")] = False,
    sysroot: Annotated[str, typer.Option("--sysroot", metavar="DIR",
                                         help="Root of the system the files run on (an unpacked image).")] = "/",
    skip: Annotated[Optional[list[str]], typer.Option(  # noqa: UP045
        "--skip", metavar="CHECK", help="Leave out dedup, verify-arch, llvm or post-build; repeatable.")] = None,
    fmt: FormatOption = OutputFormat.text,
    output: OutputOption = None,
    fail_on: FailOnOption = FailOn.error,
    quiet: QuietOption = False,
    rules: RulesOption = None,
) -> None:
    """Run every check over one inventory: dedup (check mode), verify-arch, llvm and post-build checks."""

    def body() -> int:
        from rocm_audit.audit.check import CheckOptions, run_check
        from rocm_audit.cli.progress import progress_line
        from rocm_audit.errors import UsageError

        known = {"dedup", "verify-arch", "llvm", "post-build"}
        unknown = set(skip or []) - known
        if unknown:
            raise UsageError(f"--skip takes {', '.join(sorted(known))}; not {', '.join(sorted(unknown))}")
        options = CheckOptions(targets=list(targets or []), sysroot=sysroot, probe=probe,
                               skip=frozenset(skip or []))
        with progress_line("check: scanning", quiet) as progress:
            outcome = run_check(paths, options, progress)
        return emit(outcome, fmt, output, fail_on, quiet)

    run(body, rules)
