"""Triton's own kernel cache, made by the real Triton 3.6.0 compiling for the HIP backend (no GPU
needed: Triton's AMD backend links with Debian's ld.lld-19), judged as Triton uses it: an entry is
found by a key that holds its target, so it serves that GPU only and others compile at first use."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support.tools import require_tool
from support.vendor import TRITON_WHEEL_SHA256, triton_wheel

COMPILE = """
import sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
for arch in sys.argv[1:]:
    source = ASTSource(fn=add_kernel, signature=signature, constexprs={"BLOCK": 128})
    kernel = triton.compile(source, target=GPUTarget("hip", arch, 64))
    print(arch, kernel.metadata.target.arch, kernel.hash)
"""


@pytest.fixture(scope="module")
def triton_cache(cache_dir, tmp_path_factory) -> Path:
    """A Triton cache holding add_kernel compiled for gfx942 and for gfx90a: {hash}/add_kernel.*"""
    # The pinned wheel is CPython 3.11's; Triton needs nothing else, so any 3.11 interpreter runs it.
    python = sys.executable if sys.version_info[:2] == (3, 11) else shutil.which("python3.11")
    if python is None:
        pytest.skip("no CPython 3.11 on this machine to run the pinned triton 3.6.0 (cp311) wheel")
    lld = require_tool("ld.lld-19")
    out = tmp_path_factory.mktemp("triton")
    cache = out / "site" / "triton-cache"
    (out / "compile.py").write_text(COMPILE)
    lib = _unpacked(cache_dir)
    env = dict(os.environ, PYTHONPATH=str(lib), TRITON_CACHE_DIR=str(cache), TRITON_HIP_LLD_PATH=lld)
    env["HOME"] = str(out)  # Triton's other caches stay in the test's folder
    done = subprocess.run(
        [python, str(out / "compile.py"), "gfx942", "gfx90a"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line.split()[:2] for line in done.stdout.splitlines()] == [["gfx942", "gfx942"], ["gfx90a", "gfx90a"]]
    return cache


def _unpacked(cache_dir: str) -> Path:
    """The wheel unpacked once into the test cache (with its dist-info: Triton finds its backends
    through the entry points there)."""
    wheel = triton_wheel(cache_dir)
    root = wheel.parent / "unpacked" / "triton-runtime" / TRITON_WHEEL_SHA256[:16]
    if not (root / ".complete").exists():
        scratch = root.with_name(root.name + ".partial")
        shutil.rmtree(scratch, ignore_errors=True)
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(scratch)
        shutil.rmtree(root, ignore_errors=True)
        scratch.rename(root)
        (root / ".complete").write_text("")
    return root


def _entries(cache: Path) -> dict[str, Path]:
    """arch -> entry folder, from the metadata Triton wrote."""
    import json

    found = {}
    for entry in cache.iterdir():
        metadata = json.loads((entry / "add_kernel.json").read_text())
        found[metadata["target"]["arch"]] = entry
    return found


@pytest.mark.vendor  # triton compiles a real kernel cache
def test_a_real_triton_cache_serves_each_entry_s_target_and_compiles_elsewhere(run_cli, triton_cache):
    entries = _entries(triton_cache)
    assert set(entries) == {"gfx942", "gfx90a"}
    assert (entries["gfx942"] / "__grp__add_kernel.json").is_file()  # Triton's group file, not judged
    report = run_cli("verify-arch", "gfx942", "gfx950", "-p", str(triton_cache), "--format", "json").report
    (carrier,) = report["carriers"]
    assert (carrier["path"], carrier["kind"], carrier["missing"]) == (str(triton_cache), "triton-kernels", [])
    assert sorted(carrier["members"]) == sorted(str(e / "add_kernel.hsaco") for e in entries.values())
    assert carrier["targets"] == ["gfx90a", "gfx942"]  # from the code objects' own ELF headers
    assert {m["target"]: (m["how"], len(m["tus_without"])) for m in carrier["matches"]} == {
        "gfx942": ("jit", 1),
        "gfx950": ("jit", 2),
    }
    assert [(f["rule"], f["data"]["kernels"]) for f in report["findings"]] == [("ARCH009", {"gfx942": 1, "gfx950": 2})]


def test_a_real_triton_entry_for_the_target_is_native_and_quiet(run_cli, triton_cache, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(_entries(triton_cache)["gfx942"], cache / "entry")
    report = run_cli("verify-arch", "gfx942", "-p", str(cache), "--format", "json").report
    assert [(c["kind"], c["matches"][0]["how"]) for c in report["carriers"]] == [("triton-kernels", "native")]
    assert report["findings"] == []
    # Without the metadata it is a plain code object, judged as the runtime would any other.
    (cache / "entry" / "add_kernel.json").unlink()
    report = run_cli("verify-arch", "gfx90a", "-p", str(cache), "--format", "json", expect=1).report
    assert [(c["kind"], c["missing"]) for c in report["carriers"]] == [("code-object-file", ["gfx90a"])]
