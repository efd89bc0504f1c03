"""`rocm-audit dedup`: replace byte-identical SDK shared libraries by relative symlinks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from rocm_audit.cli.common import (
    PathsOption,
    PythonOption,
    Report,
    audited_paths,
    change_mode,
    check_option,
    dry_run_option,
    manifest_option,
    reporting_command,
    revert_option,
)

if TYPE_CHECKING:
    from rocm_audit.outcome import CommandOutcome


@reporting_command()
def command(
    report: Report,
    paths: PathsOption = None,
    python: PythonOption = None,
    dry_run: Annotated[
        bool,
        dry_run_option(
            "Print the plan (and an equivalent shell script); change nothing; exit 0 whatever it finds "
            "(--check is the gate)."
        ),
    ] = False,
    check: Annotated[bool, check_option("Change nothing; exit 1 if anything would change (CI gate).")] = False,
    manifest: Annotated[
        str | None,
        manifest_option(
            "Revert manifest to append to. Default: .rocm-audit/dedup-manifest.jsonl in the directory "
            "holding the SDK trees."
        ),
    ] = None,
    revert: Annotated[
        list[str] | None, revert_option("Turn the links recorded in MANIFEST back into regular files; repeatable.")
    ] = None,
) -> CommandOutcome:
    """Replace byte-identical SDK libraries by relative symlinks to the runtime copy.

    The copy in the runtime package (_rocm_sdk_core, then _rocm_sdk_libraries*) is kept; devel
    copies and hardlinks become symlinks, each made atomically after a fresh byte comparison.
    Every change is recorded in a manifest that --revert undoes.

    \b
    Examples:
      rocm-audit dedup --dry-run
      rocm-audit dedup --check --python /opt/venv/bin/python
      rocm-audit dedup --revert .rocm-audit/dedup-manifest.jsonl
    """

    paths = audited_paths(paths, python)
    mode = change_mode(dry_run, check, revert)
    from rocm_audit.cli.progress import progress_line

    with progress_line("dedup", report.quiet) as progress:
        if revert:
            from rocm_audit.dedup.revert import revert_manifests

            outcome = revert_manifests(revert, progress)
        else:
            from rocm_audit.dedup.run import run_dedup

            outcome = run_dedup(paths, mode=mode, manifest_path=manifest, progress=progress)
    return outcome
