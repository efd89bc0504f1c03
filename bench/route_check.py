#!/usr/bin/env python3
"""Check `scan --targets` and `verify-arch` against an independent route, file by file.

Usage: route_check.py [--rocm-audit PATH] FILE...

The route does not import rocm_audit: objcopy dumps ``.hip_fatbin``, ``split_fatbin.py`` cuts it at
the bundle boundaries, a CCOB is inflated with ``zstd -d`` or zlib (LLVM 19's bundler cannot read
v3), ``clang-offload-bundler-19 --list``/``--unbundle`` gives the entries (a hand read of the entry
table where LLVM 19 does not know the processor, gfx950), ``llvm-readelf-19`` the ELF flags; a raw
AMDGPU ELF is read as it is. Targets come from ``e_flags`` (formats.md 2.7) and each TU is judged
by formats.md 2.9 for gfx942 and gfx950 as ``:sramecc+:xnack-`` agents. Prints OK or DIFF per file
with what differs (entry ids, targets with their features, generic versions, TU count, verdicts)
and exits 1 on any difference. Written for the vendor-shape survey in docs/benchmarks.md
(bitsandbytes, cyllama/inferna, aiter, tensorflow-rocm, ...).
"""

from __future__ import annotations

import collections
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUNDLER = "clang-offload-bundler-19"
# EF_AMDGPU_MACH values (formats.md 2.7; LLVM ELF.h)
MACH = {
    0x028: "gfx801", 0x029: "gfx802", 0x02A: "gfx803", 0x02B: "gfx810", 0x02C: "gfx900", 0x02D: "gfx902",
    0x02E: "gfx904", 0x02F: "gfx906", 0x030: "gfx908", 0x031: "gfx909", 0x032: "gfx90c", 0x033: "gfx1010",
    0x034: "gfx1011", 0x035: "gfx1012", 0x036: "gfx1030", 0x037: "gfx1031", 0x038: "gfx1032", 0x039: "gfx1033",
    0x03D: "gfx1035", 0x03E: "gfx1034", 0x03F: "gfx90a", 0x040: "gfx940", 0x041: "gfx1100", 0x042: "gfx1013",
    0x043: "gfx1150", 0x044: "gfx1103", 0x045: "gfx1036", 0x046: "gfx1101", 0x047: "gfx1102", 0x048: "gfx1200",
    0x049: "gfx1250", 0x04A: "gfx1151", 0x04B: "gfx941", 0x04C: "gfx942", 0x04E: "gfx1201", 0x04F: "gfx950",
    0x051: "gfx9-generic", 0x052: "gfx10-1-generic", 0x053: "gfx10-3-generic", 0x054: "gfx11-generic",
    0x055: "gfx1152", 0x058: "gfx1153", 0x059: "gfx12-generic", 0x05F: "gfx9-4-generic",
}  # fmt: skip
GENERIC = {"gfx942": "gfx9-4-generic", "gfx950": "gfx9-4-generic"}
AGENTS = {"gfx942": {"sramecc": "+", "xnack": "-"}, "gfx950": {"sramecc": "+", "xnack": "-"}}
Target = tuple[str, str, dict[str, str], int]  # target id, processor, features, generic version


def elf_target(blob: bytes) -> Target | None:
    if blob[:4] != b"\x7fELF" or len(blob) < 64 or struct.unpack_from("<H", blob, 18)[0] != 0xE0:
        return None
    abi_version, flags = blob[8], struct.unpack_from("<I", blob, 0x30)[0]
    processor = MACH.get(flags & 0xFF, f"mach{flags & 0xFF:#x}")
    features = {}
    if abi_version >= 2:  # code object v4+: 2-bit feature fields
        features.update({"sramecc": {0x800: "-", 0xC00: "+"}.get(flags & 0xC00, "")})
        features.update({"xnack": {0x200: "-", 0x300: "+"}.get(flags & 0x300, "")})
        features = {k: v for k, v in features.items() if v}
    generic = flags >> 24 if abi_version >= 4 else 0
    return processor + "".join(f":{k}{v}" for k, v in sorted(features.items())), processor, features, generic


def _readelf_flags(path: str) -> int | None:
    out = subprocess.run(["llvm-readelf-19", "--file-headers", path], capture_output=True, text=True).stdout
    found = re.search(r"Flags:\s+(0x[0-9a-fA-F]+)", out)
    return int(found.group(1), 16) if found else None


def _table_entry(path: str, entry_id: str) -> bytes:
    data = Path(path).read_bytes()
    (count,) = struct.unpack_from("<Q", data, 24)
    at = 32
    for _ in range(count):
        offset, size, id_len = struct.unpack_from("<QQQ", data, at)
        name = data[at + 24 : at + 24 + id_len].decode()
        at += 24 + id_len
        if name == entry_id:
            return data[offset : offset + size]
    return b""


def bundle_entries(path: str, tmp: str) -> list[tuple[str, Target | None]]:
    listed = subprocess.run([BUNDLER, "--list", "--type=o", f"--input={path}"], capture_output=True, text=True)
    if listed.returncode:
        raise RuntimeError(listed.stderr.strip())
    entries = []
    for number, entry_id in enumerate(line for line in listed.stdout.split() if line):
        out = os.path.join(tmp, f"entry{number}")
        done = subprocess.run(
            [BUNDLER, "--unbundle", "--type=o", f"--input={path}", f"--targets={entry_id}", f"--output={out}"],
            capture_output=True,
        )
        unbundled = done.returncode == 0 and os.path.exists(out)
        blob = Path(out).read_bytes() if unbundled else _table_entry(path, entry_id)
        target = elf_target(blob)
        if target and unbundled:
            assert _readelf_flags(out) == struct.unpack_from("<I", blob, 0x30)[0], f"readelf disagrees on {entry_id}"
        entries.append((entry_id, target))
    return entries


def inflate(path: str, tmp: str) -> tuple[str, str]:
    data = Path(path).read_bytes()
    version, method = struct.unpack_from("<HH", data, 4)
    payload = data[{1: 20, 2: 24, 3: 32}[version] :]
    if method == 1:
        raw = subprocess.run(["zstd", "-dc"], input=payload, capture_output=True, check=True).stdout
    else:
        raw = zlib.decompressobj().decompress(payload)
    out = os.path.join(tmp, "inflated.bundle")
    Path(out).write_bytes(raw)
    return out, f"ccob-v{version}-{'zstd' if method == 1 else 'zlib'}"


def judge(tus: list[list[tuple[str, Target | None]]]) -> dict[str, str | None]:
    def fits(features: dict[str, str], target: str) -> bool:
        return all(AGENTS[target].get(k) == v for k, v in features.items())

    verdict: dict[str, str | None] = {}
    for target in AGENTS:
        hows = []
        for entries in tus:
            device = [t for _, t in entries if t]
            if any(p == target and fits(f, target) for _, p, f, _ in device):
                hows.append("native")
            elif any(p == GENERIC.get(target) and g >= 1 and fits(f, target) for _, p, f, g in device):
                hows.append("generic")
            elif any("spirv" in entry_id for entry_id, _ in entries):
                hows.append("spirv")
            else:
                hows.append(None)
        order = ["native", "generic", "spirv"]
        verdict[target] = None if not hows or None in hows else max(hows, key=order.index)
    return verdict


def route(path: str) -> dict:
    tus: list[list[tuple[str, Target | None]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        with open(path, "rb") as handle:
            head = handle.read(64)
        if elf_target(head):
            tus.append([("raw", elf_target(Path(path).read_bytes()))])
        else:
            fatbin = os.path.join(tmp, "fatbin")
            dumped = subprocess.run(["objcopy", "-O", "binary", "--only-section=.hip_fatbin", path, fatbin])
            if dumped.returncode == 0 and os.path.exists(fatbin) and os.path.getsize(fatbin):
                pieces = os.path.join(tmp, "split")
                split = [sys.executable, str(HERE / "split_fatbin.py"), fatbin, pieces]
                subprocess.run(split, check=True, capture_output=True)
                for name in sorted(n for n in os.listdir(pieces) if n.endswith(".bundle")):
                    piece = os.path.join(pieces, name)
                    if Path(piece).read_bytes()[:4] == b"CCOB":
                        piece, _shape = inflate(piece, tmp)
                    tus.append(bundle_entries(piece, tmp))
    return {"tus": tus, "verdict": judge(tus)}


def main() -> int:
    args = sys.argv[1:]
    tool = "rocm-audit"
    if args[:1] == ["--rocm-audit"]:
        tool, args = args[1], args[2:]
    files = [os.path.abspath(f) for f in args]
    paths = [arg for f in files for arg in ("-p", f)]
    scan = json.loads(
        subprocess.run([tool, "scan", "--targets", "-q", "--format", "json", *paths], capture_output=True).stdout
    )
    verify = json.loads(
        subprocess.run(
            [tool, "verify-arch", "gfx942", "gfx950", "-q", "--format", "json", *paths], capture_output=True
        ).stdout
    )
    differ = 0
    for path in files:
        theirs_route = route(path)
        ours: collections.Counter = collections.Counter()
        for obj in scan["code_objects"]:
            if obj["path"] == path and obj["kind"] != "host":
                entry = "raw" if obj["container"] in ("raw-elf", "elf") else obj["entry_id"]
                ours[(entry, obj["target"], obj["generic_version"] or 0)] += 1
        theirs: collections.Counter = collections.Counter()
        for entries in theirs_route["tus"]:
            for entry_id, target in entries:
                if not entry_id.startswith("host"):
                    theirs[(entry_id, target[0] if target else None, target[3] if target else 0)] += 1
        # a per-arch set (Kernels_gfx942.hsaco, hsa/gfx942/x.co) is judged as a whole: for one of its
        # files compare the set's verdict on the arch the file serves
        carriers = [c for c in verify["carriers"] if c["path"] == path or path in c["members"]]
        our_verdict = {m["target"]: m["how"] for m in carriers[0]["matches"]} if carriers else {}
        if carriers and carriers[0]["kind"] == "per-arch-files":
            served = {t for t, how in theirs_route["verdict"].items() if how}
            our_verdict = {t: (how if t in served else None) for t, how in our_verdict.items()}
        tus = len(theirs_route["tus"])
        same_tus = tus == (carriers[0]["tu_count"] or 1 if carriers else 0)  # a per-arch set has none
        same_verdict = our_verdict == theirs_route["verdict"] or (not tus and not carriers)
        same = ours == theirs and same_verdict and same_tus
        differ += not same
        print(
            "OK  " if same else "DIFF", path, f"tus {tus}", f"entries {sum(theirs.values())}", theirs_route["verdict"]
        )
        if not same:
            print(
                "   ours only:", sorted((ours - theirs).items())[:6], "route only:", sorted((theirs - ours).items())[:6]
            )
            print("   our verdict:", our_verdict, "tu_count:", carriers[0]["tu_count"] if carriers else None)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
