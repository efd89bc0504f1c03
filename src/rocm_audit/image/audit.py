"""Audit an image from outside: merge its layers into a private directory, then run every check.

The merged root lives in a fresh ``mkdtemp`` directory (mode 0700) that is removed afterwards; it is
the ``sysroot`` of the checks, and the audited paths are the image's site-packages / dist-packages
directories (or the whole root when there are none). Paths in the report are image paths
(``/usr/lib/...``), never the temporary directory. The image's code is never run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rocm_audit.audit.attribution import attribute_carriers, with_shippers
from rocm_audit.audit.check import CheckOptions, run_check
from rocm_audit.errors import FormatError, UsageError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.gpu.verify import TargetCandidate
from rocm_audit.image import budget, layerpipe, merge, tarstream, waste, whole
from rocm_audit.image.archive import ImageLayout, Store, open_image, read_again
from rocm_audit.image.offload import Offload, helper_count
from rocm_audit.image.targets import config_history, layer_steps, recorded_targets
from rocm_audit.outcome import CommandOutcome
from rocm_audit.progress import SILENT, Progress
from rocm_audit.report_types import ImageSection, ImageSource, PruneLayer
from rocm_audit.tree.ownership import shippers_of
from rocm_audit.units import plural, size_text

PACKAGE_DIRS = ("site-packages", "dist-packages")
# What the checks read besides site-packages: the loader's search path (formats.md 4).
LOADER_PREFIXES = (
    "/lib/",
    "/lib64/",
    "/lib32/",
    "/usr/lib/",
    "/usr/lib64/",
    "/usr/lib32/",
    "/usr/local/lib/",
    "/usr/local/lib64/",
    "/etc/ld.so.conf",
)

# The image's Python interpreter (<prefix>/bin/python3.X): the first object of every load its
# extension modules make (postbuild/symbols.py reads its exported symbols, never runs it).
INTERPRETER = re.compile(r"/bin/python3(?:\.\d+)?$")


@dataclass(slots=True)
class ImageOptions:
    check: CheckOptions = field(default_factory=CheckOptions)
    ref: str | None = None  # which image of a multi-image archive
    max_bytes: int = budget.DEFAULT_MAX_BYTES
    max_entries: int = budget.DEFAULT_MAX_ENTRIES
    full: bool = False  # extract every file, not only site-packages and the loader's directories
    workdir_parent: str | None = None  # where the private temp dir goes (default: $TMPDIR)
    # Target lists the image records (its Env, its build history), most trusted first: verify-arch
    # uses them after --target, the auditing host's $GPU_ARCH and a rules file, before dist_info.json.
    recorded: tuple[TargetCandidate, ...] = ()
    layer_steps: tuple[str, ...] = ()  # the build step that wrote each layer, when the history says
    started: float = field(default_factory=time.monotonic)  # the run's start: its report's elapsed_s


def config_env(config: dict[str, Any]) -> dict[str, str]:
    """``Config.Env`` of an image config (``["K=V", ...]``) as a dict; junk entries are ignored."""
    inner = config.get("config") or config.get("Config") or {}
    entries = inner.get("Env") if isinstance(inner, dict) else None
    env: dict[str, str] = {}
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, str) and "=" in entry:
            key, value = entry.split("=", 1)
            env[key] = value
    return env


def with_config(options: ImageOptions, config: dict[str, Any], layer_count: int) -> ImageOptions:
    """``options`` with what the image config records: its target lists and each layer's step."""
    return dataclasses.replace(
        options, recorded=image_targets(config), layer_steps=tuple(layer_steps(config, layer_count))
    )


def image_targets(config: dict[str, Any], history: list[str] | None = None) -> tuple[TargetCandidate, ...]:
    """What the image config records about its GPU targets (image/targets.py); ``history`` (oldest
    first) when it comes from elsewhere than the config (the daemon's history API)."""
    return tuple(recorded_targets(config_env(config), config_history(config) if history is None else history))


def wanted(full: bool) -> Callable[[str], bool]:
    """Which regular files to write to disk; the others are streamed past (and hashed)."""
    if full:
        return lambda path: True

    def keep(path: str) -> bool:
        return (
            path.startswith(LOADER_PREFIXES)
            or any(f"/{name}/" in path for name in PACKAGE_DIRS)
            or INTERPRETER.search(path) is not None
        )

    return keep


def audit_archive(archive: str, options: ImageOptions, progress: Progress = SILENT) -> CommandOutcome:
    """`rocm-audit image --archive FILE`: a docker save tarball or an OCI layout (dir or tar).
    Raises UsageError when nothing of it can be read as an image (archive.open_image)."""
    with merging(options, progress) as state:
        try:
            layout = extract_archive(archive, os.path.dirname(state.root), state, options.ref)
        except FormatError as exc:
            return failed(archive, state, "IMG001", exc.message, {"offset": exc.offset, "format": exc.fmt})
        except merge.LimitExceeded as exc:
            return failed(archive, state, "IMG004", exc.message, {"offset": state.limits.bytes_read})
        source: ImageSource = {
            "kind": "archive",
            "path": archive,
            "format": layout.kind,
            "tags": layout.tags,
            "manifest_digest": layout.manifest_digest,
        }
        options = with_config(options, layout.config, len(layout.layers))
        layer_names = [ref.digest or ref.member for ref in layout.layers]
        if layout.unchecked:
            said = f"{layout.unchecked}: the layers cannot be checked against them (docker load refuses this archive)"
            state.findings.append(make_finding("IMG005", archive, said, data={"offset": 0}))
        return audit_merged(state, options, source, layer_names, [archive])


def audit_registry(
    text: str,
    options: ImageOptions,
    platform: str | None = None,
    insecure_hosts: frozenset[str] = frozenset(),
    progress: Progress = SILENT,
) -> CommandOutcome:
    """`rocm-audit image registry://HOST/REPO[:TAG|@DIGEST]`: layers streamed from the registry
    (image/registry.py) into the merged view, decompressed in parallel, digests checked.
    Raises UsageError for a bad reference or platform, and when the image cannot be found or
    read at all (unreachable, not found, refused, not an image)."""
    from rocm_audit.image import registry  # noqa: PLC0415 - only this source needs it

    ref = registry.parse_ref(text)
    wanted_platform = registry.parse_platform(platform) if platform is not None else None
    with merging(options, progress) as state:
        progress.phase("reading the image manifest from the registry")
        try:
            store, layout = registry.read_image(ref, wanted_platform, insecure_hosts)
        except FormatError as exc:  # nothing of the image could be read: no audit to report
            raise UsageError(exc.reason if exc.fmt == "registry" else exc.message, hint=exc.hint) from None
        try:
            apply_layers(store, layout, state, text)
        except FormatError as exc:  # a registry's answer has no offset worth a word
            message = exc.reason if exc.fmt == "registry" else exc.message
            return failed(text, state, "IMG001", message, {"offset": exc.offset, "format": exc.fmt})
        except merge.LimitExceeded as exc:
            return failed(text, state, "IMG004", exc.message, {"offset": state.limits.bytes_read})
        source: ImageSource = {
            "kind": "registry",
            "ref": text,
            "format": "registry",
            "platform": layout.platform or platform or registry.DEFAULT_PLATFORM,
            "tags": layout.tags,
            "manifest_digest": layout.manifest_digest,
        }
        options = with_config(options, layout.config, len(layout.layers))
        return audit_merged(state, options, source, [layer.member for layer in layout.layers], [text])


def extract_archive(archive: str, workdir: str, state: merge.MergeState, ref: str | None = None) -> ImageLayout:
    """Apply every layer of the archive over ``state.root``; unreadable layers become findings.

    Raises UsageError when nothing of the archive can be read as an image (archive.open_image),
    FormatError when a layer it names is missing, LimitExceeded.
    """
    store, layout = open_image(archive, workdir, state.limits.max_bytes, ref)
    apply_layers(store, layout, state, archive)
    return layout


def apply_layers(store: Store, layout: ImageLayout, state: merge.MergeState, label: str, start: int = 0) -> None:
    """Apply the layers ``start`` and up of a layout, decompressed in parallel (layerpipe).
    Findings name each layer as ``LABEL:<member>``. Raises FormatError for a missing layer."""
    todo = layout.layers[start:]
    blobs = [layerpipe.Blob(functools.partial(_layer_blob, store, layer.member), layer.digest) for layer in todo]
    with layerpipe.Pipeline(blobs) as streams:
        for index, (layer, stream) in enumerate(zip(todo, streams, strict=True), start):
            if not store.exists(layer.member):
                raise FormatError("image", 0, f"{store.label}: layer {index} ({layer.member}) is missing")
            apply_layer_stream(
                state,
                stream,
                layer.digest,
                index,
                layer.digest or layer.member,
                f"{label}:{layer.member}",
                len(layout.layers),
                functools.partial(read_again, store, layer.member),
            )


def apply_layer_stream(
    state: merge.MergeState,
    stream: layerpipe.VerifiedStream,
    expected: str | None,
    index: int,
    name: str,
    where: str,
    count: int,
    again: Callable[[], contextlib.AbstractContextManager[tarstream.Readable]] | None,
) -> None:
    """Apply one layer of a pipeline; an unreadable layer or a digest mismatch becomes a finding."""
    # Numbered from 0, as in the findings and the JSON report (docs/images.md, "Layer analysis").
    state.progress.phase(f"reading layer {index} (0 to {count - 1})", unit="entries")
    try:
        merge.apply_layer(state, stream, index, name, where, again=again)
        matches = stream.matches()
    except FormatError as exc:
        state.findings.append(
            make_finding(
                "IMG001",
                where,
                f"layer {index} is unreadable: {exc.reason}; the rest of this layer is missing from the audited view",
                data={"layer": index, "offset": exc.offset, "format": exc.fmt},
            )
        )
        return
    if not matches:
        state.findings.append(
            make_finding(
                "IMG005",
                where,
                f"layer {index} does not match its digest {expected}",
                data={"layer": index, "offset": 0, "expected": expected, "actual": stream.finish()},
            )
        )


@contextlib.contextmanager
def _layer_blob(store: Store, member: str) -> Iterator[tarstream.Readable]:
    """A layer's stored bytes (compressed or not), for the pipeline's worker."""
    raw = store.open(member)
    try:
        yield raw
    finally:
        raw.close()


@contextlib.contextmanager
def _stream_again(again: Callable[[], Iterable[bytes]]) -> Iterator[tarstream.Readable]:
    yield tarstream.decompressed(_ChunkReader(again()))


def audit_stream(
    chunks: Iterable[bytes],
    label: str,
    options: ImageOptions,
    source: ImageSource,
    again: Callable[[], Iterable[bytes]] | None = None,
    progress: Progress = SILENT,
) -> CommandOutcome:
    """Audit one flattened filesystem tar (a container export) as a single layer; ``again``
    streams it once more, when a kept hardlink's bytes were stored under a path not written."""

    with merging(options, progress) as state:
        progress.phase("reading the container's files", unit="entries")
        try:
            merge.apply_layer(
                state,
                tarstream.decompressed(_ChunkReader(chunks)),
                0,
                label,
                label,
                again=functools.partial(_stream_again, again) if again is not None else None,
            )
        except FormatError as exc:
            return failed(label, state, "IMG001", exc.message, {"offset": exc.offset, "format": exc.fmt})
        except merge.LimitExceeded as exc:
            return failed(label, state, "IMG004", exc.message, {"offset": state.limits.bytes_read})
        return audit_merged(state, options, source, [label], [label], layer_aware=False)


@contextlib.contextmanager
def merging(options: ImageOptions, progress: Progress = SILENT) -> Iterator[merge.MergeState]:
    """A merge's state in a private work directory (``dirname(state.root)``), with its helper
    processes (image/offload.py) forked now, before any layer thread starts; both go at the end."""
    with Workdir(options.workdir_parent) as workdir, Offload(helper_count()) as helpers:
        yield new_state(workdir, options, progress, helpers)


def new_state(
    workdir: str, options: ImageOptions, progress: Progress = SILENT, helpers: Offload | None = None
) -> merge.MergeState:
    # Resolved, so the paths the checks report (they resolve their roots) share this prefix.
    root = os.path.join(os.path.realpath(workdir), "rootfs")
    os.mkdir(root, 0o700)
    return merge.MergeState(
        root=root,
        limits=merge.Limits(options.max_bytes, options.max_entries),
        keep=wanted(options.full),
        progress=progress,
        placeholders=not options.full,  # files no check reads: their size only (image/needed.py)
        offload=helpers or Offload(),
    )


def audit_merged(
    state: merge.MergeState,
    options: ImageOptions,
    source: ImageSource,
    layer_names: list[str],
    inputs: list[str],
    layer_aware: bool = True,
) -> CommandOutcome:
    state.progress.phase("merging the layers")
    merge.finish(state)
    package_dirs = find_package_dirs(state.root)
    findings = list(state.findings)
    if not package_dirs:
        findings.append(
            make_finding(
                "IMG009",
                "/",
                "no site-packages or dist-packages directory in the image; audited the whole extracted root",
            )
        )
    check_options = dataclasses.replace(
        options.check,
        sysroot=state.root,
        unextracted=frozenset(state.streamed_past),
        probe=False,
        recorded_targets=options.recorded,
        prune_by_file=layer_aware,
        known_facts=whole.facts_still_shown(state),
    )
    outcome = run_check(package_dirs or [state.root], check_options, state.progress)
    section: ImageSection = {
        "source": source,
        "layers": [
            {
                "index": s.index,
                "name": s.name,
                "entries": s.entries,
                "files": s.files,
                "file_bytes": s.file_bytes,
                "whiteouts": s.whiteouts,
                "opaque_dirs": s.opaque_dirs,
                "refused": s.refused,
            }
            for s in state.layers
        ],
        "audited_paths": sorted("/" + os.path.relpath(p, state.root) for p in package_dirs) or ["/"],
        "extracted": "full" if options.full else "site-packages and loader directories",
        "bytes_read": state.limits.bytes_read,
    }
    for layer in section["layers"]:
        step = options.layer_steps[layer["index"]] if layer["index"] < len(options.layer_steps) else ""
        if step:
            layer["step"] = step
    groups: list[waste.WasteGroup] = []
    if layer_aware:
        state.progress.phase("placing identical copies in their layers")
        groups, total = waste.analyse(state)
        again = waste.replaced_in_layer(state)
        labels = _layer_labels(layer_names, options.layer_steps)
        findings.extend(waste.waste_findings(groups, labels) + waste.stored_again_findings(again, labels))
        section["waste"] = waste.waste_section(groups, total, again)
    # Who shipped each finding's file, from the image's own RECORDs while they are on disk (the
    # CLI would look for the image's paths on this machine).
    outcome.findings = with_shippers(outcome.findings)
    attribute_carriers(outcome.sections)
    findings = _shipped_in_view(findings, state.root)
    outcome.attributed = True
    outcome = _to_image_paths(outcome, state.root)
    if "prune" in outcome.sections and layer_aware:
        section["prune_layers"] = prune_layers(state, outcome.device_bytes_by_path, layer_names, groups)
    outcome.findings.extend(findings)
    outcome.sections["image"] = section
    outcome.command = "image"
    outcome.inputs = inputs
    outcome.roots = list(section["audited_paths"])
    unreadable = {f.data.get("layer") for f in state.findings if f.rule == "IMG001"}
    if layer_names and len(unreadable) >= len(layer_names):
        outcome.force_failure = True  # no layer could be read: nothing was audited, whatever --fail-on says
    _time_the_run(outcome, section, options.started, layer_aware)
    return outcome


def _layer_labels(layer_names: list[str], steps: tuple[str, ...]) -> list[str]:
    """What findings call each layer: the step that wrote it when the history says, else its name."""
    return [steps[i] if i < len(steps) and steps[i] else name for i, name in enumerate(layer_names)]


def _time_the_run(outcome: CommandOutcome, section: ImageSection, started: float, layer_aware: bool) -> None:
    """The whole run's wall time in the report's summary (reading the image takes most of it), the
    checks' own in ``image.checks_elapsed_s``; and the one-line summary for stderr."""
    elapsed = time.monotonic() - started
    summary = outcome.sections.get("summary")
    if summary is not None:
        section["checks_elapsed_s"] = summary["elapsed_s"]
        summary["elapsed_s"] = round(elapsed, 3)
    wasted = section.get("waste", {}).get("wasted_bytes")
    layers = plural(len(section["layers"]), "layer") if layer_aware else "flattened (container export)"
    outcome.summary = (
        f"image: {layers}"
        + (f", {size_text(wasted)} in identical copies" if wasted is not None else "")
        + f", {elapsed:.1f} s in all"
        + (f"; {outcome.summary}" if outcome.summary else "")
    )


def _shipped_in_view(findings: list[Finding], root: str) -> list[Finding]:
    """``findings`` on image paths, each naming who shipped its file when the merged view (at
    ``root``) still shows it and a RECORD there lists it."""
    in_view = {f.path: os.path.join(root, f.path.lstrip("/")) for f in findings if f.path.startswith("/")}
    shipped = shippers_of(in_view.values())
    return [
        dataclasses.replace(f, shipped_by=shipped[in_view[f.path]]) if in_view.get(f.path) in shipped else f
        for f in findings
    ]


def prune_layers(
    state: merge.MergeState,
    by_path: dict[str, tuple[int, int, int, int]],
    layer_names: list[str],
    groups: Iterable[waste.WasteGroup] = (),
) -> list[PruneLayer]:
    """Device-code bytes per layer that holds them (prune's weight by file, placed by the layer
    that wrote the file the merged view shows). A prune in a later RUN frees none of a lower
    layer's bytes: only a prune in the RUN that wrote the layer does.

    A file a later layer hid still weighs in its own layer. The checks read only what the merged
    view shows, so a hidden file is weighed when it has an identical copy the view shows (a waste
    group: same size and BLAKE2b), whose weight it shares; one no shown file matches (deleted, or
    replaced by other bytes) is not weighed: its bytes left the view before any check ran."""
    per: dict[int, PruneLayer] = {}
    weighed = [(state.layer_of.get(path), weight, False) for path, weight in sorted(by_path.items())]
    for group in groups:
        shown = next((by_path[c["path"]] for c in group.copies if c["visible"] and c["path"] in by_path), None)
        if shown is not None:
            weighed += [(c["layer"], shown, True) for c in group.copies if not c["visible"]]
    for layer, (device_bytes, unused_bytes, removable_bytes, fatbins_bytes), hidden in weighed:
        if layer is None:
            continue
        row = per.setdefault(
            layer,
            {
                "layer": layer,
                "name": layer_names[layer] if layer < len(layer_names) else str(layer),
                "device_bytes": 0,
                "hidden_device_bytes": 0,
                "unused_bytes": 0,
                "removable_bytes": 0,
                "fatbins_estimate_bytes": 0,
            },
        )
        row["device_bytes"] += device_bytes
        row["hidden_device_bytes"] += device_bytes if hidden else 0
        row["unused_bytes"] += unused_bytes
        row["removable_bytes"] += removable_bytes
        row["fatbins_estimate_bytes"] += fatbins_bytes
    return [per[i] for i in sorted(per)]


def find_package_dirs(root: str) -> list[str]:
    """Every site-packages / dist-packages directory under root (links are not followed)."""
    found: list[str] = []
    for directory, dirnames, _files in os.walk(root):
        dirnames.sort()
        for name in list(dirnames):
            if name in PACKAGE_DIRS:
                found.append(os.path.join(directory, name))
                dirnames.remove(name)  # nested package dirs are audited as part of this one
    return sorted(found)


def _to_image_paths(outcome: CommandOutcome, root: str) -> CommandOutcome:
    """Replace the private extraction directory by the image root in every string of the outcome."""
    prefix = root.rstrip("/")

    def fix(value: Any) -> Any:
        if isinstance(value, str):
            if value == prefix:
                return "/"
            return value.replace(prefix + "/", "/") if prefix in value else value
        if isinstance(value, dict):
            return {fix(k): fix(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(fix(v) for v in value)
        return value

    outcome.findings = [
        dataclasses.replace(
            f,
            path=fix(f.path),
            message=fix(f.message),
            detail=fix(f.detail),
            related_paths=fix(f.related_paths),
            data=fix(dict(f.data)),
        )
        for f in outcome.findings
    ]
    outcome.sections = fix(outcome.sections)
    outcome.device_bytes_by_path = fix(outcome.device_bytes_by_path)
    outcome.inputs = fix(outcome.inputs)
    if outcome.summary:
        outcome.summary = fix(outcome.summary)
    return outcome


def failed(label: str, state: merge.MergeState, rule: str, message: str, data: dict[str, Any]) -> CommandOutcome:
    findings: list[Finding] = [*state.findings, make_finding(rule, label, message, data=data)]
    # A FormatError of the image format itself reads "image: ...": said once, not "image: image:".
    said = message.removeprefix("image: ")
    # Nothing was audited: whatever --fail-on says, a CI gate must not pass on this run.
    return CommandOutcome(
        command="image", findings=findings, inputs=[label], summary=f"image: not audited: {said}", force_failure=True
    )


class Workdir:
    """A private temporary directory (0700), removed on exit whatever happened. A run that finds
    no room in it ends with an error saying where it was and how to give it more."""

    def __init__(self, parent: str | None) -> None:
        self.parent = parent
        self.path = ""

    def __enter__(self) -> str:
        try:
            self.path = tempfile.mkdtemp(prefix="rocm-audit-image-", dir=self.parent)
        except OSError as exc:
            parent = self.parent or tempfile.gettempdir()
            raise merge.ExtractionError(
                f"cannot make a private work directory in {parent}: {exc.strerror}",
                hint="set TMPDIR to a writable directory with room for what the audit reads of the image",
            ) from None
        return self.path

    def __exit__(self, kind: object, error: BaseException | None, trace: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if isinstance(error, OSError) and error.errno in merge.NO_ROOM:
            # out of room outside the layer merge (a duplicate made whole, a stream spooled)
            error = merge.ExtractionError(f"cannot write the private work directory: {error.strerror}")
        if isinstance(error, merge.ExtractionError) and error.hint is None:
            parent = os.path.dirname(self.path)
            error.hint = f"the audit's scratch files go to {parent}: point TMPDIR at a file system with more room"
            raise error from None


class _ChunkReader:
    """A read() interface over an iterator of byte chunks (the docker SDK's streams)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks = iter(chunks)
        self.pending = b""

    def read(self, size: int = -1, /) -> bytes:
        size = tarstream.CHUNK if size < 0 else size
        while not self.pending:
            try:
                self.pending = next(self.chunks)
            except StopIteration:
                return b""
        piece, self.pending = self.pending[:size], self.pending[size:]
        return piece
