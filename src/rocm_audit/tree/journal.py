"""What every changing command shares: tree locks, and an append-only JSON Lines journal that is on
disk (fsync'ed) before the change it describes is made.

dedup and prune both change other people's site-packages; they lock the same directories, so a
dedup and a prune never change one tree at the same time.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from rocm_audit.errors import UsageError
from rocm_audit.tree.smallfile import open_regular

# Where dedup and prune keep their manifests by default: a directory of this name in the tree changed.
JOURNAL_DIR = ".rocm-audit"


def journalled_trees(manifests: Iterable[str], paths: Iterable[str]) -> list[str]:
    """The trees a revert puts back, for its report to show paths relative to: the directory
    holding each manifest's JOURNAL_DIR; for a manifest kept elsewhere, the deepest directory
    holding every journalled path."""
    trees = set()
    elsewhere = False
    for manifest in manifests:
        holder = os.path.dirname(os.path.abspath(manifest))
        if os.path.basename(holder) == JOURNAL_DIR:
            trees.add(os.path.dirname(holder))
        else:
            elsewhere = True
    directories = sorted({os.path.dirname(p) for p in paths if os.path.isabs(p)})
    if elsewhere and directories:
        trees.add(os.path.commonpath(directories))
    return sorted(trees)


@contextlib.contextmanager
def one_change() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) off until the change made inside is complete and counted: the
    KeyboardInterrupt comes right after it, never between its rename and its bookkeeping.

    Only the main thread can set a signal handler; elsewhere this does nothing. Costs two
    ``signal.signal`` calls (microseconds) per change."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:  # now, as the handler in force before would have
            if callable(previous):
                previous(signal.SIGINT, None)
            elif previous == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)


@contextlib.contextmanager
def tree_locks(trees: list[str]) -> Iterator[list[str]]:
    """Hold an exclusive flock on each directory; yield the directories already locked by others."""
    held: list[int] = []
    busy: list[str] = []
    try:
        for tree in sorted(set(trees)):
            fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                busy.append(tree)
                continue
            held.append(fd)
        yield busy
    finally:
        for fd in held:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def append_records(path: str, records: Iterable[dict[str, Any]]) -> None:
    """Append one JSON object per line and fsync the file (and, when it is new, its directory).

    JSON's ASCII escapes keep undecodable file-name bytes exact (``\\udcXX`` round-trips through
    ``os.fsencode``)."""
    lines = [json.dumps(record) for record in records]
    if not lines:
        return
    directory = os.path.dirname(os.path.abspath(path))
    new_directory = not os.path.isdir(directory)
    os.makedirs(directory, exist_ok=True)
    new = not os.path.exists(path)
    # Its own file only: never written through a link or into a FIFO planted in the audited tree.
    with os.fdopen(open_append(path), "a", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    if new:  # the journal's own name (and its folder's) must survive a crash too
        fsync_directory(directory)
    if new_directory:
        fsync_directory(os.path.dirname(directory))


def open_append(path: str) -> int:
    """A journal opened to append (created 0o666 & umask): a regular file, never through a link,
    in a directory that is no link either (a ``.rocm-audit`` planted as a symlink out of the audited
    tree would make the run write where it points). Raises OSError (``ELOOP`` for a link)."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.islink(directory):
        raise OSError(errno.ELOOP, "the journal's directory is a symbolic link", directory)
    return open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, follow_symlinks=False)


def fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_records(path: str) -> list[dict[str, Any]]:
    """Every JSON object of a journal. A partial last line (a run killed while appending) is
    ignored; any other bad line is a UsageError naming the file and line."""
    records: list[dict[str, Any]] = []
    try:
        with os.fdopen(open_regular(path), encoding="utf-8") as handle:
            lines = handle.read().split("\n")
    except OSError as exc:
        raise UsageError(f"cannot read manifest {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a rocm-audit manifest (not UTF-8)") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if all(not rest.strip() for rest in lines[number:]):
                break
            raise UsageError(f"{path}:{number}: not a rocm-audit manifest line: {exc.msg}") from None
        if not isinstance(record, dict):
            raise UsageError(f"{path}:{number}: not a rocm-audit manifest line: not a JSON object")
        records.append(record)
    return records
