#!/usr/bin/env python3
"""Can LIEF's ELF builder shrink ``.hip_fatbin`` faithfully? (issue item 6; docs/prune.md "--fatbins")

Usage: lief_fatbins.py LIBRARY... (each copied into a temporary directory first; never written).

For each library and each way LIEF offers to make a section smaller, one child process (under
/usr/bin/time -v: wall time and peak RSS) parses a copy with ``lief.ELF.parse``, makes
``.hip_fatbin`` hold a tenth of its bytes, and writes the result with ``Binary.write``:

- ``content``: ``section.content = first tenth`` and ``section.size = tenth`` (what a slimmed
  bundle set would need: the same section, fewer bytes);
- ``remove``: ``Binary.remove(section, clear=True)`` (drops the section header: not what prune
  needs, since every wrapper points into it, but the only other call that gives bytes back).

Then readelf compares the original and the result: the file size, whether every section that is
loaded (SHF_ALLOC) kept its virtual address, and whether the program headers still map the same
virtual ranges. "Faithful" means: file smaller, every address kept, the bundle's first tenth at
its original address. The figures go to stdout as one JSON line per (library, mode), for
bench/RESULTS.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

SECTION = ".hip_fatbin"


def child(mode: str, source: str, output: str) -> None:
    """The LIEF run itself (in the timed child)."""
    import lief

    binary = lief.ELF.parse(source)
    section = binary.get_section(SECTION)
    tenth = section.size // 10
    if mode == "content":
        keep = bytes(section.content[:tenth])
        section.content = list(keep)
        section.size = tenth
    elif mode == "remove":
        binary.remove(section, True)
    else:
        raise SystemExit(f"unknown mode {mode}")
    binary.write(output)


def sections(path: str) -> dict[str, tuple[int, int, int, str]]:
    """name -> (address, offset, size, flags) from readelf -S -W."""
    text = subprocess.run(["readelf", "-S", "-W", path], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in text.splitlines():
        match = re.match(r"\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+([0-9a-f]+)\s+([0-9a-f]+)\s+\S+\s+(\S*)", line)
        if match and match.group(1) != "NULL":
            name, address, offset, size, flags = match.groups()
            found[name] = (int(address, 16), int(offset, 16), int(size, 16), flags if "A" in flags else "")
    return found


def loads(path: str) -> list[tuple[int, int]]:
    """(virtual address, memory size) of each PT_LOAD."""
    text = subprocess.run(["readelf", "-l", "-W", path], capture_output=True, text=True, check=True).stdout
    return [
        (int(m.group(2), 16), int(m.group(3), 16))
        for m in re.finditer(r"LOAD\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)\s+0x[0-9a-f]+\s+0x[0-9a-f]+\s+0x([0-9a-f]+)", text)
    ]


def measure(library: str, mode: str, work: str) -> dict[str, object]:
    source = os.path.join(work, "original.so")
    output = os.path.join(work, f"{mode}.so")
    started = time.monotonic()
    done = subprocess.run(
        ["/usr/bin/time", "-v", sys.executable, __file__, "--child", mode, source, output],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    wall = time.monotonic() - started
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    row: dict[str, object] = {
        "library": os.path.basename(library),
        "mode": mode,
        "exit": done.returncode,
        "wall_s": round(wall, 1),
        "peak_rss_mib": round(int(peak.group(1)) / 1024, 1) if peak else None,
        "size_before": os.path.getsize(source),
    }
    if done.returncode != 0 or not os.path.exists(output):
        row["error"] = done.stderr.strip().splitlines()[-1:] if done.stderr.strip() else "no output"
        return row
    before, after = sections(source), sections(output)
    row["size_after"] = os.path.getsize(output)
    row["smaller"] = row["size_after"] < row["size_before"]  # type: ignore[operator]
    moved = [
        name
        for name, (address, *_rest) in before.items()
        if name in after and before[name][3] and after[name][0] != address
    ]
    row["alloc_sections_moved"] = moved
    row["sections_lost"] = [name for name in before if name not in after]
    row["sections_added"] = [name for name in after if name not in before]
    old_loads, new_loads = loads(source), loads(output)
    row["loads_before"] = len(old_loads)
    row["loads_after"] = len(new_loads)
    row["load_ranges_kept"] = all(any(a <= o[0] and o[0] + o[1] <= a + s for a, s in new_loads) for o in old_loads)
    fat = after.get(SECTION)
    row["fatbin_after"] = {"address": hex(fat[0]), "offset": hex(fat[1]), "size": fat[2]} if fat else None
    row["fatbin_before"] = {
        "address": hex(before[SECTION][0]),
        "offset": hex(before[SECTION][1]),
        "size": before[SECTION][2],
    }
    if fat:
        row["freed_range_zeroed"] = _all_zero(
            output, before[SECTION][1] + fat[2], before[SECTION][1] + before[SECTION][2]
        )
    os.unlink(output)
    return row


def _all_zero(path: str, start: int, stop: int) -> bool:
    """Whether the file holds only zero bytes in [start, stop) (read in 1 MiB steps)."""
    with open(path, "rb") as handle:
        handle.seek(start)
        while start < stop:
            chunk = handle.read(min(1 << 20, stop - start))
            if not chunk or chunk.count(0) != len(chunk):
                return False
            start += len(chunk)
    return True


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        child(argv[1], argv[2], argv[3])
        return 0
    for library in argv:
        with tempfile.TemporaryDirectory(prefix="lief-fatbins-", dir="/tmp") as work:
            shutil.copyfile(library, os.path.join(work, "original.so"))
            for mode in ("content", "remove"):
                print(json.dumps(measure(library, mode, work)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
