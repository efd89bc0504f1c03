"""Content digests for the layer waste, taken only where a verdict needs them.

Two copies can be identical only if their sizes are equal, so the first copy of each size that is
written to the merged view is left unhashed; the second copy of that size makes both hashed (the
first read back from the merged view). A copy a later layer deletes or replaces is hashed before
its bytes leave the view, since a later copy of its size may still come. Files whose bytes are not
written (streamed past, sparse placeholders) are hashed while they stream (image/merge.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass
from typing import Protocol

from rocm_audit.image import tarstream


@dataclass(frozen=True, slots=True)
class Copy:
    """One stored copy of a file's bytes: a data-bearing tar member (hardlinks share it)."""

    layer: int
    path: str  # image path, "/usr/lib/x"
    size: int
    # BLAKE2b-256 of the content; None while nothing needs it: the bytes are then in the merged
    # view at ``path`` (hashed when another copy of the same size appears, or before they go).
    digest: bytes | None


class MergeState(Protocol):
    """What these functions use of image/merge.py's MergeState."""

    root: str
    copies: list[Copy]
    unhashed_by_size: dict[int, int]
    sizes_seen: set[int]


def note_size(state: MergeState, copy_index: int, digest: bytes | None) -> None:
    """Record a new copy: the first of its size may stay unhashed; from the second on, every copy
    of that size gets its digest (the earlier unhashed one is read back from the merged view)."""
    copy = state.copies[copy_index]
    if digest is not None:
        state.copies[copy_index] = dataclasses.replace(copy, digest=digest)
    first = state.unhashed_by_size.get(copy.size)
    if first is None and copy.size not in state.sizes_seen:
        state.sizes_seen.add(copy.size)
        if digest is None:
            state.unhashed_by_size[copy.size] = copy_index
        return
    state.sizes_seen.add(copy.size)
    if first is not None:
        hash_from_view(state, first)
    if digest is None:
        hash_from_view(state, copy_index)


def hash_from_view(state: MergeState, copy_index: int) -> None:
    """Hash a copy whose bytes are still in the merged view at its path (BLAKE2b-256)."""
    copy = state.copies[copy_index]
    if state.unhashed_by_size.get(copy.size) == copy_index:
        del state.unhashed_by_size[copy.size]
    if copy.digest is not None:
        return
    hasher = hashlib.blake2b(digest_size=32)
    descriptor = os.open(os.path.join(state.root, copy.path[1:]), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with open(descriptor, "rb", buffering=0) as stored:
        while piece := stored.read(tarstream.CHUNK):
            hasher.update(piece)
    state.copies[copy_index] = dataclasses.replace(copy, digest=hasher.digest())


def hash_before_removal(state: MergeState, copy_index: int | None) -> None:
    """A copy leaving the merged view stays in the image (its layer keeps it): an unhashed one is
    hashed now, while its bytes are still here, in case a later copy shares its size."""
    if copy_index is not None and state.copies[copy_index].digest is None:
        hash_from_view(state, copy_index)
