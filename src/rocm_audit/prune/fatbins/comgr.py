"""Proof (d) of ``prune --fatbins``: comgr's own lookup picks the same code object before and after.

CLR asks comgr (``amd_comgr_lookup_code_object``, formats.md 8.1) which entry of a fat binary a
device loads. Where a comgr library is at hand, each slimmed bundle is put to it: for every
setting of every kept target comgr knows (``amd_comgr_get_isa_count`` / ``amd_comgr_get_isa_name``),
the lookup runs on the original and on the slimmed bundle, and the bytes of the two chosen entries
(offset and size into each) must be equal, or both lookups must find nothing.

Which comgr: the audited site's own (``_rocm_sdk_core/lib/libamd_comgr.so*``, what the image will
run), else the system's ``libamd_comgr.so.3`` or ``.so.2``; none loadable: the proof is recorded as
not run. comgr is loaded only in a child process (a ``python -I -S`` with a clean environment, as
the load probes run, llvm/probes.py), never in rocm-audit's own: it is an LLVM build whose
constructors and options must not meet ours. One child serves a whole run: it reads each bundle's
first 4096 bytes on stdin and answers with (offset, size) per ISA name.

The C interface used, the same in comgr 2.x and 3.x [ROCm/llvm-project:
amd/comgr/include/amd_comgr.h.in]: ``amd_comgr_create_data(kind, *data)`` with
``AMD_COMGR_DATA_KIND_FATBIN = 0x10``, ``amd_comgr_set_data(data, size, bytes)``,
``amd_comgr_lookup_code_object(data, code_object_info_t *list, size_t count)`` where the struct is
``{const char *isa; size_t size; uint64_t offset}`` (size before offset), and
``amd_comgr_release_data``. What differs between the majors does not touch this path: 3.0
renumbered the language enum (``AMD_COMGR_LANGUAGE_HC`` gone) and dropped actions; the lookup of a
plain bundle kept its shape. comgr 2 predates CCOB, and CLR inflates a CCOB before the lookup, so
a CCOB is put to comgr as its inflated bundle; a plain bundle as CLR hands it, its first 4096 bytes.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import selectors
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from rocm_audit.formats import ccob
from rocm_audit.prune.fatbins.rewrite import CHUNK, ReadAt, Slimmed, inflate_to
from rocm_audit.tree.targets import TargetId, agents_of

COMGR_WINDOW = 4096  # bytes of a plain bundle CLR hands comgr (formats.md 8.1)
SYSTEM_SONAMES = ("libamd_comgr.so.3", "libamd_comgr.so.2")
SITE_GLOB = "_rocm_sdk_core/lib/libamd_comgr.so*"
ISA_PREFIX = "amdgcn-amd-amdhsa--"
TIMEOUT_S = 120.0

AGREED = "agreed"
NOT_AVAILABLE = "not available"
KNOWS_NONE = "knows none of the kept targets"
DISAGREED = "disagreed"

# The child: open comgr, say which ISA names it knows and its version, then answer each request
# frame (u32 length + bytes) with a JSON line [[offset, size], ...] in query order. One lookup per
# ISA name, as CLR asks per device: given several names at once, comgr hands each entry to the
# first compatible name only (seen with comgr 2.4: the other settings of gfx90a got nothing).
_CHILD = r"""
import ctypes, json, struct, sys
out = sys.stdout
lib = ctypes.CDLL(sys.argv[1])
major, minor = ctypes.c_size_t(), ctypes.c_size_t()
lib.amd_comgr_get_version(ctypes.byref(major), ctypes.byref(minor))
count = ctypes.c_size_t()
if lib.amd_comgr_get_isa_count(ctypes.byref(count)) != 0:
    raise SystemExit("amd_comgr_get_isa_count failed")
names = []
for i in range(count.value):
    name = ctypes.c_char_p()
    if lib.amd_comgr_get_isa_name(ctypes.c_size_t(i), ctypes.byref(name)) == 0 and name.value:
        names.append(name.value.decode("ascii", "replace"))
out.write(json.dumps({"version": [major.value, minor.value], "isas": names}) + "\n")
out.flush()
class Info(ctypes.Structure):
    _fields_ = [("isa", ctypes.c_char_p), ("size", ctypes.c_size_t), ("offset", ctypes.c_uint64)]
queries = [q.encode("ascii") for q in json.loads(sys.stdin.buffer.readline())]
lib.amd_comgr_set_data.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_char_p]
lib.amd_comgr_lookup_code_object.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
lib.amd_comgr_release_data.argtypes = [ctypes.c_uint64]
while True:
    head = sys.stdin.buffer.read(4)
    if len(head) < 4:
        break
    (size,) = struct.unpack("<I", head)
    blob = sys.stdin.buffer.read(size)
    handle = ctypes.c_uint64()
    answer = {}
    if lib.amd_comgr_create_data(0x10, ctypes.byref(handle)) != 0:
        answer["error"] = "amd_comgr_create_data failed"
    else:
        status = lib.amd_comgr_set_data(handle.value, len(blob), blob)
        found = []
        for query in queries:
            if status != 0:
                break
            info = Info(query, 0, 0)
            status = lib.amd_comgr_lookup_code_object(handle.value, ctypes.byref(info), 1)
            found.append([info.offset, info.size])
        if status != 0:
            answer["error"] = f"amd_comgr_lookup_code_object returned status {status}"
        else:
            answer["found"] = found
        lib.amd_comgr_release_data(handle.value)
    out.write(json.dumps(answer) + "\n")
    out.flush()
"""


class ComgrError(Exception):
    """The comgr child failed: the proof cannot be run with this library."""


def site_comgr(paths: Sequence[str]) -> str | None:
    """The comgr an audited site ships (``_rocm_sdk_core/lib/libamd_comgr.so*``), among ``paths``
    (the audited files), preferring the real file over its symlinks; None when there is none."""
    found = sorted(p for p in paths if _is_site_comgr(p))
    real = [p for p in found if not os.path.islink(p)]
    chosen = real or found
    return chosen[0] if chosen else None


def _is_site_comgr(path: str) -> bool:
    parent = os.path.dirname(path)
    return (
        os.path.basename(path).startswith("libamd_comgr.so")
        and os.path.basename(parent) == "lib"
        and os.path.basename(os.path.dirname(parent)) == "_rocm_sdk_core"
    )


def site_comgr_in(roots: Sequence[str]) -> str | None:
    """The comgr under any of ``roots`` (site-packages directories), by the same rule."""
    return site_comgr([p for root in roots for p in glob.glob(os.path.join(glob.escape(root), SITE_GLOB))])


def isa_queries(kept: Sequence[TargetId], known: Sequence[str]) -> list[str]:
    """The ISA names to look up: each setting of each kept target whose processor comgr knows."""
    processors = {name.removeprefix(ISA_PREFIX).split(":")[0] for name in known}
    queries: dict[str, None] = {}
    for target in kept:
        for agent in agents_of(target):
            text = str(agent)
            if text.split(":")[0] in processors:
                queries[ISA_PREFIX + text] = None
    return list(queries)


@dataclass(slots=True)
class ComgrProof:
    """One comgr child for one library: ``check(before, after)`` per slimmed bundle."""

    library: str
    kept: Sequence[TargetId]
    timeout_s: float = TIMEOUT_S
    version: tuple[int, int] = (0, 0)
    queries: list[str] = field(default_factory=list)
    checked: int = 0  # bundles comgr agreed on
    _process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ComgrProof:
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _CHILD, self.library],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C", "PYTHONDONTWRITEBYTECODE": "1"},
            start_new_session=True,
            close_fds=True,
        )
        hello: dict[str, Any] = self._answer()
        try:
            self.version = (int(hello["version"][0]), int(hello["version"][1]))
            known = [str(name) for name in hello["isas"]]
        except (KeyError, IndexError, TypeError, ValueError):
            raise ComgrError("the comgr child answered something unreadable") from None
        self.queries = isa_queries(self.kept, known)
        self._send(json.dumps(self.queries).encode("ascii") + b"\n")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        process = self._process
        if process is None:
            return
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.close()
            process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            _kill(process)
        process.stdout.close()
        self._process = None

    def _send(self, payload: bytes) -> None:
        assert self._process is not None and self._process.stdin is not None
        try:
            self._process.stdin.write(payload)
            self._process.stdin.flush()
        except OSError as exc:
            raise ComgrError(f"the comgr child stopped: {exc.strerror or exc}") from None

    def _answer(self) -> dict[str, Any]:
        process = self._process
        assert process is not None and process.stdout is not None
        line = bytearray()
        deadline = time.monotonic() + self.timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            while not line.endswith(b"\n"):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(timeout=remaining):
                    _kill(process)
                    raise ComgrError(f"the comgr child gave no answer in {self.timeout_s:g} s")
                chunk = os.read(process.stdout.fileno(), 65536)
                if not chunk:
                    raise ComgrError(f"the comgr child ended (exit status {process.poll()})")
                line.extend(chunk)
        try:
            answer = json.loads(line)
        except ValueError:
            raise ComgrError("the comgr child answered something unreadable") from None
        if not isinstance(answer, dict):
            raise ComgrError("the comgr child answered something unreadable")
        return answer

    def lookup(self, plain: bytes) -> list[tuple[int, int]]:
        """(offset, size) comgr chooses for each query in a plain bundle (CLR's 4096-byte window)."""
        window = plain[:COMGR_WINDOW]
        self._send(struct.pack("<I", len(window)) + window)
        answer = self._answer()
        if "error" in answer:
            raise ComgrError(str(answer["error"]))
        found = answer.get("found")
        if not isinstance(found, list) or len(found) != len(self.queries):
            raise ComgrError("the comgr child answered something unreadable")
        return [(int(offset), int(size)) for offset, size in found]

    def check(self, before_plain: bytes, after_plain: bytes) -> str | None:
        """``check_ranges`` of two plain bundles held as bytes (tests, small bundles)."""
        return self.check_ranges(
            _bytes_reader(before_plain), len(before_plain), _bytes_reader(after_plain), len(after_plain)
        )

    def check_ranges(self, before: ReadAt, before_size: int, after: ReadAt, after_size: int) -> str | None:
        """None when comgr picks code objects with the same bytes (sha256, read 1 MiB at a time)
        from both plain bundles for every query, else what differs. Raises ComgrError."""
        if not self.queries:
            return None
        old = self.lookup(before(0, min(COMGR_WINDOW, before_size)))
        new = self.lookup(after(0, min(COMGR_WINDOW, after_size)))
        for isa, (old_offset, old_size), (new_offset, new_size) in zip(self.queries, old, new, strict=True):
            old_code = _digest(before, before_size, old_offset, old_size)
            if old_code != _digest(after, after_size, new_offset, new_size):
                return f"comgr {self.version[0]}.{self.version[1]} picks other code for {isa} in the slimmed bundle"
        self.checked += 1
        return None

    def check_slimmed(self, slimmed: Slimmed) -> str | None:
        """``check_ranges`` of a slimmed bundle and its original (rewrite.py): for a CCOB, the
        slimmed one is inflated again into a temporary file, as CLR inflates it before the
        lookup. Raises ComgrError, FormatError, OSError."""
        if slimmed.original is None or not self.queries:
            return None
        if slimmed.compressed is None:
            return self.check_ranges(slimmed.original, slimmed.original_extent, slimmed.read_at, slimmed.size)
        header = ccob.parse_header(slimmed.read_at(0, min(slimmed.size, ccob.MAX_HEADER_SIZE)), 0, slimmed.size)
        with tempfile.TemporaryFile(dir=slimmed.spool_dir) as spool:
            size = inflate_to(header, slimmed.read_at, slimmed.size, spool)
            fd = spool.fileno()

            def inflated(offset: int, length: int) -> bytes:
                return os.pread(fd, length, offset)

            return self.check_ranges(slimmed.original, slimmed.original_extent, inflated, size)


def _bytes_reader(data: bytes) -> ReadAt:
    return lambda offset, size: data[offset : offset + size]


def _digest(read_at: ReadAt, extent: int, offset: int, size: int) -> str:
    """The sha256 of ``size`` bytes at ``offset`` ("" for none; "outside" past ``extent``)."""
    if not size:
        return ""
    if offset < 0 or offset + size > extent:
        return f"outside the bundle: {size} bytes at {offset:#x}"
    sha = hashlib.sha256()
    for at in range(offset, offset + size, CHUNK):
        sha.update(read_at(at, min(CHUNK, offset + size - at)))
    return sha.hexdigest()


def _kill(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the child leads its own session
    except ProcessLookupError:
        pass
    process.wait()


def system_comgr() -> str | None:
    """The system's comgr soname that a child can load, or None."""
    for soname in SYSTEM_SONAMES:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1])", soname],
            capture_output=True,
            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
            timeout=60,
            check=False,
        )
        if done.returncode == 0:
            return soname
    return None


__all__ = [
    "AGREED",
    "DISAGREED",
    "KNOWS_NONE",
    "NOT_AVAILABLE",
    "ComgrError",
    "ComgrProof",
    "isa_queries",
    "site_comgr",
    "site_comgr_in",
    "system_comgr",
]
