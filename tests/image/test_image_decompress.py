"""Layers decompressed by igzip, zlib-ng or zlib, in parallel threads, applied in order (issue 39).

Every gzip backend must give the same bytes and the same errors; the pipeline must apply layers in
their order whatever thread finishes first, report a bad layer where it is, and leave no thread
behind when the audit stops early.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
import os
import threading
import zlib
from pathlib import Path

import pytest

from rocm_audit.errors import FormatError
from rocm_audit.image import layerpipe, merge, tarstream
from rocm_audit.image.audit import ImageOptions, extract_archive, new_state
from support.image.layer_writers import docker_save, layer, oci_layout

SP = "usr/lib/python3/dist-packages"
BACKENDS = [
    pytest.param(
        name,
        marks=pytest.mark.skipif(
            module is not None and importlib.util.find_spec(module) is None, reason=f"{name} is not installed"
        ),
    )
    for name, module in (("isal", "isal"), ("zlib-ng", "zlib_ng"), ("zlib", None))
]


@pytest.fixture
def backend(request, monkeypatch):
    monkeypatch.setenv(tarstream.GZIP_ENV, request.param)
    tarstream.gzip_backend.cache_clear()
    yield request.param
    tarstream.gzip_backend.cache_clear()


def _read_all(stream: tarstream.Readable, size: int) -> bytes:
    out = io.BytesIO()
    while piece := stream.read(size):
        out.write(piece)
    return out.getvalue()


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_every_backend_inflates_members_and_stops_at_trailing_garbage(backend):
    assert tarstream.gzip_backend()[0] == backend
    first, second = os.urandom(3 << 20), b"abc" * 400_000
    blob = gzip.compress(first) + gzip.compress(second, compresslevel=1) + b"\0\0trailing junk"
    # Reads of 512 bytes (tar headers) and of a whole MiB give the same bytes.
    for size in (512, 1 << 20):
        assert _read_all(tarstream.decompressed(io.BytesIO(blob)), size) == first + second


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_every_backend_reports_corrupt_and_truncated_data(backend):
    good = gzip.compress(os.urandom(1 << 20))
    broken = bytearray(good)
    broken[len(broken) // 2 : len(broken) // 2 + 64] = b"\xff" * 64
    with pytest.raises(FormatError) as corrupt:
        _read_all(tarstream.decompressed(io.BytesIO(bytes(broken))), 1 << 20)
    assert corrupt.value.fmt == "gzip"
    with pytest.raises(FormatError, match="ends early"):
        _read_all(tarstream.decompressed(io.BytesIO(good[: len(good) // 2])), 1 << 20)


def test_the_fastest_installed_backend_is_the_default(monkeypatch):
    monkeypatch.delenv(tarstream.GZIP_ENV, raising=False)
    tarstream.gzip_backend.cache_clear()
    try:
        name, module = tarstream.gzip_backend()
    finally:
        tarstream.gzip_backend.cache_clear()
    installed = [n for n, m in (("isal", "isal"), ("zlib-ng", "zlib_ng")) if importlib.util.find_spec(m)]
    assert name == (installed[0] if installed else "zlib")
    assert module is not zlib or name == "zlib"


def _layers(count: int) -> list[bytes]:
    """Layer i writes file i and rewrites ``shared`` (the top one must win); layer 3 deletes 0."""
    result = []
    for i in range(count):
        entries: list[tuple[str, bytes | None]] = [
            (f"{SP}/f{i}.bin", os.urandom(300_000)),
            (f"{SP}/shared.txt", f"layer {i}".encode()),
        ]
        if i == 3:
            entries.append((f"{SP}/.wh.f0.bin", b""))
        result.append(layer(*entries))
    return result


def _merged(tmp_path: Path, archive: Path) -> merge.MergeState:
    work = tmp_path / "work"
    work.mkdir()
    state = new_state(str(work), ImageOptions(full=True))
    extract_archive(str(archive), str(work), state)
    merge.finish(state)
    return state


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_more_layers_than_cpus_are_applied_in_order(tmp_path, backend):
    count = (os.cpu_count() or 1) + 4
    layout = oci_layout(tmp_path / "oci", _layers(count))
    state = _merged(tmp_path, layout)
    root = Path(state.root) / SP
    assert (root / "shared.txt").read_text() == f"layer {count - 1}"
    assert not (root / "f0.bin").exists()  # layer 3's whiteout
    assert all((root / f"f{i}.bin").exists() for i in range(1, count))
    assert [s.index for s in state.layers] == list(range(count))
    assert not [f for f in state.findings if f.rule in ("IMG001", "IMG005")]


def test_a_corrupt_layer_and_a_wrong_digest_are_reported_where_they_are(tmp_path):
    layers = _layers(6)
    layout = oci_layout(tmp_path / "oci", layers)
    blobs = sorted((layout / "blobs" / "sha256").iterdir(), key=lambda p: p.stat().st_mtime_ns)
    by_content = {}
    for blob in blobs:
        try:
            by_content[gzip.decompress(blob.read_bytes())] = blob
        except (OSError, EOFError, zlib.error):
            continue
    # Layer 1: flip bytes inside the deflate data (digest and content both wrong);
    # layer 4: a valid gzip of other bytes under the old name (only the digest is wrong).
    one = by_content[layers[1]]
    data = bytearray(one.read_bytes())
    data[40:200] = os.urandom(160)
    one.write_bytes(bytes(data))
    by_content[layers[4]].write_bytes(gzip.compress(layers[4] + bytes(1024)))
    state = _merged(tmp_path, layout)
    found = {(f.rule, f.data["layer"]) for f in state.findings if f.rule in ("IMG001", "IMG005")}
    assert ("IMG005", 4) in found
    assert any(rule in ("IMG001", "IMG005") and index == 1 for rule, index in found)
    assert {index for _, index in found} == {1, 4}
    root = Path(state.root) / SP
    assert (root / "shared.txt").read_text() == "layer 5"  # the layers after the bad ones applied
    assert (root / "f5.bin").exists()


def test_limit_reached_mid_image_stops_every_thread(tmp_path):
    before = {t.ident for t in threading.enumerate()}
    archive = docker_save(tmp_path / "save.tar", _layers(8))
    work = tmp_path / "work"
    work.mkdir()
    state = new_state(str(work), ImageOptions(full=True, max_bytes=900_000))
    with pytest.raises(merge.LimitExceeded):
        extract_archive(str(archive), str(work), state)
    # Layer threads, and the threads that hash their blobs beside them.
    leftover = [t.name for t in threading.enumerate() if t.ident not in before and t.name.startswith("rocm-audit-")]
    assert leftover == []


def test_pipeline_memory_is_bounded_while_the_caller_waits(tmp_path):
    # The caller reads nothing for a while: each worker stops at its queue bound.
    raw = [gzip.compress(os.urandom(4 << 20)) for _ in range(3)]

    def opener(data: bytes):
        import contextlib

        @contextlib.contextmanager
        def open_it():
            yield io.BytesIO(data)

        return open_it

    blobs = [layerpipe.Blob(opener(b), "sha256:" + hashlib.sha256(b).hexdigest()) for b in raw]
    with layerpipe.Pipeline(blobs, workers=3) as streams:
        streams = list(streams)
        threading.Event().wait(0.5)
        assert all(s.queue.qsize() <= layerpipe.QUEUE_CHUNKS for s in streams)
        for s, b in zip(streams, raw, strict=True):
            assert _read_all(s, 1 << 20) == gzip.decompress(b)
            assert s.matches()


def test_a_pipeline_left_mid_layer_leaves_no_thread(tmp_path):
    """The caller stops after one piece of a layer larger than its queue: the layer's thread,
    waiting at its bound, and the thread hashing its blob both end."""
    import contextlib

    data = gzip.compress(os.urandom(64 << 10) * 512)  # 32 MiB of tar: 4x the queue's bound

    @contextlib.contextmanager
    def open_it():
        yield io.BytesIO(data)

    before = {t.ident for t in threading.enumerate()}
    with layerpipe.Pipeline([layerpipe.Blob(open_it, None)], workers=1) as streams:
        stream = next(streams)
        assert stream.read(1 << 20)
        threading.Event().wait(0.3)
        assert stream.queue.full()
        names = {t.name for t in threading.enumerate() if t.ident not in before}
        assert {"rocm-audit-blob-digest"} < names, names
    leftover = [t.name for t in threading.enumerate() if t.ident not in before and t.name.startswith("rocm-audit-")]
    assert leftover == []


def _save_stream(layout: Path, order: list[str]) -> list[bytes]:
    """The layout as one tar in ``order`` (blob names first, as Docker 25+ writes), in chunks."""
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in order:
            tar.add(layout / name, arcname=name, recursive=False)
    data = buffer.getvalue()
    return [data[i : i + 65536] for i in range(0, len(data), 65536)]


@pytest.mark.parametrize("reverse", [False, True])
def test_docker_save_stream_applies_layers_as_they_arrive(tmp_path, reverse):

    from rocm_audit.image import audit

    layers = [layer((f"{SP}/big{i}.bin", os.urandom(2 << 20)), (f"{SP}/shared.txt", f"{i}".encode())) for i in range(3)]
    layout = oci_layout(tmp_path / "oci", layers, compress=False, docker_manifest=True)
    manifest = json.loads((layout / "manifest.json").read_text())[0]
    diff_ids = ["sha256:" + hashlib.sha256(b).hexdigest() for b in layers]
    blobs = sorted(str(p.relative_to(layout)) for p in (layout / "blobs" / "sha256").iterdir())
    layer_blobs = manifest["Layers"][::-1] if reverse else manifest["Layers"]
    order = [*layer_blobs, *[b for b in blobs if b not in layer_blobs], "index.json", "manifest.json", "oci-layout"]
    work = tmp_path / "work"
    work.mkdir()
    state = new_state(str(work), ImageOptions(full=True))
    seen_spool: list[int] = []
    rest_from: list[int] = []

    def apply_rest(store, found, start):
        seen_spool.append(len(os.listdir(work / "spool")))
        rest_from.append(start)
        audit.apply_layers(store, found, state, "img", start)

    found, _store, streamed, early = _apply_save_stream(layout, order, diff_ids, state, work, apply_rest)
    merge.finish(state)
    assert (Path(state.root) / SP / "shared.txt").read_text() == "2"
    assert [s.index for s in state.layers] == [0, 1, 2]
    assert not [f for f in state.findings if f.rule in ("IMG001", "IMG005")]
    assert found.kind == "docker-save+oci"
    # Every layer is applied before the manifest: nothing is left for after it.
    assert early == 3 and rest_from == [3]
    if reverse:  # layer 2 and 1 arrive before 0: spooled; 0 streams, then 1 and 2 from the spool
        assert streamed == 1 and seen_spool == [2]
    else:  # in order: nothing spooled at all
        assert streamed == 3 and seen_spool == [0]


def _legacy_layout(directory: Path, layers: list[bytes], linked: dict[int, int] | None = None) -> list[str]:
    """The legacy `docker save` layout of older engines (Debian's docker.io 20.10 writes it):
    ``<id>/VERSION``, ``<id>/json`` naming the layer id below as ``parent`` (none for the bottom
    layer), ``<id>/layer.tar`` (a symbolic link to an earlier one for a repeated layer), the config
    and manifest.json. Returns the layer ids, bottom first."""
    from support.image.layer_writers import image_config

    ids = [hashlib.sha256(f"v1 {i}".encode() + data).hexdigest() for i, data in enumerate(layers)]
    for i, layer_id in enumerate(ids):
        folder = directory / layer_id
        folder.mkdir(parents=True)
        (folder / "VERSION").write_text("1.0")
        document = {"id": layer_id, "created": "1970-01-01T00:00:00Z", "os": "linux"}
        if i:
            document["parent"] = ids[i - 1]
        (folder / "json").write_text(json.dumps(document))
        if linked and i in linked:
            (folder / "layer.tar").symlink_to(f"../{ids[linked[i]]}/layer.tar")
        else:
            (folder / "layer.tar").write_bytes(layers[i])
    config = image_config(layers, None)
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    (directory / config_name).write_bytes(config)
    manifest = [{"Config": config_name, "RepoTags": ["test/image:1"], "Layers": [f"{i}/layer.tar" for i in ids]}]
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return ids


def _legacy_order(ids: list[str], layer_order: list[int]) -> list[str]:
    """Members of the layers in ``layer_order`` (each directory's json before its layer.tar, as the
    engine writes them), then the config and manifest.json."""
    parts = ("", "/VERSION", "/json", "/layer.tar")
    members = [ids[i] + part for i in layer_order for part in parts]
    return [*members, "CONFIG", "manifest.json"]


@pytest.mark.parametrize(
    ("layer_order", "streamed_count"),
    [([0, 1, 2, 3], 4), ([3, 2, 1, 0], 1), ([2, 0, 3, 1], 2)],
    ids=["in-order", "reversed", "shuffled"],
)
def test_legacy_save_stream_places_layers_by_their_parents(tmp_path, layer_order, streamed_count):
    """The legacy layout does not name a layer's place, but each ``<id>/json`` names the layer
    below: a layer streams when the layers below it came first, a layer that comes early is applied
    from the spool as soon as they have, and the result is the saved file's."""
    layers = [
        layer((f"{SP}/big{i}.bin", os.urandom((2 << 20) + i)), (f"{SP}/shared.txt", f"{i}".encode())) for i in range(4)
    ]
    layers[2] = layer((f"{SP}/big2.bin", os.urandom(2 << 20)), (f"{SP}/.wh.big0.bin", b""))
    folder = tmp_path / "legacy"
    ids = _legacy_layout(folder, layers)
    config = next(p.name for p in folder.iterdir() if p.name.endswith(".json") and p.name != "manifest.json")
    order = [config if name == "CONFIG" else name for name in _legacy_order(ids, layer_order)]
    diff_ids = ["sha256:" + hashlib.sha256(b).hexdigest() for b in layers]
    work = tmp_path / "work"
    work.mkdir()
    state = new_state(str(work), ImageOptions(full=True))
    rest_from: list[int] = []

    def apply_rest(store, found, start):
        from rocm_audit.image import audit

        rest_from.append(start)
        audit.apply_layers(store, found, state, "img", start)

    found, _store, streamed, early = _apply_save_stream(folder, order, diff_ids, state, work, apply_rest)
    merge.finish(state)
    assert (streamed, early, rest_from) == (streamed_count, 4, [4])
    assert found.kind == "docker-save"
    assert [s.name for s in state.layers] == [f"{i}/layer.tar" for i in ids]
    assert not [f for f in state.findings if f.rule in ("IMG001", "IMG005")]
    root = Path(state.root) / SP
    assert (root / "shared.txt").read_text() == "3"
    assert sorted(p.name for p in root.iterdir()) == ["big1.bin", "big2.bin", "big3.bin", "shared.txt"]
    assert len(os.listdir(work / "spool")) == 4 - streamed_count  # only what came early was kept


def test_legacy_save_stream_leaves_a_repeated_layer_for_the_manifest(tmp_path):
    """A layer that two places share (a symbolic link to the first copy) has no place before the
    manifest: it and the layers above it are applied after it, with the saved file's result."""
    layers = [layer((f"{SP}/big{i}.bin", os.urandom(2 << 20))) for i in range(3)]
    layers.append(layers[0])  # the same bytes again on top: docker writes a link to the first copy
    folder = tmp_path / "legacy"
    ids = _legacy_layout(folder, layers, linked={3: 0})
    config = next(p.name for p in folder.iterdir() if p.name.endswith(".json") and p.name != "manifest.json")
    order = [config if name == "CONFIG" else name for name in _legacy_order(ids, [0, 1, 2, 3])]
    diff_ids = ["sha256:" + hashlib.sha256(b).hexdigest() for b in layers]
    work = tmp_path / "work"
    work.mkdir()
    state = new_state(str(work), ImageOptions(full=True))
    found, _store, streamed, early = _apply_save_stream(folder, order, diff_ids, state, work)
    merge.finish(state)
    # Layer 0's bytes are layer 3's too: kept, so it and all above it wait for the manifest.
    assert (streamed, early) == (0, 0)
    assert [s.index for s in state.layers] == [0, 1, 2, 3]
    assert not [f for f in state.findings if f.rule in ("IMG001", "IMG005")]
    assert sorted(p.name for p in (Path(state.root) / SP).iterdir()) == ["big0.bin", "big1.bin", "big2.bin"]


def test_legacy_save_stream_that_lies_about_a_parent_is_refused(tmp_path):
    """An export whose jsons put the layers in other places than its manifest: each layer's
    digest is not the engine's diff ID for its place (a finding each), and the manifest check
    refuses the export."""
    layers = [layer((f"{SP}/big{i}.bin", os.urandom(2 << 20))) for i in range(2)]
    folder = tmp_path / "legacy"
    ids = _legacy_layout(folder, layers)
    for layer_id, parent in ((ids[0], ids[1]), (ids[1], None)):  # the chain turned upside down
        document = json.loads((folder / layer_id / "json").read_text())
        document.pop("parent", None)
        if parent:
            document["parent"] = parent
        (folder / layer_id / "json").write_text(json.dumps(document))
    config = next(p.name for p in folder.iterdir() if p.name.endswith(".json") and p.name != "manifest.json")
    order = [config if name == "CONFIG" else name for name in _legacy_order(ids, [1, 0])]
    diff_ids = ["sha256:" + hashlib.sha256(b).hexdigest() for b in layers]
    work = tmp_path / "work"
    work.mkdir()
    state = new_state(str(work), ImageOptions(full=True))
    with pytest.raises(FormatError, match="does not list"):
        _apply_save_stream(folder, order, diff_ids, state, work)
    assert [(f.rule, f.data["layer"]) for f in state.findings if f.rule == "IMG005"] == [("IMG005", 0), ("IMG005", 1)]


def _apply_save_stream(layout: Path, order: list[str], diff_ids: list[str], state, work: Path, apply_rest=None):
    """savestream.apply_save_stream over the layout streamed in ``order``, the spooled layers
    applied after it by ``apply_rest`` (a second export gives nothing)."""
    import contextlib

    from rocm_audit.image import audit, savestream

    if apply_rest is None:

        def apply_rest(store, found, start):
            audit.apply_layers(store, found, state, "img", start)

    return savestream.apply_save_stream(
        _save_stream(layout, order),
        diff_ids,
        state,
        str(work),
        "img",
        audit.apply_layer_stream,
        lambda member: contextlib.nullcontext(io.BytesIO(b"")),
        apply_rest,
        1 << 30,
    )


def test_docker_save_stream_reports_a_layer_that_is_not_its_digest(tmp_path):

    layers = [layer((f"{SP}/big{i}.bin", os.urandom(2 << 20))) for i in range(2)]
    layout = oci_layout(tmp_path / "oci", layers, compress=False, docker_manifest=True)
    manifest = json.loads((layout / "manifest.json").read_text())[0]
    diff_ids = ["sha256:" + hashlib.sha256(b).hexdigest() for b in layers]
    # The first blob holds other bytes than its name says (a different valid tar of the same size).
    first = layout / manifest["Layers"][0]
    other = layer((f"{SP}/big0.bin", os.urandom(2 << 20)))
    assert len(other) == first.stat().st_size
    first.write_bytes(other)
    blobs = sorted(str(p.relative_to(layout)) for p in (layout / "blobs" / "sha256").iterdir())
    order = [*manifest["Layers"], *[b for b in blobs if b not in manifest["Layers"]], "index.json", "manifest.json"]
    work = tmp_path / "work"
    work.mkdir()
    state = new_state(str(work), ImageOptions(full=True))
    _, _, streamed, _ = _apply_save_stream(layout, order, diff_ids, state, work)
    assert streamed == 2
    assert [(f.rule, f.data["layer"]) for f in state.findings if f.rule == "IMG005"] == [("IMG005", 0)]


def test_docker_save_stream_stopped_mid_layer_leaves_no_thread(tmp_path):
    """A limit reached inside a layer applied as it streams: the thread hashing it ends too."""

    layers = [layer(*((f"{SP}/f{i}.bin", os.urandom(64 << 10)) for i in range(40)))]
    layout = oci_layout(tmp_path / "oci", layers, compress=False, docker_manifest=True)
    manifest = json.loads((layout / "manifest.json").read_text())[0]
    blobs = sorted(str(p.relative_to(layout)) for p in (layout / "blobs" / "sha256").iterdir())
    order = [*manifest["Layers"], *[b for b in blobs if b not in manifest["Layers"]], "index.json", "manifest.json"]
    work = tmp_path / "work"
    work.mkdir()
    state = new_state(str(work), ImageOptions(full=True, max_entries=10))
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(merge.LimitExceeded):
        _apply_save_stream(layout, order, ["sha256:" + hashlib.sha256(layers[0]).hexdigest()], state, work)
    assert len(state.layers) == 1  # it stopped inside the streamed layer
    leftover = [t.name for t in threading.enumerate() if t.ident not in before and t.name.startswith("rocm-audit-")]
    assert leftover == []
