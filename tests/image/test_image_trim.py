"""`image` keeps only the blocks of a large ELF file that the checks read (image/trim.py).

What is checked: the punched ranges never touch a byte any reader of the file reads (the ELF
header and tables, every kept section; the checks' answers on the trimmed file equal those on the
original); the merged view gives a trimmed file its whole bytes back before a byte comparison can
read it (a duplicate's bytes, or its layer read again); the layer waste finds the groups of hashing
every member; and `image` on real LLVM libraries gives the report of `image --full`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import tarfile
from pathlib import Path

import blake3
import pytest

from rocm_audit.elf.view import ElfView
from rocm_audit.gpu.codeobjects import host_reads
from rocm_audit.image import digests, merge, trim, waste, whole
from rocm_audit.image.audit import ImageOptions, extract_archive, new_state
from rocm_audit.image.offload import Offload
from rocm_audit.llvm.libfacts import LINKAGE_FACT, ROLE_FACT
from rocm_audit.llvm.linkage import read_linkage
from rocm_audit.llvm.roles import REGISTRY_STRINGS, Role, classify
from support.image.layer_writers import docker_save, docker_save_of_directories, layer, member
from support.image.libraries import build
from support.image.reports import comparable

SP = "usr/lib/python3/dist-packages"
SDK = f"{SP}/_rocm_sdk_core/lib"  # where dedup byte-compares libraries (trimmed ones are made whole)


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("trim"), "libbig.so")


def _sections(path: Path) -> dict[str, tuple[int, int, int]]:
    fd = os.open(path, os.O_RDONLY)
    try:
        return {s.name: (s.offset, s.offset + s.size, s.flags) for s in ElfView(fd).sections if s.has_file_bytes}
    finally:
        os.close(fd)


def _punched_copy(original: Path, into: Path) -> tuple[Path, list[tuple[int, int]]]:
    copy = into / original.name
    copy.write_bytes(original.read_bytes())
    fd = os.open(copy, os.O_RDWR)
    try:
        ranges, _facts = trim.unread_ranges(str(copy), fd, os.fstat(fd).st_size)
        given = trim.punch(fd, ranges)
    finally:
        os.close(fd)
    assert given == sum(end - start for start, end in ranges)
    return copy, ranges


def test_only_unread_sections_lose_blocks_and_every_reader_answers_the_same(library, tmp_path):
    copy, ranges = _punched_copy(library, tmp_path)
    sections = _sections(library)
    assert ranges, "a library with debug information and machine code gives blocks back"
    assert all(start % trim.BLOCK == 0 and end % trim.BLOCK == 0 for start, end in ranges)
    given = sum(end - start for start, end in ranges)
    assert os.stat(copy).st_blocks * 512 <= os.stat(library).st_blocks * 512 - given
    # Data sections are searched (device images, LLVM's messages): only what a search finds stays.
    kept = {".dynsym", ".dynstr", ".rela.dyn", ".eh_frame_hdr", ".dynamic", ".shstrtab", ".init_array"}
    original, trimmed = library.read_bytes(), copy.read_bytes()
    for name, (start, end, _flags) in sections.items():
        if name in kept:
            assert trimmed[start:end] == original[start:end], name
            assert not any(s < end and start < e for s, e in ranges), name
    touched = {n for n, (s0, e0, _) in sections.items() if any(s < e0 and s0 < e for s, e in ranges)}
    assert ".text" in touched and any(n.startswith(".debug") for n in touched)
    searched = {n for n in sections if n.startswith((".rodata", ".data"))}
    assert touched <= {".text", ".symtab", ".strtab", ".eh_frame", ".gcc_except_table", ".comment"} | searched | {
        n for n in sections if n.startswith(".debug")
    }
    for needle in REGISTRY_STRINGS:  # what roles.py searches .rodata for stays
        at = original.index(needle)
        assert trimmed[at : at + len(needle)] == needle
    # Every byte outside the ranges is the original's; inside them, zeros.
    for start, end in ranges:
        assert trimmed[start:end] == bytes(end - start)
    mask = bytearray(len(original))
    for start, end in ranges:
        mask[start:end] = b"\1" * (end - start)
    assert all(a == b for a, b, m in zip(original, trimmed, mask, strict=True) if not m)
    # The readers that open ELF files answer the same on both.
    fa, fb = os.open(library, os.O_RDONLY), os.open(copy, os.O_RDONLY)
    try:
        va, vb = ElfView(fa), ElfView(fb)
        assert classify("x", va.dynamic, va) == classify("x", vb.dynamic, vb)
        assert classify("x", vb.dynamic, vb).role is Role.PRIVATE_COPY  # so its linkage is read too
        assert read_linkage("x", va.dynamic, va) == read_linkage("x", vb.dynamic, vb)
        assert host_reads("x", fa, va.file_size, va.header)[1] == host_reads("x", fb, vb.file_size, vb.header)[1]
    finally:
        os.close(fa)
        os.close(fb)


def test_ranges_are_whole_blocks_of_the_difference(tmp_path):
    """_subtract/_merged/_blocks against a bitmap reference on random ranges."""
    rng = random.Random(7)
    for _ in range(300):
        size = 1 << 16
        drop = [(a, a + rng.randint(0, 9000)) for a in (rng.randrange(size) for _ in range(rng.randint(0, 6)))]
        keep = [(a, a + rng.randint(0, 3000)) for a in (rng.randrange(size) for _ in range(rng.randint(0, 6)))]
        got = trim._blocks(trim._subtract(trim._merged(drop), trim._merged(keep)))
        bits = bytearray(size + 20000)
        for s, e in drop:
            bits[s:e] = b"\1" * (e - s)
        for s, e in keep:
            bits[s:e] = b"\0" * (e - s)
        want = [
            (b, b + trim.BLOCK)
            for b in range(0, len(bits), trim.BLOCK)
            if bits[b : b + trim.BLOCK] == b"\1" * trim.BLOCK
        ]
        flat = [(b, b + trim.BLOCK) for s, e in got for b in range(s, e, trim.BLOCK)]
        assert flat == want


def _state(tmp_path: Path, layers: list[bytes], full: bool = False) -> merge.MergeState:
    work = tmp_path / ("full" if full else "work")
    work.mkdir(parents=True)
    state = new_state(str(work), ImageOptions(full=full))
    extract_archive(str(docker_save(tmp_path / f"save-{full}.tar", layers)), str(work), state)
    merge.finish(state)
    return state


@pytest.fixture()
def small_trim(monkeypatch):
    monkeypatch.setattr(trim, "TRIM_MIN_BYTES", 0)


@pytest.fixture(params=["blake3", "sha256"])
def identity(request, monkeypatch) -> str:
    """Each hash a trimmed file's identity is taken with (digests.new_identity): BLAKE3 from the
    `fast` extra (the test extra installs it), or SHA-256 without it."""
    if request.param == "sha256":
        monkeypatch.setattr(digests, "_blake3", None)
    return request.param


def test_the_identity_is_blake3_with_the_fast_extra_else_sha256(identity):
    data = bytes(range(256)) * 4099  # more than one BLAKE3 chunk and SHA-256 block, not aligned
    hasher = digests.new_identity()
    for start in range(0, len(data), 70_000):
        hasher.update(data[start : start + 70_000])
    want = blake3.blake3(data).digest() if identity == "blake3" else hashlib.sha256(data).digest()
    assert hasher.digest() == want


def _variant(original: bytes, library: Path) -> bytes:
    """The same size, one byte of machine code changed: differs only where the view is trimmed."""
    start, end, _ = _sections(library)[".text"]
    position = (start + end) // 2
    return original[:position] + bytes([original[position] ^ 0xFF]) + original[position + 1 :]


def test_duplicates_in_one_layer_get_their_bytes_back_from_the_whole_copy(tmp_path, library, small_trim, identity):
    content = library.read_bytes()
    state = _state(tmp_path, [layer((f"{SDK}/a/libx.so", content), (f"{SDK}/b/libx.so", content))])
    root = Path(state.root)
    assert (root / SDK / "a/libx.so").read_bytes() == content  # trimmed, then made whole
    assert (root / SDK / "b/libx.so").read_bytes() == content
    assert state.trimmed == {}
    groups, _ = waste.analyse(state)
    assert [[c["path"] for c in g.copies] for g in groups] == [[f"/{SDK}/a/libx.so", f"/{SDK}/b/libx.so"]]
    assert groups[0].digest == hashlib.blake2b(content, digest_size=32).hexdigest()


def _default_and_full(run_cli, archive: Path, tmp_path: Path) -> dict[str, dict]:
    """The comparable JSON reports of `image` and `image --full` on one archive."""
    reports = {}
    for mode in ("default", "full"):
        out = tmp_path / f"{mode}.json"
        args = ["image", "--archive", str(archive), "gfx942", "--format", "json", "-o", str(out), "-q"]
        run_cli(*args, *(["--full"] if mode == "full" else []))
        reports[mode] = comparable(out.read_text())
    return reports


def test_sdk_duplicates_trimmed_or_not_give_the_report_of_full_extraction(tmp_path, library, small_trim, run_cli):
    """Identical libraries in two SDK trees (dedup byte-compares them), one copy outside and one
    of the same size that differs in machine code: `image` reports what `image --full` does."""
    content = library.read_bytes()
    layers = [
        layer((f"{SDK}/libx.so", content), (f"{SP}/other/libx.so", content)),
        layer((f"{SP}/_rocm_sdk_libraries_gfx942/lib/libx.so", content)),
        layer((f"{SP}/_rocm_sdk_devel/lib/libx.so", _variant(content, library))),
    ]
    archive = docker_save(tmp_path / "save.tar", layers)
    reports = _default_and_full(run_cli, archive, tmp_path)
    assert reports["default"] == reports["full"]
    rules = [json.loads(f)["rule"] for f in reports["default"]["findings"]]
    assert "DUP001" in rules, rules


def test_same_size_other_content_is_read_again_from_its_layer(tmp_path, library, small_trim, identity):
    content = library.read_bytes()
    other = _variant(content, library)
    layers = [layer((f"{SDK}/a/libx.so", content)), layer((f"{SDK}/b/libx.so", other))]
    state = _state(tmp_path, layers)
    root = Path(state.root)
    # The first copy was trimmed; a byte comparison with the second must see every byte of it.
    assert (root / SDK / "a/libx.so").read_bytes() == content
    assert (root / SDK / "b/libx.so").read_bytes() == other
    assert state.trimmed == {}
    groups, _ = waste.analyse(state)
    assert groups == []


def test_a_unique_library_stays_trimmed_and_groups_with_nothing(tmp_path, library, small_trim):
    content = library.read_bytes()
    state = _state(tmp_path, [layer((f"{SP}/a/libx.so", content))])
    path = Path(state.root) / SP / "a/libx.so"
    assert len(state.trimmed) == 1
    assert path.stat().st_size == len(content)
    assert path.stat().st_blocks * 512 < len(content)
    assert path.read_bytes() != content


def test_trimmed_copy_replaced_then_matched_by_a_later_copy(tmp_path, library, small_trim, identity):
    """A trimmed copy a later layer replaces still groups with a third copy of its content."""
    content = library.read_bytes()
    other = _variant(content, library)
    layers = [
        layer((f"{SP}/a/libx.so", content)),
        layer((f"{SP}/a/libx.so", other)),
        layer((f"{SP}/c/liby.so", content)),
    ]
    state = _state(tmp_path, layers)
    groups, _ = waste.analyse(state)
    assert [sorted((c["layer"], c["path"]) for c in g.copies) for g in groups] == [
        [(0, f"/{SP}/a/libx.so"), (2, f"/{SP}/c/liby.so")]
    ]
    root = Path(state.root)
    assert (root / SP / "a/libx.so").read_bytes() == other
    assert (root / SP / "c/liby.so").read_bytes() == content


def _merged(tmp_path: Path, layers: list[bytes]) -> merge.MergeState:
    """The state after the last layer, before ``finish`` makes trimmed files whole."""
    work = tmp_path / "work"
    work.mkdir()
    state = new_state(str(work), ImageOptions())
    extract_archive(str(docker_save(tmp_path / "save.tar", layers)), str(work), state)
    return state


def _trimmed_paths(state: merge.MergeState) -> list[tuple[int, str]]:
    return sorted((state.copies[i].layer, state.copies[i].path) for i in state.trimmed)


def test_a_reinstalled_library_is_trimmed_again_and_groups_with_the_one_it_replaces(
    tmp_path, library, small_trim, identity
):
    """A later layer that reinstalls a trimmed library: the view shows no other copy of its size,
    so the new copy is trimmed as well, hashed as it streams (BLAKE2b and identity), never read
    back; the two group by the real BLAKE2b of their bytes."""
    content = library.read_bytes()
    path = f"{SDK}/libx.so"
    state = _merged(tmp_path, [layer((path, content)), layer((path, content))])
    assert _trimmed_paths(state) == [(0, "/" + path), (1, "/" + path)]
    merge.finish(state)
    assert not state.hashing
    shown = Path(state.root) / path
    assert shown.stat().st_size == len(content)
    assert shown.stat().st_blocks * 512 < len(content)  # alone at its size: it stays trimmed
    groups, _ = waste.analyse(state)
    assert [sorted((c["layer"], c["path"]) for c in g.copies) for g in groups] == [[(0, "/" + path), (1, "/" + path)]]
    assert groups[0].digest == hashlib.blake2b(content, digest_size=32).hexdigest()


def test_a_reinstalled_library_of_other_content_groups_with_nothing_and_a_whole_peer_fixes_it(
    tmp_path, library, small_trim, identity
):
    """The reinstalled copy differs (same size): trimmed, grouped with nothing; a third copy of its
    content at another path is then written whole (the view shows the trimmed one), and gives it
    its bytes back before a byte comparison."""
    content = library.read_bytes()
    other = _variant(content, library)
    layers = [
        layer((f"{SDK}/a/libx.so", content)),
        layer((f"{SDK}/a/libx.so", other)),
        layer((f"{SDK}/b/libx.so", other)),
    ]
    state = _merged(tmp_path, layers)
    assert _trimmed_paths(state) == [(0, f"/{SDK}/a/libx.so"), (1, f"/{SDK}/a/libx.so")]
    merge.finish(state)
    root = Path(state.root)
    assert (root / SDK / "a/libx.so").read_bytes() == other
    assert (root / SDK / "b/libx.so").read_bytes() == other
    groups, _ = waste.analyse(state)
    assert [sorted((c["layer"], c["path"]) for c in g.copies) for g in groups] == [
        [(1, f"/{SDK}/a/libx.so"), (2, f"/{SDK}/b/libx.so")]
    ]
    assert groups[0].digest == hashlib.blake2b(other, digest_size=32).hexdigest()


def test_a_trimmed_copy_groups_with_whole_copies_gone_before_it(tmp_path, library, small_trim, identity):
    """Whole copies of a size (the second in a layer is never trimmed) that a later layer deletes
    were hashed with BLAKE2b alone before they went: a trimmed copy of their size after them
    takes its BLAKE2b as it streams and groups with them."""
    content = library.read_bytes()
    layers = [
        layer((f"{SP}/a/libx.so", content), (f"{SP}/b/libx.so", content)),
        layer((f"{SP}/.wh.a", b""), (f"{SP}/.wh.b", b"")),
        layer((f"{SP}/c/libx.so", content)),
    ]
    state = _merged(tmp_path, layers)
    assert _trimmed_paths(state) == [(0, f"/{SP}/a/libx.so"), (2, f"/{SP}/c/libx.so")]
    merge.finish(state)
    groups, _ = waste.analyse(state)
    assert [sorted((c["layer"], c["path"]) for c in g.copies) for g in groups] == [
        [(0, f"/{SP}/a/libx.so"), (0, f"/{SP}/b/libx.so"), (2, f"/{SP}/c/libx.so")]
    ]
    assert groups[0].digest == hashlib.blake2b(content, digest_size=32).hexdigest()


def test_a_library_the_view_still_shows_through_a_hardlink_keeps_its_successor_whole(tmp_path, library, small_trim):
    """A later layer replaces a trimmed library whose bytes a hardlink still shows: the new copy is
    written whole, and the trimmed one gets its bytes back from it."""
    content = library.read_bytes()
    path, link = f"{SDK}/libx.so", f"{SDK}/libx.so.1"
    layers = [
        layer((path, content), member(link, kind=tarfile.LNKTYPE, link=path)),
        layer((path, content)),
    ]
    state = _merged(tmp_path, layers)
    assert _trimmed_paths(state) == [(0, "/" + path)]
    merge.finish(state)
    root = Path(state.root)
    assert (root / path).read_bytes() == content
    assert (root / link).read_bytes() == content
    assert state.trimmed == {}


def _punched_and_facts(original: bytes, place: Path, named: Path) -> tuple[bytes, dict]:
    """What trimming ``original`` written at ``place`` leaves there, and the facts it reads when
    the file is named ``named`` (facts name the path they were read at)."""
    place.parent.mkdir(parents=True, exist_ok=True)
    place.write_bytes(original)
    fd = os.open(place, os.O_RDWR)
    try:
        _inode, _given, facts, _punched = trim.trim_file(str(named), fd, len(original))
    finally:
        os.close(fd)
    return place.read_bytes(), facts


@pytest.fixture()
def start_trims(monkeypatch) -> list[bool]:
    """Whether each trim the merge starts reuses the result of the trim before it at its path."""
    reused: list[bool] = []
    real = whole.start_trim

    def spy(state, path, fd, size, reuse=None, identity=None):
        reused.append(reuse is not None)
        return real(state, path, fd, size, reuse, identity)

    monkeypatch.setattr(whole, "start_trim", spy)
    return reused


def test_a_reinstalled_library_takes_the_trim_of_the_one_it_replaces(tmp_path, library, small_trim, start_trims):
    """The same bytes at the same path in a later layer: written without the blocks the first
    trim gave back, no trim of its own, and what the view then holds (bytes, holes, facts) is
    what trimming it would give."""
    content = library.read_bytes()
    path = f"{SP}/a/libx.so"
    state = _merged(tmp_path, [layer((path, content)), layer((path, content))])
    assert start_trims == [False, True]
    shown = Path(state.root) / path
    want_bytes, want_facts = _punched_and_facts(content, tmp_path / "reference" / path, shown)
    assert want_facts, "the test library carries LLVM facts"
    assert shown.read_bytes() == want_bytes
    assert shown.stat().st_blocks <= (tmp_path / "reference" / path).stat().st_blocks
    info = shown.stat()
    assert whole.facts_still_shown(state) == {(info.st_dev, info.st_ino): want_facts}
    assert state.incomplete == {}
    merge.finish(state)
    groups, _ = waste.analyse(state)
    assert [sorted(c["layer"] for c in g.copies) for g in groups] == [[0, 1]]


class _AnsweredLater(Offload):
    """Jobs answered only when the merge settles them: a helper slower than the layers."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: list[tuple] = []

    def submit(self, kind, fd, path, size, done, *, shown=False) -> None:
        self.waiting.append((kind, fd, path, size, done))

    def poll(self) -> None:
        pass

    def settle(self) -> None:
        while self.waiting:
            kind, fd, path, size, done = self.waiting.pop(0)
            try:
                answer = self.run(kind, fd, path, size)
            finally:
                os.close(fd)
            done(answer)


def test_a_reinstalled_library_whose_predecessor_trim_is_still_running_is_trimmed_itself(
    tmp_path, library, small_trim, start_trims
):
    """The reuse never waits: with the first trim unanswered, the second file is written whole and
    trimmed on its own, and the view ends the same; the first trim's late answer is dropped."""
    content = library.read_bytes()
    path = f"{SP}/a/libx.so"
    work = tmp_path / "work"
    work.mkdir()
    state = new_state(str(work), ImageOptions(), helpers=_AnsweredLater())
    extract_archive(
        str(docker_save(tmp_path / "save.tar", [layer((path, content)), layer((path, content))])), str(work), state
    )
    assert start_trims == [False, False]
    merge.finish(state)
    shown = Path(state.root) / path
    want_bytes, want_facts = _punched_and_facts(content, tmp_path / "reference" / path, shown)
    assert shown.read_bytes() == want_bytes
    info = shown.stat()
    assert whole.facts_still_shown(state) == {(info.st_dev, info.st_ino): want_facts}


def test_a_reinstalled_library_of_other_bytes_is_made_whole_from_its_layer(
    tmp_path, library, small_trim, start_trims, identity
):
    """Same path and size, other bytes: the reused trim left holes where this file has bytes of
    its own, so it is made whole from its layer after the last layer, and no fact of the first
    passes for its."""
    content = library.read_bytes()
    other = _variant(content, library)
    path = f"{SP}/a/libx.so"
    state = _merged(tmp_path, [layer((path, content)), layer((path, other))])
    assert start_trims == [False, True]
    shown = Path(state.root) / path
    assert shown.read_bytes() != other
    assert list(state.incomplete.values()) == [str(shown)]
    assert whole.facts_still_shown(state) == {}
    merge.finish(state)
    assert shown.read_bytes() == other
    assert list(state.trimmed) == [0]  # the first copy, no longer shown; the second is whole
    assert not state.findings
    groups, _ = waste.analyse(state)
    assert groups == []


def test_reinstalled_libraries_give_the_report_of_full_extraction(tmp_path, library, small_trim, run_cli):
    """Through the command (helpers beside the merge): a reinstall of the same bytes, one of
    other bytes, and one that a later layer removes again."""
    content = library.read_bytes()
    other = _variant(content, library)
    layers = [
        layer((f"{SP}/a/libx.so", content), (f"{SP}/b/libx.so", content), (f"{SP}/c/liby.so", other)),
        layer((f"{SP}/a/libx.so", content), (f"{SP}/b/libx.so", other), (f"{SP}/c/liby.so", other)),
        layer((f"{SP}/c/.wh.liby.so", b"")),
    ]
    archive = docker_save(tmp_path / "save.tar", layers)
    reports = _default_and_full(run_cli, archive, tmp_path)
    assert reports["default"] == reports["full"]
    groups = reports["default"]["image"]["waste"]["groups"]
    assert sorted(sorted((c["layer"], c["path"]) for c in g["copies"]) for g in groups) == [
        [(0, f"/{SP}/a/libx.so"), (0, f"/{SP}/b/libx.so"), (1, f"/{SP}/a/libx.so")],
        [(0, f"/{SP}/c/liby.so"), (1, f"/{SP}/b/libx.so"), (1, f"/{SP}/c/liby.so")],
    ]


def test_a_file_written_without_punched_ranges_equals_one_punched_after(tmp_path):
    rng = random.Random(11)
    for round_ in range(20):
        size = rng.randrange(1, 40) * trim.BLOCK + rng.randrange(trim.BLOCK)
        data = rng.randbytes(size)
        blocks = sorted(rng.sample(range(size // trim.BLOCK + 1), rng.randrange(size // trim.BLOCK + 1)))
        punched = trim._merged([(b * trim.BLOCK, (b + 1) * trim.BLOCK) for b in blocks if (b + 1) * trim.BLOCK <= size])
        reference = tmp_path / f"punched-{round_}"
        reference.write_bytes(data)
        fd = os.open(reference, os.O_RDWR)
        try:
            assert trim.punch(fd, punched) == sum(end - start for start, end in punched)
        finally:
            os.close(fd)
        written = tmp_path / f"written-{round_}"
        out = whole.KeptWriter(str(written), punched)
        at = 0
        while at < size:
            step = rng.choice((1, 511, trim.BLOCK, 3 * trim.BLOCK + 7, 65536))
            out.write(data[at : at + step])
            at += step
        out.truncate(size)
        out.close()
        assert written.read_bytes() == reference.read_bytes()
        assert written.stat().st_blocks <= reference.stat().st_blocks


@pytest.mark.parametrize("how", ["replaced", "whiteout", "opaque", "directory"])
def test_facts_of_a_removed_trimmed_library_never_reach_the_file_after_it(tmp_path, library, monkeypatch, how):
    """ext4 gives a freed inode to the next file it creates: the facts read while trimming a
    library a later layer removes must not pass for those of the file then at its path."""
    plain = build(tmp_path / "plain", "libplain.so", functions=3, seed=1)
    plain_text = plain.read_bytes().replace(b"CommandLine", b"commandline")  # no LLVM message
    monkeypatch.setattr(trim, "TRIM_MIN_BYTES", len(plain_text) + 1)  # the library is trimmed, not its successor
    path = f"{SP}/a/libx.so"
    later = {
        "replaced": [layer((path, plain_text))],
        "whiteout": [layer((f"{SP}/a/.wh.libx.so", b"")), layer((path, plain_text))],
        "opaque": [layer((f"{SP}/a/.wh..wh..opq", b""), (f"{SP}/a/other", b"")), layer((path, plain_text))],
        "directory": [layer((f"{SP}/.wh.a", b"")), layer((path, plain_text))],
    }[how]
    state = _state(tmp_path, [layer((path, library.read_bytes())), *later])
    assert len(state.read_facts) <= 1
    known = whole.facts_still_shown(state)
    assert known == {}, "the facts of the removed library, for the file now at its path"


def test_a_layer_that_does_not_give_the_bytes_again_leaves_the_file_out(tmp_path, library, small_trim):
    content = library.read_bytes()
    work = tmp_path / "work"
    work.mkdir()
    state = new_state(str(work), ImageOptions())
    state.placeholders = True

    @contextlib.contextmanager
    def changed():
        yield io.BytesIO(layer((f"{SDK}/a/libx.so", _variant(content, library))))

    merge.apply_layer(state, io.BytesIO(layer((f"{SDK}/a/libx.so", content))), 0, "l0", "save.tar:l0", again=changed)
    merge.apply_layer(state, io.BytesIO(layer((f"{SDK}/b/libx.so", _variant(content, library)))), 1, "l1", "save:l1")
    merge.finish(state)
    assert not (Path(state.root) / SDK / "a/libx.so").exists()
    assert [f.rule for f in state.findings] == ["IMG001"]
    assert "did not give the bytes" in state.findings[0].message


@pytest.mark.vendor
@pytest.mark.long
def test_image_of_real_llvm_libraries_reports_what_full_extraction_reports(tmp_path, run_cli):
    """Real LLVM carriers (registrants, exporters, hidden copies, plugins; sha256-pinned): trimmed
    to the blocks the checks read, the report equals that of writing every byte."""
    from support.llvm.carriers import build_tree

    tree = build_tree(
        tmp_path / "carriers", ("llvm15", "clang15", "rocmllvm", "llvmlite050", "triton38", "flydsl", "rocmllvm62")
    )
    archive = docker_save_of_directories(tmp_path / "save.tar", [[(tree.root, f"{SP}/carriers")]])
    reports = _default_and_full(run_cli, archive, tmp_path)
    assert reports["default"]["findings"], "the carriers give LLVM findings"
    assert reports["default"] == reports["full"]
    work = tmp_path / "work"
    work.mkdir()
    state = new_state(str(work), ImageOptions())
    extract_archive(str(archive), str(work), state)
    allocated = sum(os.lstat(os.path.join(d, f)).st_blocks * 512 for d, _, files in os.walk(state.root) for f in files)
    apparent = sum(os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(state.root) for f in files)
    assert len(state.trimmed) >= 5
    assert allocated < apparent / 2, (allocated, apparent)
    # The LLVM facts read while trimming, handed to the checks, are those the checks read.
    merge.finish(state)
    known = whole.facts_still_shown(state)
    assert any(LINKAGE_FACT in facts for facts in known.values())
    for identity, facts in known.items():
        path = state.read_facts[identity][0]
        fd = os.open(path, os.O_RDONLY)
        try:
            view = ElfView(fd)
            assert facts[ROLE_FACT] == classify(path, view.dynamic, view)
            if LINKAGE_FACT in facts:
                assert facts[LINKAGE_FACT] == read_linkage(path, view.dynamic, view)
        finally:
            os.close(fd)


def test_a_file_written_unbuffered_gets_every_byte_when_a_write_takes_part(tmp_path):
    """The merge writes small files unbuffered; a write(2) may take part of a piece (a signal, a
    nearly full disk): the rest is written, not dropped."""
    from rocm_audit.image import merge

    class Partial(io.FileIO):  # a real file whose every write takes at most 1,000 bytes
        def write(self, data):  # type: ignore[override]
            return super().write(bytes(data[:1000]))

    data = os.urandom(12_345)
    with Partial(tmp_path / "f", "wb") as out:
        merge._write_all(out, data)
    assert (tmp_path / "f").read_bytes() == data
