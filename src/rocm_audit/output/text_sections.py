"""Text for each command's own report section: pure functions from the JSON sections to lines.

The sections are the same data the JSON report carries (schemas/report-v1.json), so the text and
the JSON never disagree. Every name, path and message goes through ``display`` (output/escape.py):
no line of text output can start with characters a file name chose.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from rocm_audit.llvm.counts import clash_counts
from rocm_audit.output.escape import display
from rocm_audit.output.layout import PathView, hold, plural, wrap
from rocm_audit.output.prune_text import fatbins_estimate_lines, prune_closing_lines, prune_lines, prune_revert_lines
from rocm_audit.report_types import (
    CarrierRecord,
    CodeObjectRecord,
    LlvmLibrary,
    LlvmOrder,
    LlvmProbe,
    Sections,
)
from rocm_audit.tree.targets import processor_sort_key
from rocm_audit.units import clip, size_text

Shorten = Callable[[str], str]
_NO_ROOTS = PathView(())


def relative_to_roots(roots: Sequence[str]) -> Shorten:
    """A function showing a path relative to the deepest of ``roots`` holding it (pure: strings only)."""
    return PathView(roots).relative


_LINK_MARK = {"planned": "would link", "replaced": "linked", "skipped": "SKIPPED", "failed": "FAILED"}


def dedup_lines(sections: Sections, view: PathView = _NO_ROOTS, verbose: int = 0) -> list[str]:
    section = sections["dedup"]
    lines = []
    for group in section["groups"]:
        lines.append(f"keep {view.path(group['keeper'])}  ({size_text(group['size'])}, {display(group['reason'])})")
        for planned in group["duplicates"]:
            was = "  (was a hardlink)" if planned["hardlink"] else ""
            lines.append(
                f"  {_LINK_MARK[planned['status']]:10} {view.path(planned['path'])} -> "
                f"{display(planned['link_text'])}{was}"
            )
    if section["mode"] == "dry-run" and section["shell_preview"]:
        if verbose:
            lines.append("# equivalent shell (rocm-audit also re-checks each pair just before changing it):")
            lines.extend(hold(display(line)) for line in section["shell_preview"])  # whole, to paste
        else:
            lines.append("(-v shows the equivalent shell commands)")
    if section["manifest"]:
        lines.append(f"revert manifest: {display(section['manifest'])}")
    if section["verified"] is False:
        lines.append("VERIFICATION FAILED: see the DUP006 findings below")
    return lines


def revert_lines(sections: Sections, view: PathView = _NO_ROOTS) -> list[str]:
    return [f"restored {view.path(path)}" for path in sections["revert"]["restored"]]


def _relative_to_package(path: str, package: str | None) -> str:
    if package:
        marker = os.sep + package + os.sep
        index = path.find(marker)
        if index >= 0:
            return path[index + len(marker) :]
    return path


def _carrier_line(carrier: CarrierRecord, view: PathView) -> str:
    status = "MISSING" if carrier["missing"] else "ok"
    tus = f", {carrier['tu_count']} TU" if carrier["tu_count"] else ""
    images = len(carrier.get("embedded_images", []))
    if images:  # the TU count includes them: the fat binary's TUs, then the images
        tu_count = carrier["tu_count"] or 0  # a count where images are (libraries, code-object files)
        fat = f"{tu_count - images} TU, " if tu_count > images else ""
        tus = f", {fat}{images} embedded image{'s' if images > 1 else ''}"
    members = f", {plural(len(carrier['members']), 'file')}" if carrier["members"] else ""
    how = "; ".join(f"{display(m['target'])} {display(m['how'] or 'missing')}" for m in carrier["matches"])
    containers = ", ".join(display(c) for c in carrier["containers"])
    inside = _relative_to_package(carrier["path"], carrier["package"])
    path = view.path(carrier["path"]) if inside == carrier["path"] else hold(display(inside))
    return f"  {status:<7} {path}  [{containers}{tus}{members}]  {how}"


def target_text(sections: Sections) -> str:
    """``gfx942, gfx950 (from $GPU_ARCH)``, or what to do when no target was given."""
    targets = ", ".join(
        display(t["target"]) + (f" (as {display(t['agent'])})" if t["target"] != t["agent"] else "")
        for t in sections.get("targets", [])
    )
    if not targets:
        return "no GPU targets given, so none verified (the CHK001 warning says how to name them)"
    source = sections.get("targets_source")
    return f"{targets} (from {display(source)})" if source else targets


def verify_arch_lines(sections: Sections, view: PathView = _NO_ROOTS, verbose: int = 0) -> list[str]:
    """Per package: how many carriers, how many miss a target; with ``verbose`` every carrier and
    how each target is served (the missing ones are findings either way)."""
    lines = [f"Targets: {target_text(sections)}"]
    carriers = sections["carriers"]
    if not carriers:
        lines.append("No device-code carriers found.")
    by_package: dict[str, list[CarrierRecord]] = {}
    for carrier in carriers:
        by_package.setdefault(_carrier_owner(carrier), []).append(carrier)
    for package in sorted(by_package):
        group = by_package[package]
        bad = sum(1 for c in group if c["missing"])
        if verbose:
            lines.append("")
        lines.append(f"{display(package)}: {plural(len(group), 'carrier')}, {bad} missing a target")
        if verbose:
            lines.extend(_carrier_line(carrier, view) for carrier in group)
    return lines


def _carrier_owner(carrier: CarrierRecord) -> str:
    """What a carrier is counted under: its SDK tree, else the distribution that shipped it."""
    shipped = carrier.get("shipped_by")
    if carrier["package"]:
        return carrier["package"]
    return f"{shipped['name']} {shipped['version']}" if shipped else "(files no distribution owns)"


def code_object_lines(sections: Sections, view: PathView = _NO_ROOTS, verbose: int = 0) -> list[str]:
    """One line per file (its containers, translation units, GPU code objects and their targets:
    a bundle's host entry is no code object); with ``verbose`` a line per entry, host ones too."""
    lines: list[str] = []
    by_path: dict[str, list[CodeObjectRecord]] = {}
    for code_object in sections["code_objects"]:
        by_path.setdefault(code_object["path"], []).append(code_object)
    for info in sections["code_object_files"]:
        tus = f", {info['tu_count']} TU" if info["tu_count"] else ""
        containers = ", ".join(display(c) for c in info["containers"])
        objects = by_path.get(info["path"], [])
        device = [o for o in objects if o["kind"] != "host"]
        targets = sorted({display(o["target"]) for o in device if o["target"]}, key=processor_sort_key)
        shown = " ".join(targets)
        lines.append(
            f"{view.path(info['path'])}  [{containers}{tus}]  {plural(len(device), 'code object')}"
            + (f" for {plural(len(targets), 'target')}: {shown}" if targets else "")
        )
        if not verbose:
            continue
        lines.extend(_code_object_rows(objects))
    if not lines:
        lines.append("No GPU code objects found.")
    else:
        lines.append(
            f"{plural(len(sections['code_object_files']), 'file')}, "
            f"{plural(sum(o['kind'] != 'host' for o in sections['code_objects']), 'GPU code object')}"
        )
    return lines


def _code_object_rows(objects: list[CodeObjectRecord]) -> list[str]:
    """A row per entry of one file: where, kind, target, code object version, the entry's ID;
    columns as wide as this file's widest value, so the ID stays on its row."""
    rows = [
        (
            display(o["location"]),
            display(o["kind"]),
            display(o["target"] or "-"),
            f"cov{o['code_object_version']}" if o["code_object_version"] else "",
            display(o["entry_id"] or o["target"] or "?"),
        )
        for o in objects
    ]
    widths = [max((len(row[column]) for row in rows), default=0) for column in range(4)]
    return [
        "    " + "  ".join(value.ljust(width) for value, width in zip(row[:4], widths, strict=True)) + "  " + row[4]
        for row in rows
    ]


# What each file kind is called in the text and Markdown reports (JSON keeps the kinds' names).
KIND_WORDS = {
    "shared-library": "shared libraries",
    "executable": "executables",
    "amdgpu-code-object": "stand-alone GPU code objects (.hsaco, .co)",
    "other-elf": "other ELF files (objects, core files, malformed)",
    "not-elf": "other files",
}


def file_kind_lines(sections: Sections) -> list[str]:
    """Files by kind; GPU code inside libraries is not a kind of its own: --targets lists it."""
    lines = [f"{KIND_WORDS.get(kind, display(kind))}: {count:,}" for kind, count in sections["file_kinds"].items()]
    lines.append("(GPU code inside libraries: scan --targets lists every code object)")
    lines += [f"SDK tree: {display(tree)}" for tree in sections["sdk_trees"]]
    return lines


def _probe_text(probe: LlvmProbe) -> str:
    contradicts = " (contradicts)" if probe.get("agrees") is False else ""
    seen = probe.get("verdict") or probe["outcome"]
    return f"{display(probe['mode'])} {display(seen)}{contradicts}"


def _order_lines(orders: Sequence[LlvmOrder], view: PathView) -> list[str]:
    """One line per ordered pair: the verdict of each mode (both orders are judged)."""
    lines = []
    for order in orders:
        verdicts = ", ".join(f"{display(mode)} {display(p['verdict'])}" for mode, p in order["modes"].items())
        lines.append(f"    {view.path(order['first'])} then {view.path(order['second'])}: {verdicts}")
    return lines


def _interpreter_lines(sections: Sections) -> list[str]:
    """Which interpreter ran the load probes, and why (when there were probes)."""
    used = sections.get("probe_interpreter")
    if used is None:
        return []
    where = f"{display(used['executable'])} (Python {display(used['version'])}): {display(used['reason'])}"
    ran = any(c["probes"] for c in sections.get("clashes", [])) or any(p["probes"] for p in sections.get("pairs", []))
    if not ran:
        return [f"No probe was needed: nothing to confirm. Probes would run under {where}"]
    return [f"Probes ran under {where}"]


def _role_counts(libraries: Sequence[LlvmLibrary]) -> dict[str, int]:
    count: dict[str, int] = {}
    for library in libraries:
        count[library["role"]] = count.get(library["role"], 0) + 1
    return count


def llvm_summary(sections: Sections) -> str:
    """``LLVM: 11 libraries carry LLVM (...); 1 clash aborts or crashes, 1 is harmless``."""
    count = _role_counts(sections["libraries"])
    carrying = _carrying(count)
    kinds = [
        f"{count[role]} {verbs[0] if count[role] == 1 else verbs[1]}"
        for role, verbs in (
            ("exporter", ("exports its option registry", "export its option registry")),
            ("registrant", ("registers options", "register options")),
            ("private-copy", ("keeps it private", "keep it private")),
        )
        if count.get(role)
    ]
    harmful, harmless = clash_counts(sections["clashes"])
    clash_text = f"{plural(harmful, 'clash', 'clashes')} that can abort or crash a process"
    if harmless:
        clash_text += f", {harmless} harmless"
    unreadable = f", {count['unknown']} unreadable" if count.get("unknown") else ""
    return (
        f"LLVM: {plural(carrying, 'library', 'libraries')} carry LLVM"
        + (f" ({', '.join(kinds)})" if kinds else "")
        + f"{unreadable}; {clash_text}"
    )


def _closure_lines(sections: Sections) -> list[str]:
    """What each --closure root maps, in load order (asked for by name: shown without -v too)."""
    lines: list[str] = []
    for closure in sections.get("closures", []):
        lines.append(f"Closure of {display(closure['root'])}: {len(closure['objects'])} object(s)")
        for loaded in closure["objects"]:
            role = loaded.get("role")
            tag = f" [{display(role)}]" if role and role != "none" else ""
            lines.append(
                f"  {'  ' * loaded['depth']}{display(loaded['path'])}  "
                f"({display(loaded['via'])}: {display(loaded['request'])}){tag}"
            )
        lines.extend(
            f"  missing: {display(m['name'])} (needed by {display(m['needed_by'])}): {display(m['detail'])}"
            for m in closure["missing"]
        )
    return lines


def llvm_lines(sections: Sections, view: PathView = _NO_ROOTS, verbose: int = 0) -> list[str]:
    """The summary line; with ``verbose`` every LLVM library, clash, judged pair and closure."""
    if not verbose:
        return [llvm_summary(sections), *_interpreter_lines(sections), *_closure_lines(sections)]
    libraries = sections["libraries"]
    count: dict[str, int] = {}
    for library in libraries:
        count[library["role"]] = count.get(library["role"], 0) + 1
    unreadable = count.get("unknown", 0)
    lines = [
        f"LLVM libraries: {count.get('exporter', 0)} exporter(s), {count.get('registrant', 0)} registrant(s), "
        f"{count.get('private-copy', 0)} private copy(ies), {count.get('none', 0)} other"
        + (f", {unreadable} unreadable" if unreadable else "")
    ]
    for library in libraries:
        if library["role"] == "none":
            continue
        details = ", ".join(display(x) for x in (library["soname"], library["version_node"]) if x)
        scope = "" if library["in_scan"] else " [reached by a closure]"
        lines.append(
            f"  {display(library['role']):<13}{view.path(library['path'])}"
            + (f"  ({details})" if details else "")
            + scope
        )
    clashes = sections["clashes"]
    lines.extend(_interpreter_lines(sections))
    if clashes:
        lines.append(f"Clashes: {len(clashes)}")
    for clash in clashes:
        if clash["confirmed"] is True:
            option = f" (option {display(repr(clash['option']))})" if clash["option"] else ""
            status = f"CONFIRMED{option}"
        else:
            status = "not reproduced" if clash["confirmed"] is False else "not probed"
            if clash["confirmed"] is None and clash["probes"]:
                status = "probes inconclusive"  # they ran, but none could decide (load errors)
        lines.append(
            f"  {display(clash['severity']).upper()} {display(clash['reason'])}, "
            f"fires: {display(clash['mode'])}, {status}"
        )
        lines.extend(f"      {view.path(path)}" for path in clash["paths"])
        if clash["via"]:
            shown = clash["via"][:3]
            hidden = clash["via_count"] - len(shown)
            lines.append(f"    via: {', '.join(display(v) for v in shown)}" + (f" (+{hidden} more)" if hidden else ""))
        prediction = ", ".join(f"{display(mode)} {display(expect)}" for mode, expect in clash["predictions"].items())
        lines.append(f"    predicted: {prediction}")
        if "orders" in clash:
            lines.append(f"    verdict: {display(clash['verdict'])} (decided by {display(clash['decided_by'])})")
            lines.extend(_order_lines(clash["orders"], view))
        if clash["probes"]:
            lines.append("    probed:    " + ", ".join(_probe_text(p) for p in clash["probes"]))
        lines.append(f"    fix: {display(clash['fix'])}")
    pairs = sections.get("pairs", [])
    if "judged_pairs" in sections:
        lines.append(
            f"Pairs judged in both orders and three modes: {sections['judged_pairs']}; "
            f"{len(pairs)} more pair(s) that no clash names fail together"
        )
    for pair in pairs:
        through = pair["arrives_through"]
        lines.append(
            f"  {display(pair['verdict']).upper()} (decided by {display(pair['decided_by'])})"
            + (f", arrives through {', '.join(view.path(t) for t in through)}" if through else "")
        )
        lines.extend(f"      {view.path(path)}" for path in pair["paths"])
        lines.extend(_order_lines(pair["orders"], view))
    lines.extend(_closure_lines(sections))
    return lines


def check_lines(sections: Sections) -> list[str]:
    """One line per check: what it looked at and what it concluded."""
    lines = []
    dedup = sections.get("dedup")
    if dedup is not None:
        lines.append(
            f"dedup: {plural(len(dedup['groups']), 'group')} of identical SDK libraries"
            + (f", {size_text(dedup['bytes_freed'])} to free (rocm-audit dedup)" if dedup["groups"] else "")
        )
    if "carriers" in sections:
        carriers = sections["carriers"]
        missing = [c for c in carriers if c.get("missing")]
        if sections.get("targets"):
            lines.append(
                f"verify-arch: {plural(len(carriers), 'file')} with GPU code, {len(missing)} missing a target; "
                f"targets {target_text(sections)}"
            )
        else:
            lines.append(f"verify-arch: {plural(len(carriers), 'file')} with GPU code; {target_text(sections)}")
    if "prune" in sections and not sections["prune"]["totals"]["device_bytes"]:
        lines.append("prune: no device code")
    elif "prune" in sections:
        totals = sections["prune"]["totals"]
        lines.append(
            f"prune: {size_text(totals['unused_bytes'])} of {size_text(totals['device_bytes'])} device code is for "
            f"no kept target; {size_text(totals['removable_bytes'])} removable by rocm-audit prune"
        )
        lines.extend(fatbins_estimate_lines(sections["prune"]))
    if "clashes" in sections:
        lines.append(llvm_summary(sections).replace("LLVM: ", "llvm: ", 1))
        lines.extend(_interpreter_lines(sections))
    if _no_rocm_content(sections):  # all zeros can mean the wrong environment was audited: say it in words
        lines.append("no ROCm content here: no _rocm_sdk_* tree, no GPU code, no library that carries LLVM")
    return lines


def _no_rocm_content(sections: Sections) -> bool:
    """Every check ran and found nothing of ROCm to judge (a check left out says nothing)."""
    if not {"dedup", "carriers", "libraries"} <= sections.keys() or sections.get("sdk_trees"):
        return False
    return not sections["carriers"] and not _carrying(_role_counts(sections["libraries"]))


def _carrying(count: dict[str, int]) -> int:
    """How many libraries carry LLVM, from the count of each role (neither none nor unreadable)."""
    return sum(n for role, n in count.items() if role not in ("none", "unknown"))


WASTE_GROUPS_SHOWN = 3  # an image's layer-waste groups listed without -v (SDK trees first)


def image_layers_text(sections: Sections) -> str:
    """How the image was read: ``docker-save, 6 layers``, or flattened by the daemon's export,
    which has no layers to count (text and Markdown say it alike)."""
    section = sections.get("image", {})
    source = section.get("source", {})
    form = str(source.get("format", source.get("kind")))
    if form == "container export":
        return "flattened: the daemon's container export; --layers reads each layer"
    return f"{display(form)}, {plural(len(section.get('layers', [])), 'layer')}"


def image_lines(sections: Sections, view: PathView = _NO_ROOTS, verbose: int = 0) -> list[str]:
    section = sections.get("image", {})
    source = section.get("source", {})
    audited = ", ".join(display(p) for p in section.get("audited_paths", []))
    lines = [
        f"image: {display(source.get('ref') or source.get('path'))} ({image_layers_text(sections)}); audited {audited}"
    ]
    waste = section.get("waste")
    if waste is not None:
        one_layer = len(section.get("layers", [])) == 1  # every copy is in layer 0: no need to say it
        split = (
            ""
            if one_layer
            else f" ({size_text(waste['same_layer_bytes'])} within single layers, "
            f"{size_text(waste['cross_layer_bytes'])} across layers)"
        )
        again = waste.get("stored_again_bytes", 0)
        again_text = f"; {size_text(again)} in paths a layer stores more than once (IMG011)" if again else ""
        lines.append(
            f"image: {size_text(waste['wasted_bytes'])} in identical copies{split}{again_text}; "
            "a later RUN frees none of it"
        )
        shown = waste["groups"] if verbose else waste["groups"][:WASTE_GROUPS_SHOWN]
        for group in shown:
            copies = "; ".join(
                view.path(c["path"])
                + ("" if one_layer else f" (layer {c['layer']}{'' if c['visible'] else ', hidden'})")
                for c in group["copies"]
            )
            said = f"{len(group['copies'])} copies of {size_text(group['size'])}"  # the size of one copy
            lines.append(f"  {said} [{display(group['scope'])}]: {copies}")
        if len(waste["groups"]) > len(shown):
            more = len(waste["groups"]) - len(shown)
            lines.append(f"  ... and {plural(more, 'more group')} (-v lists them)")
    steps = {layer["index"]: layer["step"] for layer in section.get("layers", []) if layer.get("step")}
    for row in section.get("prune_layers", []):
        step = f" ({display(clip(steps[row['layer']], 48))})" if row["layer"] in steps else ""
        lines.append(
            f"image: layer {row['layer']}{step} holds {size_text(row['device_bytes'])} of device code"
            + (
                f" ({size_text(row['hidden_device_bytes'])} in files a later layer hid)"
                if row.get("hidden_device_bytes")
                else ""
            )
            + f", {size_text(row['unused_bytes'])} for no kept target; in the RUN that wrote it, prune removes "
            + size_text(row["removable_bytes"])
            + (
                f" and prune --fatbins about {size_text(row['fatbins_estimate_bytes'])}"
                if row["fatbins_estimate_bytes"]
                else ""
            )
        )
    return lines + check_lines(sections)


def rules_lines(sections: Sections) -> list[str]:
    """The rules table, a long title continued under the title column; policy and ignores."""
    source_width = max([len("source"), *(len(display(r["severity_source"])) for r in sections["rules"])])
    source_width = min(source_width, 34)
    title_column = " " * (8 + 1 + 8 + 1 + source_width + 1)
    lines = [f"{'rule':8} {'severity':8} {'source':{source_width}} title"]
    for rule in sections["rules"]:
        severity = display(rule["severity"]) + ("*" if rule.get("graded") else "")
        row = (
            f"{display(rule['id']):8} {severity:8} "
            f"{display(rule['severity_source']):{source_width}} {display(rule['title'])}"
        )
        lines += wrap(row, indent="", rest=title_column)
    if any(rule.get("graded") for rule in sections["rules"]):
        lines.append("*: the default; a finding's verdict may set another (rocm-audit explain RULE says when)")
    lines.append("what a rule means, why it matters and how to fix it: rocm-audit explain RULE")
    lines.append("")
    lines.append("policy:")
    for setting in sections["policy"]:
        lines.append(
            f"  {display(setting['area'])}.{display(setting['key'])} = {display(repr(setting['value']))}  "
            f"({display(setting['source'])})"
        )
    if sections["ignores"]:
        lines.append("ignored:")
        for ignore in sections["ignores"]:
            lines.append(
                f"  {display(ignore['rule'])} {display(ignore['path'])}: {display(ignore['reason'])}  "
                f"({display(ignore['source'])})"
            )
    return lines


def section_lines(command: str, sections: Sections, view: PathView = _NO_ROOTS, verbose: int = 0) -> list[str]:
    """The lines of a command's own section; which renderer is chosen by the command and what it reported."""
    if command == "dedup":
        if "revert" in sections:
            return revert_lines(sections, view)
        return dedup_lines(sections, view, verbose) if "dedup" in sections else []
    if command == "verify-arch":
        return verify_arch_lines(sections, view, verbose) if "carriers" in sections else []
    if command == "scan":
        if "code_object_files" in sections:
            return code_object_lines(sections, view, verbose)
        return file_kind_lines(sections) if "file_kinds" in sections else []
    if command == "llvm":
        return llvm_lines(sections, view, verbose) if "libraries" in sections else []
    if command == "prune":
        if "prune_revert" in sections:
            return prune_revert_lines(sections, view, verbose)
        return prune_lines(sections, view, verbose=verbose) if "prune" in sections else []
    if command == "check":
        return check_lines(sections)
    if command == "image":
        return image_lines(sections, view, verbose) if "image" in sections else []
    if command == "rules":
        return rules_lines(sections)
    return []


def closing_lines(command: str, sections: Sections) -> list[str]:
    """Lines a command ends its text with, after the findings and before the count: what an
    applying prune did and how to undo it."""
    if command == "prune" and ("prune" in sections or "prune_revert" in sections):
        return prune_closing_lines(sections)
    return []
