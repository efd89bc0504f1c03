"""The comparison funnel (identical.py) against the obvious reference: group files by their bytes.

Chunk, head and tail sizes are shrunk to a few bytes so that generated files cross every boundary
(head, tail, chunk, last partial chunk) where an off-by-one would merge or split classes.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocm_audit.tree import identical
from rocm_audit.tree.identical import Candidate, CompareStats, partition_identical, same_bytes

pytestmark = pytest.mark.fuzz  # hypothesis properties over generated files


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(identical, "HEAD_BYTES", 8)
    monkeypatch.setattr(identical, "TAIL_BYTES", 8)
    monkeypatch.setattr(identical, "CHUNK_BYTES", 16)


def _reference(contents: dict[str, bytes]) -> set[frozenset[str]]:
    by_bytes: dict[bytes, set[str]] = {}
    for path, data in contents.items():
        by_bytes.setdefault(data, set()).add(path)
    return {frozenset(paths) for paths in by_bytes.values() if len(paths) > 1}


def _write(directory: Path, variants: list[bytes], picks: list[int]) -> dict[str, bytes]:
    contents = {}
    for number, pick in enumerate(picks):
        path = directory / f"f{number}"
        path.write_bytes(variants[pick])
        contents[str(path)] = variants[pick]
    return contents


def _mutations(size: int):
    """Variants of one base file that differ at one offset each, biased to the boundaries."""
    offsets = st.one_of(
        st.integers(0, size - 1),
        st.sampled_from(
            sorted({o for o in (0, 7, 8, 9, 15, 16, 17, 31, 32, size - 9, size - 8, size - 1) if 0 <= o < size})
        ),
    )
    return st.lists(offsets, min_size=1, max_size=4)


@st.composite
def file_sets(draw):
    # sizes around head (8), head + tail (16), chunk multiples (16, 32, 48) and their neighbours
    boundaries = [1, 7, 8, 9, 15, 16, 17, 24, 25, 31, 32, 33, 47, 48, 49]
    size = draw(st.one_of(st.sampled_from(boundaries), st.integers(1, 80)))
    base = draw(st.binary(min_size=size, max_size=size))
    variants = [base]
    for offset in draw(_mutations(size)):
        changed = bytearray(base)
        changed[offset] ^= 0xFF
        variants.append(bytes(changed))
    picks = draw(st.lists(st.integers(0, len(variants) - 1), min_size=2, max_size=9))
    return variants, picks


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=file_sets(), digested=st.booleans(), lockstep_limit=st.sampled_from([2, 64]))
def test_classes_are_exactly_the_groups_of_equal_bytes(
    tmp_path_factory, small_blocks, monkeypatch, case, digested, lockstep_limit
):
    monkeypatch.setattr(identical, "MAX_LOCKSTEP_MEMBERS", lockstep_limit)  # also the digest fallback
    variants, picks = case
    contents = _write(tmp_path_factory.mktemp("files"), variants, picks)
    candidates = [
        Candidate(path, len(data), hashlib.blake2b(data[:8], digest_size=16).digest() if digested else None)
        for path, data in contents.items()
    ]
    failures: list[identical.ReadFailure] = []
    classes = partition_identical(candidates, CompareStats(), failures)
    assert not failures
    assert {frozenset(c.path for c in cls) for cls in classes} == _reference(contents)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=file_sets(), piece_bytes=st.integers(1, 40))
def test_head_and_tail_then_the_middle_in_pieces_refine_to_the_same_classes(
    tmp_path_factory, small_blocks, case, piece_bytes
):
    """What dedup does with helpers: head and tail first (full=False), then each probable class's
    middle in pieces compared separately; refining by every piece gives exactly the classes of
    equal bytes."""
    variants, picks = case
    contents = _write(tmp_path_factory.mktemp("files"), variants, picks)
    size = len(variants[0])
    candidates = [Candidate(path, size, None) for path in contents]
    probable = partition_identical(candidates, CompareStats(), [], full=False)
    middle = identical.middle_pieces(size, piece_bytes)
    covered = [b for start, end in middle for b in range(start, end)]
    assert covered == list(range(identical.HEAD_BYTES, max(min(size, 8), size - 8)))  # each middle byte once
    assert all((start - 8) % 16 == 0 for start, _ in middle)  # whole chunks from the head on
    classes = []
    for members in probable:
        partitions = [identical.equal_over(members, byte_range, CompareStats(), []) for byte_range in middle]
        classes.extend(identical.refine(members, partitions))
    assert {frozenset(c.path for c in cls) for cls in classes} == _reference(contents)


@pytest.mark.parametrize("size", [0, 1, 15, 16, 17, 100])
def test_pieces_cover_every_byte_once_in_whole_chunks(small_blocks, size):
    for piece_bytes in (1, 16, 20, 33, 1000):
        ranges = identical.pieces(size, piece_bytes)
        assert [b for start, end in ranges for b in range(start, end)] == list(range(size))
        step = max(16, piece_bytes - piece_bytes % 16)  # whole chunks (16 bytes here)
        assert [start for start, _ in ranges] == (list(range(0, size, step)) or [0])


def test_same_bytes_over_a_range_sees_only_that_range_and_growth_only_at_the_end(tmp_path, small_blocks):
    data = bytes(range(64))
    (tmp_path / "a").write_bytes(data)
    other = bytearray(data)
    other[40] ^= 1
    (tmp_path / "b").write_bytes(bytes(other))
    (tmp_path / "grown").write_bytes(data + b"!")
    a, b, grown = (str(tmp_path / n) for n in ("a", "b", "grown"))
    assert same_bytes(a, b, 64, CompareStats(), (0, 40)) and same_bytes(a, b, 64, CompareStats(), (41, 64))
    assert not same_bytes(a, b, 64, CompareStats(), (32, 48))
    assert same_bytes(a, grown, 64, CompareStats(), (0, 48))  # growth is the last piece's business
    assert not same_bytes(a, grown, 64, CompareStats(), (48, 64))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=file_sets(), lockstep_limit=st.sampled_from([2, 64]))
def test_the_head_filter_sees_each_class_once_and_drops_what_it_rejects(
    tmp_path_factory, small_blocks, monkeypatch, case, lockstep_limit
):
    monkeypatch.setattr(identical, "MAX_LOCKSTEP_MEMBERS", lockstep_limit)
    variants, picks = case
    contents = _write(tmp_path_factory.mktemp("files"), variants, picks)
    asked: list[tuple[str, bytes]] = []

    def odd_first_byte(path: str, fd: int, head: memoryview) -> bool:
        assert os.pread(fd, len(head), 0) == bytes(head)  # the open file and the bytes agree
        asked.append((path, bytes(head)))
        return head[0] % 2 == 1

    candidates = [Candidate(path, len(data), None) for path, data in contents.items()]
    classes = partition_identical(candidates, CompareStats(), [], odd_first_byte)
    expected = {cls for cls in _reference(contents) if contents[next(iter(cls))][0] % 2 == 1}
    assert {frozenset(c.path for c in cls) for cls in classes} == expected
    # Asked about each group of equal first bytes (the head, or the whole file when it fits in one
    # chunk), never about a file no other file agrees with, and with that group's real bytes.
    for path, head in asked:
        assert contents[path][: len(head)] == head and len(head) >= min(8, len(contents[path]))
        assert sum(1 for data in contents.values() if data[: len(head)] == head) > 1
    if lockstep_limit == 64:  # (the digest fallback asks once per class of equal bytes instead)
        assert len({head for _, head in asked}) == len(asked)


def test_a_file_that_shrinks_during_the_comparison_is_not_a_duplicate(tmp_path, small_blocks):
    data = bytes(range(64))
    for name in ("a", "b", "c"):
        (tmp_path / name).write_bytes(data)
    candidates = [Candidate(str(tmp_path / name), len(data), None) for name in ("a", "b", "c")]
    os.truncate(tmp_path / "c", 40)  # the size the candidates carry is now stale for c
    classes = partition_identical(candidates, CompareStats(), [])
    assert [sorted(c.path for c in cls) for cls in classes] == [[str(tmp_path / "a"), str(tmp_path / "b")]]


def test_an_unreadable_member_is_a_failure_and_the_rest_are_still_grouped(tmp_path, small_blocks):
    data = b"x" * 50
    for name in ("a", "b", "c"):
        (tmp_path / name).write_bytes(data)
    os.symlink(tmp_path / "a", tmp_path / "link")  # never followed: O_NOFOLLOW
    candidates = [Candidate(str(tmp_path / name), len(data), None) for name in ("a", "b", "c", "link")]
    failures: list[identical.ReadFailure] = []
    classes = partition_identical(candidates, CompareStats(), failures)
    assert [f.path for f in failures] == [str(tmp_path / "link")]
    assert [sorted(c.path for c in cls) for cls in classes] == [[str(tmp_path / n) for n in ("a", "b", "c")]]


@pytest.mark.parametrize("offset", [0, 15, 16, 63, None])
def test_same_bytes_finds_a_difference_at_any_offset_and_a_grown_file(tmp_path, small_blocks, offset):
    data = bytes(range(64))
    (tmp_path / "a").write_bytes(data)
    other = bytearray(data)
    if offset is None:
        other += b"!"  # grew after the plan took its size
    else:
        other[offset] ^= 1
    (tmp_path / "b").write_bytes(bytes(other))
    assert same_bytes(str(tmp_path / "a"), str(tmp_path / "a"), 64, CompareStats())
    assert not same_bytes(str(tmp_path / "a"), str(tmp_path / "b"), 64, CompareStats())


@pytest.mark.parametrize("digested", [True, False])
def test_a_single_flipped_byte_at_every_offset_splits_the_pair(tmp_path, small_blocks, digested):
    """Exhaustive over sizes up to three chunks: every byte is compared by exactly one range."""
    for size in range(1, 50):
        base = bytes((7 * i + size) % 251 for i in range(size))
        (tmp_path / "a").write_bytes(base)
        (tmp_path / "same").write_bytes(base)
        assert len(_pair_classes(tmp_path, "same", base, digested)) == 1, size
        for offset in range(size):
            changed = bytearray(base)
            changed[offset] ^= 0x80
            (tmp_path / "b").write_bytes(bytes(changed))
            assert _pair_classes(tmp_path, "b", bytes(changed), digested) == [], (size, offset)


def _pair_classes(directory: Path, other: str, other_bytes: bytes, digested: bool) -> list:
    base = (directory / "a").read_bytes()
    candidates = [
        Candidate(
            str(directory / name), len(data), hashlib.blake2b(data[:8], digest_size=16).digest() if digested else None
        )
        for name, data in (("a", base), (other, other_bytes))
    ]
    return partition_identical(candidates, CompareStats(), [])


@pytest.mark.parametrize("chunk_bytes", [16, identical.CHUNK_BYTES])
def test_read_buffers_start_on_a_page_boundary_and_compare_only_their_own_bytes(monkeypatch, chunk_bytes):
    import ctypes

    monkeypatch.setattr(identical, "CHUNK_BYTES", chunk_bytes)
    buffers = CompareStats().buffers(3)
    assert len({id(b.storage) for b in buffers}) == 3
    for buffer in buffers:
        assert ctypes.addressof(ctypes.c_char.from_buffer(buffer.view)) % identical.BUFFER_ALIGNMENT == 0
        assert len(buffer.view) == chunk_bytes
        buffer.storage[:] = b"x" * len(buffer.storage)  # what lies outside the view must not count
        buffer.view[:4] = b"abcd"
        assert buffer.begins_with(memoryview(b"abcd")) and buffer.begins_with(memoryview(b"abc"))
        assert not buffer.begins_with(memoryview(b"abce"))
        assert not buffer.begins_with(memoryview(b"xabc"))


def test_without_ctypes_buffers_are_unaligned_and_classes_stay_exact(tmp_path, small_blocks, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctypes", None)  # an interpreter built without ctypes: import fails
    variants = [bytes(range(40)), bytes(range(1, 41)), bytes(range(40))[:-1] + b"!"]
    contents = _write(tmp_path, variants, [0, 1, 0, 2, 1, 0])
    assert CompareStats().buffers(1)[0].start == 0
    classes = partition_identical([Candidate(p, 40, None) for p in contents], CompareStats(), [])
    assert {frozenset(c.path for c in cls) for cls in classes} == _reference(contents)


@pytest.mark.parametrize("full", [True, False])
def test_a_member_with_a_head_digest_and_one_without_are_still_compared(tmp_path, small_blocks, full):
    """dedup's inventory reads the heads of hardlinked files only: TheRock's devel aliases (one
    inode, several links) carry a digest, the split runtime copy does not. They hold the same bytes
    and must land in one class (issue 15: a first run never compared them)."""
    data = bytes(range(40))
    multi, single = tmp_path / "devel.so.3", tmp_path / "core.so.3"
    multi.write_bytes(data)
    single.write_bytes(data)
    candidates = [
        Candidate(str(multi), len(data), identical.head_digest(data[: identical.HEAD_BYTES])),
        Candidate(str(single), len(data), None),
    ]
    classes = partition_identical(candidates, CompareStats(), [], full=full)
    assert [sorted(c.path for c in cls) for cls in classes] == [sorted([str(multi), str(single)])]
