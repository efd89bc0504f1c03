"""Where an image says which GPU targets it was built for: its config's Env and its build history;
and which step of that history wrote each layer.

In the seed Dockerfiles (seeds.md) ``GPU_ARCH`` is a build ARG, never an ENV, so it is not in
``Config.Env``. The image still records it: both Docker builders store the build arguments a RUN
step used in that step's history entry, ``created_by``:

- classic builder: ``|2 GPU_ARCH=gfx942;gfx950 PYTHON_VERSION=3.12 /bin/sh -c pip install ...``
- BuildKit:        ``RUN |2 GPU_ARCH=gfx942;gfx950 PYTHON_VERSION=3.12 /bin/sh -c pip install ...``

``|N`` counts the ``KEY=VALUE`` words that follow; values are written unquoted. Both facts were
observed on Docker 20.10 (tests/image/test_image_targets.py builds both ways). Only the final
stage's steps (and the base image's) are in the history: a runtime stage without a RUN records no
argument, which is why Dockerfile.rocm also keeps GPU_ARCH in the runtime stage's ENV.
Pure: a config document in, candidates out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from rocm_audit.gpu.verify import TargetCandidate
from rocm_audit.units import clip

# The image config's Env names that hold a target list, in the order they are trusted.
ENV_NAMES = ("GPU_ARCH", "PYTORCH_ROCM_ARCH")
# Build arguments that hold a target list (verl, miles, PyTorch, CMake projects), in that order.
BUILD_ARG_NAMES = ("GPU_ARCH", "PYTORCH_ROCM_ARCH", "GPU_ARCHS", "AMDGPU_TARGETS")

_ARG_COUNT = re.compile(r"^(?:RUN\s+)?\|(\d+)\s+")
# The classic builder's and buildah's prefix of a step that ran no command, and a RUN's shell.
_NOP = re.compile(r"^/bin/(?:ba)?sh -c #\(nop\)\s*")
# A RUN's shell as SHELL set it: ``/bin/sh -c``, ``/bin/sh -eu -c``, ``/bin/bash -o pipefail -c``.
_SHELL = re.compile(r"^/(?:usr/)?bin/(?:ba|da|z)?sh(?:\s+(?:-\S+|pipefail))*?\s+-c\s+")
_ARG_WORD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=")
# A GPU target as target-list variables spell them (gfx942, gfx942:xnack-, gfx9-4-generic, gfx11xx).
_TARGET_WORD = re.compile(r"^gfx[0-9a-z]+(?:-[0-9a-z]+)*(?::[a-z]+[+-])*[;,]?$")


def run_step_args(created_by: str) -> dict[str, str]:
    """The build arguments a RUN history entry records (``|N K=V ... cmd``); {} for other steps."""
    return _split_run_args(created_by)[0]


def _split_run_args(created_by: str) -> tuple[dict[str, str], str]:
    """The build arguments of a RUN history entry, and the rest of it (the command).

    Values are written unquoted, so a value holding a space is ambiguous. One runs on to the next
    ``NAME=`` word while fewer than N names are read; the last one ends at its first space (the
    command follows) unless the words after it are GPU target names, so the last argument
    ``GPU_ARCH="gfx942 gfx950"`` keeps both targets instead of silently verifying one."""
    match = _ARG_COUNT.match(created_by.strip())
    if match is None:
        return {}, created_by.strip()
    count = int(match.group(1))
    words = created_by.strip()[match.end() :].split(" ")
    found: dict[str, str] = {}
    name: str | None = None
    used = 0
    for word in words:
        starts = _ARG_WORD.match(word)
        if starts is not None and len(found) < count:
            name = starts.group(1)
            found[name] = word[starts.end() :]
        elif name is not None and (len(found) < count or (name in BUILD_ARG_NAMES and _TARGET_WORD.match(word))):
            found[name] += " " + word  # a value with a space, before the next argument or the command
        else:
            break
        used += 1
    return found, " ".join(words[used:])


def config_history(config: Mapping[str, Any]) -> list[str]:
    """``created_by`` of every history entry of an OCI / docker image config, oldest first."""
    entries = config.get("history")
    if not isinstance(entries, list):
        return []
    return [str(e.get("created_by") or "") if isinstance(e, dict) else "" for e in entries]


def layer_steps(config: Mapping[str, Any], layer_count: int) -> list[str]:
    """The build step that wrote each layer, as a person reads it (``RUN pip install ...``), in
    layer order; [] when the history cannot say (no history, or its steps that made a layer, those
    without ``empty_layer``, are not one per layer: a tool that rewrote the layers)."""
    entries = config.get("history")
    if not isinstance(entries, list):
        return []
    made = [e for e in entries if isinstance(e, dict) and not e.get("empty_layer")]
    if len(made) != layer_count or not all(isinstance(e, dict) for e in entries):
        return []
    return [step_text(str(e.get("created_by") or "")) for e in made]


def step_text(created_by: str) -> str:
    """A history entry's ``created_by`` as the Dockerfile line it came from: without the build
    arguments a RUN recorded (the targets line names the one that matters), the shell prefix and
    the builders' markers; one line. The classic builder writes ``/bin/sh -c #(nop) COPY ...``
    for other instructions and ``/bin/sh -c CMD`` for a RUN; BuildKit writes the instruction and
    ``# buildkit`` (observed on Docker 20.10 by tests/image/test_image_targets.py)."""
    text = " ".join(created_by.split())
    text = text.removesuffix(" # buildkit")
    run = text.startswith("RUN ")
    _args, text = _split_run_args(text)
    text = text.removeprefix("RUN ")
    nop = _NOP.match(text)
    if nop is not None:
        return text[nop.end() :].strip()
    shell = _SHELL.match(text)
    if shell is not None:
        return "RUN " + text[shell.end() :]
    return f"RUN {text}" if run else text


def recorded_targets(env: Mapping[str, str], history: Iterable[str]) -> list[TargetCandidate]:
    """Every target list the image records, most trusted first: Env (GPU_ARCH, PYTORCH_ROCM_ARCH),
    then build arguments by name (GPU_ARCH, PYTORCH_ROCM_ARCH, GPU_ARCHS, AMDGPU_TARGETS), each with
    the value of the last history step that set it. ``history`` is oldest first."""
    found = [
        TargetCandidate(env[name], f"image config Env {name}", {"kind": "image-env", "variable": name})
        for name in ENV_NAMES
        if env.get(name, "").strip()
    ]
    last: dict[str, tuple[int, str, str]] = {}
    for index, created_by in enumerate(history):
        for name, value in run_step_args(created_by).items():
            if name in BUILD_ARG_NAMES and value.strip():
                last[name] = (index, value, created_by)
    for name in BUILD_ARG_NAMES:
        if name in last:
            index, value, created_by = last[name]
            # The step as its Dockerfile line: docker history numbers none, and `docker build`
            # counts only this build's steps, not the base image's.
            step = clip(step_text(created_by), 48)
            found.append(
                TargetCandidate(
                    value,
                    f"image history: build arg {name} of `{step}`",
                    {"kind": "image-build-arg", "variable": name, "history_index": index},
                )
            )
    return found
