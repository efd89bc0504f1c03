"""LLVM facts of the libraries of one run: roles (roles.py) and linkage (linkage.py), read once
per inode through the fact pass (tree/facts.py), and DT_NEEDED facts of files a closure reached."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterable

from rocm_audit.elf import read as elfread
from rocm_audit.elf.view import ElfView
from rocm_audit.errors import FormatError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.llvm.linkage import EMPTY as EMPTY_LINKAGE
from rocm_audit.llvm.linkage import Linkage, read_linkage
from rocm_audit.llvm.roles import ClFacts, Role, classify
from rocm_audit.tree.facts import open_checked
from rocm_audit.tree.inventory import FileRecord, Inventory, read_dynamic_info


def identities(paths: Iterable[str]) -> frozenset[tuple[int, int]]:
    identities = set()
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        identities.add((st.st_dev, st.st_ino))
    return frozenset(identities)


# Names of the per-file facts (tree/facts.py) this module reads: classify() and read_linkage() of
# the file at the record's path with its dynamic section. image/trim.py reads the same two while a
# layer streams and hands them over (``CheckOptions.known_facts``).
ROLE_FACT, LINKAGE_FACT = "llvm-role", "llvm-linkage"
# Below this many bytes of libraries whose linkage is read, helpers cost more than they save
# (a fork and the facts' pickles; a private LLVM copy of 30 MiB reads in about 0.1 s).
PARALLEL_LINKAGE_BYTES = 256 << 20


class LibraryFacts:
    """ClFacts by file identity: every file is classified once, scanned or reached by a closure."""

    def __init__(self, inventory: Inventory, findings: list[Finding]) -> None:
        self.inventory = inventory
        self.findings = findings
        self.by_identity: dict[tuple[int, int], ClFacts] = {}
        self._dynamic: dict[str, elfread.DynamicInfo | None] = {}
        self._records = {r.path: r for r in inventory.files}
        self._linkage: dict[tuple[int, int], Linkage] = {}

    def linkage(self, path: str, identity: tuple[int, int], real_path: str | None = None) -> Linkage:
        """Linkage facts (linkage.py) of the file at path, read once per inode; an unreadable
        file has none (its LLVM009 finding comes from the role pass)."""
        found = self._linkage.get(identity)
        if found is None:
            real = real_path or path
            record = self._records.get(real)
            if not reads_linkage(self.of(path, identity, real)):
                # No llvm::cl symbol and no registry in it (roles.py): libc, libstdc++, libtriton's
                # hidden LLVM. Measured: none of those took part in a failing load.
                self._linkage[identity] = EMPTY_LINKAGE
                return EMPTY_LINKAGE
            try:
                dynamic = self.dynamic(real) or elfread.EMPTY_DYNAMIC
                if record is not None:
                    found = self.inventory.facts.get(
                        record, LINKAGE_FACT, lambda view: read_linkage(real, dynamic, view)
                    )
                else:
                    found = read_linkage(real, dynamic)
            except (OSError, FormatError):
                found = EMPTY_LINKAGE
            self._linkage[identity] = found
        return found

    def dynamic(self, path: str) -> elfread.DynamicInfo | None:
        """DT_NEEDED and friends of a regular file (a scanned one from the inventory's cache)."""
        if path not in self._dynamic:
            record = self._records.get(path)
            try:
                self._dynamic[path] = self.inventory.dynamic(record) if record is not None else read_dynamic_info(path)
            except (OSError, FormatError):
                self._dynamic[path] = None
        return self._dynamic[path]

    def of(self, path: str, identity: tuple[int, int], real_path: str | None = None) -> ClFacts:
        """Facts of the file at path; real_path is the regular file to open when path is a link."""
        facts = self.by_identity.get(identity)
        if facts is None:
            facts = self._classify(path, real_path or path)
            self.by_identity[identity] = facts
        return facts

    def _classify(self, path: str, real_path: str) -> ClFacts:
        try:
            record = self._records.get(real_path)
            dynamic = self.inventory.dynamic(record) if record is not None else read_dynamic_info(real_path)
            if record is not None:
                found = role_facts_of(self.inventory, record)
            else:
                found = classify(real_path, dynamic)
            return dataclasses.replace(found, path=path)
        except FormatError as exc:
            self.findings.append(
                make_finding(
                    "LLVM009",
                    path,
                    f"{exc.reason} at offset {exc.offset:#x}",
                    data={"offset": exc.offset},
                )
            )
        except OSError as exc:
            self.findings.append(make_finding("LLVM009", path, f"cannot read: {exc.strerror}"))
        return ClFacts(path, Role.UNKNOWN, None, None, 0, False, False, None, False, None, False)


def reads_linkage(facts: ClFacts) -> bool:
    """Whether a library's linkage (linkage.py: its relocations, and the code its initialisers
    reach) is read: for exporters, registrants and private copies, never for the rest."""
    return facts.role not in (Role.NONE, Role.UNKNOWN)


def role_facts_of(inventory: Inventory, record: FileRecord) -> ClFacts:
    """The LLVM-role fact of one inventory file, read once per run. Raises FormatError or OSError."""
    dynamic = inventory.dynamic(record)
    return inventory.facts.get(record, ROLE_FACT, lambda view: classify(record.path, dynamic, view))


def linkage_is_due(inventory: Inventory, record: FileRecord) -> bool:
    """Whether the linkage fact of a library is still to be read (its role reads it, and no one
    read it before: an image hands over those it read while trimming)."""
    return reads_linkage(role_facts_of(inventory, record)) and not inventory.facts.known(record, LINKAGE_FACT)


def read_linkages(inventory: Inventory, due: list[tuple[FileRecord, int]]) -> None:
    """Read the linkage facts of ``due`` (records with a descriptor of their file, which this
    closes) in forked helpers as well as this process (tree/forkmap.py), largest first: libLLVM's
    500 000 relocations and 150 000 symbols make these the longest reads of a check, one library
    at a time. The helpers read through the inherited descriptors (no file is opened again) and
    send the facts back; a library a helper could not read is read again here, where its error
    is kept like any fact's."""
    from rocm_audit.tree.forkmap import fork_imap, worker_count  # noqa: PLC0415 - only with LLVM carriers

    def read(index: int) -> Linkage | None:
        record, fd = due[index]
        try:
            return read_linkage(record.path, inventory.dynamic(record), ElfView(fd))
        except (FormatError, OSError):
            return None  # an exception does not pickle its fields: read again by the caller

    sizes = [record.size for record, _fd in due]
    try:
        workers = worker_count(sum(sizes), PARALLEL_LINKAGE_BYTES) if len(due) > 1 else 1
        for index, linkage in fork_imap(read, list(range(len(due))), sizes, workers):
            record = due[index][0]
            if linkage is not None:
                inventory.facts.preload(record.identity, LINKAGE_FACT, linkage)
            else:
                with contextlib.suppress(FormatError, OSError):
                    linkage_facts_of(inventory, record)
    finally:
        for _record, fd in due:
            os.close(fd)


def read_linkages_of(inventory: Inventory, records: Iterable[FileRecord]) -> None:
    """``read_linkages`` for those of ``records`` whose linkage is due, each opened here (the
    llvm command reads its facts without a fact pass holding the files)."""
    due: list[tuple[FileRecord, int]] = []
    seen: set[tuple[int, int]] = set()  # one read per inode, whatever the paths
    try:
        for record in records:
            with contextlib.suppress(OSError, FormatError):  # the error comes again, read alone
                if record.identity not in seen and linkage_is_due(inventory, record):
                    seen.add(record.identity)
                    due.append((record, open_checked(record.path, record.identity)))
    except BaseException:
        for _record, fd in due:
            os.close(fd)
        raise
    read_linkages(inventory, due)


def linkage_facts_of(inventory: Inventory, record: FileRecord) -> Linkage | None:
    """The linkage fact (linkage.py) of an exporter, registrant or private copy, read in the same
    fact pass as its role (tree/facts.py); None for other libraries."""
    if not reads_linkage(role_facts_of(inventory, record)):
        return None
    dynamic = inventory.dynamic(record)
    return inventory.facts.get(record, LINKAGE_FACT, lambda view: read_linkage(record.path, dynamic, view))
