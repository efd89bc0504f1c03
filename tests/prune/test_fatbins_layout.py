"""`prune --fatbins` gives the freed bytes back on disk (prune/fatbins/layout.py).

Real HIP libraries built with clang++-19 at test time, linked by GNU ld (no PT_PHDR) and by lld
(PT_PHDR), with ``.hip_fatbin`` mid-segment (the linkers' own layout: ``.eh_frame_hdr`` and
``.eh_frame`` follow it) and at a segment's end (a linker script puts it last), plain and
``--offload-compress``: the file shrinks by what the layout claims, every section keeps its
address, readelf and eu-elflint find nothing new, and a child process that dlopens the library
(RTLD_NOW) against a stand-in HIP runtime sees bundles selecting the same gfx942 code and none for
gfx90a, and a C++ exception thrown and caught inside the library still unwinds (its
``.eh_frame_hdr`` kept its address). The vendor test does the same on cupy-rocm-7-0's cub module.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rocm_audit.elf import read as elfread
from rocm_audit.elf.sections import read_sections
from rocm_audit.elf.tables import PT_LOAD, PT_PHDR, read_phdrs
from rocm_audit.prune.fatbins.library import LibraryResult, Refused, prove_file, slim_library
from rocm_audit.prune.fatbins.rewrite import selections
from rocm_audit.tree.targets import kept_target
from support.hip_host import PRELUDE, STUB_NAMES, build_stub, load_and_read
from support.run import run_checked
from support.tools import require_tool

HIP_FLAGS = ["-x", "hip", "-nogpulib", "-nogpuinc", "-fPIC", "-O2", "-Wno-unused-command-line-argument"]
ARCHES = ["--offload-arch=gfx942", "--offload-arch=gfx90a"]
KERNEL = (
    'extern "C" __attribute__((global)) void {tu}_{i}(float* o, int n) '
    "{{ float a = o[n]; for (int j = 0; j < n; ++j) a = a * {i}.5f + o[j] / {i}.25f; o[n + {i}] = a; }}\n"
)
THROWER = """\
#include <stdexcept>
extern "C" int thrower(int x) {
  try { if (x) throw std::runtime_error("boom"); return 0; } catch (const std::exception&) { return 42; }
}
"""
# .hip_fatbin placed after .bss: the last section of the last segment, as in onnxruntime-rocm
AT_END = "SECTIONS { .hip_fatbin : { *(.hip_fatbin) } } INSERT AFTER .bss;\n"
# a symbol in the middle of .hip_fatbin: nothing may move bundles under it
INSIDE = "SECTIONS { .hip_fatbin : { *(.hip_fatbin) inside_fatbin = . - 16; } } INSERT AFTER .rodata;\n"
GFX942, GFX90A = [kept_target("gfx942")], [kept_target("gfx90a")]


def _source(tu: str, kernels: int) -> str:
    return PRELUDE + "".join(KERNEL.format(tu=tu, i=i + 1) for i in range(kernels))


@pytest.fixture(scope="module")
def hip_objects(tmp_path_factory) -> dict[str, Path]:
    """Two HIP translation units (plain and compressed), a C++ one that throws, the stand-in."""
    cxx = require_tool("clang++-19")
    out = tmp_path_factory.mktemp("layout")
    made: dict[str, Path] = {}
    for tu in ("a", "b"):
        (out / f"{tu}.hip").write_text(_source(tu, 120))
        for kind, extra in (("plain", []), ("ccob", ["--offload-compress"])):
            run_checked([cxx, *HIP_FLAGS, *extra, *ARCHES, "-c", f"{tu}.hip", "-o", f"{tu}.{kind}.o"], out)
            made[f"{tu}.{kind}"] = out / f"{tu}.{kind}.o"
    (out / "small.hip").write_text(_source("s", 1))
    run_checked([cxx, *HIP_FLAGS, "--offload-compress", *ARCHES, "-c", "small.hip", "-o", "small.o"], out)
    made["small"] = out / "small.o"
    (out / "thrower.cpp").write_text(THROWER)
    run_checked([cxx, "-fPIC", "-O1", "-c", "thrower.cpp", "-o", "thrower.o"], out)
    made["thrower"] = out / "thrower.o"
    for name, text in (("end.ld", AT_END), ("inside.ld", INSIDE)):
        (out / name).write_text(text)
        made[name] = out / name
    made["stub"] = build_stub(out)
    made["dir"] = out
    return made


def _link(hip_objects: dict[str, Path], inputs: list[str], linker: str, extra: list[str], name: str) -> Path:
    out = hip_objects["dir"] / name
    argv = [require_tool("clang++-19"), "-shared", *(str(hip_objects[i]) for i in inputs), *extra, "-o", str(out)]
    if linker == "lld":
        require_tool("ld.lld-19")
        argv.insert(2, "-fuse-ld=lld")
    run_checked(argv)
    return out


def _slim(path: Path, target: Path) -> LibraryResult:
    shutil.copyfile(path, target)
    with open(path, "rb") as before, open(target, "r+b") as after:
        result = slim_library(str(path), GFX942, after.fileno())
        assert prove_file(before.fileno(), after.fileno(), result) is None
    return result


def _sections(path: Path) -> dict[str, tuple[int, int]]:
    fd = os.open(path, os.O_RDONLY)
    try:
        header = elfread.parse_header(os.pread(fd, 64, 0))
        return {s.name: (s.addr, s.size) for s in read_sections(fd, header, os.fstat(fd).st_size)}
    finally:
        os.close(fd)


def _phdrs(path: Path) -> tuple[int, list]:
    fd = os.open(path, os.O_RDONLY)
    try:
        header = elfread.parse_header(os.pread(fd, 64, 0))
        return header.e_phoff, read_phdrs(fd, header)
    finally:
        os.close(fd)


def _child(stub: Path, library: Path, env: dict[str, str] | None = None, python: str = sys.executable) -> dict:
    return load_and_read(stub, library, env, python)


def _lint(path: Path) -> set[str]:
    done = subprocess.run(["eu-elflint", "--gnu-ld", str(path)], capture_output=True, text=True, timeout=120)
    return {line for line in (done.stdout + done.stderr).splitlines() if line.strip() and line != "No errors"}


def _same_code_and_addresses(stub: Path, before: Path, after: Path, result: LibraryResult) -> None:
    old_sections, new_sections = _sections(before), _sections(after)
    assert set(old_sections) == set(new_sections)
    for name, (addr, size) in old_sections.items():
        assert new_sections[name][0] == addr, name  # every section keeps its address
        if name != ".hip_fatbin":
            assert new_sections[name][1] == size, name
    assert new_sections[".hip_fatbin"][1] < old_sections[".hip_fatbin"][1]
    listing = subprocess.run(["readelf", "-lSW", str(after)], capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0 and not listing.stderr, listing.stderr
    if shutil.which("eu-elflint"):
        assert _lint(after) <= _lint(before)
    old, new = _child(stub, before), _child(stub, after)
    assert new["caught"] == old["caught"] == 42  # unwinding through .eh_frame_hdr still works
    assert len(new["bundles"]) == len(old["bundles"]) == len(result.bundles)
    for was, now in zip(old["bundles"], new["bundles"], strict=True):
        assert selections(now, GFX942) == selections(was, GFX942)
        assert all(selections(now, GFX942).values())
        assert any(selections(was, GFX90A).values()) and not any(selections(now, GFX90A).values())


@pytest.mark.parametrize("kind", ["plain", "ccob"])
@pytest.mark.parametrize(("linker", "place"), [("bfd", "mid"), ("lld", "mid"), ("bfd", "end"), ("lld", "end")])
def test_the_file_shrinks_and_every_address_stays(hip_objects, tmp_path, kind, linker, place):
    extra = ["-Wl,-T," + str(hip_objects["end.ld"])] if place == "end" else []
    library = _link(
        hip_objects, [f"a.{kind}", f"b.{kind}", "thrower"], linker, extra, f"lib-{kind}-{linker}-{place}.so"
    )
    old_phoff, old_phdrs = _phdrs(library)
    fatbin = _sections(library)[".hip_fatbin"]
    loads = [p for p in old_phdrs if p.p_type == PT_LOAD]
    holder = next(p for p in loads if p.p_vaddr <= fatbin[0] < p.p_vaddr + p.p_filesz)
    ends_segment = fatbin[0] + fatbin[1] == holder.p_vaddr + holder.p_filesz
    assert ends_segment == (place == "end")  # the fixture has the layout it claims
    assert any(p.p_type == PT_PHDR for p in old_phdrs) == (linker == "lld")

    after = tmp_path / library.name
    result = _slim(library, after)
    assert result.layout == ("truncated" if place == "end" else "split"), result.plan
    assert after.stat().st_size == library.stat().st_size - result.saved
    # the file gives back what the bundles lost, up to the alignment the layout keeps
    assert result.saved >= result.freed - 2 * 4096 and result.saved > 0
    new_phoff, new_phdrs = _phdrs(after)
    new_loads = [p for p in new_phdrs if p.p_type == PT_LOAD]
    assert len(new_loads) == len(loads) + (place == "mid")
    assert all(p.p_offset % p.p_align == p.p_vaddr % p.p_align for p in new_loads)
    phdr = [p for p in new_phdrs if p.p_type == PT_PHDR]
    if phdr:  # PT_PHDR names the table where it now is, inside a loaded segment
        assert phdr[0].p_offset == new_phoff and phdr[0].p_filesz == len(new_phdrs) * 56
        assert any(
            p.p_offset <= new_phoff and new_phoff + 56 * len(new_phdrs) <= p.p_offset + p.p_filesz for p in new_loads
        )
    if place == "end":
        assert new_phoff == old_phoff
    _same_code_and_addresses(hip_objects["stub"], library, after, result)


def test_too_few_freed_bytes_fall_back_to_zeroes(hip_objects, tmp_path):
    library = _link(hip_objects, ["small", "thrower"], "bfd", [], "libsmall.so")
    after = tmp_path / library.name
    result = _slim(library, after)
    assert result.layout == "zeroed" and result.saved == 0 and result.freed > 0
    assert result.plan is not None and "too few bytes" in result.plan.reason
    assert after.stat().st_size == library.stat().st_size
    old, new = _child(hip_objects["stub"], library), _child(hip_objects["stub"], after)
    assert new["caught"] == 42
    now = new["bundles"][0]
    assert selections(now, GFX942) == selections(old["bundles"][0], GFX942)
    assert not any(selections(now, GFX90A).values())


def test_a_symbol_inside_the_fat_binaries_refuses_the_file(hip_objects, tmp_path):
    library = _link(
        hip_objects, ["a.plain", "thrower"], "bfd", ["-Wl,-T," + str(hip_objects["inside.ld"])], "libinside.so"
    )
    with pytest.raises(Refused, match="points inside .hip_fatbin"):
        slim_library(str(library), GFX942)


@pytest.mark.vendor
def test_cupy_cub_module_shrinks_and_still_registers_the_same_gfx942_code(hip_objects, cache_dir, tmp_path):
    """cupy-rocm-7-0 14.2.0's cub module (146 MiB, one plain bundle, .hip_fatbin mid-segment)."""
    from support.interpreters import find_python
    from support.postbuild.standins import build_standin, plan_standins
    from support.vendor import APP_WHEELS, PIP_TARGET_312, install_members, pinned_wheel

    spec, name, digest = next(w for w in APP_WHEELS if w[0].startswith("cupy-rocm-7-0"))
    wheel = pinned_wheel(cache_dir, spec, name, digest, PIP_TARGET_312)
    (cub,) = install_members(wheel, tmp_path / "site", suffix="cuda/cub.cpython-312-x86_64-linux-gnu.so")
    after = tmp_path / "cub.so"
    result = _slim(cub, after)
    assert result.layout == "split"
    removable = sum(b.freed for b in result.bundles)
    assert result.saved >= 0.9 * removable > 0
    assert after.stat().st_size == cub.stat().st_size - result.saved

    plans = plan_standins([(str(cub), ["libamdhip64.so.7"], set())])
    standins = tmp_path / "standins"
    for plan in plans.values():
        build_standin(standins, plan, drop=STUB_NAMES)
    python = find_python("3.12") or sys.executable
    env = {"LD_LIBRARY_PATH": str(standins)}
    old, new = _child(hip_objects["stub"], cub, env, python), _child(hip_objects["stub"], after, env, python)
    assert len(new["bundles"]) == len(old["bundles"]) >= 1
    for was, now in zip(old["bundles"], new["bundles"], strict=True):
        assert selections(now, GFX942) == selections(was, GFX942)
        assert all(selections(now, GFX942).values())
        assert not any(selections(now, GFX90A).values())
    old_sections, new_sections = _sections(cub), _sections(after)
    assert {n: a for n, (a, _s) in old_sections.items()} == {n: a for n, (a, _s) in new_sections.items()}
