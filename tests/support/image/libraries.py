"""Real shared libraries built with gcc at test time, large enough for image/trim.py to trim."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path


def _source(functions: int, seed: int) -> str:
    """C with enough machine code, data and debug information to fill blocks of each kind."""
    rng = random.Random(seed)
    # LLVM's CommandLine messages (llvm/roles.py searches .rodata for them: a private copy)
    lines = [
        "#include <string.h>",
        'const char message[] = "inconsistency in registered CommandLine options";',
        'const char other[] = "CommandLine Error: Option \'";',
    ]
    for i in range(functions):
        a, b = rng.randint(1, 1 << 20), rng.randint(1, 1 << 20)
        lines.append(
            f"int f{i}(int x) {{ int y = x * {a}; for (int k = 0; k < {i % 7 + 3}; k++) y ^= (y << 3) + {b} + k;"
            f" return y + (int)strlen(message); }}"
        )
    lines.append("int table[4096] = {1};")
    return "\n".join(lines) + "\n"


def build(directory: Path, name: str, *, functions: int = 600, seed: int = 0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / f"{name}.c"
    source.write_text(_source(functions, seed))
    out = directory / name
    subprocess.run(["gcc", "-g", "-O1", "-shared", "-fPIC", "-o", str(out), str(source)], check=True)
    return out
