"""Container readers on hand-written bytes: every layout variant, and hostile or truncated input.

Every malformed input must give an ARCH004 finding that names the file offset, never an exception,
and no allocation may follow a declared size.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from pathlib import Path

import pytest

from rocm_audit.errors import FormatError
from rocm_audit.formats import ccob as ccob_format
from rocm_audit.formats import offload_bundle
from rocm_audit.gpu.codeobjects import FileCodeObjects
from support.gpu.arch_writers import amdgpu_header, bundle, ccob, host_elf, kpack_archive, scan_path
from support.memory import peak_rss_kib, reset_peak_rss

SHT_PROGBITS, SHT_NOBITS, SHF_ALLOC = 1, 8, 2
GFX942_ANY = amdgpu_header(0x54C)  # gfx942, xnack any, sramecc any, cov6
GFX950_ANY = amdgpu_header(0x54F)
GFX90A_XNACK_ON = amdgpu_header(0x33F)


def scan_bytes(tmp_path: Path, data: bytes, name: str = "blob.co") -> FileCodeObjects:
    path = tmp_path / name
    path.write_bytes(data)
    return scan_path(path)


def targets(result: FileCodeObjects) -> list[tuple[int | None, str | None]]:
    return [(obj.tu, obj.target) for obj in result.code_objects if obj.kind != "host"]


def malformed(result: FileCodeObjects) -> list[dict]:
    found = [f for f in result.findings if f.rule == "ARCH004"]
    for finding in found:
        assert isinstance(finding.data["offset"], int) and finding.path == result.path
        assert "offset" in finding.message
    return [dict(f.data) | {"message": f.message} for f in found]


SAMPLE = [
    ("host-x86_64-unknown-linux--", b""),
    ("hipv4-amdgcn-amd-amdhsa--gfx942", GFX942_ANY),
    ("hipv4-amdgcn-amd-amdhsa-unknown-gfx950\0", GFX950_ANY),
    ("hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+", GFX90A_XNACK_ON),
]


def test_plain_bundle_parser_reads_ids_offsets_and_sizes():
    data = bundle(SAMPLE)
    parsed = offload_bundle.parse_bundle(data, 0, len(data))
    assert [e.entry_id.target for e in parsed.entries] == [
        None,
        "gfx942",
        "gfx950",
        "gfx90a:xnack+",
    ]
    assert [e.size for e in parsed.entries] == [0, 64, 64, 64]
    assert all(e.offset % 4096 == 0 for e in parsed.entries[1:])
    assert parsed.end == len(data)


@pytest.mark.parametrize("cut", [24, 31, 40, 70, 120, 4096 + 10])
def test_truncated_plain_bundles_are_findings_with_offsets(tmp_path, cut):
    result = scan_bytes(tmp_path, bundle(SAMPLE)[:cut])
    problems = malformed(result)
    assert problems, result
    assert all(p["offset"] <= cut for p in problems)


def test_hostile_counts_and_lengths_allocate_nothing(tmp_path):
    header = offload_bundle.BUNDLE_MAGIC
    for count, id_len in ((1 << 62, 4), (3, 1 << 60), (5, 0)):
        data = header + struct.pack("<Q", count) + struct.pack("<QQQ", 4096, 64, id_len) + b"x" * 64
        with pytest.raises(FormatError) as caught:
            offload_bundle.parse_bundle(data, 0x1000, len(data))
        assert caught.value.offset >= 0x1000
        assert malformed(scan_bytes(tmp_path, data, f"h{count}.co"))
    # An entry that claims bytes past the end of the file:
    data = bytearray(bundle(SAMPLE))
    struct.pack_into("<Q", data, 32 + 24 + len(SAMPLE[0][0]) + 8, 1 << 40)  # entry 1 size
    problems = malformed(scan_bytes(tmp_path, bytes(data), "big.co"))
    assert any("runs past the end" in p["message"] for p in problems)


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("method", [0, 1])
def test_ccob_versions_and_codecs(tmp_path, version, method):
    data = ccob(bundle(SAMPLE), version=version, method=method)
    result = scan_bytes(tmp_path, data)
    assert not result.findings
    codec = "zstd" if method else "zlib"
    assert result.containers == [f"ccob-v{version}-{codec}"]
    assert targets(result) == [(0, "gfx942"), (0, "gfx950"), (0, "gfx90a:xnack+")]
    assert [o.entry_id for o in result.code_objects][2] == "hipv4-amdgcn-amd-amdhsa-unknown-gfx950"


@pytest.mark.parametrize("cut", [4, 6, 9, 19, 23])
def test_truncated_ccob_headers(tmp_path, cut):
    problems = malformed(scan_bytes(tmp_path, ccob(bundle(SAMPLE), version=3)[:cut]))
    assert problems and problems[0]["format"] == "CCOB"


def test_ccob_declared_sizes_are_checked_against_the_file(tmp_path):
    payload = bundle(SAMPLE)
    too_long = ccob(payload, version=2, total_size=10_000_000)
    assert any("runs past the end" in p["message"] for p in malformed(scan_bytes(tmp_path, too_long, "a.co")))
    too_small = ccob(payload, version=3, total_size=12)
    assert any("smaller than the header" in p["message"] for p in malformed(scan_bytes(tmp_path, too_small, "b.co")))
    lying = ccob(payload, version=2, declared_size=100)  # the table's entries lie beyond 100 bytes
    assert malformed(scan_bytes(tmp_path, lying, "c.co"))
    bad_method = bytearray(ccob(payload, version=2))
    bad_method[6] = 7
    assert any(
        "compression method 7" in p["message"] for p in malformed(scan_bytes(tmp_path, bytes(bad_method), "d.co"))
    )
    corrupt = bytearray(ccob(payload, version=2, method=0))
    corrupt[40:60] = b"\xff" * 20
    assert malformed(scan_bytes(tmp_path, bytes(corrupt), "e.co"))


def test_ccob_bombs_are_refused_without_inflating(tmp_path):
    before = reset_peak_rss()
    # 1 TiB declared from a few bytes: refused from the header alone.
    claim = ccob(bundle(SAMPLE), version=3, declared_size=1 << 40)
    assert any("not a plausible bundle" in p["message"] for p in malformed(scan_bytes(tmp_path, claim, "a.co")))
    # A real zstd bomb (512 MiB of zeros in a few KiB) declaring its true size: refused by ratio.
    table = bundle([("host-x86_64-unknown-linux--", b""), ("hipv4-amdgcn-amd-amdhsa--gfx942", b"\0" * 64)])
    payload_size = len(table) + (512 << 20)
    body = _zstd_zeros_after(table, 512 << 20)
    header = b"CCOB" + struct.pack("<HHQQ", 3, 1, 32 + len(body), payload_size) + b"\0" * 8
    problems = malformed(scan_bytes(tmp_path, header + body, "bomb.co"))
    assert any("not a plausible bundle" in p["message"] for p in problems)
    # zlib cannot exceed ~1032:1, so a 128 MiB zlib payload whose only code object sits at the very
    # end is plausible: it is streamed through in bounded steps to read that object's header.
    zeros = 128 << 20
    entries = [
        ("host-x86_64-unknown-linux--", b""),
        ("hipv4-amdgcn-amd-amdhsa--gfx942", GFX942_ANY),
    ]
    probe = bundle(entries)
    table_size = probe.index(GFX942_ANY[:4], 32)
    far = bytearray(probe[:table_size])
    struct.pack_into("<Q", far, 32 + 24 + len(entries[0][0]), table_size + zeros)  # entry 1 offset
    stream = zlib.compressobj(9)
    body = stream.compress(bytes(far)) + b"".join(stream.compress(b"\0" * (1 << 24)) for _ in range(zeros >> 24))
    body += stream.compress(GFX942_ANY) + stream.flush()
    size = table_size + zeros + len(GFX942_ANY)
    digest = hashlib.md5(bytes(far))
    for _ in range(zeros >> 24):
        digest.update(b"\0" * (1 << 24))
    digest.update(GFX942_ANY)
    header = b"CCOB" + struct.pack("<HHII", 2, 0, 24 + len(body), size) + digest.digest()[:8]
    result = scan_bytes(tmp_path, header + body, "far.co")
    assert not result.findings and targets(result) == [(0, "gfx942")]
    assert peak_rss_kib() - before < 64 * 1024  # KiB, from this test's own peak


def _zstd_zeros_after(prefix: bytes, zeros: int) -> bytes:
    import zstandard

    compressor = zstandard.ZstdCompressor(level=3).compressobj(size=len(prefix) + zeros)
    parts = [compressor.compress(prefix)]
    chunk = b"\0" * (1 << 24)
    for _ in range(zeros >> 24):
        parts.append(compressor.compress(chunk))
    parts.append(compressor.flush())
    return b"".join(parts)


def test_payload_stream_never_hands_out_more_than_asked():
    payload = b"\0" * (8 << 20)
    for method in (0, 1):
        data = ccob(payload, version=3, method=method)
        header = ccob_format.parse_header(data, 0, len(data))
        stream = ccob_format.PayloadStream(
            header,
            lambda off, n, data=data: data[32 + off : 32 + off + n],
            len(data) - 32,
            32,
            limit=len(payload),
        )
        sizes = [len(stream.read(1000)) for _ in range(5)]
        assert sizes == [1000] * 5
        assert stream.skip(len(payload)) == len(payload) - 5000
        assert stream.read(10) == b""


def fatbin_library(
    path: Path,
    containers: list[bytes],
    wrappers: int,
    *,
    magic: int = 0x48495046,
    extra: list[tuple[str, int, int, bytes | int]] = (),
) -> Path:
    section = b""
    for one in containers:
        section += b"\0" * (-len(section) % 4096) + one
    segment = b"".join(struct.pack("<IIQQ", magic, 1, 0, 0) for _ in range(wrappers))
    host_elf(
        [
            (".hip_fatbin", SHT_PROGBITS, SHF_ALLOC, section),
            (".hipFatBinSegment", SHT_PROGBITS, SHF_ALLOC, segment),
            *extra,
        ],
        str(path),
    )
    return path


def test_concatenated_bundles_of_every_kind_are_separate_translation_units(tmp_path):
    tu0 = bundle(SAMPLE[:2])
    tu1 = ccob(bundle([SAMPLE[0], SAMPLE[2]]), version=1, method=0)  # v1: found by searching for CCOB
    tu2 = ccob(bundle([SAMPLE[0], SAMPLE[3]]), version=1, method=1)
    tu3 = ccob(bundle(SAMPLE[:3]), version=3, method=1)
    result = scan_path(fatbin_library(tmp_path / "libmix.so", [tu0, tu1, tu2, tu3], wrappers=4))
    assert not result.findings, result.findings
    assert result.tu_count == 4 and result.wrappers == 4
    assert targets(result) == [
        (0, "gfx942"),
        (1, "gfx950"),
        (2, "gfx90a:xnack+"),
        (3, "gfx942"),
        (3, "gfx950"),
    ]
    assert [kind for _, _, kind in result.bundles] == ["offload-bundle", "ccob", "ccob", "ccob"]


def test_garbage_inside_hip_fatbin_is_reported_with_its_offset(tmp_path):
    path = fatbin_library(tmp_path / "libbad.so", [bundle(SAMPLE[:2]), b"JUNKJUNK" * 8], wrappers=2)
    result = scan_path(path)
    problems = malformed(result)
    assert len(problems) == 1 and "no bundle or CCOB magic" in problems[0]["message"]
    assert problems[0]["offset"] == 4096 + 8192  # section at 4096; junk at the next 4 KiB boundary
    assert targets(result) == [(0, "gfx942")]


def test_a_magic_after_padding_off_the_tu_alignment_is_named_where_it_is(tmp_path):
    # Only the linker pads between TUs, and it starts each TU's section 8-aligned (4096 since LLVM
    # 12): a bundle 5 bytes past a boundary is no TU. The finding names the magic, not the padding.
    path = fatbin_library(tmp_path / "libodd.so", [bundle(SAMPLE[:2]), b"\0" * 5 + bundle(SAMPLE[:1])], wrappers=2)
    result = scan_path(path)
    problems = malformed(result)
    assert len(problems) == 1 and "is not 8-aligned" in problems[0]["message"], problems
    assert problems[0]["offset"] == 4096 + 8192 + 5
    assert targets(result) == [(0, "gfx942")]


def test_wrapper_table_must_be_whole_wrappers_with_known_magic(tmp_path):
    path = fatbin_library(tmp_path / "libw.so", [bundle(SAMPLE[:2])], wrappers=1, magic=0x12345678)
    assert any(".hipFatBinSegment" in p["message"] for p in malformed(scan_path(path)))


def test_every_truncation_of_a_library_is_a_finding_not_a_crash(tmp_path):
    original = fatbin_library(
        tmp_path / "libfull.so", [bundle(SAMPLE), ccob(bundle(SAMPLE), version=2)], wrappers=2
    ).read_bytes()
    for cut in range(0, len(original), 331):
        scan_bytes(tmp_path, original[:cut], f"cut{cut}.so")  # must not raise


def test_kpack_archives_both_schemes(tmp_path):
    kernels = [("lib/libx.so#0", "gfx942", GFX942_ANY), ("lib/libx.so#0", "gfx950", GFX950_ANY)]
    for scheme in ("none", "zstd-per-kernel"):
        result = scan_bytes(tmp_path, kpack_archive(kernels, scheme=scheme), f"x_{scheme}.kpack")
        assert not result.findings
        assert [(o.entry_id, o.bundle_target, o.target) for o in result.code_objects] == [
            ("lib/libx.so#0", "gfx942", "gfx942"),
            ("lib/libx.so#0", "gfx950", "gfx950"),
        ]
    broken = bytearray(kpack_archive(kernels))
    struct.pack_into("<Q", broken, 8, 1 << 50)  # TOC offset past the end
    assert malformed(scan_bytes(tmp_path, bytes(broken), "broken.kpack"))


def test_a_nobits_hip_fatbin_is_not_read(tmp_path):
    path = tmp_path / "libnobits.so"
    host_elf([(".hip_fatbin", SHT_NOBITS, SHF_ALLOC, 1 << 30)], str(path))
    result = scan_path(path)
    assert result.code_objects == [] and result.findings == []


def test_hipf_wrappers_without_a_fat_binary_fail_every_tu(tmp_path):
    segment = struct.pack("<IIQQ", 0x48495046, 1, 0, 0) * 2
    for name, sections in (
        ("libnone.so", [(".hipFatBinSegment", SHT_PROGBITS, SHF_ALLOC, segment)]),
        (
            "libnobits.so",
            [
                (".hip_fatbin", SHT_NOBITS, SHF_ALLOC, 8192),
                (".hipFatBinSegment", SHT_PROGBITS, SHF_ALLOC, segment),
            ],
        ),
    ):
        host_elf(sections, str(tmp_path / name))
        result = scan_path(tmp_path / name)
        assert result.tu_count == 2 and result.code_objects == []
        assert any("HIPF wrappers but .hip_fatbin" in p["message"] for p in malformed(result))


@pytest.mark.parametrize("version", [1, 2, 3])
def test_ccob_payload_hash_is_verified(tmp_path, version):
    good = ccob(bundle(SAMPLE), version=version)
    assert not scan_bytes(tmp_path, good, "good.co").findings
    bad = bytearray(good)
    hash_at = {1: 12, 2: 16, 3: 24}[version]
    bad[hash_at] ^= 0xFF
    problems = malformed(scan_bytes(tmp_path, bytes(bad), "bad.co"))
    assert [p["offset"] for p in problems if "MD5" in p["message"]] == [hash_at]


def test_bytes_after_the_section_end_are_not_read_as_part_of_it(tmp_path):
    """clang-14 sections end one byte after the bundle; the next bytes of the file are not ours."""
    path = fatbin_library(tmp_path / "libtail.so", [bundle(SAMPLE[:2]) + b"\0"], wrappers=1)
    data = bytearray(path.read_bytes())
    section_end = 4096 + len(bundle(SAMPLE[:2])) + 1
    data[section_end : section_end + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))
    result = scan_path(path)
    assert result.findings == [] and targets(result) == [(0, "gfx942")]


def test_ccobs_separated_by_padding_shorter_than_a_header_are_all_read(tmp_path):
    """Found by the benchmark on a 48-bundle library: 12 zero bytes before the next 4 KiB boundary."""
    import hashlib as _hashlib
    import zlib as _zlib

    def stored_ccob(payload: bytes) -> bytes:
        body = _zlib.compress(payload, 0)  # stored blocks: the size is predictable
        header = b"CCOB" + struct.pack("<HHII", 2, 0, 24 + len(body), len(payload))
        return header + _hashlib.md5(payload).digest()[:8] + body

    table = bundle(SAMPLE)
    for extra in range(4096):
        first = stored_ccob(table + b"\0" * extra)
        if len(first) % 4096 == 4096 - 12:
            break
    else:
        raise AssertionError("no payload length leaves 12 bytes of padding")
    second = stored_ccob(table)
    fatbin = first + b"\0" * 12 + second
    path = tmp_path / "libtwo.so"
    host_elf([(".hip_fatbin", SHT_PROGBITS, SHF_ALLOC, fatbin)], str(path))
    result = scan_path(path)
    assert not result.findings, result.findings
    assert [(kind, offset - result.bundles[0][0]) for offset, _, kind in result.bundles] == [
        ("ccob", 0),
        ("ccob", len(first) + 12),
    ]


def test_many_long_window_ccobs_are_read_with_bounded_memory(tmp_path):
    """Each zstd stream holds a window of up to 128 MiB; found by the benchmark: a 48-CCOB library
    peaked at 339 MB because every stream's window stayed allocated (a reference cycle) until the
    garbage collector ran. Now each stream is closed as soon as its CCOB is listed."""
    import os
    import subprocess
    import sys

    import zstandard

    from support.memory import PEAK_RSS_KIB_EXPR

    # The code objects sit behind 64 MiB of filler (one random MiB repeated: about 60:1, inside the
    # bomb guard), so reading their headers runs each stream through its whole window.
    filler = os.urandom(1 << 20) * 64
    plain = bytearray(bundle(SAMPLE))
    (count,) = struct.unpack_from("<Q", plain, 24)
    cursor, first_object = 32, len(plain)
    for _ in range(count):
        offset, size, id_len = struct.unpack_from("<QQQ", plain, cursor)
        if size:
            first_object = min(first_object, offset)
            struct.pack_into("<Q", plain, cursor, offset + len(filler))
        cursor += 24 + id_len
    payload = bytes(plain[:first_object]) + filler + bytes(plain[first_object:])
    params = zstandard.ZstdCompressionParameters.from_level(1, window_log=26)
    body = zstandard.ZstdCompressor(compression_params=params).compress(payload)
    one = b"CCOB" + struct.pack("<HHII", 2, 1, 24 + len(body), len(payload)) + hashlib.md5(payload).digest()[:8] + body
    one += b"\0" * (-len(one) % 4096)
    path = tmp_path / "libwindows.so"
    host_elf([(".hip_fatbin", SHT_PROGBITS, SHF_ALLOC, one * 4)], str(path))
    probe = (
        "from rocm_audit.cli.app import main\n"
        f"code = main(['scan', '--targets', '-q', '-p', {str(path)!r}, '--format', 'json', '-o', "
        f"{str(tmp_path / 'out.json')!r}])\n"
        f"print({PEAK_RSS_KIB_EXPR}, code)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    peak_kib, code = map(int, done.stdout.split())
    report = json.loads((tmp_path / "out.json").read_text())
    assert code == 0, report["findings"]
    assert len(report["code_objects"]) == 4 * len(SAMPLE)
    assert peak_kib < 120 * 1024, f"peak RSS {peak_kib // 1024} MB for four 64 MiB-window streams"


@pytest.mark.parametrize("method", [0, 1])
def test_a_corrupt_compressed_bundle_leaves_the_next_translation_unit_read(tmp_path, run_cli, method):
    """The runtime registers each TU's bundle on its own: a corrupt stream in the first is a finding
    there and fails that TU, the second is still listed and judged (it was dropped before)."""
    gfx942 = amdgpu_header(0x54C)
    entries = [("host-x86_64-unknown-linux--", b""), ("hipv4-amdgcn-amd-amdhsa--gfx942", gfx942 * 64)]
    first = bytearray(ccob(bundle(entries), version=2, method=method))
    header = 24
    middle = header + (len(first) - header) // 2
    first[middle:] = b"\xff" * (len(first) - middle)  # the compressed stream's second half
    second = ccob(bundle(entries), version=3, method=method)
    section = bytes(first) + b"\0" * (-len(first) % 4096) + second
    wrappers = struct.pack("<IIQQ", 0x48495046, 1, 0, 0) * 2
    host_elf([(".hip_fatbin", 1, 2, section), (".hipFatBinSegment", 1, 2, wrappers)], str(tmp_path / "libk.so"))
    result = scan_path(tmp_path / "libk.so")
    assert result.tu_count == 2
    assert [(o.tu, o.target) for o in result.code_objects if o.kind != "host" and o.tu == 1] == [(1, "gfx942")]
    (finding,) = result.findings
    assert finding.rule == "ARCH004" and finding.message.startswith(".hip_fatbin+0x0: CCOB: ")
    assert 4096 <= finding.data["offset"] <= 4096 + len(first)  # in the first CCOB (the section is at 4096)
    report = run_cli("verify-arch", "gfx942", "-p", str(tmp_path / "libk.so"), "--format", "json", expect=1).report
    (carrier,) = report["carriers"]
    assert carrier["tu_count"] == 2 and carrier["matches"][0]["tus_without"] == [0]
    # One bundle record per TU, the failed one included, so bundles[tu] is the TU's own bundle.
    second_at = 4096 + len(first) + (-len(first) % 4096)
    assert [(offset, kind) for offset, _, kind in result.bundles] == [(4096, "ccob"), (second_at, "ccob")]
    assert result.bundles[1][1] == len(second)
    # prune weighs TU 1's gfx942 code by the second bundle's bytes on disk (it was its inflated size)
    report = run_cli("prune", "gfx90a", "-p", str(tmp_path), "--dry-run", "--format", "json").report
    rows = [r for r in report["prune"]["weight"] if r["target"] == "gfx942"]
    assert [(r["compressed_bytes"], r["inflated_bytes"]) for r in rows] == [(len(second), 64 * len(gfx942))]


def test_the_magic_inside_a_v1_stream_does_not_end_the_bundle(tmp_path):
    """A CCOB v1 runs to the next magic; its compressed bytes can hold "CCOB" by chance (random-looking
    data, about once in 4 GiB; here forced: zstd stores incompressible bytes as they are). Only a
    magic with a known version and method after it starts the next bundle: both TUs are read whole."""
    import random

    rng = random.Random(7)
    code = amdgpu_header(0x54C) + rng.randbytes(20000) + b"CCOB\x37\x13\x99\x42" + rng.randbytes(20000)
    entries = [("host-x86_64-unknown-linux--", b""), ("hipv4-amdgcn-amd-amdhsa--gfx942", code)]
    first = ccob(bundle(entries), version=1, method=1)
    assert first.find(b"CCOB", 4) > 0  # the stream itself holds the magic
    section = first + b"\0" * (-len(first) % 4096) + ccob(bundle(entries), version=1, method=1)
    wrappers = struct.pack("<IIQQ", 0x48495046, 1, 0, 0) * 2
    host_elf([(".hip_fatbin", 1, 2, section), (".hipFatBinSegment", 1, 2, wrappers)], str(tmp_path / "libk.so"))
    result = scan_path(tmp_path / "libk.so")
    assert result.findings == []
    assert result.tu_count == 2
    assert [(o.tu, o.target, o.size) for o in result.code_objects if o.kind != "host"] == [
        (0, "gfx942", len(code)),
        (1, "gfx942", len(code)),
    ]
