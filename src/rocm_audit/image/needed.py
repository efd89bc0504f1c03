"""Which files of an image the checks read, told from a file's name and its first bytes.

``image`` writes the bytes of these files into the merged view; every other regular file of at
least 4 KiB becomes a sparse placeholder of the same apparent size (no data blocks), so the
inventory's sizes and kinds stay what a full extraction gives while the scratch disk holds only
what is read. When in doubt the bytes are written. What the checks open (``grep -rn
"open(\\|os.pread\\|read_small\\|read_head" src/rocm_audit``): ELF files (inventory, loader, LLVM
and code-object scans), device-code containers sniffed by magic (gpu/scanning.py
``may_hold_code``), wheels and zips (tree/discovery.py), package metadata (``*.dist-info``,
``*.egg-info``: METADATA, RECORD, entry points), Python modules (postbuild/sonames.py reads the
ctypes loads of RECORD's ``.py`` files), JSON (Triton metadata beside a ``.hsaco``, TheRock's
``dist_info.json``), kpack manifests (``.kpm``), Tensile files (tree/archfiles.py), TOML rule
files, and the loader's configuration (``/etc/ld.so.conf*``).
"""

from __future__ import annotations

import posixpath

ELF_MAGIC = b"\x7fELF"
# First bytes of what a check reads by content (formats.md; gpu/scanning.py may_hold_code).
MAGICS = (
    ELF_MAGIC,
    b"__CLANG_OFFLOAD_BUNDLE__",
    b"CCOB",
    b"KPAK",
    b"AKS2",
    b"\x10\xff\x10\xad",  # AMD code-object archive of a Tensile/kpack container
    b"PK\x03\x04",  # a wheel or zip (tree/discovery.py)
    b"!<arch>\n",  # static archives may hold device code
    b"BC\xc0\xde",  # LLVM bitcode
    b"\xde\xc0\x17\x0b",  # LLVM bitcode wrapper
)
SUFFIXES = (
    ".py",
    ".pth",
    ".json",
    ".toml",
    ".cfg",
    ".kpm",
    ".kpack",
    ".aks2",
    ".msgpack",
    ".hsaco",
    ".co",
    ".dat",
    ".egg-info",
    ".egg-link",
)
METADATA_DIRS = (".dist-info", ".egg-info")


def needs_bytes_by_name(path: str) -> bool:
    """Whether a check may open the file at image ``path`` because of its name."""
    directory, name = posixpath.split(path)
    if name.endswith(SUFFIXES) or ".so" in name or "ld.so.conf" in path:
        return True
    return any(part.endswith(METADATA_DIRS) for part in directory.split("/"))


def needs_bytes(path: str, head: bytes) -> bool:
    """Whether the bytes of the file at ``path`` starting with ``head`` must be written.

    ``head`` is the first chunk the tar stream gives (up to 1 MiB; at least 32 bytes of any file
    of 4 KiB or more). A text file starting with ``{`` (JSON under another name) is kept too."""
    return head.startswith(MAGICS) or head.lstrip()[:1] == b"{" or needs_bytes_by_name(path)
