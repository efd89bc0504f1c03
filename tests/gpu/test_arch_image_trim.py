"""`image` on HIP fat binaries, embedded device images and real vendor CCOB libraries gives the
report of `image --full` when large ELF files keep only the blocks the checks read
(image/trim.py; the size threshold is lowered so these libraries are trimmed too)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from rocm_audit.elf.view import ElfView
from rocm_audit.image import merge, trim
from rocm_audit.image.audit import ImageOptions, extract_archive, new_state
from support.hip_host import HIP_FLAGS, TU
from support.image.layer_writers import docker_save_of_directories
from support.image.reports import comparable
from support.run import run_checked

SITE = "usr/lib/python3/dist-packages"


def _same_report_as_full(tmp_path: Path, run_cli, site: Path, *targets: str) -> merge.MergeState:
    archive = docker_save_of_directories(tmp_path / "save.tar", [[(site, f"{SITE}/libs")]])
    reports = {}
    for mode in ("default", "full"):
        out = tmp_path / f"{mode}.json"
        run_cli(
            "image",
            "--archive",
            str(archive),
            *targets,
            "--format",
            "json",
            "-o",
            str(out),
            "-q",
            *(["--full"] if mode == "full" else []),
        )
        reports[mode] = comparable(out.read_text())
    assert reports["default"]["findings"]
    assert reports["default"] == reports["full"]
    work = tmp_path / "work"
    work.mkdir()
    state = new_state(str(work), ImageOptions())
    extract_archive(str(archive), str(work), state)
    return state


def _gather(into: Path, *paths: Path) -> Path:
    into.mkdir()
    for path in paths:
        shutil.copyfile(path, into / path.name)
    return into


def _big_plain_library(out: Path, clang: str) -> Path:
    """Plain offload bundles (no compression) whose code objects span many blocks: the part of
    .hip_fatbin the scan does not read (the code past each code object's headers and notes)."""
    kernels = "".join(
        f'extern "C" __attribute__((global)) void k{n}(int* out) '
        f"{{ for (int i = 0; i < {n % 13 + 2}; i++) out[i] = out[i + {n}] * {n + 3} + i; }}\n"
        for n in range(400)
    )
    out.mkdir()
    (out / "big.hip").write_text(TU % ("k_base", 0) + kernels)
    arches = ["--offload-arch=gfx942", "--offload-arch=gfx90a", "--offload-arch=gfx1100"]
    run_checked([clang, *HIP_FLAGS, "-shared", *arches, "big.hip", "-o", "libbigplain.so"], out)
    return out / "libbigplain.so"


def test_clang_fat_binaries_and_embedded_images(
    tmp_path, run_cli, tools, built, embedded_libs, many_arch_libs, monkeypatch
):
    monkeypatch.setattr(trim, "TRIM_MIN_BYTES", 0)
    big = _big_plain_library(tmp_path / "big", tools["clang++-19"])
    libraries = [p for p in built.values() if p.name.endswith(".so")]
    libraries += [p for p in embedded_libs.values() if p.name.endswith(".so")]
    libraries += [*sorted(many_arch_libs.glob("*.so")), big]
    site = _gather(tmp_path / "site", *libraries)
    state = _same_report_as_full(tmp_path, run_cli, site, "gfx942", "gfx90a")
    trimmed = Path(state.root) / SITE / "libs" / big.name
    fd = os.open(trimmed, os.O_RDONLY)
    try:
        (fatbin,) = [s for s in ElfView(fd).sections if s.name == ".hip_fatbin"]
    finally:
        os.close(fd)
    data, original = trimmed.read_bytes(), big.read_bytes()
    inside = data[fatbin.offset : fatbin.offset + fatbin.size]
    assert inside != original[fatbin.offset : fatbin.offset + fatbin.size]  # code given back
    assert inside.startswith(b"__CLANG_OFFLOAD_BUNDLE__")  # the table stays


def test_real_vendor_ccob_libraries(tmp_path, run_cli, jax_plugin, bitsandbytes_libs, monkeypatch):
    monkeypatch.setattr(trim, "TRIM_MIN_BYTES", 0)
    libraries = sorted(jax_plugin.glob("*.so")) + sorted(bitsandbytes_libs.glob("*.so"))
    site = _gather(tmp_path / "site", *libraries)
    state = _same_report_as_full(tmp_path, run_cli, site, "gfx942", "gfx950")
    root = Path(state.root)
    given = sum(os.path.getsize(p) - os.lstat(p).st_blocks * 512 for p in root.rglob("*.so") if p.is_file())
    assert state.trimmed and given > 0
