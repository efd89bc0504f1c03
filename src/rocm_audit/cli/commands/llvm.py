"""`rocm-audit llvm`: LLVM command-line option double registrations, predicted and probed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer

from rocm_audit.cli.common import (
    ACTION_PANEL,
    AUDIT_PANEL,
    PathsOption,
    PythonOption,
    Report,
    audited_paths,
    reporting_command,
    sysroot_option,
)

if TYPE_CHECKING:
    from rocm_audit.outcome import CommandOutcome

_ProbeOption = Annotated[
    bool,
    typer.Option(
        "--probe",
        help="Confirm each clash by loading the libraries in a sandboxed child process "
        "(runs their constructors: probe only images you would run).",
        rich_help_panel=ACTION_PANEL,
    ),
]

_ProbeTimeoutOption = Annotated[
    float,
    typer.Option(
        "--probe-timeout",
        metavar="SECONDS",
        min=0.1,
        help="Kill a probe after this long: a hang, as conclusive as an abort.",
        rich_help_panel=ACTION_PANEL,
    ),
]

_PreloadOption = Annotated[
    Optional[list[str]],  # noqa: UP045 - typer needs Optional on 3.10
    typer.Option(
        "--preload",
        metavar="LIB",
        help="Treat LIB as preloaded RTLD_GLOBAL (as rocm_sdk.preload_libraries does): "
        "in the predictions and before each probe; repeatable.",
        rich_help_panel=AUDIT_PANEL,
    ),
]

_PreloadRocmSdkOption = Annotated[
    bool,
    typer.Option(
        "--preload-rocm-sdk",
        help="Model and probe with rocm_sdk's own preloads (amd_comgr, amdhip64, hiprtc, "
        "rocm_kpack from _rocm_sdk_core/lib, RTLD_GLOBAL), as `rocm-sdk test` and "
        "rocm_sdk.initialize_process do.",
        rich_help_panel=AUDIT_PANEL,
    ),
]

_ClosureOption = Annotated[
    Optional[list[str]],  # noqa: UP045 - typer needs Optional on 3.10
    typer.Option(
        "--closure",
        metavar="PATH",
        help="Show the load closure of PATH (what dlopen(PATH) maps); repeatable.",
        rich_help_panel=ACTION_PANEL,
    ),
]

_SysrootOption = Annotated[
    str, sysroot_option("Resolve default library directories and ld.so.conf under DIR (an unpacked image).")
]

_LdLibraryPathOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--ld-library-path",
        metavar="DIRS",
        help="Colon-separated LD_LIBRARY_PATH to model (and probe with).",
        rich_help_panel=AUDIT_PANEL,
    ),
]


@reporting_command()
def command(
    report: Report,
    paths: PathsOption = None,
    python: PythonOption = None,
    probe: _ProbeOption = False,
    probe_timeout: _ProbeTimeoutOption = 60.0,
    preload: _PreloadOption = None,
    preload_rocm_sdk: _PreloadRocmSdkOption = False,
    closure: _ClosureOption = None,
    sysroot: _SysrootOption = "/",
    ld_library_path: _LdLibraryPathOption = None,
) -> CommandOutcome:
    """Report the LLVM `cl::opt` double registrations the scanned libraries can hit.

    Each shared library gets a role from its ELF facts (exporter, registrant, private-copy, none);
    duplicated exporters/registrants, exporters that bind each other and load closures holding two
    LLVMs are reported with the load modes they fire in and a fix. Exit 1 on any high-risk or
    probe-confirmed clash.

    \b
    Examples:
      rocm-audit llvm --python /opt/venv/bin/python
      rocm-audit llvm --probe --preload-rocm-sdk
      rocm-audit llvm --format json -o llvm.json
    """

    paths = audited_paths(paths, python)

    from rocm_audit.cli.progress import progress_line
    from rocm_audit.llvm.clashes import LlvmOptions, run_llvm

    options = LlvmOptions(
        probe=probe,
        probe_timeout_s=probe_timeout,
        preload=tuple(preload or ()),
        preload_rocm_sdk=preload_rocm_sdk,
        closure_paths=tuple(closure or ()),
        sysroot=sysroot,
        ld_library_path=tuple(d for d in (ld_library_path or "").split(":") if d),
        python=python,
    )
    with progress_line("llvm", report.quiet) as progress:
        outcome = run_llvm(paths, options, progress=progress)
    return outcome
