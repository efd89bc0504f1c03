"""Content digests for the layer waste, taken only where a verdict needs them.

Two copies can be identical only if their sizes are equal, so the first copy of each size that is
written to the merged view is left unhashed; the second copy of that size makes both hashed (read
back from the merged view by a helper process beside the merge: image/offload.py). A copy a later
layer deletes or replaces is opened for its hash before its path leaves the view, since a later
copy of its size may still come. Files whose bytes are not written (streamed past, sparse
placeholders) are hashed while they stream (image/merge.py).

A trimmed file (image/trim.py: the view keeps only the blocks the checks read) is one the view
shows alone at its size: its bytes are hashed as they stream, on a thread of their own
(``StreamedHashes``). They give its content identity (``new_identity``), and its BLAKE2b too when
copies of its size came before (a reinstalled library replacing the one a lower layer trimmed).
A trimmed copy that is the first of its size gets no BLAKE2b: every later copy of its size gets
an identity (taken as it streams, or read back with its digest), and a trimmed copy of the same
identity takes that copy's BLAKE2b (``note_size``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast

from rocm_audit.hashing import Hasher, ThreadedHash
from rocm_audit.image import tarstream

_blake3: Callable[[], Hasher] | None
try:  # the `fast` extra (docs/dependencies.md)
    from blake3 import blake3 as _blake3
except ImportError:  # pragma: no cover - the tests run both ways (tests/image/test_image_trim.py)
    _blake3 = None


@dataclass(frozen=True, slots=True)
class Copy:
    """One stored copy of a file's bytes: a data-bearing tar member (hardlinks share it)."""

    layer: int
    path: str  # image path, "/usr/lib/x"
    size: int
    # BLAKE2b-256 of the content; None while nothing needs it: the bytes are then in the merged
    # view at ``path`` (hashed when another copy of the same size appears, or before they go).
    digest: bytes | None
    offset: int = -1  # of the member's tar header in its layer: how a second reading finds it
    # A later member of the same name in the same layer replaced it: its bytes are in the layer's
    # blob, but no layer's view shows them (``stored_again``; image/waste.py reports them apart).
    replaced_in_layer: bool = False


@dataclass(frozen=True, slots=True)
class Trimmed:
    """A copy the merged view holds only the checked blocks of (image/trim.py)."""

    inode: tuple[int, int]
    identity: bytes  # its whole content's identity (``new_identity``), taken as it streamed


def new_identity() -> Hasher:
    """A hasher of a copy's content identity, what tells a trimmed file's content from that of a
    later copy of its size: BLAKE3 when the `fast` extra installed it, else SHA-256. BLAKE3 hashes
    10 GB/s on one core of the bench machine, SHA-256 2 GB/s with the CPU's SHA instructions, and
    every trimmed library goes through it: a one-layer run of 4.3 GB used 1.6 CPU-s less
    (docs/benchmarks.md). Both are collision-resistant, and both sides of every comparison of one
    run take the same one, so which one never shows in a report (the waste's digests are BLAKE2b)."""
    return _blake3() if _blake3 is not None else hashlib.sha256()


class StreamedHashes:
    """What a trimmed file's bytes are hashed for as the merge writes and trims it, on a thread of
    their own: its identity, and its BLAKE2b-256 when ``with_digest`` (copies of its size came
    before it, none of which the view still shows)."""

    def __init__(self, *, with_digest: bool) -> None:
        self._both = _Both(new_identity(), hashlib.blake2b(digest_size=32) if with_digest else None)
        self._thread = ThreadedHash(self._both, backlog=16, name="rocm-audit-identity")

    def update(self, chunk: bytes, /) -> None:
        """Hand one chunk over to the hashing thread (waits while 16 are queued)."""
        self._thread.update(chunk)

    def close(self) -> None:
        """Stop the thread once every chunk handed over is hashed (idempotent)."""
        self._thread.close()

    def digest(self) -> bytes:
        """The identity of every chunk handed over."""
        return self._thread.digest()

    def blake2b(self) -> bytes | None:
        """The BLAKE2b-256 of every chunk handed over, None without ``with_digest``."""
        self.close()
        return self._both.blake2b.digest() if self._both.blake2b is not None else None


@dataclass(slots=True)
class _Both:
    """The hashes ``StreamedHashes`` feeds on its thread; its digest is the identity."""

    identity: Hasher
    blake2b: Hasher | None

    def update(self, data: bytes, /) -> None:
        self.identity.update(data)
        if self.blake2b is not None:
            self.blake2b.update(data)

    def digest(self) -> bytes:
        return self.identity.digest()


class Jobs(Protocol):
    """What these functions use of image/offload.py's Offload."""

    def submit(
        self, kind: str, fd: int, path: str, size: int, done: Callable[[object], None], *, shown: bool = False
    ) -> None: ...

    def left_view(self, path: str, *, below: bool = False) -> None: ...


class MergeState(Protocol):
    """What these functions use of image/merge.py's MergeState."""

    root: str
    copies: list[Copy]
    unhashed_by_size: dict[int, int]
    by_size: dict[int, list[int]]
    visible: dict[str, int]
    hardlinked: dict[str, int]
    trimmed: dict[int, Trimmed]
    trimmed_by_size: dict[int, list[int]]
    hashing: set[int]

    @property
    def offload(self) -> Jobs: ...


def note_size(state: MergeState, copy_index: int, digest: bytes | None, identity: bytes | None = None) -> None:
    """Record a new copy: the first of its size may stay unhashed; from the second on, every copy
    of that size gets its digest (the earlier unhashed one is read back from the merged view).

    A trimmed copy that is the first of its size gets no BLAKE2b: a later copy of its size gets
    its identity too (``identity``, taken as it streamed, or read back with its digest), and a
    trimmed copy of the same identity takes that copy's digest. One whose content no other copy
    has keeps none: it groups with nothing."""
    copy = state.copies[copy_index]
    if digest is not None:
        state.copies[copy_index] = dataclasses.replace(copy, digest=digest)
    of_size = state.by_size.setdefault(copy.size, [])
    of_size.append(copy_index)
    first = state.unhashed_by_size.get(copy.size)
    if first is None and len(of_size) == 1:
        if digest is None:
            state.unhashed_by_size[copy.size] = copy_index
        return
    if first is not None:
        hash_from_view(state, first)
    if digest is None:
        hash_from_view(state, copy_index)
    elif identity is not None:
        _match_trimmed(state, copy_index, identity)


def shows_size(state: MergeState, size: int) -> bool:
    """Whether the merged view shows a copy of ``size``, at its own path or through a hardlink. A
    file is trimmed only while none is: a later copy of its size is then kept whole, so a duplicate
    group the view shows keeps a whole member to give a trimmed one its bytes (image/whole.py)."""
    of_size = state.by_size.get(size, [])
    if any(state.visible.get(state.copies[i].path) == i for i in of_size):
        return True
    return bool(of_size) and not set(of_size).isdisjoint(state.hardlinked.values())


def hash_from_view(state: MergeState, copy_index: int) -> None:
    """Hash a copy whose bytes are still in the merged view at its path (BLAKE2b-256, and its
    identity when a trimmed copy shares its size), beside the merge (image/offload.py): the digest
    is in ``copies`` once the merge's jobs are settled. The file is opened now, so a path the merge
    removes or replaces meanwhile keeps its bytes for the hash."""
    copy = state.copies[copy_index]
    if state.unhashed_by_size.get(copy.size) == copy_index:
        del state.unhashed_by_size[copy.size]
    if copy.digest is not None or copy_index in state.trimmed or copy_index in state.hashing:
        return
    kind = "blake2b+identity" if copy.size in state.trimmed_by_size else "blake2b"
    descriptor = os.open(os.path.join(state.root, copy.path[1:]), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    state.hashing.add(copy_index)

    def done(answer: object) -> None:
        state.hashing.discard(copy_index)
        if answer is None:
            return  # unreadable (logged): the copy groups with nothing
        digest, identity = cast("tuple[bytes, bytes | None]", answer)
        state.copies[copy_index] = dataclasses.replace(state.copies[copy_index], digest=digest)
        if identity is not None:
            _match_trimmed(state, copy_index, identity)

    state.offload.submit(kind, descriptor, copy.path, copy.size, done, shown=True)


def hash_descriptor(fd: int, *, with_identity: bool) -> tuple[bytes, bytes | None]:
    """BLAKE2b-256 (and the identity) of the whole file open at ``fd``, read from its start."""
    hasher = hashlib.blake2b(digest_size=32)
    identity = new_identity() if with_identity else None
    position = 0
    while piece := os.pread(fd, tarstream.CHUNK, position):
        position += len(piece)
        hasher.update(piece)
        if identity is not None:
            identity.update(piece)
    return hasher.digest(), identity.digest() if identity is not None else None


def _match_trimmed(state: MergeState, copy_index: int, identity: bytes) -> None:
    """Give the trimmed copies whose content equals this copy's its digest."""
    digest = state.copies[copy_index].digest
    for trimmed_index in state.trimmed_by_size.get(state.copies[copy_index].size, []):
        trimmed = state.copies[trimmed_index]
        if trimmed.digest is None and state.trimmed[trimmed_index].identity == identity:
            state.copies[trimmed_index] = dataclasses.replace(trimmed, digest=digest)


def stored_again(state: MergeState, path: str, layer: int) -> None:
    """``layer`` stores ``path`` a second time (a tar appended to keeps the older member): the copy
    the view showed there, if this layer wrote it, is now one nothing shows. A copy a hardlink of
    the layer shares is still shown under the link's name."""
    copy_index = state.visible.get(path)
    if copy_index is None or state.copies[copy_index].layer != layer or copy_index in state.hardlinked.values():
        return
    state.copies[copy_index] = dataclasses.replace(state.copies[copy_index], replaced_in_layer=True)


def hash_before_removal(state: MergeState, copy_index: int | None) -> None:
    """A copy leaving the merged view stays in the image (its layer keeps it): an unhashed one is
    hashed now, while its bytes are still here, in case a later copy shares its size (a trimmed
    one is not: a later copy's identity tells whether it has its content)."""
    if copy_index is not None and state.copies[copy_index].digest is None:
        hash_from_view(state, copy_index)
