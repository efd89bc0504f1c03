"""elf/search.py's find (libc memmem through ctypes) gives bytes.find's answers."""

from __future__ import annotations

import os

import pytest

from rocm_audit.elf import search

MAGICS = [b"CCOB", b"__CLANG_OFFLOAD_BUNDLE__", b"\x7fELF\x02\x01\x01", b"\0", b"ab"]


def test_memmem_is_what_the_search_uses_here():
    """glibc has memmem: the fast path is the one the other tests exercise."""
    assert search._load() is not None


@pytest.mark.parametrize("needle", MAGICS)
def test_every_hit_and_start_agree_with_bytes_find(needle):
    seed = os.urandom(4096)
    data = seed[:1000] + needle + seed[1000:3000] + needle + needle + seed[3000:] + needle
    starts = sorted({0, 1, 999, 1000, 1001, len(data) - len(needle), len(data) - 1, len(data), len(data) + 5})
    starts += [i for i in range(0, len(data), 97)]
    for start in starts:
        assert search.find(data, needle, start) == data.find(needle, start), start


def test_edge_cases_agree_with_bytes_find():
    for data, needle, start in [
        (b"", b"CCOB", 0),
        (b"CCO", b"CCOB", 0),
        (b"CCOB", b"CCOB", 0),
        (b"CCOB", b"CCOB", 1),
        (b"xxCCOB", b"", 3),
        (b"xxCCOB", b"CCOB", -3),
        (b"CCOBCCOB", b"CCOB", 4),
    ]:
        assert search.find(data, needle, start) == data.find(needle, start), (data, needle, start)


def test_a_large_window_of_random_bytes():
    data = os.urandom(1 << 20)
    for needle in (data[123456:123460], data[-4:], b"CCOB"):
        for start in (0, 5000, 123456, 123457, len(data) - 4):
            assert search.find(data, needle, start) == data.find(needle, start)
