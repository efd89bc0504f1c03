"""A test-side writer of AOTriton ``.aks2`` archives (real code objects in, hostile fields on request)."""

from __future__ import annotations

import lzma
import struct


def aks2(
    images: list[tuple[str, bytes]],
    *,
    count: int | None = None,
    directory_size: int | None = None,
    uncompressed_size: int | None = None,
    name_lengths: dict[int, int] | None = None,
) -> bytes:
    """An AOTriton ``.aks2`` archive (AKS2, u32 content size, u32 N, u32 directory size, then one
    xz stream of N x (u32 shared memory, threads, offset, size, name length with NUL; name) and
    the images), written from AOTriton's layout comment in v2src/packed_kernel.cc. The keyword
    arguments override a field with a hostile value."""
    directory = bytearray()
    offset = 0
    for index, (name, image) in enumerate(images):
        raw = name.encode() + b"\0"
        length = (name_lengths or {}).get(index, len(raw))
        directory += struct.pack("<5I", 0, 64, offset, len(image), length) + raw
        offset += len(image)
    content = bytes(directory) + b"".join(image for _, image in images)
    header = struct.pack(
        "<4sIII",
        b"AKS2",
        len(content) if uncompressed_size is None else uncompressed_size,
        len(images) if count is None else count,
        len(directory) if directory_size is None else directory_size,
    )
    return header + lzma.compress(content, format=lzma.FORMAT_XZ)
