"""Roles from ELF facts alone (formats.md 3.4), on real LLVM libraries and gcc-built look-alikes."""

from __future__ import annotations

import os

import pytest

from rocm_audit.elf import view as elfview
from rocm_audit.llvm.roles import Role, classify
from rocm_audit.tree.inventory import read_dynamic_info
from support.llvm.llvm_builders import (
    FAKE_LLVM,
    LIBCLANG_CPP15,
    LIBLLVM15,
    LIBLLVM16,
    cc_shared,
    llvmlite_library,
)


def facts(path):
    real = os.path.realpath(path)
    return classify(real, read_dynamic_info(real))


def test_debian_libllvm_is_a_versioned_interposable_exporter():
    for library, node in ((LIBLLVM15, "LLVM_15"), (LIBLLVM16, "LLVM_16")):
        one = facts(library)
        assert one.role is Role.EXPORTER
        assert one.version_node == node and one.soname == library.name
        assert one.interposable_registry is True  # GLOB_DAT against TopLevelSubCommand
        assert one.nodelete and not one.symbolic and one.exported_cl_symbols > 50


def test_libclang_cpp_is_a_registrant_despite_weak_cl_template_copies():
    one = facts(LIBCLANG_CPP15)
    assert one.role is Role.REGISTRANT
    assert one.imports_add_argument and one.has_initialisers
    assert one.version_node == "LLVM_15"  # the node its addArgument import requires
    assert one.exported_cl_symbols == 0


def test_llvmlite_is_a_private_copy():
    one = facts(llvmlite_library())
    assert one.role is Role.PRIVATE_COPY
    assert one.embeds_registry is True and one.exported_cl_symbols == 0 and not one.imports_add_argument


def test_libc_has_no_role():
    one = facts("/lib/x86_64-linux-gnu/libc.so.6")
    assert one.role is Role.NONE and one.embeds_registry is False


@pytest.fixture(scope="module")
def lookalikes(tmp_path_factory):
    root = tmp_path_factory.mktemp("lookalikes")
    exporter = cc_shared(root / "libexporter.so", FAKE_LLVM, "-Wl,-soname,libexporter.so")
    return {
        "exporter": exporter,
        "registrant": cc_shared(
            root / "libregistrant.so",
            """
            void _ZN4llvm2cl6Option11addArgumentEv(void);
            __attribute__((constructor)) static void add(void) {
                _ZN4llvm2cl6Option11addArgumentEv();
            }
        """,
            f"-L{root}",
            "-lexporter",
        ),
        # Vague-linkage template copies (cl::OptionValue<bool> vtable) are WEAK: not a registry.
        "weak-only": cc_shared(
            root / "libweak.so",
            """
            __attribute__((weak)) const void *_ZTVN4llvm2cl11OptionValueIbEE[4] = {0};
            const void *use(void) { return _ZTVN4llvm2cl11OptionValueIbEE; }
        """,
        ),
        # LLVM linked in with hidden visibility: the registry's strings, none of its symbols.
        "hidden": cc_shared(
            root / "libhidden.so",
            """
            __attribute__((visibility("hidden"))) void _ZN4llvm2cl6Option11addArgumentEv(void) {}
            const char *messages[] = {"inconsistency in registered CommandLine options",
                                      ": CommandLine Error: Option '"};
        """,
        ),
        "symbolic": cc_shared(root / "libsymbolic.so", FAKE_LLVM, "-Wl,-Bsymbolic"),
    }


def test_lookalike_roles(lookalikes):
    exporter = facts(lookalikes["exporter"])
    assert exporter.role is Role.EXPORTER and exporter.version_node is None and exporter.interposable_registry
    registrant = facts(lookalikes["registrant"])
    assert registrant.role is Role.REGISTRANT and registrant.version_node is None
    assert facts(lookalikes["weak-only"]).role is Role.NONE
    hidden = facts(lookalikes["hidden"])
    assert hidden.role is Role.PRIVATE_COPY and hidden.exported_cl_symbols == 0
    symbolic = facts(lookalikes["symbolic"])
    assert symbolic.role is Role.EXPORTER and symbolic.symbolic and symbolic.interposable_registry is False


@pytest.mark.parametrize("window", [16, 37, 61, 4096])
def test_windowed_scans_find_what_a_whole_read_finds(lookalikes, monkeypatch, window):
    """Needles straddling window edges are found once; small windows give the same facts."""
    expected = {name: facts(path) for name, path in lookalikes.items()}
    monkeypatch.setattr(elfview, "WINDOW_BYTES", window)
    for name, path in lookalikes.items():
        assert facts(path) == expected[name], name
    with open(lookalikes["hidden"], "rb") as stream:
        view = elfview.ElfView(stream.fileno())
        rodata = view.by_name(".rodata")
        stream.seek(rodata.offset)
        whole = stream.read(rodata.size)
        for needle in (b"in", b"CommandLine", b"options\0"):
            naive = [i for i in range(len(whole)) if whole.startswith(needle, i)]
            assert list(view.find_all(rodata, needle)) == naive
