"""kpack'd libraries of a TheRock-faithful install judged as the kpack runtime resolves them (issue 15,
item 6): ``librocblas.so.5`` is installed under its SONAME while the kpack TOC keys its build path
(``math-libs/BLAS/rocBLAS/stage/lib/librocblas.so.5.0.0``); its reference names the component and the
``.kpm`` that lists the per-arch archives the device wheels install."""

from __future__ import annotations

from pathlib import Path

from rocm_audit.gpu import verify
from support.therock import build_therock_install


def test_rocblas_is_judged_through_its_build_key_and_named_when_a_target_is_missing(tmp_path: Path) -> None:
    install = build_therock_install(tmp_path, kpack=True)
    site = install.libraries.parent
    rocblas = install.libraries / "lib" / "librocblas.so.5"
    outcome = verify.verify_arch([str(site)], ["gfx942", "gfx950"], environ={})
    (carrier,) = [c for c in outcome.sections["carriers"] if c["path"] == str(rocblas)]
    assert carrier["kind"] == "library" and carrier["containers"] == ["kpack"]
    assert carrier["targets"] == ["gfx90a", "gfx942"] and carrier["missing"] == ["gfx950"]
    assert [m["how"] for m in carrier["matches"]] == ["native", None]
    named = [f for f in outcome.findings if f.path == str(rocblas)]
    assert [f.rule for f in named] == ["ARCH001"], named
    assert "gfx950" in named[0].message
