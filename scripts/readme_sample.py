#!/usr/bin/env python3
"""Regenerate the README's quick-start sample output from a real run.

    python scripts/readme_sample.py           # exit 1 when README.md differs from a fresh run
    python scripts/readme_sample.py --write   # rewrite the samples in README.md

It builds a small TheRock-shaped site-packages in a temp dir with gcc: `_rocm_sdk_core` and
`_rocm_sdk_devel`, where devel's libamd_comgr.so.3 was copied (a second inode: what `cp -r` or one
`COPY --from` per tree makes) and its libamdhip64.so.6 is a hardlink of the runtime file. Then it
runs the real `rocm-audit` of this interpreter on it, in that temp dir, and puts each command and
its output between the README's markers:

    <!-- sample:check -->  ...  <!-- /sample -->

Every library is padded to a fixed size, so the output does not depend on the compiler's version;
timings are the only figures that change from run to run and are shown as `0.01 s`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
LIBRARY_BYTES = 16 * 1024  # every sample library is padded to this size

# marker name -> the rocm-audit arguments shown (run in the temp dir that holds site-packages)
SAMPLES: dict[str, list[str]] = {
    "check": ["check", "gfx942", "-p", "site-packages"],
    "dedup": ["dedup", "--dry-run", "-p", "site-packages"],
}
_BLOCK = re.compile(r"(<!-- sample:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /sample -->)", re.DOTALL)


def _library(path: Path, name: str, value: int) -> Path:
    """A real gcc shared library with SONAME = file name, padded with zeros to LIBRARY_BYTES."""
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.parent / f".{name}.c"
    source.write_text(f"int {name}_value(void) {{ return {value}; }}\n")
    argv = ["gcc", "-shared", "-fPIC", "-O1", "-o", str(path), str(source), f"-Wl,-soname,{path.name}"]
    subprocess.run(argv, check=True, timeout=120, capture_output=True)
    source.unlink()
    size = path.stat().st_size
    if size > LIBRARY_BYTES:
        raise SystemExit(f"readme_sample: {path.name} is {size} bytes, more than {LIBRARY_BYTES}")
    with path.open("ab") as out:  # bytes after the section headers: nothing reads them
        out.write(b"\0" * (LIBRARY_BYTES - size))
    return path


def build_tree(work: Path) -> Path:
    """site-packages with a copied and a hardlinked devel library; returns site-packages."""
    site = work / "site-packages"
    core, devel = site / "_rocm_sdk_core" / "lib", site / "_rocm_sdk_devel" / "lib"
    comgr = _library(core / "libamd_comgr.so.3", "comgr", 3)
    hip = _library(core / "libamdhip64.so.6", "hip", 6)
    devel.mkdir(parents=True)
    shutil.copy2(comgr, devel / comgr.name)  # a second inode with the same bytes and mode
    os.link(hip, devel / hip.name)  # one inode, which the next `cp -r` would split
    return site


def run_sample(work: Path, arguments: list[str]) -> str:
    """`$ rocm-audit ...` and what it printed, with the temp dir taken out and timings fixed."""
    env = {key: value for key, value in os.environ.items() if key not in ("GPU_ARCH", "CI")}
    env.update(NO_COLOR="1", COLUMNS="100")
    done = subprocess.run(
        [sys.executable, "-m", "rocm_audit", *arguments],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode not in (0, 1):
        raise SystemExit(f"readme_sample: rocm-audit {' '.join(arguments)} exited {done.returncode}:\n{done.stderr}")
    output = done.stdout.replace(f"{os.path.realpath(work)}/", "").replace(f"{work}/", "")
    output = re.sub(r"\bin(\s+)\d+(\.\d+)? s\b", r"in\g<1>0.01 s", output)
    shown = f"$ rocm-audit {' '.join(arguments)}\n{output.rstrip()}\n"
    if done.returncode:
        shown += f"$ echo $?\n{done.returncode}\n"
    return shown


def samples() -> dict[str, str]:
    with tempfile.TemporaryDirectory(prefix="rocm-audit-sample-") as temp:
        work = Path(temp)
        build_tree(work)
        return {name: run_sample(work, arguments) for name, arguments in SAMPLES.items()}


def render(readme: str, fresh: dict[str, str]) -> str:
    found = {m.group("name") for m in _BLOCK.finditer(readme)}
    missing = sorted(set(fresh) - found)
    if missing:
        raise SystemExit(f"readme_sample: README.md has no <!-- sample:{missing[0]} --> block")

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in fresh:
            raise SystemExit(f"readme_sample: README.md has a sample block no command makes: {name}")
        return f"{match.group(1)}```text\n{fresh[name]}```\n{match.group(4)}"

    return _BLOCK.sub(replace, readme)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite README.md instead of comparing")
    args = parser.parse_args()
    current = README.read_text(encoding="utf-8")
    wanted = render(current, samples())
    if wanted == current:
        print("readme_sample: README.md samples are up to date")
        return 0
    if args.write:
        README.write_text(wanted, encoding="utf-8")
        print("readme_sample: README.md samples rewritten")
        return 0
    import difflib

    diff = difflib.unified_diff(current.splitlines(True), wanted.splitlines(True), "README.md", "fresh run")
    sys.stdout.writelines(diff)
    print("readme_sample: README.md samples are out of date: run python scripts/readme_sample.py --write")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
