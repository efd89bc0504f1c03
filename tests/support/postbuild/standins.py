"""Stand-in libraries for the libraries a vendor tree needs but does not ship (the ROCm runtime of
a plugin wheel), generated from what its consumers import so that real loads reach symbol
resolution: every undefined symbol a consumer asks of a missing SONAME (its name, type and
version node, read through the ELF view), assembled by gcc with a version script."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from rocm_audit.elf.view import VERSYM_HIDDEN, open_view
from rocm_audit.errors import FormatError

STT_OBJECT, STT_TLS = 1, 6
STB_GLOBAL = 1


@dataclass(slots=True)
class StandIn:
    soname: str
    # name -> (type, version node or None)
    symbols: dict[str, tuple[int, str | None]] = field(default_factory=dict)


def undefined_symbols(path: str) -> list[tuple[str, int, str | None, str | None]]:
    """(name, type, version, version's library) of the undefined non-weak symbols of path."""
    fd, view = open_view(path, follow_symlinks=True)
    try:
        table = view.symbol_table()
        if table is None:
            return []
        strings = view.read(view.linked(table))
        versions = view.symbol_versions()
        needed = {other: (need.file, name) for need in view.version_needs for other, name in need.versions}
        found = []
        for base, rows in view.symbol_rows(table):
            for index, (st_name, info, _other, shndx, _value) in enumerate(rows, base):
                if shndx != 0 or index == 0 or info >> 4 != STB_GLOBAL:
                    continue
                name = strings[st_name : strings.index(b"\0", st_name)].decode()
                raw = versions[index] & ~VERSYM_HIDDEN if index < len(versions) else 0
                file, version = needed.get(raw, (None, None)) if raw >= 2 else (None, None)
                found.append((name, info & 0xF, version, file))
        return found
    except FormatError:
        return []
    finally:
        os.close(fd)


def plan_standins(consumers: Iterable[tuple[str, list[str], set[str]]]) -> dict[str, StandIn]:
    """Stand-ins for the missing SONAMEs. ``consumers``: (path, its missing DT_NEEDED names in
    order, the names its present scope already defines). A versioned symbol goes to the library
    its version node names; an unversioned one nothing present defines, to its first missing one."""
    plans: dict[str, StandIn] = {}
    for path, missing, defined in consumers:
        for soname in missing:
            plans.setdefault(soname, StandIn(soname))
        for name, kind, version, file in undefined_symbols(path):
            if file is not None and file in missing:
                target = file
            elif file is None and name not in defined:
                target = missing[0]
            else:
                continue
            plans.setdefault(target, StandIn(target)).symbols.setdefault(name, (kind, version if file else None))
    return plans


def build_standin(directory: Path, plan: StandIn, drop: Iterable[str] = ()) -> Path:
    """Assemble the stand-in (functions, data, TLS as consumers use them), minus ``drop``; one
    that nothing asks a symbol of is an empty library of that SONAME."""
    dropped = set(drop)
    lines = []
    nodes: dict[str, list[str]] = {}
    for index, (name, (kind, version)) in enumerate(sorted(plan.symbols.items())):
        if name in dropped:
            continue
        quoted = '"' + name.replace('"', "") + '"'
        if kind == STT_TLS:
            lines += [f'.section .tbss.s{index},"awT",@nobits', f".globl {quoted}", f".type {quoted}, @object"]
            lines += [f".size {quoted}, 64", f"{quoted}:", ".zero 64"]
        elif kind == STT_OBJECT:
            lines += [f'.section .data.s{index},"aw"', f".globl {quoted}", f".type {quoted}, @object"]
            lines += [f".size {quoted}, 256", f"{quoted}:", ".zero 256"]
        else:
            lines += [f'.section .text.s{index},"ax"', f".globl {quoted}", f".type {quoted}, @function"]
            lines += [f"{quoted}:", "ret"]
        if version is not None:
            nodes.setdefault(version, []).append(name)
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / f".{plan.soname}.s"
    source.write_text("\n".join(lines) + '\n.section .note.GNU-stack,"",@progbits\n')
    output = directory / plan.soname
    argv = ["gcc", "-shared", "-nostdlib", "-o", str(output), str(source), f"-Wl,-soname,{plan.soname}"]
    if nodes:
        unversioned = [n for n, (_k, v) in plan.symbols.items() if v is None and n not in dropped]
        script = directory / f".{plan.soname}.map"
        blocks = []
        for position, (node, names) in enumerate(sorted(nodes.items())):
            extra = unversioned if position == 0 else []
            listed = "".join(f'"{n}"; ' for n in [*names, *extra])
            blocks.append(f'{node} {{ global: extern "C" {{ {listed}}}; }};')
        script.write_text("\n".join(blocks) + "\n")
        argv.append(f"-Wl,--version-script={script}")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    for leftover in directory.glob(f".{plan.soname}.*"):
        leftover.unlink()
    return output
