"""The inventory: content-based classification, dynamic facts checked against readelf, no link
following, no hang on special files, bounded memory on huge files."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rocm_audit.tree.discovery import AuditRoot, resolve_roots
from rocm_audit.tree.inventory import FileKind, build_inventory, read_dynamic_info
from support.memory import PEAK_RSS_KIB_EXPR
from support.toolchain import gcc_compile, gfx942_object

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


def compile_c(output: Path, *flags: str, source: str = "int f(void) { return 1; }\n") -> Path:
    return gcc_compile(output, source, *flags)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> Path:
    """One file of each kind, with names that lie about their content."""
    root = tmp_path_factory.mktemp("zoo")
    main = "int main(void) { return 0; }\n"
    compile_c(root / "libplain.so.1", "-shared", "-fPIC", "-Wl,-soname,libplain.so.1")
    compile_c(
        root / "libdeps.so.2",
        "-shared",
        "-fPIC",
        "-Wl,-soname,libdeps.so.2",
        f"-L{root}",
        "-Wl,--no-as-needed",
        "-l:libplain.so.1",
        "-Wl,--disable-new-dtags,-rpath,$ORIGIN:$ORIGIN/../lib",
    )
    compile_c(root / "librunpath.so", "-shared", "-fPIC", "-Wl,--enable-new-dtags,-rpath,$ORIGIN/sub")
    compile_c(root / "pie-tool.so", "-fPIE", "-pie", source=main)  # an executable named like a library
    compile_c(root / "static-tool", "-no-pie", source=main)
    compile_c(root / "object.so", "-c", "-fPIC")  # a relocatable object named like a library
    gfx942_object(root / "libkernel.so")  # a relocatable device object named like a library
    (root / "notes.so").write_text("not an ELF file, whatever the suffix says\n")
    (root / "libc-copy.so.6").write_bytes(Path(LIBC).read_bytes())
    return root


def classify(root: Path) -> dict[str, FileKind]:
    inventory = build_inventory([AuditRoot(str(root), str(root))])
    return {os.path.basename(r.path): r.kind for r in inventory.files}


def test_files_are_classified_by_content_never_by_suffix(zoo):
    kinds = classify(zoo)
    assert kinds == {
        "libplain.so.1": FileKind.SHARED_LIBRARY,
        "libdeps.so.2": FileKind.SHARED_LIBRARY,
        "librunpath.so": FileKind.SHARED_LIBRARY,
        "pie-tool.so": FileKind.EXECUTABLE,
        "static-tool": FileKind.EXECUTABLE,
        "object.so": FileKind.OTHER_ELF,
        "libkernel.so": FileKind.CODE_OBJECT,
        "notes.so": FileKind.NOT_ELF,
        # libc is runnable (PT_INTERP) yet a library: it has a SONAME and no DF_1_PIE.
        "libc-copy.so.6": FileKind.SHARED_LIBRARY,
    }


def readelf_dynamic(path: Path) -> dict[str, list[str]]:
    """The oracle: binutils readelf -d."""
    out = subprocess.run(["readelf", "-d", str(path)], check=True, capture_output=True, text=True).stdout
    facts: dict[str, list[str]] = {"NEEDED": [], "SONAME": [], "RPATH": [], "RUNPATH": []}
    for tag, value in re.findall(r"\((NEEDED|SONAME|RPATH|RUNPATH)\)\s+\S+(?: \S+)*?: \[(.*)\]", out):
        facts[tag].extend(value.split(":") if tag in ("RPATH", "RUNPATH") else [value])
    return facts


@pytest.mark.parametrize("name", ["libplain.so.1", "libdeps.so.2", "librunpath.so", "libc-copy.so.6", "pie-tool.so"])
def test_dynamic_facts_agree_with_readelf(zoo, name):
    ours = read_dynamic_info(str(zoo / name))
    oracle = readelf_dynamic(zoo / name)
    assert list(ours.needed) == oracle["NEEDED"]
    assert ([ours.soname] if ours.soname else []) == oracle["SONAME"]
    assert list(ours.rpath) == oracle["RPATH"]
    assert list(ours.runpath) == oracle["RUNPATH"]
    if name == "libdeps.so.2":
        assert ours.rpath == ("$ORIGIN", "$ORIGIN/../lib") and ours.needed[0] == "libplain.so.1"


def test_inventory_records_identity_and_links_without_following_them(tmp_path, zoo):
    site = tmp_path / "site"
    lib = site / "_rocm_sdk_core" / "lib"
    lib.mkdir(parents=True)
    (lib / "libplain.so.1").write_bytes((zoo / "libplain.so.1").read_bytes())
    os.link(lib / "libplain.so.1", lib / "libplain-hard.so.1")
    os.symlink("libplain.so.1", lib / "libplain.so")
    os.symlink(str(zoo), site / "_rocm_sdk_core" / "escape")  # a directory link out of the root
    os.symlink("missing.so", lib / "dangling.so")
    os.mkfifo(lib / "pipe.so")  # opening a FIFO would block: it must never be opened
    inventory = build_inventory(resolve_roots([str(site)])[0])
    paths = {os.path.relpath(r.path, site): r for r in inventory.files}
    assert set(paths) == {"_rocm_sdk_core/lib/libplain.so.1", "_rocm_sdk_core/lib/libplain-hard.so.1"}
    first, second = paths.values()
    assert first.identity == second.identity and first.nlink == 2
    assert first.sdk_tree == str(site / "_rocm_sdk_core")
    links = {os.path.relpath(link.path, site): link for link in inventory.links}
    assert links["_rocm_sdk_core/lib/libplain.so"].target_text == "libplain.so.1"
    assert inventory.resolved(links["_rocm_sdk_core/lib/libplain.so"]) == str(lib / "libplain.so.1")
    assert inventory.resolved(links["_rocm_sdk_core/escape"]) is None  # leads out of the root
    assert inventory.resolved(links["_rocm_sdk_core/lib/dangling.so"]) is None
    assert inventory.sdk_trees == [str(site / "_rocm_sdk_core")]


def test_a_single_file_path_is_audited_alone(zoo):
    roots, _ = resolve_roots([str(zoo / "libdeps.so.2")])
    inventory = build_inventory(roots)
    assert [os.path.basename(r.path) for r in inventory.files] == ["libdeps.so.2"]


def test_memory_stays_bounded_on_a_huge_library(tmp_path, zoo):
    """A 700 MB (sparse) shared library costs the inventory and the dedup plan a few pages."""
    tree = tmp_path / "_rocm_sdk_core" / "lib"
    tree.mkdir(parents=True)
    for name in ("libhuge.so.1", "libhuge-copy.so.1"):
        with open(tree / name, "wb") as handle:
            handle.write((zoo / "libplain.so.1").read_bytes())
            handle.truncate(700 << 20)
    probe = textwrap.dedent(f"""
        from rocm_audit.dedup.run import run_dedup
        outcome = run_dedup([{str(tmp_path)!r}], mode="check")
        groups = outcome.sections["dedup"]["groups"]
        print(len(groups), {PEAK_RSS_KIB_EXPR} // 1024)
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600, check=True)
    groups, peak_mb = map(int, done.stdout.split())
    assert groups == 1  # the two 700 MB files were compared to the last byte and found identical
    assert peak_mb < 100, f"peak RSS {peak_mb} MB"


def test_a_file_changed_between_listing_and_reading_is_recorded_as_read(tmp_path, zoo):
    """The walk lists every file first; a file that grows before it is opened is recorded with the
    size and times of the bytes read, not those of the listing."""
    lib = tmp_path / "_rocm_sdk_core" / "lib"
    lib.mkdir(parents=True)
    grown = lib / "libplain.so.1"
    grown.write_bytes((zoo / "libplain.so.1").read_bytes())
    listed_size = grown.stat().st_size

    def grow_then_read_all(listed):
        assert [entry.size for entry in listed] == [listed_size]
        with open(grown, "ab") as handle:
            handle.write(b"\0" * 4096)
        return {entry.path for entry in listed}

    roots, _ = resolve_roots([str(tmp_path)])
    (record,) = build_inventory(roots, worth_reading=grow_then_read_all).files
    now = grown.stat()
    assert (record.size, record.mtime_ns, record.ctime_ns) == (now.st_size, now.st_mtime_ns, now.st_ctime_ns)
    assert record.size == listed_size + 4096 and record.kind is FileKind.SHARED_LIBRARY


def test_memory_per_file_of_a_large_tree(tmp_path):
    """A Python environment holds hundreds of thousands of small files: the inventory keeps a few
    hundred bytes for each (an ``os.stat_result`` kept per file, or a listing kept beside the
    records, was over 1 KiB a file at its peak)."""
    files = 20_000
    for package in range(files // 1000):
        folder = tmp_path / "site-packages" / f"package_{package:03}"
        folder.mkdir(parents=True)
        for module in range(1000):
            (folder / f"module_{module:04}.py").write_text("x = 1\n")
    probe = textwrap.dedent(f"""
        import tracemalloc
        from rocm_audit.tree.discovery import resolve_roots
        from rocm_audit.tree.inventory import build_inventory
        roots, _ = resolve_roots([{str(tmp_path / "site-packages")!r}])
        tracemalloc.start()
        inventory = build_inventory(roots)
        print(len(inventory.files), tracemalloc.get_traced_memory()[1])
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600, check=True)
    recorded, peak_bytes = map(int, done.stdout.split())
    assert recorded == files
    path_bytes = len(str(tmp_path / "site-packages" / "package_000" / "module_0000.py")) + 49  # a str object
    assert (peak_bytes / files) - path_bytes < 600, f"{peak_bytes / files:.0f} bytes a file at the peak"
