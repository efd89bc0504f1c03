"""Test-side writers for what no build tool makes: hand-built layers, docker-save and OCI archives,
including malformed and hostile ones (absolute names, '..', escaping links, devices, big headers).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import zstandard


def member(
    name: str,
    data: bytes | None = None,
    *,
    kind: bytes = tarfile.REGTYPE,
    link: str = "",
    mode: int = 0o644,
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    info.size = len(data) if data is not None and kind == tarfile.REGTYPE else 0
    return info


def layer(*entries: tuple[str, bytes | None] | tarfile.TarInfo, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """A layer tar: ("path/", None) is a directory, ("path", bytes) a file, or a ready TarInfo."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as archive:
        for entry in entries:
            if isinstance(entry, tarfile.TarInfo):
                archive.addfile(entry, io.BytesIO(b"\0" * entry.size) if entry.size else None)
                continue
            name, data = entry
            if data is None:
                archive.addfile(member(name.rstrip("/"), kind=tarfile.DIRTYPE, mode=0o755))
            else:
                archive.addfile(member(name, data), io.BytesIO(data))
    return buffer.getvalue()


def write_file_member(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def image_config(
    layers: list[bytes],
    env: list[str] | None,
    history: list[str | dict[str, object]] | None = None,
    diff_ids: list[str] | None = None,
) -> bytes:
    """The image config both archive formats carry: platform, Env, the layers' diff ids (or
    ``diff_ids`` as given), and ``history`` (oldest first: a ``created_by`` per entry, or a whole
    entry) when given."""
    config: dict[str, object] = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": env or []},
        "rootfs": {
            "type": "layers",
            "diff_ids": ["sha256:" + hashlib.sha256(b).hexdigest() for b in layers] if diff_ids is None else diff_ids,
        },
    }
    if history is not None:
        config["history"] = [entry if isinstance(entry, dict) else {"created_by": entry} for entry in history]
    return json.dumps(config).encode()


def docker_save(
    path: Path,
    layers: list[bytes],
    *,
    env: list[str] | None = None,
    tag: str = "test/image:1",
    manifest: object | None = None,
    linked: dict[int, int] | None = None,
    history: list[str | dict[str, object]] | None = None,
    diff_ids: list[str] | None = None,
) -> Path:
    """A legacy `docker save` archive: manifest.json, <id>.json config, <id>/layer.tar.

    ``linked`` {i: j}: layer i's layer.tar is a symlink to layer j's (docker writes that for
    identical layers).
    """
    config_bytes = image_config(layers, env, history, diff_ids)
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    names = [f"{hashlib.sha256(bytes([i]) + b).hexdigest()}/layer.tar" for i, b in enumerate(layers)]
    if manifest is None:
        manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": names}]
    with tarfile.open(path, "w") as archive:
        for i, (name, data) in enumerate(zip(names, layers, strict=True)):
            if linked and i in linked:
                link = tarfile.TarInfo(name)
                link.type, link.linkname = tarfile.SYMTYPE, f"../{names[linked[i]]}"
                archive.addfile(link)
            else:
                write_file_member(archive, name, data)
        write_file_member(archive, config_name, config_bytes)
        write_file_member(
            archive,
            "manifest.json",
            manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode(),
        )
    return path


def oci_layout(
    directory: Path,
    layers: list[bytes],
    *,
    compress: bool | str = True,
    ref: str = "latest",
    env: list[str] | None = None,
    corrupt_digest: bool = False,
    docker_manifest: bool = False,
    history: list[str | dict[str, object]] | None = None,
) -> Path:
    """An OCI image layout directory (gzip layers), as skopeo and umoci write it.

    ``docker_manifest``: also the manifest.json that `docker save` from Docker 25+ adds.
    """
    blobs = directory / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def put(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return "sha256:" + digest

    descriptors: list[dict[str, Any]] = []
    for data in layers:
        if compress == "zstd":
            stored = zstandard.ZstdCompressor().compress(data)
        else:
            stored = gzip.compress(data, mtime=0) if compress else data
        digest = put(stored)
        if corrupt_digest:
            (blobs / digest.split(":")[1]).write_bytes(stored[:-8] + b"\0" * 8)
        descriptors.append(
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar"
                + ({"zstd": "+zstd", True: "+gzip"}.get(compress, "")),
                "digest": digest,
                "size": len(stored),
            }
        )
    config_bytes = image_config(layers, env, history)
    manifest: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": put(config_bytes),
            "size": len(config_bytes),
        },
        "layers": descriptors,
    }
    manifest_bytes = json.dumps(manifest).encode()
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": put(manifest_bytes),
                "size": len(manifest_bytes),
                "annotations": {"org.opencontainers.image.ref.name": ref},
            }
        ],
    }
    (directory / "index.json").write_text(json.dumps(index))
    (directory / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    if docker_manifest:
        legacy = [
            {
                "Config": "blobs/" + manifest["config"]["digest"].replace(":", "/"),
                "RepoTags": [f"test/image:{ref}"],
                "Layers": ["blobs/" + d["digest"].replace(":", "/") for d in descriptors],
            }
        ]
        (directory / "manifest.json").write_text(json.dumps(legacy))
    return directory


def tar_directory(directory: Path, path: Path) -> Path:
    """An oci-archive: the layout directory as one tar."""
    with tarfile.open(path, "w") as archive:
        for child in sorted(directory.rglob("*")):
            archive.add(child, arcname=str(child.relative_to(directory)), recursive=False)
    return path


def docker_save_of_directories(path: Path, layers: list[list[tuple[Path, str]]]) -> Path:
    """A legacy `docker save` archive whose layers are directories on disk, each ``(directory,
    prefix)`` put under ``prefix`` (no leading /) in its layer; written through files, never held in
    memory (real wheels and libraries of gigabytes)."""
    work = path.parent / (path.name + ".layers")
    work.mkdir(parents=True, exist_ok=True)
    layer_files, diff_ids = [], []
    for index, parts in enumerate(layers):
        layer_file = work / f"layer{index}.tar"
        with tarfile.open(layer_file, "w", format=tarfile.PAX_FORMAT) as archive:
            for directory, prefix in parts:
                archive.add(directory, arcname=prefix.strip("/"))
        digest = hashlib.sha256()
        with layer_file.open("rb") as stored:
            while piece := stored.read(1 << 20):
                digest.update(piece)
        layer_files.append(layer_file)
        diff_ids.append("sha256:" + digest.hexdigest())
    config = {"architecture": "amd64", "os": "linux", "config": {"Env": []}}
    config["rootfs"] = {"type": "layers", "diff_ids": diff_ids}
    config_bytes = json.dumps(config).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    names = [f"{d.split(':')[1]}/layer.tar" for d in diff_ids]
    with tarfile.open(path, "w") as archive:
        for name, layer_file in zip(names, layer_files, strict=True):
            archive.add(layer_file, arcname=name)
            layer_file.unlink()
        write_file_member(archive, config_name, config_bytes)
        manifest = [{"Config": config_name, "RepoTags": ["test/dirs:1"], "Layers": names}]
        write_file_member(archive, "manifest.json", json.dumps(manifest).encode())
    work.rmdir()
    return path
