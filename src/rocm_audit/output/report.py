"""The versioned JSON report: one encoder, one schema, atomic writes (docs/style.md 8-10)."""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
import os
import re
import secrets
import stat
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import PurePath
from typing import Any

from rocm_audit import __version__
from rocm_audit.errors import UsageError
from rocm_audit.findings import Finding, Severity, cause_groups, sorted_findings
from rocm_audit.output.prefixes import rule_family
from rocm_audit.report_types import FindingRecord, Report, Sections, SeverityCounts, Summary, SuppressedSource

SCHEMA_VERSION = 1
SCHEMA_RESOURCE = "schemas/report-v1.json"


def _default(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"cannot encode {type(value).__name__}")


# Lone surrogates: os.fsdecode holds each byte of a file name that is not UTF-8 as U+DC80-U+DCFF.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# A member name that is a field name (not a path or a target used as a key of a map).
_FIELD_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
RAW_BYTES_SUFFIX = "_bytes_b64"


def to_json(document: object, *, indent: int | None = 2, records_at: int = 2) -> str:
    """JSON text that is always valid UTF-8, also for file names that are not (schema: "raw bytes").

    A string holding undecodable bytes (lone surrogates from os.fsdecode) is written readable,
    each such byte as the four characters ``\\xNN``; when it is the value of a field (or an item
    of a list field) the exact bytes follow in a sibling field ``<field>_bytes_b64``: base64 of
    os.fsencode(value), or a list of them with null for the items that are valid UTF-8. Object
    keys that are data (a map keyed by a path) keep the readable form only. The common case (no
    surrogate) costs one regex search of the encoded text.

    With ``indent``, objects and arrays are laid out one member per line above depth
    ``records_at``; a value at that depth (a finding, a code object, a dedup group: one record)
    is one line, written by the C encoder. json.dumps(indent=...) runs the pure-Python encoder
    over every value: 60 ms of a 0.2 s `scan --targets` of librocsparse (888 code objects)."""
    text = _encoded(document, indent, records_at)
    if _LONE_SURROGATE.search(text):
        text = _encoded(_with_raw_bytes(json.loads(text)), indent, records_at)
    return text + "\n"


def _encoded(document: object, indent: int | None, records_at: int) -> str:
    if indent is None:
        return json.dumps(document, default=_default, ensure_ascii=False)
    return _laid_out(document, 0, " " * indent, records_at)


def readable(text: str) -> str:
    """``text`` with each undecodable byte (a lone surrogate) as ``\\xNN``: valid UTF-8, one way."""

    def one(match: re.Match[str]) -> str:
        code = ord(match.group())
        return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"

    return _LONE_SURROGATE.sub(one, text)


def _raw_b64(text: str) -> str | None:
    """base64 of the bytes os.fsdecode read, or None when ``text`` is valid UTF-8 as it is."""
    if not _LONE_SURROGATE.search(text):
        return None
    try:
        return base64.b64encode(os.fsencode(text)).decode("ascii")
    except UnicodeEncodeError:  # a surrogate no file name decodes to: readable form only
        return None


def _with_raw_bytes(value: Any) -> Any:
    """The plain JSON value with readable strings and a ``_bytes_b64`` sibling where bytes were lost."""
    if isinstance(value, str):
        return readable(value)
    if isinstance(value, list):
        return [_with_raw_bytes(item) for item in value]
    if not isinstance(value, dict):
        return value
    result: dict[str, Any] = {}
    for key, item in value.items():
        result[readable(key)] = _with_raw_bytes(item)
        sibling = key + RAW_BYTES_SUFFIX
        if not _FIELD_NAME.match(key) or sibling in value:
            continue
        if isinstance(item, str):
            raw = _raw_b64(item)
            if raw is not None:
                result[sibling] = raw
        elif isinstance(item, list) and any(isinstance(i, str) and _LONE_SURROGATE.search(i) for i in item):
            result[sibling] = [_raw_b64(i) if isinstance(i, str) else None for i in item]
    return result


def _laid_out(value: object, depth: int, step: str, records_at: int) -> str:
    if depth < records_at and value:
        inner = step * (depth + 1)
        if isinstance(value, dict) and all(isinstance(key, str) for key in value):
            members = [
                f"{inner}{_compact(key)}: {_laid_out(item, depth + 1, step, records_at)}" for key, item in value.items()
            ]
            return "{\n" + ",\n".join(members) + "\n" + step * depth + "}"
        if isinstance(value, (list, tuple)):
            members = [inner + _laid_out(item, depth + 1, step, records_at) for item in value]
            return "[\n" + ",\n".join(members) + "\n" + step * depth + "]"
    return _compact(value)


def _compact(value: object) -> str:
    return json.dumps(value, default=_default, separators=(", ", ": "), ensure_ascii=False)


def finding_to_dict(one: Finding, group: int | None = None) -> FindingRecord:
    document: FindingRecord = {
        "rule": one.rule,
        "severity": one.severity.value,
        "path": one.path,
        "related_paths": list(one.related_paths),
        "message": one.message,
        "data": dict(one.data),
    }
    if one.detail:
        document["detail"] = one.detail
    if group is not None:
        document["group"] = group
    if one.fingerprint:
        document["fingerprint"] = one.fingerprint
    if one.shipped_by is not None:
        document["shipped_by"] = {
            "name": one.shipped_by.name,
            "version": one.shipped_by.version,
            "report_to": one.shipped_by.report_to,
        }
    return document


def group_numbers(findings: Iterable[Finding]) -> dict[int, int]:
    """id(finding) -> its cause group's number, as text and Markdown number their entries."""
    return {id(one): number for number, group in enumerate(cause_groups(findings), 1) for one in group}


def build_report(
    command: str,
    findings: Iterable[Finding],
    *,
    inputs: Iterable[str] = (),
    sections: Sections | None = None,
    suppressed: Iterable[Mapping[str, str]] = (),
) -> Report:
    """The report document: fixed header, the summary, sorted findings, then command-specific sections."""
    findings = list(findings)
    groups = group_numbers(findings)
    ordered = sorted_findings(findings)
    suppressed = list(suppressed)
    document: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "rocm-audit", "version": __version__},
        "command": command,
        "inputs": sorted(inputs),
        "summary": summary_counts(ordered, suppressed),
        "findings": [finding_to_dict(f, groups.get(id(f))) for f in ordered],
    }
    if suppressed:
        document["suppressed"] = [dict(s) for s in suppressed]
    for key, value in (sections or {}).items():
        if key == "summary" and isinstance(value, Mapping):  # a command's own summary (check: what ran)
            counts = document["summary"]
            document["summary"] = {**counts, **{k: v for k, v in value.items() if k not in counts}}
        else:
            document[key] = value
    # Round-trip so the document holds plain JSON types only (what a consumer will see).
    return json.loads(to_json(document, indent=None))  # type: ignore[no-any-return]


BASELINE_SOURCE_PREFIX = "baseline:"


def summary_counts(findings: Sequence[Finding], suppressed: Sequence[Mapping[str, str]]) -> Summary:
    """Findings per severity and per rule family (the rule id's letters: DUP, ARCH, ...), and the
    suppressed ones per source: a rules file's ``path:line`` (kind "rules") or ``baseline:FILE``."""
    by_family: dict[str, SeverityCounts] = {}
    for one in findings:
        family = rule_family(one.rule)
        by_family[family] = _add_counts(by_family.get(family, _severity_counts(())), [one])
    per_source: dict[str, int] = {}
    for entry in suppressed:
        per_source[entry["source"]] = per_source.get(entry["source"], 0) + 1
    by_source: list[SuppressedSource] = [
        {"source": source, "kind": _source_kind(source), "count": count} for source, count in sorted(per_source.items())
    ]
    return {
        "findings": _severity_counts(findings),
        "by_family": dict(sorted(by_family.items())),
        "suppressed": {
            "total": len(suppressed),
            "rules": sum(e["count"] for e in by_source if e["kind"] == "rules"),
            "baseline": sum(e["count"] for e in by_source if e["kind"] == "baseline"),
            "by_source": by_source,
        },
    }


def _severity_counts(findings: Sequence[Finding]) -> SeverityCounts:
    return _add_counts({"total": 0, "error": 0, "warning": 0, "info": 0}, findings)


def _add_counts(counts: SeverityCounts, findings: Sequence[Finding]) -> SeverityCounts:
    """``counts`` with ``findings`` added, per severity and in all."""
    return {
        "total": counts["total"] + len(findings),
        "error": counts["error"] + sum(1 for f in findings if f.severity is Severity.ERROR),
        "warning": counts["warning"] + sum(1 for f in findings if f.severity is Severity.WARNING),
        "info": counts["info"] + sum(1 for f in findings if f.severity is Severity.INFO),
    }


def _source_kind(source: str) -> str:
    return "baseline" if source.startswith(BASELINE_SOURCE_PREFIX) else "rules"


def load_schema() -> dict[str, Any]:
    text = (resources.files("rocm_audit") / SCHEMA_RESOURCE).read_text(encoding="utf-8")
    return json.loads(text)  # type: ignore[no-any-return]


def check_destination(path: str, given: str) -> None:
    """Raise UsageError unless ``write_atomic`` can put a file at ``path``: its directory exists
    and is writable, and ``path`` is not a directory. Checked before a run starts, so a mistyped
    path costs nothing; ``given`` is the option as the user wrote it, for the message."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        reason = "is a directory: name a file in it"
    elif not os.path.isdir(directory):
        reason = f"no directory {directory}"
    elif not os.access(directory, os.W_OK | os.X_OK):
        reason = f"cannot create files in {directory}"
    else:
        return
    raise UsageError(f"{given}: {reason}")


def _write_in_place(path: str, text: str) -> None:
    """``text`` written to a device, FIFO or socket that ``path`` names, without creating anything."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as handle:
            handle.write(text)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None


def write_atomic(path: str, text: str) -> None:
    """Write text to path atomically: temp file in the same directory, fsync, rename. The file
    gets the mode a plain write would give it: the replaced file's, else 0666 less the umask (a
    job summary or an artifact others read). Raises UsageError (naming the file) when it cannot
    be written.

    A symlink is written through, as a shell's ``>`` would: its target is replaced, the link stays.
    A target that is no regular file (``-o /dev/null``, a FIFO a job reads) is written to in place:
    renaming over it would put a regular file where the device or pipe was."""
    path = os.path.realpath(path) if os.path.islink(path) else path
    try:
        found = os.stat(path)
    except OSError:
        found = None
    if found is not None and not stat.S_ISREG(found.st_mode):
        _write_in_place(path, text)
        return
    directory = os.path.dirname(os.path.abspath(path)) or "."
    mode = stat.S_IMODE(found.st_mode) if found is not None else None
    # Not mkstemp: its 0600 would stay. O_EXCL never opens a file someone else made; 64 random
    # bits make a clash as unlikely as mkstemp's retries do.
    temp_path = os.path.join(directory, f".rocm-audit-tmp.{secrets.token_hex(8)}")
    try:
        fd = os.open(temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp_path, path)
    except BaseException as exc:
        try:
            os.unlink(temp_path)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise UsageError(f"cannot write {path}: {exc.strerror}") from None
        raise
