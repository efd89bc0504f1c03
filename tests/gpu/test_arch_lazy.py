"""One verdict, whichever path computes it: the lazy judgement (only the entries the runtime would
select are inflated, each compressed stream stops after the last of them) against the full scan
(every entry read), over clang-built libraries (images embedded in .rodata too), the pinned vendor
wheels (CCOB v3; CCOB v2 and v3 side by side) and test-written bundles."""

from __future__ import annotations

import hashlib
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rocm_audit.formats import ccob as ccob_format
from rocm_audit.formats import zstd_index
from rocm_audit.gpu import verify
from rocm_audit.gpu.carriers import named_target
from rocm_audit.tree.discovery import resolve_roots
from rocm_audit.tree.inventory import build_inventory
from rocm_audit.tree.targets import choose_entry
from support.gpu.arch_writers import amdgpu_header, bundle, ccob

TARGET_SETS = [
    ["gfx942"],
    ["gfx950"],
    ["gfx90a:xnack+"],
    ["gfx90a:xnack-", "gfx1100"],
    ["gfx900", "gfx1010", "gfx1201"],
]

# e_flags: mach | xnack "any" (0x100) | sramecc "any" (0x400), cov6 (formats.md 2.7).
GFX942_ANY = amdgpu_header(0x54C)
GFX90A_ANY = amdgpu_header(0x53F)
GFX950_ANY = amdgpu_header(0x54F)


def _written_samples(into: Path) -> None:
    """Bundles no toolchain here makes: CCOB v1/v3, zlib, and an entry whose ELF header disagrees
    with its bundle id (the runtime picks it by id; the loader then refuses it)."""
    entries = [
        ("host-x86_64-unknown-linux--", b""),
        ("hipv4-amdgcn-amd-amdhsa--gfx90a", GFX90A_ANY),
        ("hipv4-amdgcn-amd-amdhsa--gfx942", GFX942_ANY),
        ("hipv4-amdgcn-amd-amdhsa--gfx950", GFX950_ANY),
    ]
    for version, method in ((1, 0), (2, 0), (3, 1)):
        (into / f"v{version}m{method}.co").write_bytes(ccob(bundle(entries), version=version, method=method))
    (into / "plain.co").write_bytes(bundle(entries))
    lying = [entries[0], ("hipv4-amdgcn-amd-amdhsa--gfx942", GFX90A_ANY), entries[3]]
    (into / "lying.co").write_bytes(ccob(bundle(lying), version=3))


@pytest.fixture(scope="module")
def sample_dirs(
    built, embedded_libs, jax_plugin, bitsandbytes_libs, many_arch_libs, tmp_path_factory
) -> dict[str, Path]:
    clang = tmp_path_factory.mktemp("lazy-clang")
    for name, path in built.items():
        shutil.copy(path, clang / name)
    embedded = tmp_path_factory.mktemp("lazy-embedded")
    for name, path in embedded_libs.items():
        shutil.copy(path, embedded / name)
    written = tmp_path_factory.mktemp("lazy-written")
    _written_samples(written)
    return {
        "clang": clang,
        "embedded": embedded,
        "vendor": jax_plugin,
        "bitsandbytes": bitsandbytes_libs,
        "many": many_arch_libs,
        "written": written,
    }


def _full_judgement(root: Path, targets: list[str]):
    roots, _ = resolve_roots([str(root)])
    inventory = build_inventory(roots)
    required = [verify.resolve_required(t) for t in targets]
    scans = verify.scan_inventory(inventory)  # no selection: every entry read
    carriers = verify.build_carriers(scans)
    findings = list(inventory.findings) + verify.scan_findings(scans)
    for carrier in carriers:
        findings.extend(verify.judge(carrier, required))
    return carriers, findings, required


def _lazy_judgement(root: Path, targets: list[str]):
    roots, _ = resolve_roots([str(root)])
    inventory = build_inventory(roots)
    required = [verify.resolve_required(t) for t in targets]
    scans = verify.scan_inventory(inventory, verify.selection_for(required))
    carriers = verify.build_carriers(scans)
    findings = list(inventory.findings) + verify.scan_findings(scans)
    for carrier in carriers:
        findings.extend(verify.judge(carrier, required))
    return carriers, findings


def _verdicts(carriers) -> list[tuple]:
    return [(c.path, c.kind, len(c.tus), c.matches, sorted(c.missing)) for c in carriers]


def _judged_objects(carriers, required) -> list[tuple]:
    """The entry each TU's runtime choice lands on, per target: what the judgement read."""
    chosen = []
    for carrier in carriers:
        for number, tu in enumerate(carrier.tus):
            named = [named_target(obj) for obj in tu]
            for target in required:
                pick = choose_entry(named, target.agent)
                if pick is not None:
                    chosen.append((carrier.path, number, target.spelled, tu[pick[0]]))
    return chosen


def _keyed(findings) -> list[tuple]:
    return sorted((f.rule, f.path, f.message) for f in findings)


@pytest.mark.parametrize("targets", TARGET_SETS, ids=lambda t: "+".join(t))
@pytest.mark.parametrize("sample", ["clang", "embedded", "vendor", "bitsandbytes", "many", "written"])
def test_lazy_and_full_paths_give_one_verdict(sample_dirs, sample, targets):
    root = sample_dirs[sample]
    full_carriers, full_findings, required = _full_judgement(root, targets)
    lazy_carriers, lazy_findings = _lazy_judgement(root, targets)
    assert full_carriers, f"no carriers in {sample}"
    assert _verdicts(lazy_carriers) == _verdicts(full_carriers)
    assert _judged_objects(lazy_carriers, required) == _judged_objects(full_carriers, required)
    if sample == "written":
        # lying.co's gfx942 entry holds a gfx90a object: the full scan reports it whatever is
        # judged; the lazy one only when a target makes the runtime pick that entry. Every other
        # finding is the same.
        lying = str(root / "lying.co")
        full = [k for k in _keyed(full_findings) if not (k[0] == "ARCH003" and k[1] == lying)]
        lazy = [k for k in _keyed(lazy_findings) if not (k[0] == "ARCH003" and k[1] == lying)]
        assert lazy == full
    else:
        assert _keyed(lazy_findings) == _keyed(full_findings)


def _scans(root: Path, selection) -> list:
    roots, _ = resolve_roots([str(root)])
    return verify.scan_inventory(build_inventory(roots), selection)


# CCOBs over 1 MiB inflated are read through the zstd index: jax's _linalg.so, bitsandbytes'
# ROCm builds (v2 and v3) and the ten-GPU clang build.
INDEXED_SAMPLES = ("vendor", "bitsandbytes", "many")


@pytest.mark.skipif(not zstd_index.available(), reason="the _zstdindex extension is not built")
@pytest.mark.parametrize("sample", ["clang", "embedded", "vendor", "bitsandbytes", "many", "written"])
def test_the_index_and_libzstds_stream_give_one_scan(sample_dirs, sample, monkeypatch):
    """One scan whichever way a CCOB is read: through the zstd index (entry table and heads read
    at random, no window) or inflated by libzstd's streaming decoder, for the full scan and for
    each selection: the same code objects with the same ELF facts, and the same findings."""
    root = sample_dirs[sample]
    selections = [None] + [verify.selection_for([verify.resolve_required(t) for t in ts]) for ts in TARGET_SETS]
    indexed_frames = []

    class Counting(zstd_index.FrameIndex):
        def __init__(self, data, base, fmt=zstd_index.FMT):
            super().__init__(data, base, fmt)
            indexed_frames.append(base)

    monkeypatch.setattr(zstd_index, "FrameIndex", Counting)
    indexed = [_scans(root, selection) for selection in selections]
    monkeypatch.setenv("ROCM_AUDIT_NO_ZSTD_INDEX", "1")
    streamed = [_scans(root, selection) for selection in selections]
    assert indexed == streamed
    assert bool(indexed_frames) == (sample in INDEXED_SAMPLES)


def test_an_entry_the_runtime_picks_by_id_but_the_loader_refuses_serves_nothing(sample_dirs):
    """lying.co: the id says gfx942, the ELF header gfx90a. gfx942 is missing (ARCH001) with ARCH003
    on the entry; gfx90a is served by the real gfx90a entry."""
    root = sample_dirs["written"]
    outcome = verify.verify_arch([str(root / "lying.co")], ["gfx942"], environ={})
    rules = sorted(f.rule for f in outcome.findings)
    assert rules == ["ARCH001", "ARCH003"], outcome.findings
    outcome = verify.verify_arch([str(root / "lying.co")], ["gfx950"], environ={})
    assert not [f for f in outcome.findings if f.rule in ("ARCH001", "ARCH003")], outcome.findings


def test_lazy_judgement_inflates_only_up_to_the_chosen_entries(sample_dirs, monkeypatch):
    """On the vendor wheel's CCOB v3 bundles, an early target's heads are reached after a small
    part of each stream; the full scan inflates to the last head. Entries no target picks are
    never inspected."""
    inflated = {"bytes": 0}
    real_read, real_skip = ccob_format.PayloadStream.read, ccob_format.PayloadStream.skip

    def counting_read(self, size):
        data = real_read(self, size)
        inflated["bytes"] += len(data)
        return data

    def counting_skip(self, size):
        done = real_skip(self, size)
        inflated["bytes"] += done
        return done

    monkeypatch.setattr(ccob_format.PayloadStream, "read", counting_read)
    monkeypatch.setattr(ccob_format.PayloadStream, "skip", counting_skip)
    root = sample_dirs["vendor"]
    full_carriers, _, _ = _full_judgement(root, ["gfx1010"])
    full_bytes, inflated["bytes"] = inflated["bytes"], 0
    lazy_carriers, _ = _lazy_judgement(root, ["gfx1010"])
    lazy_bytes = inflated["bytes"]
    assert full_bytes > 0 and lazy_bytes * 4 < full_bytes, (lazy_bytes, full_bytes)
    read_from_elf = [
        obj.bundle_target for c in lazy_carriers for obj in c.code_objects if obj.target_source == "e_flags"
    ]
    assert read_from_elf and set(read_from_elf) == {"gfx1010"}
    assert len([o for c in full_carriers for o in c.code_objects if o.target_source == "e_flags"]) > len(read_from_elf)


def test_the_md5_of_a_large_payload_is_not_computed(monkeypatch):
    """Hashing costs more than inflating; a stream asked for no hash keeps none."""
    payload = bundle([("host-x86_64-unknown-linux--", b""), ("hipv4-amdgcn-amd-amdhsa--gfx942", GFX942_ANY)])
    data = ccob(payload, version=3)
    header = ccob_format.parse_header(data, 0, len(data))

    def read_at(offset: int, size: int) -> bytes:
        return data[32 + offset : 32 + offset + size]

    stream = ccob_format.PayloadStream(header, read_at, len(data) - 32, 32, len(payload), hashed=False)
    assert stream.skip(len(payload)) == len(payload)
    assert stream.hash_matches(header) is None
    stream.close()
    stream = ccob_format.PayloadStream(header, read_at, len(data) - 32, 32, len(payload))
    stream.skip(len(payload))
    assert stream.hash_matches(header) is True
    assert struct.unpack_from("<Q", data, 16)[0] == len(payload)


@pytest.mark.parametrize("lazy", [False, True])
def test_helpers_that_share_the_bundles_give_the_same_scan(sample_dirs, monkeypatch, lazy):
    """CCOBs of one section are inflated by forked helpers when there is much to inflate; forced
    here for every file with two or more CCOBs, the scan is the same as a sequential one."""
    from rocm_audit.gpu import fatbin

    required = [verify.resolve_required(t) for t in ("gfx942", "gfx90a:xnack-")]
    selection = verify.selection_for(required) if lazy else None

    def scans(root: Path) -> list:
        roots, _ = resolve_roots([str(root)])
        return verify.scan_inventory(build_inventory(roots), selection)

    for root in (sample_dirs["clang"], sample_dirs["vendor"]):
        monkeypatch.setattr(fatbin, "PARALLEL_INFLATE_BYTES", 1 << 60)
        alone = scans(root)
        monkeypatch.setattr(fatbin, "PARALLEL_INFLATE_BYTES", 0)
        shared = scans(root)
        assert shared == alone
        assert any(sum(kind == "ccob" for _, _, kind in s.bundles) > 1 for s in shared)


PJRT_WHEEL = "jax_rocm7_pjrt-0.12.0-py3-none-manylinux_2_27_x86_64.whl"
PJRT_SHA256 = "4551d0714523355f2946ca1958c3f584e95661e467a641d36b726f718a1c7934"


@pytest.mark.slow  # a 133 MB download
def test_one_verdict_on_the_459_mb_pjrt_plugin(cache_dir, tmp_path):
    """jax-rocm7-pjrt 0.12.0's xla_rocm_plugin.so (45 CCOB v3 bundles, 2.4 GB inflated), both paths."""
    wheel = Path(cache_dir) / "bench" / PJRT_WHEEL
    if not wheel.exists():
        wheel.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(wheel.parent), "jax-rocm7-pjrt==0.12.0"],
            check=True,
            capture_output=True,
            timeout=1200,
        )
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert digest == PJRT_SHA256, f"{wheel} is not the pinned file"
    with zipfile.ZipFile(wheel) as archive:
        archive.extract("jax_plugins/xla_rocm7/xla_rocm_plugin.so", tmp_path)
    root = tmp_path / "jax_plugins"
    for targets in (["gfx950"], ["gfx942", "gfx1100"], ["gfx90a:xnack+"]):
        full_carriers, full_findings, required = _full_judgement(root, targets)
        lazy_carriers, lazy_findings = _lazy_judgement(root, targets)
        assert _verdicts(lazy_carriers) == _verdicts(full_carriers)
        assert _judged_objects(lazy_carriers, required) == _judged_objects(full_carriers, required)
        assert _keyed(lazy_findings) == _keyed(full_findings)


def test_bombs_and_truncations_through_the_lazy_path(tmp_path):
    """The judgement's reader meets the same guards: a declared 1 TiB and a real zstd bomb are
    refused from the header, every truncation of a library is a finding, nothing is raised."""
    import zstandard

    from rocm_audit.gpu.codeobjects import scan_file
    from support.gpu.arch_writers import host_elf
    from support.memory import peak_rss_kib, reset_peak_rss

    selection = verify.selection_for([verify.resolve_required("gfx942")])

    def lazy_scan(data: bytes, name: str):
        path = tmp_path / name
        path.write_bytes(data)
        roots, _ = resolve_roots([str(path)])
        (record,) = build_inventory(roots).files
        return scan_file(record, None, selection)

    entries = [("host-x86_64-unknown-linux--", b""), ("hipv4-amdgcn-amd-amdhsa--gfx942", GFX942_ANY)]
    before = reset_peak_rss()
    claim = ccob(bundle(entries), version=3, declared_size=1 << 40)
    assert any("not a plausible bundle" in f.message for f in lazy_scan(claim, "claim.co").findings)
    table = bundle(entries)
    compressor = zstandard.ZstdCompressor(level=3).compressobj(size=len(table) + (128 << 20))
    body = compressor.compress(table) + b"".join(compressor.compress(b"\0" * (1 << 24)) for _ in range(8))
    body += compressor.flush()
    bomb = b"CCOB" + struct.pack("<HHQQ", 3, 1, 32 + len(body), len(table) + (128 << 20)) + b"\0" * 8 + body
    assert any("not a plausible bundle" in f.message for f in lazy_scan(bomb, "bomb.co").findings)
    assert peak_rss_kib() - before < 64 * 1024
    plain = bundle(entries)
    section = plain + b"\0" * (-len(plain) % 4096) + ccob(bundle(entries), version=2)
    wrappers = struct.pack("<IIQQ", 0x48495046, 1, 0, 0) * 2
    host_elf([(".hip_fatbin", 1, 2, section), (".hipFatBinSegment", 1, 2, wrappers)], str(tmp_path / "libfull.so"))
    original = (tmp_path / "libfull.so").read_bytes()
    for cut in range(0, len(original), 331):
        lazy_scan(original[:cut], f"cut{cut}.so")  # must not raise
