"""Text rendering of a command outcome, for a person at a terminal of 100 columns.

Order: where the paths are relative to, the command's own summary, the findings (errors first,
then warnings, then info; findings with one rule and one cause on one entry with a count), what
the run did when it changed something (prune: and how to undo it), what a rules file or baseline
suppressed, and one count line that agrees with the findings. ``-v`` adds
the detail: every path of a group, each finding's explanation, and the command's full tables.

Pure: the outcome's data in, one string out; every name passes through output/escape.py, and a
path is never split across lines (output/layout.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from rocm_audit.findings import Finding, Severity, cause_groups, cause_text, place_in_file
from rocm_audit.outcome import CommandOutcome
from rocm_audit.output.escape import display
from rocm_audit.output.layout import PathView, plural, wrap
from rocm_audit.output.text_sections import closing_lines, section_lines
from rocm_audit.rulebook.catalogue import reports_upstream

_COLOURS = {Severity.ERROR: "\x1b[31m", Severity.WARNING: "\x1b[33m", Severity.INFO: "\x1b[36m"}
# Paths listed on a grouped entry by default; -v lists them all.
GROUP_PATHS_SHOWN = 3


def use_colour() -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (no-color.org)."""
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def severity_label(severity: Severity, colour: bool) -> str:
    label = severity.value.upper()
    return f"{_COLOURS[severity]}{label}\x1b[0m" if colour else label


def _shipped_text(group: Sequence[Finding]) -> str:
    """Who ships the files of a group: ``shipped by triton 3.9.0 (report to URL)``, the URL only for
    a rule about a defect in what was shipped; empty when some file is the user's own (no RECORD
    lists it)."""
    shippers = {f.shipped_by for f in group}
    if None in shippers:
        return ""
    named = sorted((s for s in shippers if s is not None), key=lambda s: s.name.lower())
    if len(named) == 1:
        only = named[0]
        # not for what the user's own prune removed (audit/pruned.py)
        upstream = only.report_to and reports_upstream(group[0].rule) and not group[0].data.get("pruned_by")
        where = f" (report to {display(only.report_to)})" if upstream else ""
        return f"shipped by {display(only.name)} {display(only.version)}{where}"
    return "shipped by " + ", ".join(f"{display(s.name)} {display(s.version)}" for s in named)


# Names a group counts across its files (POST002: the libraries no search path finds), most first.
_TALLIED = "missing_sonames"
TALLY_SHOWN = 4


def _tally(group: Sequence[Finding]) -> str:
    """``- libamdhip64.so.7 (15 files), libhipblas.so.3 (9 files) ... and 12 other libraries``."""
    counts: dict[str, int] = {}
    for one in group:
        for name in one.data.get(_TALLIED) or ():
            counts[str(name)] = counts.get(str(name), 0) + 1
    said = group[0].message if len(group) == 1 else cause_text(group[0])
    if not counts or all(name in said for name in counts):  # the text names them already
        return ""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    shown = [f"{display(name)} ({n} file{'s' if n > 1 else ''})" for name, n in ranked[:TALLY_SHOWN]]
    others = len(ranked) - TALLY_SHOWN  # "16 files: ... and 16 more" read as 16 more files
    more = f" and {plural(others, 'other library', 'other libraries')}" if others > 0 else ""
    return "- " + ", ".join(shown) + more


def finding_lines(group: Sequence[Finding], view: PathView, colour: bool, verbose: int) -> list[str]:
    """One entry for a group of findings with one rule and one cause: the file (or the count of
    files) and the message, the files of a group, who ships them; with ``verbose`` the detail."""
    first = group[0]
    label = severity_label(first.severity, colour)
    said = first.message if len(group) == 1 else cause_text(first)  # a group says its cause once
    message = view.in_text(said, [first.path, *first.related_paths])
    one_file = all(f.path == first.path for f in group)
    if len(group) == 1:
        words = [f"{label} {first.rule}", view.path(first.path) + ":", message]
    elif one_file:  # one cause met at several places of one file (old code objects in a library)
        words = [f"{label} {first.rule}", f"{view.path(first.path)} ({len(group)} places):", message]
    else:
        words = [f"{label} {first.rule}", f"{plural(len(group), 'file')}:", message]
    tally = _tally(group)
    if tally:
        words.append(tally)
    shipped = _shipped_text(group)
    lines = wrap(" ".join(words) + (f" [{shipped}]" if shipped else ""))
    if len(group) > 1:
        shown = group if verbose else group[:GROUP_PATHS_SHOWN]
        listed = ", ".join(display(place_in_file(f)) if one_file else view.path(f.path) for f in shown)
        hidden = len(group) - len(shown)
        if hidden:
            listed += f" and {hidden} more (-v lists them)"
        lines += wrap(listed, indent="    ", rest="    ")
    related = first.related_paths if verbose or len(first.related_paths) <= GROUP_PATHS_SHOWN else ()
    if first.related_paths and len(group) == 1:
        names = ", ".join(view.path(p) for p in (related or first.related_paths[:GROUP_PATHS_SHOWN]))
        more = len(first.related_paths) - (len(related) if related else GROUP_PATHS_SHOWN)
        lines += wrap(
            f"with {names}" + (f" and {more} more (-v lists them)" if more > 0 else ""), indent="    ", rest="    "
        )
    if verbose and first.detail:
        lines += wrap(view.in_text(first.detail, [first.path, *first.related_paths]), indent="    ", rest="    ")
    return lines


def render_findings(outcome: CommandOutcome, colour: bool, view: PathView, verbose: int = 0) -> list[str]:
    lines: list[str] = []
    for group in cause_groups(outcome.findings):
        lines.extend(finding_lines(group, view, colour, verbose))
    return lines


def suppressed_line(suppressed: Sequence[dict[str, str]]) -> str | None:
    """``12 findings suppressed: 10 by rules.toml, 2 by baseline.json`` (None when none)."""
    if not suppressed:
        return None
    by_source: dict[str, int] = {}
    for entry in suppressed:
        source = entry.get("source", "")
        name = source.split(":", 1)[1] if source.startswith("baseline:") else source.rsplit(":", 1)[0]
        by_source[name] = by_source.get(name, 0) + 1
    parts = ", ".join(f"{count} by {display(name)}" for name, count in sorted(by_source.items()))
    return f"{plural(len(suppressed), 'finding')} suppressed: {parts}"


def count_line(command: str, findings: Sequence[Finding]) -> str:
    counts = {s: sum(1 for f in findings if f.severity is s) for s in Severity}
    return (
        f"{command}: {plural(counts[Severity.ERROR], 'error')}, {plural(counts[Severity.WARNING], 'warning')}, "
        f"{counts[Severity.INFO]} info"
    )


def render_text(outcome: CommandOutcome, verbose: int = 0, colour: bool = False) -> str:
    """The text report; ``colour``: severity labels in ANSI colours (for a terminal: ``use_colour``)."""
    view = PathView(outcome.roots)
    parts: list[str] = []
    body = section_lines(outcome.command, outcome.sections, view, verbose)
    header = view.header() if (body or outcome.findings) else []
    if outcome.command == "dedup" and outcome.summary:  # dedup closes its own section with the summary
        body.append(display(outcome.summary))
    top = [line for raw in [*header, *body] for line in wrap(raw)]
    if top:
        parts.append("\n".join(top).rstrip("\n"))
    findings = render_findings(outcome, colour, view, verbose)
    if findings:
        parts.append("\n".join(findings))
    done = [line for raw in closing_lines(outcome.command, outcome.sections) for line in wrap(raw)]
    if done:  # what a changing run did, a paragraph of its own above the counts
        parts.append("\n".join(done))
    closing = [line for line in (suppressed_line(outcome.suppressed),) if line]
    entries = len(cause_groups(outcome.findings))
    grouped = f" (in {plural(entries, 'entry', 'entries')} above)" if entries < len(outcome.findings) else ""
    if outcome.findings or outcome.command != "rules":  # a listing of the rules finds nothing to count
        closing.append(count_line(outcome.command, outcome.findings) + grouped)
    if closing:
        parts.append("\n".join(closing))
    return "\n\n".join(parts) + "\n"
