"""Markdown for people reading a CI job summary (GitHub's ``$GITHUB_STEP_SUMMARY``, a merge request note).

Four parts, each only when it has something to say: a summary table (errors, warnings, info per
check), a library x target coverage table (verify-arch, check, image: only carriers with a gap,
capped), the largest duplicate groups (dedup, check, image) and the findings list (capped). Pure:
the outcome in, one string out; every name and message passes through ``escape.markdown``, so a
file name cannot open a link, an HTML tag, a table cell or a mention.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rocm_audit.audit.check import CHECKS
from rocm_audit.findings import Severity, cause_groups, cause_text, place_in_file
from rocm_audit.outcome import CommandOutcome
from rocm_audit.output.escape import markdown, markdown_message
from rocm_audit.output.layout import PathView
from rocm_audit.output.prefixes import check_of
from rocm_audit.output.prune_text import weight_by_distribution
from rocm_audit.output.text_sections import KIND_WORDS, image_layers_text, relative_to_roots
from rocm_audit.report_types import Sections
from rocm_audit.units import size_text

COVERAGE_ROWS = 25
DUPLICATE_GROUPS = 10
FINDINGS_LISTED = 100  # entries (one per cause)
GROUP_PATHS_LISTED = 3


def _row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows)]


def summary_lines(outcome: CommandOutcome) -> list[str]:
    counts: dict[str, dict[Severity, int]] = {}
    for one in outcome.findings:
        per = counts.setdefault(check_of(one.rule), dict.fromkeys(Severity, 0))
        per[one.severity] += 1
    ran = outcome.command in ("check", "image")  # these name the checks that ran: a clean one is a row
    checks = list(outcome.sections.get("summary", {}).get("checks", [])) if ran else []
    for check in checks:
        counts.setdefault(check, dict.fromkeys(Severity, 0))
    if not counts:
        return ["No findings."]
    rows: list[list[object]] = [
        [markdown(check), per[Severity.ERROR], per[Severity.WARNING], per[Severity.INFO]]
        for check, per in sorted(counts.items())
    ]
    rows += [[markdown(check), "skipped", "", ""] for check in CHECKS if checks and check not in checks]
    total = [sum(per[s] for per in counts.values()) for s in (Severity.ERROR, Severity.WARNING, Severity.INFO)]
    rows.append(["**total**", *(f"**{n}**" for n in total)])
    return _table(["check", "errors", "warnings", "info"], rows)


def coverage_lines(sections: Sections, shorten: Callable[[str], str]) -> list[str]:
    """Library x target, only for carriers missing a target; at most COVERAGE_ROWS rows."""
    targets = [t["target"] for t in sections.get("targets", [])]
    carriers = sections.get("carriers")
    if not targets or carriers is None:
        return []
    source = sections.get("targets_source")
    lines = [f"Targets: {', '.join(markdown(t) for t in targets)}" + (f" (from {markdown(source)})" if source else "")]
    gaps = [c for c in carriers if c.get("missing")]
    lines.append("")
    if not gaps:
        lines.append(f"No GPU code carrier misses a target ({len(carriers)} judged).")
        return lines
    lines.append(f"GPU code carriers missing a target: {len(gaps)} of {len(carriers)}.")
    lines.append("")
    rows = []
    for carrier in gaps[:COVERAGE_ROWS]:
        how = {m["target"]: m["how"] for m in carrier.get("matches", [])}
        rows.append(
            [markdown(shorten(carrier["path"]))] + [markdown(how[t]) if how.get(t) else "**missing**" for t in targets]
        )
    lines.extend(_table(["library", *(markdown(t) for t in targets)], rows))
    if len(gaps) > COVERAGE_ROWS:
        lines.append("")
        lines.append(f"... and {len(gaps) - COVERAGE_ROWS} more")
    return lines


def duplicate_lines(sections: Sections, shorten: Callable[[str], str]) -> list[str]:
    """The largest groups of identical files: dedup's plan, or an image's layer-aware waste."""
    rows: list[list[object]] = []
    waste = sections.get("image", {}).get("waste")
    if waste is not None:
        groups = waste["groups"]  # ranked as the text and JSON rank them: SDK trees first (image/waste.py)
        header = ["wasted", "copies", "scope", "paths (layer)"]
        for group in groups[:DUPLICATE_GROUPS]:
            paths = "<br>".join(f"{markdown(shorten(c['path']))} ({c['layer']})" for c in group["copies"])
            rows.append([size_text(group["wasted_bytes"]), len(group["copies"]), markdown(group["scope"]), paths])
        total = len(groups)
    elif "dedup" in sections:
        linked = sorted(sections["dedup"]["groups"], key=lambda g: g["size"] * len(g["duplicates"]), reverse=True)
        header = ["size", "copies", "keep", "link"]
        for one in linked[:DUPLICATE_GROUPS]:
            links = "<br>".join(markdown(shorten(d["path"])) for d in one["duplicates"])
            rows.append([size_text(one["size"]), 1 + len(one["duplicates"]), markdown(shorten(one["keeper"])), links])
        total = len(linked)
    else:
        return []
    if not rows:
        return ["No duplicate files."]
    lines = [f"Largest duplicate groups ({min(total, DUPLICATE_GROUPS)} of {total}):", "", *_table(header, rows)]
    if total > DUPLICATE_GROUPS:
        lines += ["", f"... and {total - DUPLICATE_GROUPS} more"]
    return lines


def finding_lines(outcome: CommandOutcome, shorten: Callable[[str], str], verbose: int = 0) -> list[str]:
    """One list item per cause (text's grouping): the rule, the file or the count of files, the
    message, and the first files of a group (every file with -v)."""
    lines = []
    groups = cause_groups(outcome.findings)
    for group in groups[:FINDINGS_LISTED]:
        first = group[0]
        if len(group) == 1:
            where = markdown(shorten(first.path))
        elif all(f.path == first.path for f in group):  # one file, several places (text's grouping)
            places = ", ".join(markdown(place_in_file(f)) for f in group)
            where = f"{markdown(shorten(first.path))} ({len(group)} places: {places})"
        else:
            shown = group if verbose else group[:GROUP_PATHS_LISTED]
            more = "" if len(shown) == len(group) else f" and {len(group) - len(shown)} more"
            where = f"{len(group)} files ({', '.join(markdown(shorten(f.path)) for f in shown)}{more})"
        said = first.message if len(group) == 1 else cause_text(first)  # a group says its cause once
        message = markdown_message(PathView(outcome.roots).relative_text(said))
        lines.append(f"- **{first.severity.value}** {markdown(first.rule)} {where}: {message}")
    if len(groups) > FINDINGS_LISTED:
        lines.append(f"- ... and {len(groups) - FINDINGS_LISTED} more (the JSON report has them all)")
    if outcome.suppressed:
        by_source: dict[str, int] = {}
        for entry in outcome.suppressed:
            by_source[entry.get("source", "")] = by_source.get(entry.get("source", ""), 0) + 1
        parts = ", ".join(f"{n} by {markdown(source)}" for source, n in sorted(by_source.items()))
        lines.append(f"- {len(outcome.suppressed)} suppressed: {parts}")
    return lines


def prune_lines(sections: Sections, limit: int = 15) -> list[str]:
    """Device code per distribution: how much no kept target loads, and how much prune removes."""
    section = sections.get("prune")
    if not section or not section["weight"]:
        return []
    mib = 1 << 20
    rows = [
        [
            markdown(one["distribution"]),
            one["targets"],
            f"{one['bytes'] / mib:,.1f}",
            f"{one['compressed_bytes'] / mib:,.1f}",
            f"{one['unused_bytes'] / mib:,.1f}",
            f"{one['removable_bytes'] / mib:,.1f}",
        ]
        for one in weight_by_distribution(section["weight"])[:limit]
    ]
    kept = ", ".join(markdown(t) for t in section["targets"])
    return [
        f"Device code by distribution (MiB; kept targets: {kept}):",
        "",
        *_table(["distribution", "targets", "on disk", "compressed", "for no kept target", "removable"], rows),
    ]


def _rules_lines(sections: Sections) -> list[str]:
    rows = [
        [markdown(r["id"]), markdown(r["severity"]), markdown(r["title"]), markdown(r["severity_source"])]
        for r in sections.get("rules", [])
    ]
    return _table(["rule", "severity", "title", "severity from"], rows)


def context_lines(sections: Sections) -> list[str]:
    """What was audited, when the command says more than its inputs: an image, a scan's file kinds."""
    image = sections.get("image")
    if image is not None:
        source = image.get("source", {})
        audited = ", ".join(markdown(p) for p in image.get("audited_paths", []))
        shown = markdown(source.get("ref") or source.get("path"))
        return [f"Image {shown} ({markdown(image_layers_text(sections))}); audited {audited}"]
    kinds = sections.get("file_kinds")
    if kinds is not None:
        rows = [[markdown(KIND_WORDS.get(kind, kind)), f"{count:,}"] for kind, count in kinds.items()]
        return _table(["file kind", "files"], rows)
    return []


def render_markdown(outcome: CommandOutcome, verbose: int = 0) -> str:
    """The outcome as a Markdown job summary. ``verbose`` is the -v count (not used yet)."""
    shorten = relative_to_roots(outcome.roots)
    parts: list[list[str]] = [[f"### rocm-audit {markdown(outcome.command)}"]]
    if outcome.summary:
        parts[0] += ["", markdown(outcome.summary)]
    shown_roots = PathView(outcome.roots).roots  # numbered as the paths below show them: [1] lib/x.so
    if len(shown_roots) == 1:
        parts[0] += ["", "Paths relative to " + markdown(shown_roots[0])]
    elif shown_roots:
        numbered = ", ".join(f"[{n}] {markdown(root)}" for n, root in enumerate(shown_roots, 1))
        parts[0] += ["", "Paths relative to the audited directory holding them: " + numbered]
    context = context_lines(outcome.sections)
    if context:
        parts.append(context)
    if outcome.command == "rules":
        parts.append(_rules_lines(outcome.sections))
    else:
        parts.append(summary_lines(outcome))
    for section in (
        coverage_lines(outcome.sections, shorten),
        duplicate_lines(outcome.sections, shorten),
        prune_lines(outcome.sections),
    ):
        if section:
            parts.append(section)
    findings = finding_lines(outcome, shorten, verbose)
    if findings:
        parts.append(["Findings:", "", *findings])
    return "\n\n".join("\n".join(p) for p in parts) + "\n"
