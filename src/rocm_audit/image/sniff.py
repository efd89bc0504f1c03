"""What a file named as an image is, when it is not one: the words of `image --archive` errors.

An archive that cannot be opened as an image at all (no tar, no manifest, several images and no
REF, a REF it does not hold) is nothing to audit: a UsageError (exit 2), never a finding. Its
message names the file once and says what the file is, from its first bytes (a zip or wheel, a
compression rocm-audit does not read, text, an ELF file, a file-system tar that `docker export`
wrote), in plain words: no byte reprs, and a byte offset only where it tells something (where a
truncated archive ends).
"""

from __future__ import annotations

import os

from rocm_audit.errors import FormatError, UsageError
from rocm_audit.image import tarstream
from rocm_audit.units import size_text

HEAD_BYTES = 512
# First bytes -> what the file is. gzip and zstd are read (the tar inside them is sniffed again).
_MAGIC = (
    (b"PK\x03\x04", "a zip archive"),
    (b"PK\x05\x06", "an empty zip archive"),
    (b"\x7fELF", "an ELF file (a program or library)"),
    (b"BZh", "bzip2-compressed"),
    (b"\xfd7zXZ\x00", "xz-compressed"),
    (b"\x04\x22\x4d\x18", "lz4-compressed"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"%PDF", "a PDF document"),
)
UNREAD_COMPRESSIONS = {"bzip2-compressed": "bzip2 -d", "xz-compressed": "xz -d", "lz4-compressed": "lz4 -d"}
SEE = "give a `docker save` file or an OCI image layout (a directory or a tar)"
# Top-level names of a root file system: a tar of them without manifest.json is `docker export`'s.
ROOT_DIRS = frozenset(("bin", "etc", "lib", "lib64", "opt", "root", "sbin", "usr", "var"))


def head_of(path: str) -> bytes:
    """The first bytes of a file (b"" for a directory or an unreadable file)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(HEAD_BYTES)
    except OSError:
        return b""


def kind_of(head: bytes, name: str = "") -> str | None:
    """What ``head`` shows the file to be, in words ("a zip archive (a wheel)"); None for a tar,
    gzip or zstd stream, or bytes nothing is known about."""
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            if kind == "a zip archive" and name.endswith(".whl"):
                return "a wheel (a zip archive)"
            return kind
    if head and b"\0" not in head and _is_text(head):
        return "a text file"
    return None


def _is_text(head: bytes) -> bool:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:  # more than a character cut at the end of the head
            return False
        text = head[: exc.start].decode("utf-8")
    return all(c.isprintable() or c in "\t\r\n\f" for c in text)


def refuse_known_kind(path: str, head: bytes) -> None:
    """Raise UsageError when the first bytes show a file that is no image archive (a wheel, text,
    a compression rocm-audit does not read)."""
    kind = kind_of(head, os.path.basename(path))
    if kind is None:
        return
    if kind in UNREAD_COMPRESSIONS:
        raise UsageError(
            f"{path} is {kind}: rocm-audit reads plain, gzip or zstd archives",
            hint=f"decompress it first ({UNREAD_COMPRESSIONS[kind]} {os.path.basename(path)}), or {SEE}",
        )
    hint = SEE
    if "zip" in kind or "wheel" in kind:
        hint = "rocm-audit check audits installed wheels; an image is a `docker save` file or an OCI layout"
    raise UsageError(f"{path} is {kind}, not an image archive", hint=hint)


def not_a_tar(path: str, exc: FormatError, compression: str | None, inner_head: bytes) -> UsageError:
    """The error for an archive whose tar could not be read (``exc``, from its first pass).
    ``compression``: "gzip" or "zstd" when the file was that; ``inner_head``: what it decompressed to."""
    reason = exc.reason.removeprefix(f"{path}: ")
    cut = reason.startswith("archive ends inside") or reason == "compressed stream ends early"
    if cut:
        where = f"its {compression} stream ends" if compression else f"at {size_text(_size(path))}"
        return UsageError(
            f"{path} is cut short {where}, inside a member (an interrupted copy or download?)",
            hint="recreate it (docker save, skopeo copy) and check its size against the original",
        )
    if compression and exc.fmt != "tar":  # the compressed stream itself is damaged
        return UsageError(f"{path} is {compression}-compressed, but cannot be decompressed: {reason}", hint=SEE)
    if compression:
        kind = kind_of(inner_head)
        return UsageError(
            f"{path} is {compression}-compressed (read as such), but holds {kind or 'no tar archive'}", hint=SEE
        )
    if exc.offset == 0:
        return UsageError(f"{path} is not a tar archive (plain, gzip or zstd)", hint=SEE)
    reason = reason.split(": b'", 1)[0].split(': b"', 1)[0]  # no byte reprs in plain words
    return UsageError(
        f"{path}: the tar header at byte {exc.offset:,} is damaged ({reason})",
        hint="recreate the archive (docker save, skopeo copy) and check it was not damaged in transfer",
    )


def no_image_in(path: str, names: list[str]) -> UsageError:
    """The error for a tar or directory holding neither manifest.json nor index.json; ``names``:
    its members (or the directory's entries)."""
    top = {name.strip("/").split("/", 1)[0] for name in names if name.strip("/") not in ("", ".")}
    what = "a directory" if os.path.isdir(path) else "a tar"
    if len(top & ROOT_DIRS) >= 2:
        if os.path.isdir(path):
            return UsageError(
                f"{path} is a directory of files (a root file system?), not an image layout",
                hint="rocm-audit check -p DIR audits the site-packages of a directory; for an image, " + SEE,
            )
        return UsageError(
            f"{path} is a file-system tar (`docker export` output?): no manifest.json, no layers",
            hint="`docker save IMAGE -o FILE` writes the image with its layers and config",
        )
    return UsageError(f"{path} is {what} without manifest.json or index.json: not an image", hint=SEE)


def damaged(path: str, exc: FormatError) -> UsageError:
    """The error for an archive whose manifest, index or config cannot be read: nothing of the
    image can be found, so nothing is audited."""
    reason = exc.reason.removeprefix(f"{path}: ")  # a JSON error says its line and column itself
    return UsageError(
        f"cannot read {path} as an image: {reason}",
        hint="recreate the archive (docker save, skopeo copy) and check it was not damaged in transfer",
    )


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def is_compressed(head: bytes) -> str | None:
    if head.startswith(tarstream.GZIP_MAGIC):
        return "gzip"
    if head.startswith(tarstream.ZSTD_MAGIC):
        return "zstd"
    return None


def which_image(path: str, ref: str | None, names: list[str], count: int) -> UsageError:
    """The error for a REF the archive does not hold (``ref``), or for several images and no REF
    (``ref`` None). A REF that is nearly a GPU target's name is said to be one (``image
    --archive img.tar MI300``: MI300A or MI300X?)."""
    shown = ", ".join(names) or "none"
    if ref is None:
        return UsageError(f"{path} holds {count} images: name one as REF (its tags: {shown})")
    return UsageError(f"no image tagged {ref!r} in {path} (its tags: {shown})", hint=target_hint(ref))


def target_hint(ref: str) -> str | None:
    """The hint "did you mean the target MI300A or MI300X?" for a REF that nearly names a GPU target."""
    from rocm_audit.tree.targets import either, target_guesses  # noqa: PLC0415 - only for a REF not found

    guesses = target_guesses(ref)
    return f"{ref!r} is nearly a GPU target's name: did you mean the target {either(guesses)}?" if guesses else None


def too_large(path: str, max_bytes: int) -> UsageError:
    return UsageError(
        f"{path} decompresses to more than {size_text(max_bytes)}, the --max-bytes limit",
        hint="raise --max-bytes if the image is really that large",
    )
