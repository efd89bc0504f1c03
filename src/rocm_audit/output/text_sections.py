"""Text for each command's own report section: pure functions from the JSON sections to lines.

The sections are the same data the JSON report carries (schemas/report-v1.json), so the text and
the JSON never disagree. Every name, path and message goes through ``display`` (output/escape.py):
no line of text output can start with characters a file name chose.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rocm_audit.output.escape import display

Sections = Mapping[str, Any]
Shorten = Callable[[str], str]


def _same(path: str) -> str:
    return path


def relative_to_roots(roots: Sequence[str]) -> Shorten:
    """A function showing a path relative to the deepest of ``roots`` holding it (pure: strings only)."""
    prefixes = sorted((r.rstrip("/") for r in roots if r and r != "/"), key=len, reverse=True)
    if not prefixes:
        return _same

    def shorten(path: str) -> str:
        for prefix in prefixes:
            if path.startswith(prefix + "/"):
                return path[len(prefix) + 1 :]
        return path

    return shorten


_LINK_MARK = {"planned": "would link", "replaced": "linked", "skipped": "SKIPPED", "failed": "FAILED"}


def dedup_lines(sections: Sections, shorten: Shorten = _same) -> list[str]:
    section = sections["dedup"]
    lines = []
    for group in section["groups"]:
        lines.append(f"keep {display(shorten(group['keeper']))}  ({group['size']:,} bytes, {display(group['reason'])})")
        for planned in group["duplicates"]:
            was = "  (was a hardlink)" if planned["hardlink"] else ""
            lines.append(
                f"  {_LINK_MARK[planned['status']]:10} {display(shorten(planned['path']))} -> "
                f"{display(planned['link_text'])}{was}"
            )
    if section["mode"] == "dry-run" and section["shell_preview"]:
        lines.append("# equivalent shell (rocm-audit also re-checks each pair just before changing it):")
        lines.extend(display(line) for line in section["shell_preview"])
    if section["manifest"]:
        lines.append(f"revert manifest: {display(section['manifest'])}")
    if section["verified"] is False:
        lines.append("VERIFICATION FAILED: see the DUP006 findings below")
    return lines


def revert_lines(sections: Sections) -> list[str]:
    return [f"restored {display(path)}" for path in sections["revert"]["restored"]]


def _relative_to_package(path: str, package: str | None) -> str:
    if package:
        marker = os.sep + package + os.sep
        index = path.find(marker)
        if index >= 0:
            return path[index + len(marker) :]
    return path


def verify_arch_lines(sections: Sections, shorten: Shorten = _same) -> list[str]:
    targets = ", ".join(
        display(t["target"]) + (f" (as {display(t['agent'])})" if t["target"] != t["agent"] else "")
        for t in sections["targets"]
    )
    lines = [f"Targets: {targets}  [from {display(sections['targets_source'])}]"]
    carriers = sections["carriers"]
    if not carriers:
        lines.append("No device-code carriers found.")
    by_package: dict[str, list[Mapping[str, Any]]] = {}
    for carrier in carriers:
        by_package.setdefault(carrier["package"] or "(outside SDK packages)", []).append(carrier)
    for package in sorted(by_package):
        group = by_package[package]
        bad = sum(1 for c in group if c["missing"])
        lines.append("")
        lines.append(f"{display(package)}: {len(group)} carrier(s), {bad} missing a target")
        for carrier in group:
            status = "MISSING" if carrier["missing"] else "ok"
            tus = f", {carrier['tu_count']} TU" if carrier["tu_count"] else ""
            images = len(carrier.get("embedded_images", []))
            if images:  # the TU count includes them: the fat binary's TUs, then the images
                fat = f"{carrier['tu_count'] - images} TU, " if carrier["tu_count"] > images else ""
                tus = f", {fat}{images} embedded image{'s' if images > 1 else ''}"
            members = f", {len(carrier['members'])} file(s)" if carrier["members"] else ""
            how = "; ".join(f"{display(m['target'])} {display(m['how'] or 'missing')}" for m in carrier["matches"])
            containers = ", ".join(display(c) for c in carrier["containers"])
            inside = _relative_to_package(carrier["path"], carrier["package"])
            path = display(inside if inside != carrier["path"] else shorten(inside))
            lines.append(f"  {status:<7} {path}  [{containers}{tus}{members}]  {how}")
    return lines


def code_object_lines(sections: Sections, shorten: Shorten = _same) -> list[str]:
    lines: list[str] = []
    by_path: dict[str, list[Mapping[str, Any]]] = {}
    for code_object in sections["code_objects"]:
        by_path.setdefault(code_object["path"], []).append(code_object)
    for info in sections["code_object_files"]:
        tus = f", {info['tu_count']} TU" if info["tu_count"] else ""
        containers = ", ".join(display(c) for c in info["containers"])
        lines.append(f"{display(shorten(info['path']))}  [{containers}{tus}]")
        for code_object in by_path.get(info["path"], []):
            version = code_object["code_object_version"]
            cov = f"cov{version}" if version else ""
            ident = display(code_object["entry_id"] or code_object["target"] or "?")
            target = display(code_object["target"] or "-")
            lines.append(
                f"    {display(code_object['location']):<36} {display(code_object['kind']):<6} "
                f"{target:<28} {cov:<5} {ident}"
            )
    if not lines:
        lines.append("No GPU code objects found.")
    return lines


def file_kind_lines(sections: Sections) -> list[str]:
    lines = [f"{display(kind)}: {count}" for kind, count in sections["file_kinds"].items()]
    lines += [f"SDK tree: {display(tree)}" for tree in sections["sdk_trees"]]
    return lines


def _probe_text(probe: Mapping[str, Any]) -> str:
    contradicts = " (contradicts)" if probe.get("agrees") is False else ""
    seen = probe.get("verdict") or probe["outcome"]
    return f"{display(probe['mode'])} {display(seen)}{contradicts}"


def _order_lines(orders: Sequence[Mapping[str, Any]], shorten: Shorten) -> list[str]:
    """One line per ordered pair: the verdict of each mode (issue 16: both orders are judged)."""
    lines = []
    for order in orders:
        verdicts = ", ".join(f"{display(mode)} {display(p['verdict'])}" for mode, p in order["modes"].items())
        lines.append(f"    {display(shorten(order['first']))} then {display(shorten(order['second']))}: {verdicts}")
    return lines


def llvm_lines(sections: Sections, shorten: Shorten = _same) -> list[str]:
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
            f"  {display(library['role']):<13}{display(shorten(library['path']))}"
            + (f"  ({details})" if details else "")
            + scope
        )
    clashes = sections["clashes"]
    if clashes:
        lines.append(f"Clashes: {len(clashes)}")
    for clash in clashes:
        if clash["confirmed"] is True:
            option = f" (option {display(repr(clash['option']))})" if clash["option"] else ""
            status = f"CONFIRMED{option}"
        else:
            status = {False: "not reproduced", None: "not probed"}[clash["confirmed"]]
        lines.append(
            f"  {display(clash['severity']).upper()} {display(clash['reason'])}, "
            f"fires: {display(clash['mode'])}, {status}"
        )
        lines.extend(f"      {display(shorten(path))}" for path in clash["paths"])
        if clash["via"]:
            shown = clash["via"][:3]
            hidden = clash["via_count"] - len(shown)
            lines.append(f"    via: {', '.join(display(v) for v in shown)}" + (f" (+{hidden} more)" if hidden else ""))
        prediction = ", ".join(f"{display(mode)} {display(expect)}" for mode, expect in clash["predictions"].items())
        lines.append(f"    predicted: {prediction}")
        if "orders" in clash:
            lines.append(f"    verdict: {display(clash['verdict'])} (decided by {display(clash['decided_by'])})")
            lines.extend(_order_lines(clash["orders"], shorten))
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
            + (f", arrives through {', '.join(display(shorten(t)) for t in through)}" if through else "")
        )
        lines.extend(f"      {display(shorten(path))}" for path in pair["paths"])
        lines.extend(_order_lines(pair["orders"], shorten))
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


def check_lines(sections: Sections) -> list[str]:
    lines = []
    dedup = sections.get("dedup")
    if dedup is not None:
        lines.append(
            f"dedup: {len(dedup['groups'])} group(s) of identical SDK libraries"
            + (f", {dedup['bytes_freed']:,} bytes to free" if dedup["groups"] else "")
        )
    if "carriers" in sections:
        carriers = sections["carriers"]
        missing = [c for c in carriers if c.get("missing")]
        targets = ", ".join(display(t["target"]) for t in sections.get("targets", [])) or "unknown"
        source = f"  [from {display(sections['targets_source'])}]" if sections.get("targets_source") else ""
        lines.append(f"verify-arch: {len(carriers)} carrier(s), {len(missing)} missing a target of {targets}{source}")
    if "prune" in sections:
        totals = sections["prune"]["totals"]
        lines.append(
            f"prune: {totals['unused_bytes']:,} of {totals['device_bytes']:,} device-code bytes for no kept target, "
            f"{totals['removable_bytes']:,} removable by rocm-audit prune"
        )
    if "clashes" in sections:
        with_roles = [lib for lib in sections["libraries"] if lib.get("role") not in ("none", None)]
        lines.append(
            f"llvm: {len(with_roles)} LLVM exporter(s)/registrant(s)/private copies, "
            f"{len(sections['clashes'])} clash(es)"
        )
    return lines


def image_lines(sections: Sections, shorten: Shorten = _same) -> list[str]:
    section = sections.get("image", {})
    source = section.get("source", {})
    audited = ", ".join(display(p) for p in section.get("audited_paths", []))
    lines = [
        f"image: {display(source.get('ref') or source.get('path'))} "
        f"({display(source.get('format', source.get('kind')))}), {len(section.get('layers', []))} layer(s); "
        f"audited {audited}"
    ]
    waste = section.get("waste")
    if waste is not None:
        lines.append(
            f"image: {waste['wasted_bytes']:,} bytes in identical copies "
            f"({waste['same_layer_bytes']:,} within single layers, "
            f"{waste['cross_layer_bytes']:,} across layers); a later RUN frees none of it"
        )
        for group in waste["groups"][:10]:
            copies = "; ".join(
                f"{display(shorten(c['path']))} (layer {c['layer']}{'' if c['visible'] else ', hidden'})"
                for c in group["copies"]
            )
            lines.append(f"  {group['size']:,} bytes x{len(group['copies'])} [{display(group['scope'])}]: {copies}")
    for row in section.get("prune_layers", []):
        lines.append(
            f"image: layer {row['layer']} holds {row['device_bytes']:,} bytes of device code, "
            f"{row['unused_bytes']:,} for no kept target, {row['removable_bytes']:,} removable by prune "
            "in the RUN that wrote it"
        )
    return lines + check_lines(sections)


def _mib(count: int) -> str:
    return f"{count / (1 << 20):,.1f}"


def weight_by_distribution(rows: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The prune weight rows summed per distribution, largest first (pure; text and markdown)."""
    sums: dict[str, dict[str, Any]] = {}
    for row in rows:
        one = sums.setdefault(
            row["distribution"],
            {
                "distribution": row["distribution"],
                "bytes": 0,
                "compressed_bytes": 0,
                "unused_bytes": 0,
                "removable_bytes": 0,
                "targets": 0,
            },
        )
        for key in ("bytes", "compressed_bytes", "unused_bytes", "removable_bytes"):
            one[key] += row[key]
        one["targets"] += 1
    return sorted(sums.values(), key=lambda d: (-d["bytes"], d["distribution"]))


_REMOVAL_MARK = {"planned": "would remove", "removed": "removed", "skipped": "SKIPPED", "failed": "FAILED"}


def prune_lines(sections: Sections, shorten: Shorten = _same, *, limit: int = 40) -> list[str]:
    section = sections["prune"]
    totals = section["totals"]
    lines = [
        f"Keep: {', '.join(display(t) for t in section['targets'])}  [from {display(section['targets_source'])}]",
        f"device code {_mib(totals['device_bytes'])} MiB on disk ({_mib(totals['compressed_bytes'])} MiB in compressed"
        f" bundles, {_mib(totals['inflated_bytes'])} MiB inflated); for no kept target: "
        f"{_mib(totals['unused_bytes'])} MiB, removable: {_mib(totals['removable_bytes'])} MiB",
        "",
        f"{'distribution':40} {'targets':>7} {'MiB':>10} {'compressed':>10} {'unused':>10} {'removable':>10}",
    ]
    for one in weight_by_distribution(section["weight"]):
        lines.append(
            f"{display(one['distribution']):40} {one['targets']:>7} {_mib(one['bytes']):>10} "
            f"{_mib(one['compressed_bytes']):>10} {_mib(one['unused_bytes']):>10} {_mib(one['removable_bytes']):>10}"
        )
    lines += [
        "",
        f"{'distribution':40} {'target':24} {'MiB':>10} {'compressed':>10} {'kept':>4} {'removable':>10}",
    ]
    rows = section["weight"]
    for row in rows[:limit]:
        lines.append(
            f"{display(row['distribution']):40} {display(row['target']):24} {_mib(row['bytes']):>10} "
            f"{_mib(row['compressed_bytes']):>10} {'yes' if row['needed'] else 'no':>4} "
            f"{_mib(row['removable_bytes']):>10}"
        )
    if len(rows) > limit:
        lines.append(f"... {len(rows) - limit} more row(s) in the JSON report")
    if section["removals"]:
        lines.append("")
    for removal in section["removals"]:
        what = (
            display(removal["distribution"]) + " (pip uninstall)"
            if removal["distribution"]
            else display(removal["path"])
        )
        devel = f", {len(removal['devel_links'])} devel link(s)" if removal["devel_links"] else ""
        why = f": {display(removal['reason'])}" if removal["reason"] else ""
        lines.append(
            f"{_REMOVAL_MARK[removal['status']]:12} {what}  [{display(removal['kind'])}, "
            f"{', '.join(display(a) for a in removal['arches'])}, {_mib(removal['bytes'])} MiB{devel}]{why}"
        )
    for kept in section["kept_units"]:
        lines.append(f"{'kept':12} {display(shorten(kept['path']))}: {display(kept['reason'])}")
    if section["mode"] == "dry-run" and section["shell_preview"]:
        lines.append("# equivalent shell (rocm-audit also journals and re-checks each file just before removing it):")
        lines.extend(display(line) for line in section["shell_preview"])
    if section["manifest"]:
        lines.append(f"revert manifest: {display(section['manifest'])}")
    return lines


def prune_revert_lines(sections: Sections) -> list[str]:
    section = sections["prune_revert"]
    lines = [f"restored {display(path)}" for path in section["restored"]]
    lines.extend(f"to restore, run: {display(line)}" for line in section["reinstall"])
    return lines


def rules_lines(sections: Sections) -> list[str]:
    lines = [f"{'rule':8} {'severity':8} {'source':34} title"]
    for rule in sections["rules"]:
        lines.append(
            f"{display(rule['id']):8} {display(rule['severity']):8} {display(rule['severity_source']):34} "
            f"{display(rule['title'])}"
        )
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


def section_lines(command: str, sections: Sections, shorten: Shorten = _same) -> list[str]:
    """The lines of a command's own section; which renderer is chosen by the command and what it reported."""
    if command == "dedup":
        if "revert" in sections:
            return revert_lines(sections)
        return dedup_lines(sections, shorten) if "dedup" in sections else []
    if command == "verify-arch":
        return verify_arch_lines(sections, shorten) if "carriers" in sections else []
    if command == "scan":
        if "code_object_files" in sections:
            return code_object_lines(sections, shorten)
        return file_kind_lines(sections) if "file_kinds" in sections else []
    if command == "llvm":
        return llvm_lines(sections, shorten) if "libraries" in sections else []
    if command == "prune":
        if "prune_revert" in sections:
            return prune_revert_lines(sections)
        return prune_lines(sections, shorten) if "prune" in sections else []
    if command == "check":
        return check_lines(sections)
    if command == "image":
        return image_lines(sections, shorten) if "image" in sections else []
    if command == "rules":
        return rules_lines(sections)
    return []
