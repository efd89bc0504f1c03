"""Read an image through a Docker daemon (docker SDK): never start it, always clean up.

Two ways, both streamed (nothing is held in memory):
- default: create a container from the image without starting it (network disabled, a command that
  is never run), stream its flattened filesystem with ``export`` (the daemon has applied the
  whiteouts), audit, remove the container;
- ``layers=True``: stream ``docker save`` into the private work directory and read it as an archive,
  which gives the layer-aware waste analysis (the export has no layers).
The docker SDK is untyped; it stays inside this module.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
from typing import Any

from rocm_audit.errors import UsageError
from rocm_audit.image.audit import ImageOptions, audit_archive, audit_stream, image_targets
from rocm_audit.outcome import CommandOutcome
from rocm_audit.progress import SILENT, Progress
from rocm_audit.report_types import ImageSource

log = logging.getLogger(__name__)

STREAM_CHUNK = 2 << 20
NEVER_RUN = ["/rocm-audit: this container is never started"]


def _client() -> Any:
    try:
        import docker  # noqa: PLC0415 - the optional extra, imported only when a daemon is used
    except ImportError:
        raise UsageError(
            "reading an image from a Docker daemon needs the docker SDK: "
            "install rocm-audit with its docker extra (pip install '.[docker]' in a clone), "
            "or audit a `docker save` file with --archive"
        ) from None
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise UsageError(f"cannot reach the Docker daemon ({exc}); set DOCKER_HOST, or use --archive") from None
    return client


def audit_daemon_image(
    ref: str, options: ImageOptions, layers: bool = False, progress: Progress = SILENT
) -> CommandOutcome:
    """Audit image ``ref`` of the daemon. Raises UsageError without SDK, daemon or image."""
    client = _client()
    import docker  # noqa: PLC0415 - present: _client() imported it

    try:
        image = client.images.get(ref)
    except docker.errors.ImageNotFound:
        raise UsageError(f"image {ref!r} is not in the daemon's image store (docker pull it first)") from None
    except docker.errors.APIError as exc:
        raise UsageError(f"cannot inspect image {ref!r}: {exc}") from None
    if layers:
        return _via_save(image, ref, options, progress)
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
    workdir = tempfile.mkdtemp(prefix="rocm-audit-save-", dir=options.workdir_parent)
    try:
        archive = os.path.join(workdir, "image.tar")
        written = 0
        progress.phase("saving the image from the Docker daemon")
        with open(archive, "wb") as target:
            for chunk in image.save(chunk_size=STREAM_CHUNK, named=True):
                written += len(chunk)
                progress.update(0, written)
                if written > options.max_bytes:
                    raise UsageError(f"image {ref!r} is larger than --max-bytes {options.max_bytes}")
                target.write(chunk)
        outcome = audit_archive(archive, options, progress)
        # Name the image, not the temporary file, in findings ("REF:<layer member>").
        outcome.findings = [dataclasses.replace(f, path=f.path.replace(archive, ref, 1)) for f in outcome.findings]
        image_section = outcome.sections.get("image")
        if image_section is not None:
            image_section["source"].update({"kind": "daemon", "ref": ref, "image_id": image.id, "path": None})
        outcome.inputs = [ref]
        return outcome
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
