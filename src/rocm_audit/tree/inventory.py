"""Walk audited roots and classify every regular file by content (never by suffix).

The walk never follows a symbolic link (directory links are recorded, not entered), reads at most
the first block of each file, and keeps memory proportional to the number of files, not their size.
"""

from __future__ import annotations

import enum
import os
import stat
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field

from rocm_audit.elf import read as elfread
from rocm_audit.elf.view import ElfView
from rocm_audit.errors import FormatError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.progress import SILENT, Progress
from rocm_audit.tree.discovery import AuditRoot, enclosing_sdk_tree, is_sdk_tree_name
from rocm_audit.tree.facts import FileFacts
from rocm_audit.tree.identical import KnownClasses, head_digest

HEAD_BYTES = 4096
MAGIC_BYTES = 32
TEMP_PREFIX = ".rocm-audit-tmp."  # every temporary name rocm-audit creates starts with this


class FileKind(str, enum.Enum):
    SHARED_LIBRARY = "shared-library"  # ELF ET_DYN, host machine, not an executable
    EXECUTABLE = "executable"  # ET_EXEC, or a PIE (DF_1_PIE, or PT_INTERP without SONAME)
    CODE_OBJECT = "amdgpu-code-object"  # e_machine EM_AMDGPU (224), any e_type
    OTHER_ELF = "other-elf"  # relocatable objects, core files, malformed ELF
    NOT_ELF = "not-elf"


@dataclass(frozen=True, slots=True)
class FileRecord:
    path: str
    root: str
    sdk_tree: str | None
    kind: FileKind | None  # None: listed but not opened (see build_inventory's worth_reading)
    dev: int
    ino: int
    nlink: int
    size: int
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    ctime_ns: int
    magic: bytes  # empty when not opened
    head_digest: bytes | None  # of the first HEAD_BYTES; None when not opened
    elf: elfread.ElfHeader | None = None

    @property
    def opened_kind(self) -> FileKind:
        """The kind of a file the inventory opened (every command but dedup opens every file)."""
        if self.kind is None:
            raise ValueError(f"{self.path}: listed without being opened, so its kind is unknown")
        return self.kind

    @property
    def identity(self) -> tuple[int, int]:
        """(st_dev, st_ino): what glibc uses to tell two loaded files apart (formats.md 4)."""
        return (self.dev, self.ino)


@dataclass(frozen=True, slots=True)
class LinkRecord:
    path: str
    root: str
    sdk_tree: str | None
    target_text: str


@dataclass(slots=True)
class Inventory:
    roots: list[AuditRoot]
    files: list[FileRecord] = field(default_factory=list)
    links: list[LinkRecord] = field(default_factory=list)
    sdk_trees: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    facts: FileFacts = field(default_factory=FileFacts)  # every per-file fact of this run, read once
    identical: KnownClasses = field(default_factory=KnownClasses)  # what this run compared, and found
    _resolved: dict[str, str | None] = field(default_factory=dict)

    def dynamic(self, record: FileRecord) -> elfread.DynamicInfo:
        """SONAME, DT_NEEDED, RPATH/RUNPATH of an ELF file, read once on first use. Raises
        FormatError or OSError (every time it is asked, for a file that cannot be read)."""
        return self.facts.get(record, "dynamic", dynamic_info_of)

    def elf_keys(self) -> dict[tuple[int, int], tuple[int, int]]:
        """(EI_CLASS, e_machine) of every ELF file the walk classified, by (st_dev, st_ino)."""
        return {r.identity: (r.elf.elf_class, r.elf.e_machine) for r in self.files if r.elf is not None}

    def resolved(self, link: LinkRecord) -> str | None:
        """The real path a symbolic link leads to when that exists inside its root, else None.
        Resolved on first use: few commands ask, and realpath costs an lstat per path component."""
        if link.path not in self._resolved:
            real = os.path.realpath(link.path)
            inside = real == link.root or real.startswith(link.root.rstrip("/") + "/")
            self._resolved[link.path] = real if inside and os.path.exists(real) else None
        return self._resolved[link.path]

    def maybe_elf(self) -> Iterator[FileRecord]:
        """Every file but those the walk read and found not ELF: what a lookup by path or identity
        for ELF facts needs to hold (a tree of Python modules is mostly files of no interest)."""
        return (r for r in self.files if r.kind is not FileKind.NOT_ELF)

    def by_kind(self, *kinds: FileKind) -> list[FileRecord]:
        return [r for r in self.files if r.kind in kinds]


def read_dynamic_info(path: str, *, follow_symlinks: bool = False) -> elfread.DynamicInfo:
    """Read the dynamic facts of one ELF file. Raises FormatError or OSError."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        return dynamic_info_of(ElfView(fd))
    finally:
        os.close(fd)


def dynamic_info_of(view: ElfView) -> elfread.DynamicInfo:
    """The dynamic facts of the ELF file of a view (parsed once per view, with pread)."""
    return view.dynamic


def classify(fd: int, head: bytes, size: int) -> tuple[FileKind, elfread.ElfHeader | None]:
    if head[:4] != elfread.ELF_MAGIC:
        return FileKind.NOT_ELF, None
    header = elfread.parse_header(head)
    if header.e_machine == elfread.EM_AMDGPU:
        return FileKind.CODE_OBJECT, header
    if header.e_type == elfread.ET_EXEC:
        return FileKind.EXECUTABLE, header
    if header.e_type != elfread.ET_DYN:
        return FileKind.OTHER_ELF, header
    if elfread.PT_INTERP in elfread.program_header_types(fd, header, head, size):
        # A PIE executable and a runnable library (libc.so.6) both have PT_INTERP; DF_1_PIE or a
        # missing SONAME tells the executable apart.
        phdrs = elfread.read_program_headers(fd, header, head, size)
        dynamic = elfread.read_dynamic(fd, header, phdrs, size)
        if dynamic.flags_1 & elfread.DF_1_PIE or dynamic.soname is None:
            return FileKind.EXECUTABLE, header
    return FileKind.SHARED_LIBRARY, header


def _walk(root: AuditRoot, findings: list[Finding]) -> Iterator[tuple[str, os.stat_result]]:
    """Yield (path, lstat) for every non-directory entry under root, in sorted order."""
    if root.single_file:
        try:
            yield root.path, os.lstat(root.path)
        except OSError as exc:
            findings.append(make_finding("SCAN001", root.path, f"cannot stat: {exc.strerror}"))
        return
    stack = [root.path]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as entries:
                listed = sorted(entries, key=lambda e: e.name)
        except OSError as exc:
            findings.append(make_finding("SCAN001", directory, f"cannot list directory: {exc.strerror}"))
            continue
        subdirs = []
        for entry in listed:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                findings.append(make_finding("SCAN001", entry.path, f"cannot stat: {exc.strerror}"))
                continue
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(entry.path)
            else:
                yield entry.path, st
        stack.extend(reversed(subdirs))


@dataclass(frozen=True, slots=True)
class ListedFile:
    """A regular file as the walk saw it (its lstat), before anything was opened.

    Only the fields a record keeps: an ``os.stat_result`` costs about 500 bytes a file (a tuple of
    19 fields, three of them floats), which at 300,000 files was a third of the peak memory.
    """

    path: str
    root: AuditRoot
    sdk_tree: str | None
    dev: int
    ino: int
    nlink: int
    size: int
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    ctime_ns: int


class _Listing:
    """Makes ListedFiles, sharing the int objects of the values most files repeat (device and mode
    are large ints, a new object in every stat result)."""

    def __init__(self) -> None:
        self._shared: dict[int, int] = {}

    def listed(self, path: str, root: AuditRoot, sdk_tree: str | None, st: os.stat_result) -> ListedFile:
        share = self._shared.setdefault
        return ListedFile(
            path, root, sdk_tree, share(st.st_dev, st.st_dev), st.st_ino, st.st_nlink, st.st_size,
            share(st.st_mode, st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns, st.st_ctime_ns,
        )  # fmt: skip


# Given every listed regular file, the paths worth opening; the rest are recorded from lstat alone.
ReadSelector = Callable[[list[ListedFile]], Container[str]]


def build_inventory(
    roots: list[AuditRoot], progress: Progress = SILENT, worth_reading: ReadSelector | None = None
) -> Inventory:
    """Walk every root and classify its files. Problems become findings; the walk goes on.

    With ``worth_reading``, only the selected files are opened; the others get ``kind=None``
    (dedup opens only files whose size another file shares, as the peers do: peers.md 1).
    """
    inventory = Inventory(roots=list(roots))
    trees: set[str] = set()
    listed: list[ListedFile] = []
    listing = _Listing()
    progress.phase("listing files", unit="files")
    for root in roots:
        root_tree = enclosing_sdk_tree(root.path)
        tree_of_dir: dict[str, str | None] = {}  # the owning tree is a property of the directory
        for path, st in _walk(root, inventory.findings):
            directory = os.path.dirname(path)
            if directory in tree_of_dir:
                sdk_tree = tree_of_dir[directory]
            else:
                rel_dir = os.path.dirname(os.path.relpath(path, root.path))
                sdk_tree = tree_of_dir[directory] = _tree_of(root.path, rel_dir, root_tree)
            if sdk_tree:
                trees.add(sdk_tree)
            if os.path.basename(path).startswith(TEMP_PREFIX):
                inventory.findings.append(
                    make_finding("SCAN004", path, "temporary file left by an interrupted rocm-audit run")
                )
            if stat.S_ISLNK(st.st_mode):
                try:
                    link = LinkRecord(path, root.path, sdk_tree, os.readlink(path))
                except OSError as exc:
                    inventory.findings.append(make_finding("SCAN001", path, f"cannot read link: {exc.strerror}"))
                    continue
                inventory.links.append(link)
                continue
            if not stat.S_ISREG(st.st_mode):
                continue  # FIFOs, sockets and devices are never opened: reading one can hang
            if root.sdk_only and sdk_tree is None:
                continue
            listed.append(listing.listed(path, root, sdk_tree, st))
            progress.update(len(listed))
    selected = None if worth_reading is None else worth_reading(listed)
    progress.phase("scanning", len(listed), "files")
    seen_files = seen_bytes = 0
    listed.reverse()  # taken from the end, so each listing is freed as its record is made
    while listed:
        entry = listed.pop()
        if selected is None or entry.path in selected:
            record = _file_record(entry, inventory.findings)
        else:
            record = _record(entry, None, b"", None, None)
        if record is not None:
            inventory.files.append(record)
        seen_files += 1
        seen_bytes += entry.size
        progress.update(seen_files, seen_bytes)
    inventory.sdk_trees = sorted(trees)
    return inventory


def _tree_of(root_path: str, rel_dir: str, root_tree: str | None) -> str | None:
    if root_tree is not None:
        return root_tree
    if rel_dir in ("", "."):
        return None
    parts = rel_dir.split(os.sep)
    for depth, name in enumerate(parts):
        if is_sdk_tree_name(name):
            return os.path.join(root_path, *parts[: depth + 1])
    return None


def _file_record(entry: ListedFile, findings: list[Finding]) -> FileRecord | None:
    path = entry.path
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        findings.append(make_finding("SCAN001", path, f"cannot open: {exc.strerror}"))
        return None
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (entry.dev, entry.ino):
            findings.append(make_finding("SCAN001", path, "file was replaced while it was being read"))
            return None
        head = os.pread(fd, HEAD_BYTES, 0)
        try:
            kind, header = classify(fd, head, opened.st_size)
        except FormatError as exc:
            findings.append(make_finding("SCAN002", path, exc.reason, data={"offset": exc.offset}))
            kind, header = FileKind.OTHER_ELF, None
    except OSError as exc:
        findings.append(make_finding("SCAN001", path, f"cannot read: {exc.strerror}"))
        return None
    finally:
        os.close(fd)
    if _changed(entry, opened):  # the record describes the bytes read: the open file's stat wins
        entry = _Listing().listed(entry.path, entry.root, entry.sdk_tree, opened)
    return _record(entry, kind, head[:MAGIC_BYTES], head_digest(head), header)


def _changed(entry: ListedFile, st: os.stat_result) -> bool:
    return (st.st_size, st.st_mode, st.st_nlink, st.st_uid, st.st_gid, st.st_mtime_ns, st.st_ctime_ns) != (
        entry.size, entry.mode, entry.nlink, entry.uid, entry.gid, entry.mtime_ns, entry.ctime_ns
    )  # fmt: skip


def _record(
    entry: ListedFile,
    kind: FileKind | None,
    magic: bytes,
    head_digest: bytes | None,
    header: elfread.ElfHeader | None,
) -> FileRecord:
    return FileRecord(
        path=entry.path,
        root=entry.root.path,
        sdk_tree=entry.sdk_tree,
        kind=kind,
        dev=entry.dev,
        ino=entry.ino,
        nlink=entry.nlink,
        size=entry.size,
        mode=entry.mode,
        uid=entry.uid,
        gid=entry.gid,
        mtime_ns=entry.mtime_ns,
        ctime_ns=entry.ctime_ns,
        magic=magic,
        head_digest=head_digest,
        elf=header,
    )
