"""Read image archives without a daemon: `docker save` tarballs and OCI image layouts.

Formats (peers.md 5):
- `docker save`, legacy: ``manifest.json`` (list of ``{"Config", "RepoTags", "Layers"}``) with
  ``<id>/layer.tar`` members, which may be links to other layer tars;
- `docker save` from Docker 25+: the same ``manifest.json`` plus an OCI layout (``blobs/sha256``);
- OCI image layouts (skopeo ``oci:``, umoci) as a directory or a tar of one (``oci-archive:``):
  ``index.json`` -> manifest (possibly through nested indexes) -> config and layer blobs.
Layer blobs are sniffed (gzip, zstd, plain tar); media types are not trusted. A compressed outer
archive is first decompressed into the private work directory (bounded by the same byte limit).
Every structural problem raises FormatError naming the member and offset.
"""

from __future__ import annotations

import abc
import contextlib
import json
import os
import posixpath
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from rocm_audit.errors import FormatError
from rocm_audit.image import sniff, tarstream
from rocm_audit.units import plural

MAX_JSON_BYTES = 16 << 20
MAX_INDEX_DEPTH = 4
MAX_LINK_HOPS = 8
_DIGEST = re.compile(r"^(sha256|sha512):([0-9a-f]{64}|[0-9a-f]{128})$")
OCI_INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)


class WhichImage(FormatError):
    """The archive holds no image of the REF asked for (``ref``), or several and no REF was named
    (``ref`` None); ``names``: the tags or ref names it has."""

    def __init__(self, label: str, ref: str | None, names: list[str], count: int = 0) -> None:
        shown = ", ".join(names) or "none"
        said = f"no image tagged {ref!r}" if ref is not None else f"{count} images and no REF to choose one"
        super().__init__("image", 0, f"{label}: {said} (its tags: {shown})")
        self.ref, self.names, self.count = ref, names, count


@dataclass(frozen=True, slots=True)
class LayerRef:
    member: str  # path inside the archive or layout
    digest: str | None  # expected digest of the stored blob (OCI), None when not known
    media_type: str = ""


@dataclass(slots=True)
class ImageLayout:
    kind: str  # "docker-save", "docker-save+oci", "oci-layout"
    layers: list[LayerRef]
    config: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    manifest_digest: str | None = None
    platform: str | None = None  # OS/ARCH[/VARIANT] of the config, where the source says it (registry)
    unchecked: str = ""  # why the layers cannot be checked against the config's digests ("" when they are)


class _Region:
    """A read-only window [start, start+size) of a file: one member of an uncompressed tar."""

    def __init__(self, path: str, start: int, size: int) -> None:
        self.handle = open(path, "rb")
        self.handle.seek(start)
        self.left = size

    def read(self, size: int = -1, /) -> bytes:
        size = self.left if size < 0 else min(size, self.left)
        piece = self.handle.read(size)
        self.left -= len(piece)
        return piece

    def close(self) -> None:
        self.handle.close()


class Store(abc.ABC):
    """Named members of an archive or directory."""

    label: str

    @abc.abstractmethod
    def exists(self, name: str) -> bool: ...

    @abc.abstractmethod
    def open(self, name: str) -> BinaryIO | _Region: ...

    @abc.abstractmethod
    def size(self, name: str) -> int: ...

    def names(self) -> list[str]:
        """Every member's name (what an error says the store holds instead of an image)."""
        return []

    def read_json(self, name: str) -> Any:
        if not self.exists(name):
            raise FormatError("image", 0, f"{self.label}: {name} is missing")
        if self.size(name) > MAX_JSON_BYTES:
            raise FormatError("image", 0, f"{self.label}: {name} is larger than {MAX_JSON_BYTES} bytes")
        handle = self.open(name)
        try:
            raw = handle.read(MAX_JSON_BYTES + 1)
        finally:
            handle.close()
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise FormatError("json", getattr(exc, "pos", 0) or 0, f"{self.label}: {name}: {exc}") from None
        except RecursionError:  # "[[[[..." of a hostile archive: Python's parser recurses per level
            raise FormatError("json", 0, f"{self.label}: {name}: nested too deeply") from None


class DirStore(Store):
    """An unpacked layout. Names resolve inside the directory only (links out are refused)."""

    def __init__(self, directory: str) -> None:
        self.directory = os.path.realpath(directory)
        self.label = directory

    def _path(self, name: str) -> str:
        clean = _clean(name, self.label)
        path = os.path.realpath(os.path.join(self.directory, clean))
        if not path.startswith(self.directory + os.sep):
            raise FormatError("image", 0, f"{self.label}: {name} resolves outside the layout")
        return path

    def exists(self, name: str) -> bool:
        return os.path.isfile(self._path(name))

    def size(self, name: str) -> int:
        return os.path.getsize(self._path(name))

    def names(self) -> list[str]:
        try:
            return sorted(os.listdir(self.directory))
        except OSError:
            return []

    def open(self, name: str) -> BinaryIO:
        if not self.exists(name):
            raise FormatError("image", 0, f"{self.label}: {name} is missing")
        return open(self._path(name), "rb")


class TarStore(Store):
    """An uncompressed tar, indexed in one pass of headers (data is skipped with seeks)."""

    def __init__(self, path: str, label: str) -> None:
        self.path = path
        self.label = label
        self.members: dict[str, tuple[int, int]] = {}  # name -> (data offset, size)
        self.links: dict[str, str] = {}  # name -> target name (hardlinks and symlinks)
        with open(path, "rb") as handle:
            try:
                for entry, _data in tarstream.iter_entries(handle):
                    name = tarstream_name(entry.name)
                    if entry.kind == tarstream.REGULAR:
                        self.members[name] = (entry.data_offset, entry.size)
                    elif entry.kind == tarstream.HARDLINK:
                        self.links[name] = tarstream_name(entry.linkname)
                    elif entry.kind == tarstream.SYMLINK:
                        self.links[name] = posixpath.normpath(posixpath.join(posixpath.dirname(name), entry.linkname))
            except FormatError as exc:
                raise FormatError(exc.fmt, exc.offset, f"{label}: {exc.reason}") from None

    def _resolve(self, name: str) -> str:
        name = _clean(name, self.label)
        for _ in range(MAX_LINK_HOPS):
            if name in self.members:
                return name
            if name not in self.links:
                raise FormatError("image", 0, f"{self.label}: {name} is missing")
            name = self.links[name]
        raise FormatError("image", 0, f"{self.label}: {name}: too many links")

    def exists(self, name: str) -> bool:
        try:
            self._resolve(name)
        except FormatError:
            return False
        return True

    def size(self, name: str) -> int:
        return self.members[self._resolve(name)][1]

    def names(self) -> list[str]:
        return [*self.members, *self.links]

    def open(self, name: str) -> _Region:
        start, size = self.members[self._resolve(name)]
        return _Region(self.path, start, size)


@contextlib.contextmanager
def read_again(store: Store, member: str) -> Iterator[tarstream.Readable]:
    """A layer's tar stream read once more from its start (merge.apply_layer's ``again``)."""
    raw = store.open(member)
    try:
        yield tarstream.decompressed(raw)
    finally:
        raw.close()


def tarstream_name(name: str) -> str:
    return posixpath.normpath(name.lstrip("/")) if name not in ("", ".", "./") else "."


def _clean(name: str, label: str) -> str:
    clean = posixpath.normpath(name)
    if clean.startswith("/") or clean == ".." or clean.startswith("../") or "\0" in clean:
        raise FormatError("image", 0, f"{label}: unsafe member name {name!r}")
    return clean


def open_image(path: str, workdir: str, max_bytes: int, ref: str | None = None) -> tuple[Store, ImageLayout]:
    """The archive's members and the layout of its image (``ref`` among several). Raises
    UsageError when nothing of it can be read as an image, saying what it is instead
    (image/sniff.py): a wheel, text, a file-system tar, several images and no REF, ..."""
    head = b"" if os.path.isdir(path) else sniff.head_of(path)
    sniff.refuse_known_kind(path, head)
    try:
        store = open_store(path, workdir, max_bytes)
    except FormatError as exc:
        inner = sniff.head_of(os.path.join(workdir, "archive.tar"))
        raise sniff.not_a_tar(path, exc, sniff.is_compressed(head), inner) from None
    try:
        return store, read_layout(store, ref)
    except WhichImage as exc:
        raise sniff.which_image(path, exc.ref, exc.names, exc.count) from None
    except FormatError as exc:
        if not _holds_image_documents(store):
            raise sniff.no_image_in(path, store.names()) from None
        raise sniff.damaged(path, exc) from None


def _holds_image_documents(store: Store) -> bool:
    try:
        return store.exists("manifest.json") or store.exists("index.json")
    except FormatError:  # a link out of a layout directory: there, but not readable
        return True


def open_store(path: str, workdir: str, max_bytes: int) -> Store:
    """A directory layout, an uncompressed tar, or a compressed tar (decompressed into workdir)."""
    if os.path.isdir(path):
        return DirStore(path)
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head.startswith(tarstream.GZIP_MAGIC) or head == tarstream.ZSTD_MAGIC:
        plain = os.path.join(workdir, "archive.tar")
        copied = 0
        with open(path, "rb") as source, open(plain, "wb") as target:
            stream = tarstream.decompressed(source)
            while piece := stream.read(tarstream.CHUNK):
                copied += len(piece)
                if copied > max_bytes:
                    raise sniff.too_large(path, max_bytes)
                target.write(piece)
        return TarStore(plain, path)
    return TarStore(path, path)


def blob_name(digest: object, label: str) -> str:
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise FormatError("image", 0, f"{label}: bad digest {digest!r}")
    algorithm, hexdigest = digest.split(":", 1)
    return f"blobs/{algorithm}/{hexdigest}"


def read_layout(store: Store, ref: str | None = None) -> ImageLayout:
    """Find the image's layers in order. ``ref`` picks among several images (tag or ref name)."""
    if store.exists("manifest.json"):
        return _docker_save(store, ref)
    if store.exists("index.json"):
        return _oci(store, ref)
    raise FormatError(
        "image",
        0,
        f"{store.label}: neither manifest.json nor index.json: not a docker save archive or an OCI image layout",
    )


def _docker_save(store: Store, ref: str | None) -> ImageLayout:
    manifest = store.read_json("manifest.json")
    if not isinstance(manifest, list) or not manifest or not all(isinstance(m, dict) for m in manifest):
        raise FormatError("image", 0, f"{store.label}: manifest.json is not a list of images")
    chosen = manifest[0]
    if ref is not None:
        matching = [m for m in manifest if ref in (m.get("RepoTags") or [])]
        if not matching:
            raise WhichImage(store.label, ref, _tags_of(manifest))
        chosen = matching[0]
    elif len(manifest) > 1:
        raise WhichImage(store.label, None, _tags_of(manifest), len(manifest))
    layers = chosen.get("Layers")
    if not isinstance(layers, list) or not all(isinstance(name, str) for name in layers):
        raise FormatError("image", 0, f"{store.label}: manifest.json Layers is not a list of names")
    config: dict[str, Any] = {}
    if isinstance(chosen.get("Config"), str) and store.exists(chosen["Config"]):
        loaded = store.read_json(chosen["Config"])
        config = loaded if isinstance(loaded, dict) else {}
    kind = "docker-save+oci" if store.exists("oci-layout") else "docker-save"
    # A legacy `<id>/layer.tar` is the uncompressed layer, so its digest is the config's diff ID for
    # its place (rootfs.diff_ids, one per layer, as `docker load` checks them). Other names (a
    # tool's own `layer0.tar.gz`) may be compressed blobs, whose digest is no diff ID: unchecked.
    rootfs = config.get("rootfs")
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    fits = isinstance(diff_ids, list) and len(diff_ids) == len(layers) and all(isinstance(d, str) for d in diff_ids)
    refs = []
    legacy = [name.endswith("/layer.tar") for name in layers]  # another name may hold a compressed blob
    for place, name in enumerate(layers):
        digest = diff_ids[place] if fits and legacy[place] and isinstance(diff_ids, list) else None
        if name.startswith("blobs/"):  # Docker 25+: the blob is named by its digest
            parts = name.split("/")
            digest = f"{parts[1]}:{parts[2]}" if len(parts) == 3 else None
        refs.append(LayerRef(member=name, digest=digest))
    tags = [t for t in chosen.get("RepoTags") or [] if isinstance(t, str)]
    unchecked = ""
    if not fits and any(legacy):
        listed = len(diff_ids) if isinstance(diff_ids, list) else 0
        unchecked = (
            f"its config lists {plural(listed, 'layer digest')} (rootfs.diff_ids) for {plural(len(layers), 'layer')}"
        )
    return ImageLayout(kind=kind, layers=refs, config=config, tags=tags, unchecked=unchecked)


def _tags_of(manifest: list[dict[str, Any]]) -> list[str]:
    return sorted(t for m in manifest for t in (m.get("RepoTags") or []) if isinstance(t, str))


def _oci(store: Store, ref: str | None) -> ImageLayout:
    index = store.read_json("index.json")
    manifest, digest = _pick_manifest(store, index, ref, 0)
    layers = manifest.get("layers")
    if not isinstance(layers, list):
        raise FormatError("image", 0, f"{store.label}: manifest {digest} has no layers list")
    refs = []
    for layer in layers:
        if not isinstance(layer, dict):
            raise FormatError("image", 0, f"{store.label}: manifest {digest}: bad layer descriptor")
        refs.append(
            LayerRef(
                member=blob_name(layer.get("digest"), store.label),
                digest=layer.get("digest"),
                media_type=str(layer.get("mediaType", "")),
            )
        )
    config: dict[str, Any] = {}
    descriptor = manifest.get("config")
    if isinstance(descriptor, dict):
        name = blob_name(descriptor.get("digest"), store.label)
        if store.exists(name):
            loaded = store.read_json(name)
            config = loaded if isinstance(loaded, dict) else {}
    tags = [ref] if ref else []
    return ImageLayout(kind="oci-layout", layers=refs, config=config, tags=tags, manifest_digest=digest)


def _ref_names(entries: list[dict[str, Any]]) -> list[str]:
    names = [(e.get("annotations") or {}).get("org.opencontainers.image.ref.name") for e in entries]
    return [n for n in names if isinstance(n, str)]


def _pick_manifest(store: Store, index: Any, ref: str | None, depth: int) -> tuple[dict[str, Any], str]:
    if depth > MAX_INDEX_DEPTH:
        raise FormatError("image", 0, f"{store.label}: image indexes nested too deep")
    entries = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise FormatError("image", 0, f"{store.label}: index has no manifests")
    candidates = entries
    if ref is not None and depth == 0:
        candidates = [
            e
            for e in entries
            if (e.get("annotations") or {}).get("org.opencontainers.image.ref.name") in (ref, ref.rsplit(":", 1)[-1])
        ]
        if not candidates:
            raise WhichImage(store.label, ref, sorted(_ref_names(entries)))
    if len({str(e.get("digest")) for e in candidates}) == 1:
        candidates = candidates[:1]  # one image under several names (skopeo copy of two tags): no choice
    if len(candidates) > 1:
        amd64 = [e for e in candidates if (e.get("platform") or {}).get("architecture") == "amd64"]
        if len(amd64) == 1:
            candidates = amd64
        elif depth == 0:
            raise WhichImage(store.label, None, sorted(_ref_names(candidates)), len(candidates))
    chosen = candidates[0]
    digest = chosen.get("digest")
    document = store.read_json(blob_name(digest, store.label))
    if not isinstance(document, dict):
        raise FormatError("image", 0, f"{store.label}: manifest {digest} is not an object")
    if document.get("mediaType") in OCI_INDEX_TYPES or chosen.get("mediaType") in OCI_INDEX_TYPES:
        return _pick_manifest(store, document, None, depth + 1)
    return document, str(digest)
