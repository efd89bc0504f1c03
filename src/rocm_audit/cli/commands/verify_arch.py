"""`rocm-audit verify-arch`: prove every device-code carrier runs on the required GPU targets."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from rocm_audit.cli.common import (
    ListTargetsOption,
    PathsOption,
    PythonOption,
    Report,
    announce_products,
    audited_paths,
    reporting_command,
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
            'GPU targets: gfx950, gfx942:sramecc+:xnack-, a product (MI300X), or one list "gfx942;gfx950". '
            "Default: $GPU_ARCH, else dist_amdgpu_targets of "
            "_rocm_sdk_core/share/therock/dist_info.json, narrowed to the installed "
            "rocm-sdk-device-<gfx> wheels when there are any."
        ),
    ] = None,
    paths: PathsOption = None,
    python: PythonOption = None,
    list_targets: ListTargetsOption = False,
) -> CommandOutcome:
    """Check that every library and kernel database has code for each GPU target.

    Judged as the HIP runtime picks code objects: the exact processor with compatible xnack/sramecc
    settings, else the generic target (gfx9-4-generic for gfx942/gfx950), else SPIR-V (a warning).
    Every translation unit of a library must match. A bare processor name means its usual setting:
    sramecc+ and xnack- where the processor has those features.

    \b
    Examples:
      rocm-audit verify-arch gfx942 gfx950
      rocm-audit verify-arch --python /opt/venv/bin/python "gfx942;gfx950"
      rocm-audit verify-arch --format sarif -o verify-arch.sarif gfx950
    """

    del list_targets  # its callback lists and exits before the command runs
    paths = audited_paths(paths, python)
    announce_products(list(targets or []), report.quiet)

    from rocm_audit.audit.pruned import mark_pruned
    from rocm_audit.cli.progress import progress_line
    from rocm_audit.gpu.verify import verify_arch

    with progress_line("verify-arch", report.quiet) as progress:
        outcome = verify_arch(paths, list(targets or []), progress=progress)
    # a target this tree's own prune removed says so, not "report to the shipper"
    outcome.findings = mark_pruned(outcome.findings, outcome.inputs)
    return outcome
