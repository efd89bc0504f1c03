"""The zstd frame index (formats/zstd_index.py, _zstdindex.c) against libzstd, the reference.

Frames come from the real encoders: libzstd through python-zstandard at several levels, with
long-distance matching and wide windows (as clang's offload bundler writes them), with and without
checksums and declared sizes, raw and RLE blocks; clang-offload-bundler-19 --compress over real
clang-built code objects; and the CCOBs of the pinned vendor wheels. Every byte the index serves
must be libzstd's byte; every frame libzstd refuses must be refused; and no input, however cut or
flipped, may raise anything but FormatError or IndexTooLarge.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest
import zstandard

from rocm_audit.errors import FormatError
from rocm_audit.formats import zstd_index

pytestmark = [
    pytest.mark.skipif(not zstd_index.available(), reason="the _zstdindex extension is not built"),
    pytest.mark.fuzz,  # differential runs against libzstd over many frames
]


def _codeish(size: int, seed: int, *, noise: bool = True) -> bytes:
    """Bytes shaped like a bundle of code objects for many GPUs: blocks of random words that
    recur with small edits far apart (what long-distance matching finds across entries); with
    ``noise``, also stretches of random bytes (raw blocks) and more edits."""
    rng = random.Random(seed)
    words = [rng.randbytes(rng.randint(2, 12)) for _ in range(400)]
    unique = size // (7 if noise else 40)  # what the entries share: real bundles inflate 40-100x
    base = b"".join(rng.choice(words) for _ in range(unique // 7 + 1))[:unique]
    out = bytearray()
    while len(out) < size:
        cut = rng.randrange(len(base))
        piece = bytearray(base[cut : cut + rng.randint(1000, 60000)])
        for _ in range(len(piece) // (500 if noise else 5000)):
            piece[rng.randrange(len(piece))] = rng.randrange(256)
        out += piece
        if rng.random() < 0.1:
            out += b"\0" * rng.randint(1, 5000)  # alignment padding: RLE blocks and offset-1 runs
        if noise and rng.random() < 0.05:
            out += rng.randbytes(rng.randint(100, 200000))  # incompressible: raw blocks
    return bytes(out[:size])


def _check(frame: bytes, content: bytes, rng: random.Random, reads: int = 60) -> zstd_index.FrameIndex:
    index = zstd_index.FrameIndex(frame, 0)
    assert index.size == len(content)
    for _ in range(reads // 3):  # reads before every block is decoded
        start = rng.randrange(len(content) + 10)
        assert index.read(start, 3000) == content[start : start + 3000]
    assert index.decode_all() <= len(frame)
    assert index.read(0, len(content)) == content
    for _ in range(reads):
        start = rng.randrange(len(content) + 10)
        length = rng.choice([1, 7, 64, 4096, 70000, 10**9])
        assert index.read(start, length) == content[start : start + length]
    return index


ENCODINGS = {
    "level1": {"level": 1},
    "level3-checksum": {"level": 3, "write_checksum": True},
    "level9-no-size": {"level": 9, "write_content_size": False},
    "level19": {"level": 19},
    "ldm-window27": {
        "compression_params": zstandard.ZstdCompressionParameters.from_level(
            3, enable_ldm=True, window_log=27, write_content_size=True
        )
    },
    "ldm-level19": {
        "compression_params": zstandard.ZstdCompressionParameters.from_level(
            19, enable_ldm=True, window_log=25, write_content_size=True
        )
    },
}


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("size", [0, 1, 100, 131072, 131073, 3 << 20])
def test_every_byte_is_libzstds(encoding, size):
    rng = random.Random(size)
    content = _codeish(size, size) if size > 200 else rng.randbytes(size)
    compressor = zstandard.ZstdCompressor(**ENCODINGS[encoding])
    if encoding == "level9-no-size":
        # a streamed frame: no content size, a window below the content
        writer = compressor.compressobj()
        frame = writer.compress(content) + writer.flush()
    else:
        frame = compressor.compress(content)
    _check(frame, content, rng)


def test_indexes_on_threads_let_go_of_the_gil_and_each_is_one_threads_at_a_time():
    """Indexes decoded and read on three threads at once give libzstd's bytes; while a thread
    decodes, another runs Python (the extension lets go of the GIL) and a second call on the same
    index is refused with RuntimeError instead of racing it (prune --fatbins slims on threads)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    content = _codeish(24 << 20, 9, noise=False)
    params = zstandard.ZstdCompressionParameters.from_level(3, enable_ldm=True, window_log=27)
    frame = zstandard.ZstdCompressor(compression_params=params).compress(content)

    def whole(start: int) -> bytes:
        index = zstd_index.FrameIndex(frame, 0)
        return index.read(start, len(content))

    with ThreadPoolExecutor(3) as pool:
        assert list(pool.map(whole, [0, 1 << 20, 5 << 20])) == [content, content[1 << 20 :], content[5 << 20 :]]

    index = zstd_index.FrameIndex(frame, 0)
    used: list[int] = []
    decoder = threading.Thread(target=lambda: used.append(index.decode_all()))
    decoder.start()
    refusals = []
    while decoder.is_alive():
        try:
            index.nbytes  # noqa: B018 - a call on the index another thread is decoding
        except RuntimeError as exc:
            refusals.append(str(exc))
    decoder.join()
    assert refusals and all("in use by another thread" in r for r in refusals)
    assert used == [len(frame)]
    assert index.read(0, len(content)) == content  # the index is whole after the refusals


def test_block_types_and_table_modes_seen_in_real_frames():
    """Raw, RLE and compressed blocks, 1- and 4-stream Huffman literals, treeless literals, and
    every FSE table mode (predefined, RLE, compressed, repeat) come up in these frames."""
    rng = random.Random(7)
    samples = [
        b"\0" * (1 << 20),  # RLE blocks
        rng.randbytes(300000),  # raw blocks
        b"ab" * 200000,  # offset-2 runs across blocks
        _codeish(2 << 20, 11),
        bytes(range(256)) * 4000,
    ]
    for content in samples:
        for level in (1, 3, 12, 22):
            _check(zstandard.ZstdCompressor(level=level).compress(content), content, rng, reads=10)


def test_index_memory_is_the_sequences_not_the_window():
    """A 96 MiB frame with a 128 MiB window (long-distance matches across all of it) is indexed in
    a small fraction of its size: no window is held, and the index is a few bytes per input byte
    (jax's PJRT plugin: 8.6 MB for a 1.1 MB frame of 113 MB)."""
    content = _codeish(96 << 20, 3, noise=False)
    params = zstandard.ZstdCompressionParameters.from_level(3, enable_ldm=True, window_log=27)
    frame = zstandard.ZstdCompressor(compression_params=params).compress(content)
    assert zstandard.get_frame_parameters(frame).window_size >= len(content) // 2
    index = zstd_index.FrameIndex(frame, 0)
    index.decode_all()
    assert index.nbytes < len(content) // 8, (index.nbytes, len(content))
    assert index.nbytes < 12 * len(frame), (index.nbytes, len(frame))
    rng = random.Random(5)
    for _ in range(40):
        start = rng.randrange(len(content))
        assert index.read(start, 65536) == content[start : start + 65536]


def test_every_truncation_is_a_finding_at_an_offset_inside_the_input():
    rng = random.Random(1)
    content = _codeish(600000, 1)
    frame = zstandard.ZstdCompressor(level=6, write_checksum=False).compress(content)
    cuts = sorted({*range(0, 40), *rng.sample(range(len(frame)), 300)})
    for cut in cuts:
        with pytest.raises(FormatError) as caught:
            zstd_index.FrameIndex(frame[:cut], 1000).decode_all()
        assert 1000 <= caught.value.offset <= 1000 + cut, (cut, caught.value)
        assert caught.value.fmt == "zstd"


def test_flipped_bits_are_refused_as_libzstd_refuses_them_or_decode_as_it_does():
    """libzstd's one-shot decoder (what LLVM's bundler and comgr call) is the oracle: where it
    refuses a damaged frame the index refuses it (FormatError), where it decodes one the index
    serves the same bytes. Frames without a checksum, as the bundler writes them."""
    rng = random.Random(2)
    content = _codeish(200000, 2, noise=False)
    frame = bytearray(zstandard.ZstdCompressor(level=3).compress(content))
    oracle = zstandard.ZstdDecompressor()
    agreed = refused = 0
    for _ in range(600):
        damaged = bytearray(frame)
        for _ in range(rng.choice([1, 1, 2, 8])):
            damaged[rng.randrange(6, len(damaged))] ^= 1 << rng.randrange(8)
        try:
            expected = oracle.decompress(bytes(damaged), max_output_size=len(content) * 2)
        except zstandard.ZstdError:
            expected = None
        try:
            index = zstd_index.FrameIndex(bytes(damaged), 0)
            index.decode_all()
        except FormatError:
            assert expected is None, "the index refused a frame libzstd decodes"
            refused += 1
            continue
        assert expected is not None, "the index accepted a frame libzstd refuses"
        assert index.read(0, index.size) == expected
        agreed += 1
    assert refused > 100 and agreed > 10, (refused, agreed)  # both outcomes were exercised


def test_limits_raise_index_too_large_not_a_finding(monkeypatch):
    content = _codeish(1 << 20, 4)
    frame = zstandard.ZstdCompressor(level=3).compress(content)
    monkeypatch.setattr(zstd_index, "MAX_RECORDS", 100)
    with pytest.raises(zstd_index.IndexTooLarge):
        zstd_index.FrameIndex(frame, 0).decode_all()
    monkeypatch.undo()
    monkeypatch.setattr(zstd_index, "STEP_BUDGET", 2)
    monkeypatch.setattr(zstd_index, "STEPS_PER_BYTE", 0)
    index = zstd_index.FrameIndex(frame, 0)
    assert index.read(0, 1) == content[:1]  # a literal: one step
    with pytest.raises(zstd_index.IndexTooLarge):
        index.read(len(content) - 70000, 65536)


def _boundary_reads(index: zstd_index.FrameIndex, content: bytes, rng: random.Random) -> int:
    """Reads that start and end on both sides of block boundaries (128 KiB of output, the
    encoder's block size) and of the index's lookup table (every 256 bytes), and reads starting
    at every byte of a stretch (most of them inside a sequence's literals or match)."""
    reads = 0
    for boundary in [*range(0, len(content), 128 << 10), *rng.sample(range(0, len(content), 256), 20)]:
        for delta in (-257, -256, -255, -1, 0, 1, 255, 256, 257):
            start = boundary + delta
            if not 0 <= start < len(content):
                continue
            for length in (1, 255, 256, 257, 4096, 140000):
                assert index.read(start, length) == content[start : start + length], (start, length)
                reads += 1
    stretch = rng.randrange(len(content) - 1000)
    for start in range(stretch, stretch + 700):
        assert index.read(start, 300) == content[start : start + 300], start
        reads += 1
    return reads


def test_reads_across_blocks_and_inside_sequences_are_libzstds():
    """The same reads before every block is decoded (each read decodes up to its end) and after,
    on a frame of long-distance matches over a wide window (as clang's bundler writes them)."""
    content = _codeish(3 << 20, 21, noise=True)
    params = zstandard.ZstdCompressionParameters.from_level(3, enable_ldm=True, window_log=27)
    frame = zstandard.ZstdCompressor(compression_params=params).compress(content)
    assert zstandard.ZstdDecompressor().decompress(frame) == content
    lazy = zstd_index.FrameIndex(frame, 0)
    assert _boundary_reads(lazy, content, random.Random(21)) > 1000
    whole = zstd_index.FrameIndex(frame, 0)
    whole.decode_all()
    _boundary_reads(whole, content, random.Random(22))


def test_reads_across_blocks_of_a_frame_clang_writes(many_arch_libs):
    (frame,) = _ccob_frames((many_arch_libs / "libmanyc.so").read_bytes())
    content = zstandard.ZstdDecompressor().decompress(frame)
    _boundary_reads(zstd_index.FrameIndex(frame, 0), content, random.Random(23))


def _rle_frame(blocks: int, size: int = 128 << 10) -> bytes:
    """A frame of ``blocks`` RLE blocks of ``size`` bytes each, block k repeating byte k % 251:
    4 input bytes make 128 KiB of output, and no header declares how much (no content size)."""
    out = bytearray(b"\x28\xb5\x2f\xfd\x00\x38")  # magic; no size, no checksum; 128 KiB window
    for k in range(blocks):
        header = (k == blocks - 1) | 1 << 1 | size << 3
        out += header.to_bytes(3, "little") + bytes([k % 251])
    return bytes(out)


def _rle_content_at(start: int, length: int, size: int = 128 << 10) -> bytes:
    return bytes((position // size) % 251 for position in range(start, start + length))


def test_a_frame_of_rle_blocks_cannot_make_the_lookup_table_outgrow_the_limits(monkeypatch):
    """The lookup table (one record number per 256 bytes of output) grows with the output, and an
    RLE block makes 128 KiB of output from 4 input bytes: 20,000 of them (80 KB of input, 2.5 GiB
    of output) would ask for a 40 MiB table. It stops at MAX_RECORDS entries (4 bytes each),
    counted in nbytes, and reads past it still serve the frame's bytes."""
    small = _rle_frame(20)
    assert zstandard.ZstdDecompressor().decompressobj().decompress(small) == _rle_content_at(0, 20 << 17)
    frame = _rle_frame(20000)
    output = 20000 << 17
    index = zstd_index.FrameIndex(frame, 0)
    assert index.size == output
    limit = zstd_index.MAX_RECORDS * 4 + 20000 * (24 + 1) + 20000 // 16 * 8 * 2
    assert index.nbytes < limit, (index.nbytes, limit)
    assert index.nbytes > zstd_index.MAX_RECORDS * 4  # the table is counted, and full
    rng = random.Random(24)
    starts = [0, 1, (128 << 10) - 3, output // 2 - 1, output - (128 << 10) - 2, output - 300]
    starts += [rng.randrange(output - 300) for _ in range(40)]
    for start in starts:
        assert index.read(start, 300) == _rle_content_at(start, 300), start
    # a tighter limit: the records' limit bounds the table too, and reads still hold
    monkeypatch.setattr(zstd_index, "MAX_RECORDS", 1000)
    index = zstd_index.FrameIndex(_rle_frame(900), 0)
    assert index.read((900 << 17) - 5, 10) == _rle_content_at((900 << 17) - 5, 5)
    assert index.nbytes < 64 << 10, index.nbytes  # a table of 460,800 entries would be 1.8 MB
    for start in [0, 899 << 17, (450 << 17) - 1, *(rng.randrange(900 << 17) for _ in range(20))]:
        assert index.read(start, 3) == _rle_content_at(start, 3)[: (900 << 17) - start], start


def test_a_frame_that_needs_a_dictionary_is_refused():
    content = _codeish(50000, 9)
    dictionary = zstandard.train_dictionary(4096, [content[i : i + 2000] for i in range(0, 48000, 2000)])
    frame = zstandard.ZstdCompressor(dict_data=dictionary).compress(content)
    with pytest.raises(FormatError, match="dictionary"):
        zstd_index.FrameIndex(frame, 0).decode_all()


def _ccob_frames(data: bytes) -> list[bytes]:
    """The zstd frames of every CCOB v2/v3 in ``data``."""
    frames = []
    at = data.find(b"CCOB")
    while at >= 0:
        version, method = struct.unpack_from("<HH", data, at + 4)
        if version in (2, 3) and method == 1:
            total = struct.unpack_from("<I" if version == 2 else "<Q", data, at + 8)[0]
            frames.append(data[at + {2: 24, 3: 32}[version] : at + total])
        at = data.find(b"CCOB", at + 4)
    return frames


def test_frames_clang_writes(many_arch_libs):
    """clang++-19 --offload-compress (its offload bundler compresses the TU's bundle, ten GPUs)."""
    (frame,) = _ccob_frames((many_arch_libs / "libmanyc.so").read_bytes())
    content = zstandard.ZstdDecompressor().decompress(frame)
    assert len(content) > 4 << 20
    _check(frame, content, random.Random(3))


def test_real_vendor_ccobs(jax_plugin, bitsandbytes_libs):
    """Every CCOB of the pinned vendor wheels: the index serves libzstd's bytes throughout."""
    frames = 0
    for library in [*sorted(jax_plugin.glob("*.so")), *sorted(bitsandbytes_libs.glob("*.so"))]:
        for frame in _ccob_frames(Path(library).read_bytes()):
            content = zstandard.ZstdDecompressor().decompress(frame)
            _check(frame, content, random.Random(len(frame)), reads=30)
            frames += 1
    assert frames >= 8


def test_judging_the_last_entry_of_a_wide_window_bundle_holds_no_window(tmp_path, monkeypatch):
    """A CCOB shaped like jax's: one zstd frame with a 128 MiB window over 96 MiB of entries that
    share long stretches, gfx950 last. Judged through the index, peak memory grows by the index
    (a few MB); streamed, by the window libzstd must hold to reach the last entry."""
    import gc

    from rocm_audit.gpu import verify
    from rocm_audit.gpu.codeobjects import scan_file
    from rocm_audit.tree.discovery import resolve_roots
    from rocm_audit.tree.inventory import build_inventory
    from support.gpu.arch_writers import amdgpu_header, bundle, ccob
    from support.memory import peak_rss_kib, reset_peak_rss

    share = _codeish(96 << 20, 8, noise=False)
    step = len(share) // 3
    entries = [("host-x86_64-unknown-linux--", b"")] + [
        (f"hipv4-amdgcn-amd-amdhsa--{arch}", amdgpu_header(flags) + share[k * step : (k + 1) * step])
        for k, (arch, flags) in enumerate((("gfx90a", 0x53F), ("gfx942", 0x54C), ("gfx950", 0x54F)))
    ]
    payload = bundle(entries)
    del share, entries
    params = zstandard.ZstdCompressionParameters.from_level(3, enable_ldm=True, window_log=27)
    frame = zstandard.ZstdCompressor(compression_params=params).compress(payload)
    blob = ccob(payload, version=3)
    blob = blob[:32] + frame
    blob = blob[:8] + struct.pack("<Q", len(blob)) + blob[16:]
    (tmp_path / "wide.co").write_bytes(blob)
    del payload, frame, blob
    gc.collect()
    selection = verify.selection_for([verify.resolve_required("gfx950")])
    roots, _ = resolve_roots([str(tmp_path / "wide.co")])
    (record,) = build_inventory(roots).files

    def judged() -> tuple[int, list]:
        before = reset_peak_rss()
        scan = scan_file(record, None, selection)
        return peak_rss_kib() - before, [(o.bundle_target, o.target) for o in scan.code_objects]

    indexed_kib, indexed = judged()
    monkeypatch.setenv("ROCM_AUDIT_NO_ZSTD_INDEX", "1")
    streamed_kib, streamed = judged()
    assert indexed == streamed
    assert ("gfx950", "gfx950") in indexed
    assert streamed_kib > 60 * 1024, streamed_kib  # the window: most of the 96 MiB
    assert indexed_kib < 20 * 1024, indexed_kib


def test_a_damaged_bundle_reads_as_the_stream_reads_it(tmp_path, monkeypatch):
    """A CCOB over 1 MiB whose frame breaks before its last entry: the index meets the damage,
    and the CCOB is read by the stream instead, so the findings are the ones the stream gives
    (what precedes the damage listed, the damage named), with the index or without."""
    from rocm_audit.gpu import verify
    from rocm_audit.gpu.codeobjects import scan_file
    from rocm_audit.tree.discovery import resolve_roots
    from rocm_audit.tree.inventory import build_inventory
    from support.gpu.arch_writers import amdgpu_header, bundle, ccob

    share = _codeish(3 << 20, 12, noise=False)
    step = len(share) // 3
    entries = [("host-x86_64-unknown-linux--", b"")] + [
        (f"hipv4-amdgcn-amd-amdhsa--{arch}", amdgpu_header(flags) + share[k * step : (k + 1) * step])
        for k, (arch, flags) in enumerate((("gfx90a", 0x53F), ("gfx942", 0x54C), ("gfx950", 0x54F)))
    ]
    blob = bytearray(ccob(bundle(entries), version=3))
    blob[len(blob) // 3] ^= 0x5A  # before the gfx942 and gfx950 entries
    (tmp_path / "damaged.co").write_bytes(bytes(blob))
    roots, _ = resolve_roots([str(tmp_path / "damaged.co")])
    (record,) = build_inventory(roots).files
    failures = []
    real = zstd_index.FrameIndex.read

    def watched(self, offset, length):
        try:
            return real(self, offset, length)
        except FormatError as exc:
            failures.append(exc)
            raise

    monkeypatch.setattr(zstd_index.FrameIndex, "read", watched)
    selections = [None, verify.selection_for([verify.resolve_required("gfx950")])]
    indexed = [scan_file(record, None, selection) for selection in selections]
    assert failures, "the index never met the damage"
    monkeypatch.setenv("ROCM_AUDIT_NO_ZSTD_INDEX", "1")
    streamed = [scan_file(record, None, selection) for selection in selections]
    assert indexed == streamed
    assert any(f.rule == "ARCH004" for f in indexed[1].findings)
