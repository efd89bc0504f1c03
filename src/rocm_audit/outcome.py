"""What every command returns to the CLI: findings and the JSON sections. Data only: the renderers in
output/ turn it into text, JSON, SARIF, JUnit or GitHub annotations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rocm_audit.findings import Finding, Severity

if TYPE_CHECKING:  # building the TypedDicts costs 25 ms of every `--help`
    from rocm_audit.report_types import Sections


@dataclass(slots=True)
class CommandOutcome:
    command: str
    findings: list[Finding]
    inputs: list[str] = field(default_factory=list)
    sections: Sections = field(default_factory=dict)  # type: ignore[assignment]
    # Set by commands whose own contract decides failure (dedup --check: "anything would change").
    force_failure: bool = False
    # False for a preview (dedup --dry-run): it reports what is wrong, and exits 0 whatever it found.
    findings_decide_exit: bool = True
    # One human line for stderr when the report itself goes to a file or is JSON.
    summary: str | None = None
    # Commands ``summary`` gives to run (prune's undo line): held whole when it is wrapped, since a
    # command split over two lines pastes as two commands.
    summary_commands: list[str] = field(default_factory=list)
    # Findings an ignore in the policy removed, with the reason (filled in by the CLI).
    suppressed: list[dict[str, str]] = field(default_factory=list)
    # The audited directories, spelled as the findings spell paths: text shows paths under them
    # relative to them (the CLI fills it from ``inputs`` when a command leaves it empty).
    roots: list[str] = field(default_factory=list)
    # image only, never reported: path -> (bytes, unused bytes, removable bytes, bytes --fatbins
    # would remove, estimated) of device code,
    # from check's prune weight (CheckOptions.prune_by_file), placed in the layers that wrote them.
    device_bytes_by_path: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    # The findings already name who shipped each file (image: read from the image's own RECORDs
    # while its merged view existed; the paths they spell are not this machine's).
    attributed: bool = False

    def exit_code(self, fail_on: Severity) -> int:
        if self.force_failure:
            return 1
        if not self.findings_decide_exit:
            return 0
        return 1 if any(f.severity >= fail_on for f in self.findings) else 0
