"""The AOTriton ``.aks2`` reader (formats/aks2.py): hipengine 0.8.3's real archives, checked against a
second decode of each whole file with Python's lzma, and hostile archives written at test time."""

from __future__ import annotations

import lzma
import os
import struct
from pathlib import Path

import pytest

from rocm_audit.errors import FormatError
from rocm_audit.formats import aks2 as reader
from rocm_audit.formats import amdgpu_elf
from support.aotriton import aks2
from support.toolchain import gfx942_code_object
from support.vendor import install_aotriton_images

GFX11_PROCESSORS = {"gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153"}


@pytest.fixture(scope="module")
def hipengine_archives(cache_dir: str, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return install_aotriton_images(cache_dir, tmp_path_factory.mktemp("hipengine-lib"))


def _whole_decode(data: bytes) -> list[tuple[str, int, bytes]]:
    """(name, image size, image) of every entry, by decompressing the whole xz stream at once."""
    _magic, content_size, count, directory_size = struct.unpack_from("<4sIII", data)
    content = lzma.decompress(data[16:])
    assert len(content) == content_size
    entries, pos = [], 0
    for _ in range(count):
        _shared, _threads, offset, size, name_length = struct.unpack_from("<5I", content, pos)
        name = content[pos + 20 : pos + 20 + name_length - 1].decode()
        pos += 20 + name_length
        entries.append((name, size, content[directory_size + offset : directory_size + offset + size]))
    assert pos == directory_size
    return entries


@pytest.mark.vendor  # hipengine 0.8.3's sdist, sha256-pinned (20 MB)
def test_hipengine_archives_hold_1632_gfx11_code_objects(hipengine_archives: list[Path]) -> None:
    assert len(hipengine_archives) == 12
    assert {p.parent.parent.parent.name for p in hipengine_archives} == {"amd-gfx11xx"}
    total, processors = 0, set()
    for path in hipengine_archives:
        data = path.read_bytes()
        archive = reader.parse(data)
        expected = _whole_decode(data)
        assert [(k.name, k.size) for k in archive.kernels] == [(n, s) for n, s, _ in expected]
        for kernel, (_name, _size, image) in zip(archive.kernels, expected, strict=True):
            assert kernel.head == image[: reader.HEAD_BYTES]
            target = amdgpu_elf.parse_header(kernel.head).identity.target_id
            whole = amdgpu_elf.parse_header(image[:64]).identity.target_id
            assert target == whole
            processors.add(target)
        total += len(archive.kernels)
    assert total == 1632
    assert processors == GFX11_PROCESSORS


@pytest.mark.toolchain  # a gfx942 code object built by clang-19
def test_decompression_stops_after_the_last_elf_header(tmp_path: Path) -> None:
    big = os.urandom(3 << 20)  # incompressible: the tail the reader must not inflate
    code = gfx942_code_object(tmp_path).read_bytes()
    data = aks2([("small", code), ("last", code + big)])
    archive = reader.parse(data)
    directory = archive.header.directory_size
    assert archive.decompressed == directory + len(code) + reader.HEAD_BYTES
    assert archive.decompressed < archive.header.uncompressed_size - (3 << 20) + reader.HEAD_BYTES + 1
    assert [amdgpu_elf.parse_header(k.head).identity.target_id for k in archive.kernels] == ["gfx942", "gfx942"]


@pytest.mark.toolchain  # a gfx942 code object built by clang-19
def test_an_empty_image_has_no_head(tmp_path: Path) -> None:
    code = gfx942_code_object(tmp_path).read_bytes()
    archive = reader.parse(aks2([("failed", b""), ("ok", code)]))
    assert [(k.name, k.size, len(k.head)) for k in archive.kernels] == [("failed", 0, 0), ("ok", len(code), 64)]


def _error(data: bytes) -> FormatError:
    with pytest.raises(FormatError) as caught:
        reader.parse(data)
    return caught.value


def test_truncated_xz_stream_names_the_file_offset() -> None:
    data = aks2([("a", os.urandom(200_000)), ("b", os.urandom(200_000))])
    cut = data[: len(data) // 2]
    error = _error(cut)
    assert error.fmt == reader.FMT and "truncated" in error.reason
    assert 16 < error.offset <= len(cut)


def test_absurd_count_is_refused_before_any_decompression() -> None:
    error = _error(aks2([("a", b"x" * 64)], count=0xFFFFFFFF))
    assert (error.fmt, error.offset) == (reader.FMT, 8)
    assert "4294967295" in error.reason


def test_absurd_directory_size_is_refused() -> None:
    error = _error(aks2([("a", b"x" * 64)], directory_size=0xFFFFFFF0, uncompressed_size=0xFFFFFFFF))
    assert (error.fmt, error.offset) == (reader.FMT, 12)


def test_a_name_running_past_the_directory_end() -> None:
    error = _error(aks2([("kernel", b"x" * 64)], name_lengths={0: 5000}))
    assert error.fmt == reader.CONTENT_FMT
    assert error.offset == 16 and "name of 5000 bytes" in error.reason


def test_an_image_running_past_the_content() -> None:
    data = bytearray(aks2([("kernel", b"x" * 64)]))
    # the same archive with a content size 10 bytes short: the image no longer fits
    struct.pack_into("<I", data, 4, struct.unpack_from("<I", data, 4)[0] - 10)
    error = _error(bytes(data))
    assert error.fmt == reader.CONTENT_FMT and error.offset == 8 and "runs past" in error.reason


def test_entries_that_do_not_end_at_the_directory_size() -> None:
    good = aks2([("k", b"x" * 64)])
    directory = struct.unpack_from("<I", good, 12)[0]
    content = struct.unpack_from("<I", good, 4)[0]
    error = _error(aks2([("k", b"x" * 64)], directory_size=directory + 3, uncompressed_size=content + 3))
    assert error.fmt == reader.CONTENT_FMT and error.offset == directory


def test_corrupt_xz_data_and_a_bad_magic() -> None:
    data = bytearray(aks2([("k", os.urandom(4096))]))
    data[40:48] = b"\xff" * 8
    assert _error(bytes(data)).fmt == reader.FMT
    assert _error(b"AKS1" + bytes(data[4:])).offset == 0
    assert _error(b"AKS2").offset == 0


def test_content_longer_than_its_header_says() -> None:
    data = bytearray(aks2([("k", b"x" * 64), ("l", b"y" * 64)]))
    struct.pack_into("<I", data, 4, struct.unpack_from("<I", data, 12)[0] + 32)  # images: 32 bytes
    error = _error(bytes(data))
    assert "runs past" in error.reason  # the second image does not fit the declared content


def test_stream_ending_before_a_head_it_needs() -> None:
    content = struct.pack("<5I", 0, 0, 0, 64, 2) + b"k\0"  # the image is missing from the stream
    data = struct.pack("<4sIII", b"AKS2", len(content) + 64, 1, len(content)) + lzma.compress(content)
    error = _error(data)
    assert error.fmt == reader.CONTENT_FMT and error.offset == len(content) and "ends" in error.reason
