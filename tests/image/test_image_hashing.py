"""Layer waste hashes only copies that share a size, and still finds every identical pair.

A written file of a size no other copy has is not hashed; a second copy of that size makes both
hashed (the first read back from the merged view), and a copy a later layer deletes or replaces is
hashed before its bytes leave the merged view. The reference here is independent: every data
member of every layer tar hashed with hashlib over ``tarfile``, grouped by (size, digest).
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import tarfile
from collections import defaultdict
from pathlib import Path

import pytest

from rocm_audit.image import merge, waste
from rocm_audit.image.audit import ImageOptions, extract_archive, new_state
from support.image.layer_writers import docker_save, layer

SP = "usr/lib/python3/dist-packages"
KEPT = f"{SP}/pkg"  # written to the merged view (the tests name files *.so: image/needed.py)
PAST = "opt/data"  # streamed past (not an audited directory): hashed while streaming


def analysed(tmp_path: Path, layers: list[bytes], full: bool = False) -> tuple[merge.MergeState, list]:
    work = tmp_path / "work"
    work.mkdir(parents=True)
    state = new_state(str(work), ImageOptions(full=full))
    extract_archive(str(docker_save(tmp_path / "save.tar", layers)), str(work), state)
    merge.finish(state)
    groups, _total = waste.analyse(state)
    return state, groups


def paths_of(groups: list) -> list[list[tuple[int, str, bool]]]:
    return sorted([(c["layer"], c["path"], c["visible"]) for c in g.copies] for g in groups)


def reference_groups(layers: list[bytes]) -> list[list[tuple[int, str]]]:
    """Every data member of at least HASH_MIN_BYTES, grouped by content, read with tarfile."""
    by_content: dict[tuple[int, str], list[tuple[int, str]]] = defaultdict(list)
    for index, blob in enumerate(layers):
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            for info in tar:
                if info.isreg() and info.size >= merge.HASH_MIN_BYTES:
                    content = tar.extractfile(info).read()  # type: ignore[union-attr]
                    key = (len(content), hashlib.blake2b(content, digest_size=32).hexdigest())
                    by_content[key].append((index, "/" + info.name))
    return sorted(sorted(m) for m in by_content.values() if len(m) > 1)


def test_unique_sizes_are_not_hashed(tmp_path):
    one, two = os.urandom(5000), os.urandom(6000)
    state, groups = analysed(tmp_path, [layer((f"{KEPT}/a.so", one), (f"{KEPT}/b.so", two))])
    assert groups == []
    assert [c.digest for c in state.copies] == [None, None]


def test_same_size_different_bytes_are_hashed_and_not_grouped(tmp_path):
    one, two = os.urandom(5000), os.urandom(5000)
    state, groups = analysed(tmp_path, [layer((f"{KEPT}/a.so", one)), layer((f"{KEPT}/b.so", two))])
    assert groups == []
    assert [c.digest for c in state.copies] == [
        hashlib.blake2b(one, digest_size=32).digest(),
        hashlib.blake2b(two, digest_size=32).digest(),
    ]


@pytest.mark.parametrize(
    "removal",
    [
        layer((f"{KEPT}/.wh.a.so", b"")),  # whiteout
        layer((f"{KEPT}/a.so", os.urandom(7000))),  # replaced by other bytes of another size
        layer((f"{KEPT}/.wh..wh..opq", b"")),  # opaque directory
        layer((KEPT, b"now a file")),  # type change: the directory becomes a file
    ],
    ids=["whiteout", "replaced", "opaque", "type-change"],
)
def test_duplicate_found_only_across_layers_after_the_first_copy_was_removed(tmp_path, removal):
    """Layer 0 writes a file of a new size (left unhashed); layer 1 removes it from the merged
    view; layer 2 writes the same bytes elsewhere. Only the hash taken before the removal can
    pair them."""
    content = os.urandom(9000)
    layers = [layer((f"{KEPT}/a.so", content)), removal, layer((f"{SP}/other/copy.so", content))]
    state, groups = analysed(tmp_path, layers)
    assert paths_of(groups) == [[(0, f"/{KEPT}/a.so", False), (2, f"/{SP}/other/copy.so", True)]]
    assert groups[0].digest == hashlib.blake2b(content, digest_size=32).hexdigest()
    assert not groups[0].same_layer


def test_first_copy_streamed_past_then_written_copy(tmp_path):
    content = os.urandom(8192)
    layers = [layer((f"{PAST}/blob", content)), layer((f"{KEPT}/blob.so", content))]
    state, groups = analysed(tmp_path, layers)
    assert paths_of(groups) == [[(0, f"/{PAST}/blob", True), (1, f"/{KEPT}/blob.so", True)]]
    assert not (Path(state.root) / PAST / "blob").exists()  # never written: hashed as it streamed


def test_hardlinked_copy_keeps_its_alias_after_the_first_name_goes(tmp_path):
    content = os.urandom(10_000)
    link = tarfile.TarInfo(f"{KEPT}/alias.so")
    link.type, link.linkname = tarfile.LNKTYPE, f"{KEPT}/a.so"
    layers = [
        layer((f"{KEPT}/a.so", content), link),
        layer((f"{KEPT}/.wh.a.so", b"")),
        layer((f"{SP}/later.so", content)),
    ]
    state, groups = analysed(tmp_path, layers)
    assert paths_of(groups) == [[(0, f"/{KEPT}/a.so", False), (2, f"/{SP}/later.so", True)]]
    assert [c["hardlinks"] for c in groups[0].copies] == [[f"/{KEPT}/alias.so"], []]


@pytest.mark.parametrize("seed", range(6))
def test_random_layers_give_the_groups_of_hashing_every_file(tmp_path, seed):
    """Random layers over a few shared contents and sizes (writes, rewrites, whiteouts, opaque
    directories, files streamed past): the groups equal those of hashing every member."""
    rng = random.Random(seed)
    contents = [rng.randbytes(rng.choice([4096, 5000, 5000, 12_000])) for _ in range(6)]
    contents.append(contents[1][:-1] + bytes([contents[1][-1] ^ 1]))  # same size, one byte differs
    dirs = [f"{SP}/a", f"{SP}/b", f"{SP}/a/deep", PAST]
    names: list[str] = []
    layers = []
    for _ in range(5):
        entries: list[tuple[str, bytes | None]] = []
        for _ in range(rng.randint(2, 7)):
            action = rng.random()
            if action < 0.15 and names:
                victim = rng.choice(names)
                directory, base = victim.rsplit("/", 1)
                entries.append((f"{directory}/.wh.{base}", b""))
            elif action < 0.22:
                entries.append((f"{rng.choice(dirs[:3])}/.wh..wh..opq", b""))
            else:
                # .so names are written to the merged view; .h names become sparse placeholders
                fresh = f"{rng.choice(dirs)}/f{len(names)}{rng.choice(['.so', '.h'])}"
                name = rng.choice(names) if names and action < 0.45 else fresh
                names.append(name)
                entries.append((name, rng.choice(contents)))
        seen: set[str] = set()
        unique = [e for e in entries if not (e[0] in seen or seen.add(e[0]))]  # type: ignore[func-returns-value]
        layers.append(layer(*unique))
    _state, groups = analysed(tmp_path, layers)
    got = sorted(sorted((c["layer"], c["path"]) for c in g.copies) for g in groups)
    assert got == reference_groups(layers)


def test_files_no_check_reads_are_sparse_placeholders_of_their_size(tmp_path, libs_elf):
    header = os.urandom(20_000)
    read = {
        f"{KEPT}/renamed.bin": libs_elf,  # ELF by content, whatever its name
        f"{KEPT}/meta.json": b"[" + b"1," * 3000 + b"1]",
        f"{KEPT}/mod.py": b"# " + b"x" * 5000,
        f"{SP}/pkg-1.0.dist-info/RECORD": b"pkg/mod.py,,\n" * 400,
        f"{KEPT}/bundle.bin": b"__CLANG_OFFLOAD_BUNDLE__" + os.urandom(5000),
        f"{KEPT}/small.h": b"tiny",  # under 4 KiB: written
    }
    layers = [layer(*read.items(), (f"{KEPT}/big.h", header), (f"{KEPT}/same.h", header))]
    state, groups = analysed(tmp_path, layers)
    root = Path(state.root)
    for name, content in read.items():
        assert (root / name).read_bytes() == content, name
    placeholder = (root / KEPT / "big.h").stat()
    assert placeholder.st_size == len(header) and placeholder.st_blocks == 0
    assert (root / KEPT / "big.h").read_bytes() == bytes(len(header))
    assert state.sparse == {f"/{KEPT}/big.h", f"/{KEPT}/same.h"}
    assert paths_of(groups) == [[(0, f"/{KEPT}/big.h", True), (0, f"/{KEPT}/same.h", True)]]
    full_state, _ = analysed(tmp_path / "full", layers, full=True)
    assert (Path(full_state.root) / KEPT / "big.h").read_bytes() == header
    assert full_state.sparse == set()


def test_hardlink_a_check_reads_by_name_gets_the_bytes_of_a_placeholder(tmp_path):
    content = b"pkg/mod.py,sha256=x,1\n" * 300
    link = tarfile.TarInfo(f"{SP}/pkg-1.0.dist-info/RECORD")
    link.type, link.linkname = tarfile.LNKTYPE, f"{KEPT}/record.txt"
    state, _groups = analysed(
        tmp_path, [layer((f"{SP}/pkg-1.0.dist-info/", None), (f"{KEPT}/record.txt", content), link)]
    )
    root = Path(state.root)
    assert (root / SP / "pkg-1.0.dist-info/RECORD").read_bytes() == content
    assert (root / KEPT / "record.txt").stat().st_blocks == 0


@pytest.fixture(scope="module")
def libs_elf(tmp_path_factory) -> bytes:
    from support.sdk_tree import build_library

    return build_library(tmp_path_factory.mktemp("elf"), "one", "libone.so.1", value=3).read_bytes()


def test_no_finding_text_names_the_private_view(tmp_path):
    """A finding's ``detail`` (LLVM verdicts say how a load order comes about) names image paths,
    never the private directory: it differed from run to run and told nothing about the image."""
    from rocm_audit.findings import make_finding
    from rocm_audit.image.audit import _to_image_paths
    from rocm_audit.outcome import CommandOutcome

    root = str(tmp_path / "rootfs")
    finding = make_finding(
        "LLVM001", f"{root}/a/lib.so", f"{root}/a/lib.so clashes", detail=f"abort in {root}/a/lib.so then {root}/b.so"
    )
    fixed = _to_image_paths(CommandOutcome(command="image", findings=[finding]), root).findings[0]
    assert (fixed.path, fixed.message) == ("/a/lib.so", "/a/lib.so clashes")
    assert fixed.detail == "abort in /a/lib.so then /b.so"
