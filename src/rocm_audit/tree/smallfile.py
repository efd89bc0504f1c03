"""Small files read by name rather than found by the walk: a distribution's RECORD and METADATA,
TheRock's ``dist_info.json`` and ``_dist_info.py``, ``ld.so.conf``.

A walk classifies each entry before it opens one; a file read by name gets no such look first, and
in a tree rocm-audit does not own a FIFO there would block a plain ``open`` or ``read`` forever, and
a device or a huge file would be read without end. So: open without blocking, read regular files
only, and never more than the caller's limit.
"""

from __future__ import annotations

import errno
import os
import stat

_CHUNK = 1 << 20


def open_regular(path: str, flags: int = os.O_RDONLY, *, follow_symlinks: bool = True, mode: int = 0o666) -> int:
    """A descriptor of the regular file at ``path``, opened without blocking (``O_NONBLOCK``: a FIFO
    opens at once for reading and is then refused; opened for writing, ``ENXIO`` while no reader
    has it open). ``mode`` is for ``O_CREAT``. Raises OSError, ``EINVAL`` for anything but a
    regular file."""
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW), mode)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_small(path: str, limit: int, *, follow_symlinks: bool = True) -> bytes:
    """The bytes of the regular file at ``path``, which must hold at most ``limit`` of them.
    Raises OSError (``EFBIG`` when it holds more, however its size is reported)."""
    fd = open_regular(path, follow_symlinks=follow_symlinks)
    try:
        if os.fstat(fd).st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit:,} bytes", path)
        chunks: list[bytes] = []
        held = 0
        while held <= limit:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - held))
            if not chunk:
                break
            chunks.append(chunk)
            held += len(chunk)
        if held > limit:
            raise OSError(errno.EFBIG, f"larger than {limit:,} bytes", path)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_head(path: str, size: int) -> bytes:
    """The first ``size`` bytes (fewer if the file is shorter) of the regular file at ``path``,
    opened as ``open_regular`` does. Raises OSError."""
    fd = open_regular(path)
    try:
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)
