"""A plugin whose own search cannot find its host library (issue 16, Deliver 2 and 4).

A real process loads the host first (python imports it), then dlopens the plugin, whose DT_NEEDED
then matches the host's SONAME. rocm-audit finds the host by that SONAME in the audited tree, judges
and probes each plugin after it, and reports a clash the host carries into the process; a probe
that did not load the host would only say "load-error".
"""

from __future__ import annotations

import shutil

import pytest

from rocm_audit.llvm.clashes import LlvmOptions, analyse, probe_analysis
from rocm_audit.tree.discovery import resolve_roots
from rocm_audit.tree.inventory import build_inventory
from support.llvm.llvm_builders import cc_shared
from support.llvm.realload import load

# The host: LLVM's registry, whose addArgument files one named option and aborts on a repeat.
HOST = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
struct registry { const char *names[16]; int count; };
struct registry _ZN4llvm2cl18TopLevelSubCommandE;
void _ZN4llvm2cl6Option11addArgumentEv(const char *name) {
    struct registry *top = &_ZN4llvm2cl18TopLevelSubCommandE;
    for (int i = 0; i < top->count; i++)
        if (strcmp(top->names[i], name) == 0) {
            fprintf(stderr, ": CommandLine Error: Option '%s' registered more than once!\n", name);
            fprintf(stderr, "LLVM ERROR: inconsistency in registered CommandLine options\n");
            abort();
        }
    top->names[top->count++] = name;
}
__attribute__((constructor)) static void host_options(void) { _ZN4llvm2cl6Option11addArgumentEv("host-opt"); }
"""

# The plugin: a static cl::opt of its own, registered into whichever registry it binds to.
PLUGIN = r"""
void _ZN4llvm2cl6Option11addArgumentEv(const char *name);
__attribute__((constructor)) static void plugin_options(void) { _ZN4llvm2cl6Option11addArgumentEv("plugin-opt"); }
"""


@pytest.fixture(scope="module")
def plugin_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugin-host")
    host = cc_shared(root / "lib" / "libfakehost.so", HOST, "-Wl,-soname,libfakehost.so")
    plugin = cc_shared(
        root / "plugins" / "libplug.so",
        PLUGIN,
        "-Wl,-soname,libplug.so",
        f"-L{root / 'lib'}",
        "-lfakehost",
    )
    copy = root / "plugins-copy" / "libplug.so"  # a wheel's copy instead of a symlink
    copy.parent.mkdir()
    shutil.copyfile(plugin, copy)
    return root, host, plugin, copy


def test_the_host_is_found_by_soname_and_loaded_first(plugin_tree):
    root, host, plugin, copy = plugin_tree
    assert load([(str(plugin), True)]).verdict == "load-error"  # alone, its search cannot find the host
    roots, _ = resolve_roots([str(root)])
    analysis = analyse(build_inventory(roots), LlvmOptions())
    judge = analysis.judge
    assert judge.hosts(str(plugin)) == (str(host),) and judge.hosts(str(copy)) == (str(host),)
    (clash,) = [c for c in analysis.clashes if set(c.paths) == {str(plugin), str(copy)}]
    assert clash.judged.worst.verdict.value == "abort" and clash.finding.severity.name == "ERROR"
    assert all(p.verdict.value == "abort" for o in clash.judged.orders for p in o.modes.values())
    assert clash.judged.hosts == {str(plugin): (str(host),), str(copy): (str(host),)}
    # The truth: host first, then both copies, in every mode.
    for first, second in ((plugin, copy), (copy, plugin)):
        for mode in (
            judge.load_sequence(str(first), str(second), "local-local"),
            judge.load_sequence(str(first), str(second), "global-global"),
        ):
            assert mode[0] == (str(host), True)
            assert load(mode).verdict == "abort"


def test_probes_load_the_host_first_and_name_what_they_saw(plugin_tree):
    root, host, plugin, copy = plugin_tree
    roots, _ = resolve_roots([str(root)])
    options = LlvmOptions(probe=True, probe_timeout_s=20.0)
    analysis = analyse(build_inventory(roots), options)
    probe_analysis(analysis, options)
    (clash,) = [c for c in analysis.clashes if set(c.paths) == {str(plugin), str(copy)}]
    assert len(clash.probes) == 6  # both orders, three modes
    assert all(p.verdict.value == "abort" and p.steps[0] == f"global:{host}" for p in clash.probes)
    assert all(p.option == "plugin-opt" for p in clash.probes)
    assert clash.finding.data["decided_by"] == "probe"
    assert not [f for f in analysis.findings if f.rule in ("LLVM007", "LLVM008")]


# An MLIR-style pass plugin: it imports addArgument, but only a pass constructor calls it; its
# static initialiser registers a pass factory and never reaches addArgument (formats.md 6).
PASS_PLUGIN = r"""
void _ZN4llvm2cl6Option11addArgumentEv(const char *name);
typedef void (*factory)(void);
static factory registered;
void create_pass(void) { _ZN4llvm2cl6Option11addArgumentEv("pass-opt"); }
__attribute__((constructor)) static void register_pass(void) { registered = create_pass; }
"""


def test_copies_of_a_plugin_that_registers_nothing_at_load_are_clean_and_info(tmp_path):
    host = cc_shared(tmp_path / "lib" / "libfakehost.so", HOST, "-Wl,-soname,libfakehost.so")
    plugin = cc_shared(
        tmp_path / "plugins" / "libpass.so",
        PASS_PLUGIN,
        "-Wl,-soname,libpass.so",
        f"-L{tmp_path / 'lib'}",
        "-lfakehost",
    )
    copy = tmp_path / "plugins-copy" / "libpass.so"
    copy.parent.mkdir()
    shutil.copyfile(plugin, copy)
    roots, _ = resolve_roots([str(tmp_path)])
    analysis = analyse(build_inventory(roots), LlvmOptions())
    linkage = analysis.facts.linkage(str(plugin), (plugin.stat().st_dev, plugin.stat().st_ino))
    assert linkage.registers_at_load is False and "no .init_array function reaches" in linkage.registration_path
    (clash,) = [c for c in analysis.clashes if set(c.paths) == {str(plugin), str(copy)}]
    assert not clash.judged.bad and clash.finding.rule == "LLVM014" and clash.finding.severity.name == "INFO"
    assert clash.finding.message.startswith(
        "2 identical copies (separate files, separate inodes) of libpass.so, which registers LLVM options, "
        "but loading them together is harmless"
    )
    for first, second in ((plugin, copy), (copy, plugin)):
        for rtld in ((True, True), (True, False), (False, False)):
            steps = [(str(host), True), (str(first), rtld[0]), (str(second), rtld[1])]
            assert load(steps).verdict == "clean"


def test_two_builds_of_one_soname_are_called_different_builds(tmp_path):
    host = cc_shared(tmp_path / "lib" / "libfakehost.so", HOST, "-Wl,-soname,libfakehost.so")
    for folder, extra in (("plugins", ""), ("plugins-other", "int another_build = 1;\n")):
        cc_shared(
            tmp_path / folder / "libpass.so",
            PASS_PLUGIN + extra,
            "-Wl,-soname,libpass.so",
            f"-L{host.parent}",
            "-lfakehost",
        )
    roots, _ = resolve_roots([str(tmp_path)])
    analysis = analyse(build_inventory(roots), LlvmOptions())
    (clash,) = [c for c in analysis.clashes if c.soname == "libpass.so"]
    assert clash.identical is False
    assert clash.finding is not None and clash.finding.message.startswith("2 different builds of libpass.so,")
