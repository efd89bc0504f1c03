"""`prune --fatbins`: real HIP host libraries built with clang++-19, slimmed for gfx942.

The selection rule (prune/fatbins/select.py) on bundle ids; the rewrite of plain bundles and
CCOBs checked by clang-offload-bundler-19 and by parsing both bundles again; the applied result
loaded with dlopen(RTLD_NOW) in a child against a stand-in HIP runtime (gcc) that records what
each wrapper registers, read back from the process's memory; verify-arch before and after; RECORD
rewritten as pip writes it; revert byte-identical; a SIGKILL at every rename leaves each library
either original or journalled with a whole backup.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from rocm_audit.errors import FormatError
from rocm_audit.formats import ccob
from rocm_audit.formats.offload_bundle import parse_bundle
from rocm_audit.prune.fatbins.library import locate
from rocm_audit.prune.fatbins.rewrite import (
    COMGR_WINDOW,
    Slimmed,
    prove_same_selection,
    selections,
    slim,
)
from rocm_audit.prune.fatbins.select import entries_to_keep
from rocm_audit.tree.targets import TargetId, agents_of, kept_target
from support.hip_host import HIP_FLAGS, TU, build_stub, hippkg_site, load_and_read, record_hash
from support.killpoints import rocm_audit
from support.memory import give_back_freed_memory, peak_rss_kib, reset_peak_rss
from support.run import run_checked
from support.tools import require_tool


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    cxx = require_tool("clang++-19")
    out = tmp_path_factory.mktemp("fatbins")
    (out / "k1.hip").write_text(TU % ("k1", 1))
    (out / "k2.hip").write_text(TU % ("k2", 2))
    arches = ["--offload-arch=gfx942", "--offload-arch=gfx90a"]
    made = {}
    for name, extra in (("libplain.so", []), ("libccob.so", ["--offload-compress"])):
        # two translation units: two wrappers, two bundles in .hip_fatbin
        for tu in ("k1", "k2"):
            run_checked([cxx, *HIP_FLAGS, "-c", *extra, *arches, f"{tu}.hip", "-o", f"{name}.{tu}.o"], out)
        run_checked([cxx, "-shared", f"{name}.k1.o", f"{name}.k2.o", "-o", name], out)
        made[name] = out / name
    made["stub"] = build_stub(out)
    return made


@pytest.fixture
def site(tmp_path, built) -> Path:
    """A site-packages: one distribution owning both libraries, with a RECORD as pip writes it."""
    return hippkg_site(tmp_path / "site-packages", {name: built[name] for name in ("libplain.so", "libccob.so")})


def _bundles(path: Path) -> list[bytes]:
    fd = os.open(path, os.O_RDONLY)
    try:
        _section, places = locate(fd)
        return [os.pread(fd, p.extent, p.offset) for p in places]
    finally:
        os.close(fd)


def _slim_bytes(data: bytes, kept, tmp_path: Path, level: int | None = None) -> tuple[Slimmed, bytes, bool]:
    """Slim a bundle held in a file of its own; the slimmed bytes, written as a library would;
    whether the proof holds."""
    path = tmp_path / "bundle.in"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        with slim(fd, 0, len(data), kept, level, str(tmp_path)) as slimmed:
            out = tmp_path / "bundle.out"
            with open(out, "wb") as handle:
                slimmed.write(handle.fileno(), 0)
            proved = prove_same_selection(slimmed, kept) is None
        return slimmed, out.read_bytes(), proved
    finally:
        os.close(fd)


def _inflated(data: bytes) -> bytes:
    """A CCOB's inflated bundle, one-shot (python-zstandard or zlib), checked against its header."""
    header = ccob.parse_header(data, 0, len(data))
    payload = data[header.header_size : header.total_size]
    if header.method == ccob.METHOD_ZSTD:
        import zstandard

        inner = zstandard.ZstdDecompressor().decompress(payload)
    else:
        inner = zlib.decompress(payload)
    assert len(inner) == header.uncompressed_size
    assert hashlib.md5(inner).digest()[:8] == header.hash64
    return inner


def _registered(stub: Path, library: Path) -> list[bytes]:
    return load_and_read(stub, library, timeout=60)["bundles"]


# --- the rule ------------------------------------------------------------------------------

H = ("host-x86_64-unknown-linux--", 0)


def _ids(*names: str) -> list[tuple[str, int]]:
    return [H, *((f"hipv4-amdgcn-amd-amdhsa--{n}", 100) for n in names)]


def test_a_bare_target_keeps_every_setting_and_nothing_else():
    entries = _ids("gfx90a", "gfx942:xnack-", "gfx942:xnack+", "gfx950")
    assert entries_to_keep(entries, [kept_target("gfx942")]) == [0, 2, 3]
    assert entries_to_keep(entries, [kept_target("gfx942:xnack-")]) == [0, 2]
    assert len(agents_of(kept_target("gfx942"))) == 4
    assert len(agents_of(kept_target("gfx1100"))) == 1  # no sramecc, no xnack


def test_first_compatible_entry_wins_and_generic_only_when_no_native_serves():
    # the any-feature entry comes first: comgr takes it for every setting, the specific one never
    entries = _ids("gfx942", "gfx942:xnack+", "gfx9-4-generic")
    assert entries_to_keep(entries, [kept_target("gfx942")]) == [0, 1]
    # no native entry for xnack+: the generic one serves that setting and stays
    entries = _ids("gfx942:xnack-", "gfx9-4-generic")
    assert entries_to_keep(entries, [kept_target("gfx942")]) == [0, 1, 2]
    assert entries_to_keep(entries, [kept_target("gfx942:xnack-")]) == [0, 1]


def test_empty_entries_count_as_absent():
    entries = [H, ("hipv4-amdgcn-amd-amdhsa--gfx942", 0), ("hipv4-amdgcn-amd-amdhsa--gfx9-4-generic", 100)]
    assert entries_to_keep(entries, [kept_target("gfx942")]) == [0, 2]


def test_spirv_unknown_and_unreadable_entries_stay():
    entries = [
        H,
        ("hipv4-spirv64-amd-amdhsa--amdgcnspirv", 100),
        ("hipv4-amdgcn-amd-amdhsa--gfx1999", 100),  # a processor this release does not know
        ("hipv4-amdgcn-amd-amdhsa--gfx942", 100),
        ("hipv4-amdgcn-amd-amdhsa--gfx90a", 100),
        ("something-else-entirely", 100),
    ]
    assert entries_to_keep(entries, [kept_target("gfx942")]) == [0, 1, 2, 3, 5]


# --- the rewrite ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["libplain.so", "libccob.so"])
def test_slimmed_bundle_selects_the_same_code_and_the_bundler_agrees(built, tmp_path, name):
    kept = [kept_target("gfx942")]
    bundles = _bundles(built[name])
    assert len(bundles) == 2
    for index, original in enumerate(bundles):
        slimmed, data, proved = _slim_bytes(original, kept, tmp_path)
        assert slimmed.size == len(data) < len(original)
        assert proved
        assert [r.rsplit("-", 1)[-1] for r in slimmed.removed] == ["gfx90a"]
        before, after = selections(original, kept), selections(data, kept)
        assert before == after and all(code for code in after.values())
        assert all(selections(original, [kept_target("gfx90a")]).values())
        assert not any(selections(data, [kept_target("gfx90a")]).values())
        plain = _inflated(data) if data.startswith(ccob.CCOB_MAGIC) else data
        table = parse_bundle(plain, 0, len(plain))
        assert table.table_size <= COMGR_WINDOW
        path = tmp_path / f"{name}.{index}.bundle"
        path.write_bytes(plain)
        listed = run_checked([require_tool("clang-offload-bundler-19"), "--list", "--type=o", f"--input={path}"])
        assert sorted(listed.stdout.split()) == ["hipv4-amdgcn-amd-amdhsa--gfx942", "host-x86_64-unknown-linux--"]
        if original.startswith(ccob.CCOB_MAGIC):
            header = ccob.parse_header(data, 0, len(data))
            old = ccob.parse_header(original, 0, len(original))
            assert (header.version, header.method) == (old.version, old.method)
            assert header.total_size == len(data)


def _zlib_ccob(plain: bytes, version: int) -> bytes:
    payload = zlib.compress(plain, 6)
    return (
        ccob.pack_header(version, ccob.METHOD_ZLIB, len(plain), len(payload), hashlib.md5(plain).digest()[:8]) + payload
    )


@pytest.mark.parametrize("method", ["zstd", "zlib"])
def test_streamed_ccob_is_what_the_one_shot_compressors_give(built, tmp_path, method):
    """The streamed CCOB equals, byte for byte, the whole-buffer path: inflate one-shot, slim the
    plain bundle, compress one-shot (zstd 9 with the content size in the frame, zlib 6), header.
    (zstd only while the slimmed bundle fits one 128 KiB block, as here: zstd 1.5.7 splits blocks
    by content only when a call hands it more than one block, which a stream never does; zlib
    always.)"""
    import zstandard

    kept = [kept_target("gfx942")]
    for original in _bundles(built["libccob.so"]):
        plain = _inflated(original)
        if method == "zlib":
            original = _zlib_ccob(plain, 2)
        _plain_slimmed, slim_plain, _ = _slim_bytes(plain, kept, tmp_path)
        slimmed, data, proved = _slim_bytes(original, kept, tmp_path)
        assert proved and slimmed.compressed == method
        if method == "zstd":
            payload = zstandard.ZstdCompressor(level=9, write_content_size=True).compress(slim_plain)
        else:
            payload = zlib.compress(slim_plain, 6)
        old = ccob.parse_header(original, 0, len(original))
        digest = hashlib.md5(slim_plain).digest()[:8]
        assert data == ccob.pack_header(old.version, old.method, len(slim_plain), len(payload), digest) + payload
        # the plain bundle laid out as before: the kept entries' bytes, in order, at 4096
        table = parse_bundle(slim_plain, 0, len(slim_plain))
        source = parse_bundle(plain, 0, len(plain))
        for entry in table.entries:
            was = next(e for e in source.entries if e.entry_id.raw == entry.entry_id.raw)
            assert slim_plain[entry.offset : entry.offset + entry.size] == plain[was.offset : was.offset + was.size]
            assert entry.size == 0 or entry.offset % 4096 == 0


def test_a_ccob_that_lies_about_its_size_or_hash_is_refused(built, tmp_path):
    kept = [kept_target("gfx942")]
    original = _bundles(built["libccob.so"])[0]
    header = ccob.parse_header(original, 0, len(original))
    size_field = ("<I", 12) if header.version == 2 else ("<Q", 16)
    for value in (header.uncompressed_size + 1, header.uncompressed_size - 1):
        bad = bytearray(original)
        struct.pack_into(size_field[0], bad, size_field[1], value)
        with pytest.raises(FormatError, match="inflates to"):
            _slim_bytes(bytes(bad), kept, tmp_path)
    bad = bytearray(original)
    bad[header.header_size - 1] ^= 1  # the hash
    with pytest.raises(FormatError, match="hash"):
        _slim_bytes(bytes(bad), kept, tmp_path)


def _big_bundle(entry_size: int) -> bytes:
    """A plain bundle: an empty host entry, then gfx942 and gfx90a entries of ``entry_size``
    bytes each (a random MiB repeated, distinct per entry)."""
    ids = [b"host-x86_64-unknown-linux--", b"hipv4-amdgcn-amd-amdhsa--gfx942", b"hipv4-amdgcn-amd-amdhsa--gfx90a"]
    sizes = [0, entry_size, entry_size]
    table = 32 + sum(24 + len(i) for i in ids)
    offsets, position = [], 4096
    for size in sizes:
        offsets.append(position if size else table)
        position += size
    head = b"__CLANG_OFFLOAD_BUNDLE__" + struct.pack("<Q", len(ids))
    head += b"".join(struct.pack("<QQQ", o, s, len(i)) + i for o, s, i in zip(offsets, sizes, ids, strict=True))
    return head.ljust(4096, b"\0") + os.urandom(1 << 20) * (entry_size >> 20) + os.urandom(1 << 20) * (entry_size >> 20)


def _slimmed_peak(source: Path, kept: list[TargetId], tmp_path: Path) -> tuple[int, bytes]:
    """Slim the bundle file ``source``, prove it and write it out: how much the peak RSS grew (KiB)
    and the bytes written."""
    fd = os.open(source, os.O_RDONLY)
    try:
        before = reset_peak_rss()
        with slim(fd, 0, os.fstat(fd).st_size, kept, None, str(tmp_path)) as slimmed:
            assert prove_same_selection(slimmed, kept) is None
            with open(tmp_path / "slimmed.out", "wb") as out:
                slimmed.write(out.fileno(), 0)
                assert os.fstat(out.fileno()).st_size == slimmed.size
        grown = peak_rss_kib() - before
    finally:
        os.close(fd)
    return grown, (tmp_path / "slimmed.out").read_bytes()


@pytest.mark.memory
def test_a_large_bundle_is_slimmed_in_bounded_memory(tmp_path):
    """A plain bundle with two 64 MiB entries and a zstd CCOB of it: slimming, proving and writing
    either grows the peak resident memory by far less than the bundle."""
    import zstandard

    kept = [kept_target("gfx942")]
    plain = _big_bundle(64 << 20)
    payload = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(plain)
    packed = ccob.pack_header(3, ccob.METHOD_ZSTD, len(plain), len(payload), hashlib.md5(plain).digest()[:8]) + payload
    gfx942 = hashlib.sha256(plain[4096 : 4096 + (64 << 20)]).hexdigest()
    for data in (plain, packed):
        source = tmp_path / "big.bundle"
        source.write_bytes(data)
        grown, written = _slimmed_peak(source, kept, tmp_path)
        assert len(written) < os.path.getsize(source)
        assert grown < 40 * 1024, f"peak grew by {grown} KiB slimming a {os.path.getsize(source)}-byte bundle"
        # what was written (the CCOB last) selects the original's gfx942 entry on every setting
        assert set(selections(written, kept).values()) == {gfx942}
    header = ccob.parse_header(written, 0, len(written))
    frame = zstandard.get_frame_parameters(written[header.header_size :])
    assert frame.content_size == header.uncompressed_size < len(plain)


def test_the_proof_compares_the_selected_code_byte_for_byte(tmp_path):
    """A byte changed in the original's kept entry (its last byte, past the first MiB compared)
    fails the proof of a plain bundle and of a CCOB; one changed in the removed entry does not."""
    import zstandard

    kept = [kept_target("gfx942")]
    plain = _big_bundle(2 << 20)
    payload = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(plain)
    packed = ccob.pack_header(3, ccob.METHOD_ZSTD, len(plain), len(payload), hashlib.md5(plain).digest()[:8]) + payload
    kept_last, removed_first = 4096 + (2 << 20) - 1, 4096 + (2 << 20)
    for data in (plain, packed):
        source = tmp_path / "bundle"
        source.write_bytes(data)
        fd = os.open(source, os.O_RDONLY)
        try:
            with slim(fd, 0, len(data), kept, None, str(tmp_path)) as slimmed:
                assert prove_same_selection(slimmed, kept) is None
                original = slimmed.original
                assert original is not None
                for changed, verdict in ((kept_last, "for gfx942"), (removed_first, None)):

                    def altered(offset: int, size: int, changed: int = changed, original=original) -> bytes:
                        chunk = bytearray(original(offset, size))
                        if offset <= changed < offset + size:
                            chunk[changed - offset] ^= 0xFF
                        return bytes(chunk)

                    slimmed.original = altered
                    problem = prove_same_selection(slimmed, kept)
                    assert (problem is None) if verdict is None else (verdict in (problem or ""))
                slimmed.original = original
        finally:
            os.close(fd)


# --- applied to a site-packages -------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rocm_audit", *args], capture_output=True, text=True, timeout=300, check=False
    )


def _verify(site: Path, target: str) -> subprocess.CompletedProcess[str]:
    return _cli("verify-arch", "-p", str(site), target, "--format", "json")


def test_apply_loads_registers_the_same_code_rewrites_record_and_reverts(site, built, tmp_path):
    originals = {p.name: p.read_bytes() for p in (site / "hippkg").iterdir()}
    record_before = (site / "hippkg-1.0.dist-info" / "RECORD").read_bytes()
    registered_before = {name: _registered(built["stub"], site / "hippkg" / name) for name in originals}
    assert _verify(site, "gfx90a").returncode == 0

    dry = _cli("prune", "--fatbins", "--dry-run", "-p", str(site), "gfx942", "--format", "json")
    report = json.loads(dry.stdout)
    assert report["prune_fatbins"]["bytes"] > 0
    assert [d["distribution"] for d in report["prune_fatbins"]["by_distribution"]] == ["hippkg"]
    prune001 = next(f for f in report["findings"] if f["rule"] == "PRUNE001")
    assert "prune --fatbins` removes" in prune001["message"]
    assert all(p.read_bytes() == originals[p.name] for p in (site / "hippkg").iterdir())  # dry run

    backup = tmp_path / "backup"
    done = _cli("prune", "--fatbins", "-p", str(site), "--backup", str(backup), "gfx942")
    assert done.returncode == 0, done.stdout + done.stderr
    record = (site / "hippkg-1.0.dist-info" / "RECORD").read_text().splitlines()
    for name, data in originals.items():
        path = site / "hippkg" / name
        now = path.read_bytes()
        assert len(now) <= len(data) and now != data
        assert f"hippkg/{name},{record_hash(now)},{len(now)}" in record
        # the slimmed library still loads, and registers bundles selecting the same gfx942 code
        registered = _registered(built["stub"], path)
        assert len(registered) == len(registered_before[name]) == 2
        for old, new in zip(registered_before[name], registered, strict=True):
            assert selections(new, [kept_target("gfx942")]) == selections(old, [kept_target("gfx942")])
            assert not any(selections(new, [kept_target("gfx90a")]).values())
            assert any(selections(old, [kept_target("gfx90a")]).values())
    assert _verify(site, "gfx942").returncode == 0
    missing = _verify(site, "gfx90a")
    assert missing.returncode == 1
    assert {f["rule"] for f in json.loads(missing.stdout)["findings"]} == {"ARCH001"}

    again = _cli("prune", "--fatbins", "--dry-run", "-p", str(site), "gfx942", "--format", "json")
    assert json.loads(again.stdout)["prune_fatbins"]["bytes"] == 0

    manifest = site / ".rocm-audit" / "prune-manifest.jsonl"
    reverted = _cli("prune", "--revert", str(manifest))
    assert reverted.returncode == 0, reverted.stdout + reverted.stderr
    assert {p.name: p.read_bytes() for p in (site / "hippkg").iterdir()} == originals
    assert (site / "hippkg-1.0.dist-info" / "RECORD").read_bytes() == record_before


def test_revert_without_backup_names_the_reinstall(site):
    done = _cli("prune", "--fatbins", "-p", str(site), "gfx942")
    assert done.returncode == 0, done.stdout + done.stderr
    reverted = _cli("prune", "--revert", str(site / ".rocm-audit" / "prune-manifest.jsonl"))
    assert reverted.returncode == 1
    said = " ".join(reverted.stdout.split())  # as wrapped at 100 columns
    # no interpreter owns this bare site-packages: the message says whose pip it must be
    reinstall = "python -m pip install --force-reinstall --no-deps hippkg==1.0"
    assert f"`{reinstall}`, run by the interpreter of {site}" in said
    # paths relative to the tree the revert put back
    assert said.count(reinstall) == 1
    assert said.startswith(f"paths relative to {site} WARNING PRUNE007 hippkg-1.0.dist-info: ")


def test_keep_dist_and_hard_links_leave_the_library_whole(site):
    originals = {p.name: p.read_bytes() for p in (site / "hippkg").iterdir()}
    kept = _cli("prune", "--fatbins", "--keep-dist", "HipPkg", "-p", str(site), "gfx942")
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert {p.name: p.read_bytes() for p in (site / "hippkg").iterdir()} == originals
    os.link(site / "hippkg" / "libplain.so", site / "libplain-link.so")
    done = _cli("prune", "--fatbins", "-p", str(site), "gfx942", "--format", "json")
    assert (site / "hippkg" / "libplain.so").read_bytes() == originals["libplain.so"]
    assert (site / "hippkg" / "libccob.so").read_bytes() != originals["libccob.so"]
    refused = [f for f in json.loads(done.stdout)["findings"] if f["rule"] == "PRUNE008"]
    assert refused and all("hard links" in f["message"] for f in refused)


def test_a_kill_at_any_rename_leaves_each_library_original_or_journalled(site, tmp_path):
    originals = {p.name: p.read_bytes() for p in (site / "hippkg").iterdir()}
    record_before = (site / "hippkg-1.0.dist-info" / "RECORD").read_bytes()
    base = tmp_path / "base"
    shutil.copytree(site, base)
    states = []
    for nth in range(1, 12):
        shutil.rmtree(site)
        shutil.copytree(base, site)
        backup = tmp_path / f"backup{nth}"
        args = ("prune", "--fatbins", "-p", str(site), "--backup", str(backup), "gfx942")
        killed = rocm_audit(*args, inject=("rename", nth))
        manifest = site / ".rocm-audit" / "prune-manifest.jsonl"
        journalled = {}
        if manifest.exists():
            for line in manifest.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if entry.get("type") == "fatbin-file":
                    journalled[Path(entry["path"]).name] = entry
        changed = 0
        for name, data in originals.items():
            now = (site / "hippkg" / name).read_bytes()
            if now != data:
                changed += 1
                entry = journalled[name]  # changed: journalled first, with a whole backup
                assert hashlib.sha256(Path(entry["backup"]).read_bytes()).hexdigest() == entry["sha256"]
        assert not list((site / "hippkg").glob(".rocm-audit-tmp.*")) or killed.returncode != 0
        states.append((killed.returncode != 0, bool(journalled), changed))
        if manifest.exists():
            assert _cli("prune", "--revert", str(manifest)).returncode == 0
        assert {p.name: p.read_bytes() for p in (site / "hippkg").iterdir() if not p.name.startswith(".")} == originals
        assert (site / "hippkg-1.0.dist-info" / "RECORD").read_bytes() == record_before
        if killed.returncode == 0:
            break  # past the last rename: the run completed
    else:
        pytest.fail(f"the run still renamed after 11 kill points: {states}")
    # killed between journal and replace, and between the two libraries
    assert (True, True, 0) in states and (True, True, 1) in states, states


# --- zstd CCOBs read through the frame index -------------------------------------------------


def _counting_index(monkeypatch) -> dict[str, int]:
    """Count the frame indexes built and the inflated bytes read through them."""
    from rocm_audit.formats import zstd_index

    counts = {"built": 0, "read": 0}

    class Counting(zstd_index.FrameIndex):
        def __init__(self, *args, **kwargs) -> None:
            counts["built"] += 1
            super().__init__(*args, **kwargs)

        def read(self, offset: int, length: int) -> bytes:
            chunk = super().read(offset, length)
            counts["read"] += len(chunk)
            return chunk

    monkeypatch.setattr(zstd_index, "FrameIndex", Counting)
    return counts


def _needs_index() -> None:
    from rocm_audit.formats import zstd_index

    if not zstd_index.available():
        pytest.skip("the _zstdindex extension is not built (setup.py builds it where a C compiler is)")


def _varied(size: int, seed: int) -> bytes:
    """Bytes that recur with small edits far apart, as code objects for many GPUs do (what
    long-distance matching finds), with alignment padding between them."""
    import random

    rng = random.Random(seed)
    words = [rng.randbytes(rng.randint(2, 12)) for _ in range(400)]
    base = b"".join(rng.choice(words) for _ in range(size // 280 + 1))[: size // 40]
    out = bytearray()
    while len(out) < size:
        cut = rng.randrange(len(base))
        piece = bytearray(base[cut : cut + rng.randint(1000, 60000)])
        for _ in range(len(piece) // 5000):
            piece[rng.randrange(len(piece))] = rng.randrange(256)
        out += piece
        if rng.random() < 0.1:
            out += b"\0" * rng.randint(1, 5000)
    return bytes(out[:size])


# Kept for gfx942 and gfx950: their native entries (xnack- and the bare one, for xnack+) and the
# SPIR-V one; gfx90a, gfx1100 and the generic one (native entries serve every setting) go.
WIDE_ARCHES = (
    ("gfx90a", 0x53F),
    ("gfx942:xnack-", 0x54C),
    ("gfx942", 0x54C),
    ("gfx1100", 0x41),
    ("gfx9-4-generic", 0x5F),
    ("gfx950", 0x54F),
)


def _wide_ccob(entry_size: int, window_log: int) -> tuple[bytes, bytes]:
    """A CCOB v3 of a bundle with several entries compressed as clang's bundler does (one zstd
    frame, long-distance matching, a window of 2**window_log); returns (CCOB, inflated bundle)."""
    import zstandard

    from support.gpu.arch_writers import amdgpu_header, bundle

    share = _varied(entry_size * len(WIDE_ARCHES), 5)
    entries = [("host-x86_64-unknown-linux--", b"")]
    entries += [
        (f"hipv4-amdgcn-amd-amdhsa--{arch}", amdgpu_header(flags) + share[k * entry_size : (k + 1) * entry_size])
        for k, (arch, flags) in enumerate(WIDE_ARCHES)
    ]
    entries.append(("hip-spirv64-amd-amdhsa--amdgcnspirv", b"\x03\x02\x23\x07" + share[:4096]))
    plain = bundle(entries)
    params = zstandard.ZstdCompressionParameters.from_level(
        3, enable_ldm=True, window_log=window_log, write_content_size=True
    )
    payload = zstandard.ZstdCompressor(compression_params=params).compress(plain)
    digest = hashlib.md5(plain).digest()[:8]
    return ccob.pack_header(3, ccob.METHOD_ZSTD, len(plain), len(payload), digest) + payload, plain


def test_the_index_and_the_stream_give_the_same_ccob(built, tmp_path, monkeypatch):
    """Every zstd CCOB slimmed through the frame index is byte for byte the one the streaming
    path gives, and proved the same way: clang's --offload-compress bundles (read whole through
    the index and checked against their MD5) and a larger test-made one with several entries,
    where the index resolves the table and the kept entries only."""
    _needs_index()
    kept = [kept_target("gfx942"), kept_target("gfx950")]
    wide, plain = _wide_ccob(2 << 20, 27)
    for original in [*_bundles(built["libccob.so"]), wide]:
        counts = _counting_index(monkeypatch)
        indexed, indexed_bytes, proved = _slim_bytes(original, kept, tmp_path)
        assert proved and counts["built"] == 1 and counts["read"] > 0
        header = ccob.parse_header(original, 0, len(original))
        if header.uncompressed_size > (1 << 20):
            # the table and the kept entries, not the three 2 MiB entries that go
            assert counts["read"] < header.uncompressed_size - 3 * (2 << 20), counts
        with monkeypatch.context() as streaming:
            streaming.setenv("ROCM_AUDIT_NO_ZSTD_INDEX", "1")
            streamed, streamed_bytes, streamed_proved = _slim_bytes(original, kept, tmp_path)
        assert counts["built"] == 1, "the index was used with ROCM_AUDIT_NO_ZSTD_INDEX=1"
        assert streamed_proved and streamed_bytes == indexed_bytes
        assert (indexed.kept, indexed.removed) == (streamed.kept, streamed.removed)
        monkeypatch.undo()
    removed = sorted(r.rsplit("--", 1)[-1] for r in indexed.removed)
    assert removed == ["gfx1100", "gfx9-4-generic", "gfx90a"]
    assert selections(indexed_bytes, kept) == selections(wide, kept)
    assert all(selections(indexed_bytes, kept).values())
    assert _inflated(indexed_bytes) != plain


def test_a_frame_the_index_refuses_is_streamed(built, tmp_path, monkeypatch):
    """Past the index's limits (IndexTooLarge) the CCOB is streamed and slimmed all the same; a
    damaged frame (FrameCorrupt) is streamed too, so it is refused with the stream's words."""
    from rocm_audit.formats import zstd_index

    _needs_index()
    kept = [kept_target("gfx942")]
    wide, _plain = _wide_ccob(1 << 20, 24)
    _slimmed, expected, _ = _slim_bytes(wide, kept, tmp_path)
    counts = _counting_index(monkeypatch)
    monkeypatch.setattr(zstd_index, "MAX_RECORDS", 100)
    _slimmed, data, proved = _slim_bytes(wide, kept, tmp_path)
    assert counts["built"] == 1 and proved and data == expected
    monkeypatch.undo()
    damaged = bytearray(wide)
    damaged[len(damaged) // 2] ^= 0x5A
    errors = []
    counts = _counting_index(monkeypatch)
    for env in ("0", "1"):
        monkeypatch.setenv("ROCM_AUDIT_NO_ZSTD_INDEX", env)
        with pytest.raises(FormatError) as caught:
            _slim_bytes(bytes(damaged), kept, tmp_path)
        errors.append(str(caught.value))
        assert counts["built"] == 1  # the index met the damage first, then the stream
    assert errors[0] == errors[1] and "corrupt" in errors[0]


def test_through_the_index_the_original_md5_is_not_read_the_sizes_and_selection_are(tmp_path, monkeypatch):
    """The decision docs/prune.md states: over 1 MiB inflated, the index path does not read
    every inflated byte, so a wrong MD5 in the original's header goes unseen (the stream refuses
    it); a wrong declared size is refused both ways, and the new CCOB gets a correct MD5."""
    _needs_index()
    kept = [kept_target("gfx942")]
    wide, _plain = _wide_ccob(1 << 20, 24)
    header = ccob.parse_header(wide, 0, len(wide))
    bad_hash = bytearray(wide)
    bad_hash[header.header_size - 1] ^= 1
    _slimmed, data, proved = _slim_bytes(bytes(bad_hash), kept, tmp_path)
    assert proved and _inflated(data)  # _inflated checks the new header's MD5
    bad_size = bytearray(wide)
    struct.pack_into("<Q", bad_size, 16, header.uncompressed_size - 1)
    for env in ("0", "1"):
        monkeypatch.setenv("ROCM_AUDIT_NO_ZSTD_INDEX", env)
        with pytest.raises(FormatError, match="inflates to"):
            _slim_bytes(bytes(bad_size), kept, tmp_path)
    with pytest.raises(FormatError, match="hash"):
        _slim_bytes(bytes(bad_hash), kept, tmp_path)


@pytest.mark.memory
def test_a_wide_window_ccob_is_slimmed_without_its_window(tmp_path, monkeypatch):
    """A CCOB of 48 MiB inflated compressed with a 128 MiB window (clang's bundler asks for
    long-distance matching): streamed, slimming holds the window (most of the 48 MiB); through
    the index, peak memory grows by a few MiB."""
    import gc

    from rocm_audit.formats import ccob as ccob_format

    _needs_index()
    kept = [kept_target("gfx942")]
    wide, plain = _wide_ccob(8 << 20, 27)
    del plain
    source = tmp_path / "wide.bundle"
    source.write_bytes(wide)
    del wide
    gc.collect()

    def slimmed_peak() -> tuple[int, bytes]:
        ccob_format.release_shared_decompressor()
        gc.collect()
        return _slimmed_peak(source, kept, tmp_path)

    slimmed_peak()  # once untimed: first-use allocations (imports, the extension) are not the window
    indexed_kib, indexed = slimmed_peak()
    monkeypatch.setenv("ROCM_AUDIT_NO_ZSTD_INDEX", "1")
    give_back_freed_memory()  # the window must come from new pages, not from what earlier tests freed
    streamed_kib, streamed = slimmed_peak()
    assert indexed == streamed
    assert streamed_kib > 32 * 1024, streamed_kib  # the window
    assert indexed_kib < 16 * 1024, indexed_kib


# --- bundles slimmed on several threads ------------------------------------------------------


@pytest.fixture(scope="module")
def mixed_library(built, tmp_path_factory) -> Path:
    """A library of five bundles, plain and CCOB mixed: the two fixture libraries' objects and
    three more translation units (more bundles than two workers take at once)."""
    cxx = require_tool("clang++-19")
    out = built["libccob.so"].parent
    objects = ["libplain.so.k1.o", "libccob.so.k2.o"]
    for tu, number, extra in (("k3", 3, ["--offload-compress"]), ("k4", 4, []), ("k5", 5, ["--offload-compress"])):
        (out / f"{tu}.hip").write_text(TU % (tu, number))
        arches = ["--offload-arch=gfx942", "--offload-arch=gfx90a"]
        run_checked([cxx, *HIP_FLAGS, "-c", *extra, *arches, f"{tu}.hip", "-o", f"mixed.{tu}.o"], out)
        objects.append(f"mixed.{tu}.o")
    run_checked([cxx, "-shared", *objects, "-o", "libmixed.so"], out)
    return out / "libmixed.so"


def _slim_with(path: Path, workers: int, tmp_path: Path, monkeypatch) -> tuple[bytes, object, int, set[str]]:
    """slim_library with ``workers`` into a copy: the new file's bytes, the result's fields, the
    most bundles slimmed at once and the threads that slimmed them."""
    import threading

    from rocm_audit.prune.fatbins import library

    running, most, threads = [0], [0], set()
    lock = threading.Lock()
    real_slim = library.slim

    def counted_slim(*args, **kwargs):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            threads.add(threading.current_thread().name)
        try:
            return real_slim(*args, **kwargs)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(library, "slim", counted_slim)
    copy = tmp_path / f"{path.name}.{workers}"
    shutil.copyfile(path, copy)
    with open(path, "rb") as before, open(copy, "r+b") as after:
        result = library.slim_library(str(path), [kept_target("gfx942")], after.fileno(), workers=workers)
        assert library.prove_file(before.fileno(), after.fileno(), result) is None
    monkeypatch.undo()
    fields = ([(b.place, b.new_size, b.kept, b.removed) for b in result.bundles], result.digests, result.plan)
    return copy.read_bytes(), fields, most[0], threads


@pytest.mark.parametrize("name", ["libplain.so", "libccob.so", "libmixed.so"])
def test_any_number_of_workers_writes_the_same_file(built, mixed_library, tmp_path, monkeypatch, name):
    """One worker and two or more give byte-identical libraries and the same result, bundle for
    bundle; with two workers at most two bundles are slimmed at once, off the calling thread."""
    path = mixed_library if name == "libmixed.so" else built[name]
    serial, serial_fields, most, threads = _slim_with(path, 1, tmp_path, monkeypatch)
    assert most == 1 and threads == {"MainThread"}
    assert serial != path.read_bytes() and all(new < place.extent for place, new, *_ in serial_fields[0])
    for workers in (2, 3):
        data, fields, most, threads = _slim_with(path, workers, tmp_path, monkeypatch)
        assert data == serial and fields == serial_fields
        assert most <= workers and "MainThread" not in threads
    if name == "libmixed.so":
        assert len(serial_fields[0]) == 5
        assert {b[0].format.split("-")[0] for b in serial_fields[0]} == {"bundle", "ccob"}


def test_the_first_damaged_bundle_is_refused_whatever_the_workers(mixed_library, tmp_path):
    """Two damaged bundles (the third's compressed payload, the fifth's header hash): every
    worker count raises the serial run's error, the third bundle's, and leaves no worker running."""
    import threading

    from rocm_audit.prune.fatbins.library import locate, slim_library

    damaged = tmp_path / "libdamaged.so"
    data = bytearray(mixed_library.read_bytes())
    fd = os.open(mixed_library, os.O_RDONLY)
    try:
        _section, places = locate(fd)
    finally:
        os.close(fd)
    third, fifth = places[2], places[4]
    assert third.format.startswith("ccob") and fifth.format.startswith("ccob")
    header = ccob.parse_header(bytes(data[third.offset : third.offset + 64]), third.offset, third.extent)
    for at in range(header.header_size + 40, third.extent, 97):  # damage all through the payload
        data[third.offset + at] ^= 0x5A
    fifth_header = ccob.parse_header(bytes(data[fifth.offset : fifth.offset + 64]), fifth.offset, fifth.extent)
    data[fifth.offset + fifth_header.header_size - 1] ^= 1  # the hash is the header's last field
    damaged.write_bytes(bytes(data))
    errors = []
    threads = threading.active_count()
    for workers in (1, 2, 4):
        with pytest.raises(FormatError) as caught:
            slim_library(str(damaged), [kept_target("gfx942")], workers=workers)
        errors.append((type(caught.value), str(caught.value)))
        assert threading.active_count() == threads
    assert errors[0] == errors[1] == errors[2], errors
    assert "corrupt" in errors[0][1], errors  # the third's, not the fifth's "hash"
    original = mixed_library.read_bytes()
    damaged.write_bytes(
        bytes(data[: third.offset]) + original[third.offset : fifth.offset] + bytes(data[fifth.offset :])
    )
    with pytest.raises(FormatError, match="hash"):  # the fifth alone
        slim_library(str(damaged), [kept_target("gfx942")], workers=2)


@pytest.mark.memory
def test_wide_window_streams_on_two_threads_hold_one_window(tmp_path, monkeypatch):
    """Streamed (ROCM_AUDIT_NO_ZSTD_INDEX=1), a CCOB with a 128 MiB window holds most of its
    48 MiB inflated bundle as the window; two slimmed at once on two threads, as a library's
    bundles are, give the same bytes (a decompression context each) and hold one window at a
    time, not two."""
    import gc
    import threading

    from rocm_audit.formats import ccob as ccob_format

    kept = [kept_target("gfx942")]
    wide, plain = _wide_ccob(8 << 20, 27)
    del plain
    source = tmp_path / "wide.bundle"
    source.write_bytes(wide)
    del wide
    monkeypatch.setenv("ROCM_AUDIT_NO_ZSTD_INDEX", "1")

    def slimmed(name: str, results: dict[str, bytes]) -> None:
        fd = os.open(source, os.O_RDONLY)
        try:
            with slim(fd, 0, os.fstat(fd).st_size, kept, None, str(tmp_path)) as made:
                assert prove_same_selection(made, kept) is None
                results[name] = made.read_at(0, made.size)
        finally:
            os.close(fd)
            ccob_format.release_shared_decompressor()

    def peak_growth(names: list[str]) -> tuple[int, dict[str, bytes]]:
        gc.collect()
        results: dict[str, bytes] = {}
        threads = [threading.Thread(target=slimmed, args=(name, results)) for name in names]
        before = reset_peak_rss()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return peak_rss_kib() - before, results

    one_kib, one = peak_growth(["a"])
    two_kib, two = peak_growth(["b", "c"])
    assert one_kib > 32 * 1024, one_kib  # the window
    assert two["b"] == two["c"] == one["a"]
    assert two_kib < one_kib + 24 * 1024, (one_kib, two_kib)
