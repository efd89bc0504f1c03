"""Fix texts (llvm/fixes.py): dedup only inside SDK trees, exact commands elsewhere, the keeper a
package owns (issue 16, Deliver 5). The commands themselves are executed on real carriers in
test_llvm_differential.py."""

from __future__ import annotations

import shlex

from rocm_audit.llvm import fixes


def _site(tmp_path):
    site = tmp_path / "site-packages"
    owned = site / "pkg" / "lib" / "libLLVM.so.19.1"
    stray = site / "aaa-stray" / "libLLVM.so.19.1"  # sorts first: path order alone would keep it
    for path in (owned, stray):
        path.parent.mkdir(parents=True)
        path.write_bytes(b"\x7fELF same bytes")
    record = site / "pkg-1.0.dist-info" / "RECORD"
    record.parent.mkdir()
    record.write_text("pkg/lib/libLLVM.so.19.1,sha256=abc,15\npkg-1.0.dist-info/RECORD,,\n")
    return owned, stray


def test_the_keeper_outside_sdk_trees_is_the_copy_a_record_owns(tmp_path):
    owned, stray = _site(tmp_path)
    assert fixes.record_owned(str(owned)) and not fixes.record_owned(str(stray))
    keeper = fixes.choose_keeper([str(stray), str(owned)], lambda p: None, "libLLVM.so.19.1")
    assert keeper == str(owned)


def test_dedup_is_suggested_only_inside_sdk_trees(tmp_path):
    owned, stray = _site(tmp_path)
    outside = fixes.duplicate_fix([str(owned), str(stray)], True, str(owned), False, "SONAME")
    assert "run `rocm-audit dedup`" not in outside
    (command,) = [c for c in outside.split("`")[1::2] if c.startswith("ln ")]
    assert shlex.split(command) == ["ln", "-sfr", str(owned), str(stray)]
    inside = fixes.duplicate_fix([str(owned), str(stray)], True, str(owned), True, "SONAME")
    assert "run `rocm-audit dedup`" in inside
    different = fixes.duplicate_fix([str(owned), str(stray)], False, str(owned), False, "SONAME")
    assert "load only one of them" in different and "ln -sfr" not in different


def test_a_global_caution_only_when_it_is_enough():
    assert "Never load /a RTLD_GLOBAL" in fixes.pair_fix("/a", "/b", "/a", ())
    fallback = fixes.pair_fix("/a", "/b", None, ("/usr/lib/libLLVM-15.so.1",))
    assert "Load only one of /a and /b" in fallback and "arrives through /usr/lib/libLLVM-15.so.1" in fallback
