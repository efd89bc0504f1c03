"""Read an image through a Docker daemon (docker SDK): never start it, always clean up.

Two ways, both streamed (nothing is held in memory):
- default: create a container from the image without starting it (network disabled, a command that
  is never run), stream its flattened filesystem with ``export`` (the daemon has applied the
  whiteouts), audit, remove the container;
- ``layers=True``: stream ``docker save`` into the audit (image/savestream.py), which gives the
  layer-aware waste analysis (the export has no layers); only layers the export's order does not
  place yet are spooled into the private work directory.
The docker SDK is untyped; it stays inside this module.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from rocm_audit.errors import UsageError
from rocm_audit.image.audit import ImageOptions, audit_stream, image_targets
from rocm_audit.image.sniff import target_hint
from rocm_audit.outcome import CommandOutcome
from rocm_audit.progress import SILENT, Progress
from rocm_audit.report_types import ImageSource

log = logging.getLogger(__name__)

STREAM_CHUNK = 2 << 20
NEVER_RUN = ["/rocm-audit: this container is never started"]


DEFAULT_HOST = "unix:///var/run/docker.sock"
OTHER_SOURCES = "use --archive FILE or registry://HOST/REPO:TAG"
# Transports of skopeo and containers-image that a daemon REF is not: what to write instead.
_TRANSPORTS = {
    "docker://": "write {bare} for an image in the Docker daemon, or registry://HOST/REPO:TAG for a registry",
    "docker-daemon:": "write {bare} for an image in the Docker daemon",
    "docker-archive:": "write --archive {bare} for a docker save file",
    "oci-archive:": "write --archive {bare} for an OCI layout tar",
    "oci:": "write --archive {bare} for an OCI layout directory",
}


def check_reference(ref: str) -> None:
    """Raise UsageError for a daemon REF spelled as a transport (``docker://name:tag``), which
    the daemon would refuse as an invalid reference."""
    for prefix, instead in _TRANSPORTS.items():
        if ref.startswith(prefix):
            bare = ref[len(prefix) :] or "NAME:TAG"
            raise UsageError(
                f"{ref!r} is a skopeo transport, not a reference rocm-audit reads", hint=instead.format(bare=bare)
            )


def _client() -> Any:
    try:
        import docker  # noqa: PLC0415 - the optional extra, imported only when a daemon is used
    except ImportError:
        raise UsageError(
            "reading an image from a daemon needs the docker SDK (rocm-audit's docker extra)",
            hint="pip install '.[docker]' in a clone of rocm-audit, or audit a `docker save` file (--archive)",
        ) from None
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise _no_daemon(str(exc)) from None
    return client


def _no_daemon(said: str) -> UsageError:
    """The error for a daemon that cannot be reached: where rocm-audit looked (DOCKER_HOST, or
    the default socket) and what the connection said, in words; docker-py's text is not shown."""
    host = os.environ.get("DOCKER_HOST")
    where = f"{host or DEFAULT_HOST} ({'from DOCKER_HOST' if host else 'DOCKER_HOST is not set'})"
    if "PermissionError" in said or "Permission denied" in said:
        return UsageError(
            f"no permission to use the Docker daemon at {where}",
            hint=f"run as a member of the docker group (or root), or {OTHER_SOURCES}",
        )
    if "FileNotFoundError" in said or "No such file" in said or "Connection refused" in said:
        return UsageError(f"no Docker daemon at {where}", hint=f"start one, set DOCKER_HOST, or {OTHER_SOURCES}")
    log.info("Docker daemon at %s: %s", host or DEFAULT_HOST, said)
    return UsageError(
        f"cannot reach the Docker daemon at {where} (-v says why)",
        hint=f"check that it runs and DOCKER_HOST is right, or {OTHER_SOURCES}",
    )


def audit_daemon_image(
    ref: str, options: ImageOptions, layers: bool = False, progress: Progress = SILENT
) -> CommandOutcome:
    """Audit image ``ref`` of the daemon. Raises UsageError without SDK, daemon or image."""
    check_reference(ref)
    client = _client()
    import docker  # noqa: PLC0415 - present: _client() imported it

    try:
        image = client.images.get(ref)
    except docker.errors.ImageNotFound:
        raise UsageError(
            f"image {ref!r} is not in the daemon's image store (docker pull it first)", hint=target_hint(ref)
        ) from None
    except docker.errors.APIError as exc:
        said = str(getattr(exc, "explanation", None) or exc)
        raise UsageError(f"the Docker daemon cannot read image {ref!r}: {said}", hint=target_hint(ref)) from None
    if layers:
        return _via_save(image, ref, options, progress)
    return _via_export(client, image, ref, options, progress)


def _via_export(client: Any, image: Any, ref: str, options: ImageOptions, progress: Progress) -> CommandOutcome:
    """A container created from the image (never started), its file system streamed out with
    ``export`` into the audit, then removed."""
    import docker  # noqa: PLC0415 - present: the caller got ``client`` from it

    options = dataclasses.replace(
        options, recorded=image_targets({"Config": image.attrs.get("Config") or {}}, _history(image))
    )
    container_id = client.api.create_container(
        image.id,
        command=NEVER_RUN,
        entrypoint=[],
        network_disabled=True,
        host_config=client.api.create_host_config(network_mode="none"),
        labels={"org.rocm-audit.purpose": "audit; never started"},
    )["Id"]
    try:
        source: ImageSource = {
            "kind": "daemon",
            "ref": ref,
            "image_id": image.id,
            "format": "container export",
            "tags": sorted(image.tags),
        }
        chunks = client.api.export(container_id, chunk_size=STREAM_CHUNK)
        outcome = audit_stream(
            chunks,
            f"{ref} (container export)",
            options,
            source,
            again=lambda: client.api.export(container_id, chunk_size=STREAM_CHUNK),
            progress=progress,
        )
    finally:
        try:
            client.api.remove_container(container_id, force=True, v=True)
        except docker.errors.APIError as exc:  # the report still stands; say what was left behind
            log.warning("could not remove container %s: %s", container_id, exc)
    outcome.inputs = [ref]
    return outcome


def _history(image: Any) -> list[str]:
    """``CreatedBy`` of each history entry, oldest first (the API lists the newest first)."""
    import docker  # noqa: PLC0415 - present: the caller got ``image`` from it

    try:
        entries = image.history()
    except docker.errors.APIError as exc:
        log.warning("cannot read the history of %s: %s", image.id, exc)
        return []
    return [str(e.get("CreatedBy") or "") for e in reversed(entries) if isinstance(e, dict)]


def _via_save(image: Any, ref: str, options: ImageOptions, progress: Progress = SILENT) -> CommandOutcome:
    """`docker save` streamed into the audit (image/savestream.py): layers whose place the export
    shows are applied as they arrive, the others spooled until the layers below them are."""
    from rocm_audit.errors import FormatError  # noqa: PLC0415
    from rocm_audit.image import audit, merge, savestream  # noqa: PLC0415

    diff_ids = [str(d) for d in (image.attrs.get("RootFS") or {}).get("Layers") or []]
    with audit.merging(options, progress) as state:
        workdir = os.path.dirname(state.root)
        progress.phase("reading the image from the Docker daemon", unit="entries")
        try:
            layout, _store, streamed, early = savestream.apply_save_stream(
                image.save(chunk_size=STREAM_CHUNK, named=True),
                diff_ids,
                state,
                workdir,
                ref,
                audit.apply_layer_stream,
                lambda member: savestream.member_again(image.save(chunk_size=STREAM_CHUNK, named=True), member),
                lambda store, layout, start: audit.apply_layers(store, layout, state, ref, start),
                options.max_bytes,
            )
        except FormatError as exc:
            return audit.failed(ref, state, "IMG001", exc.message, {"offset": exc.offset, "format": exc.fmt})
        except merge.LimitExceeded as exc:
            return audit.failed(ref, state, "IMG004", exc.message, {"offset": state.limits.bytes_read})
        log.info(
            "%s: %d of %d layers applied as they streamed, %d more from the spool before the export ended",
            ref,
            streamed,
            len(layout.layers),
            early - streamed,
        )
        source: ImageSource = {
            "kind": "daemon",
            "ref": ref,
            "image_id": image.id,
            "path": None,
            "format": layout.kind,
            "tags": layout.tags,
            "manifest_digest": layout.manifest_digest,
        }
        options = audit.with_config(options, layout.config, len(layout.layers))
        layer_names = [layer.digest or layer.member for layer in layout.layers]
        return audit.audit_merged(state, options, source, layer_names, [ref])
