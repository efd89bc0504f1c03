"""LLVM facts of the libraries of one run: roles (roles.py) and linkage (linkage.py), read once
per inode through the fact pass (tree/facts.py), and DT_NEEDED facts of files a closure reached."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable

from rocm_audit.elf import read as elfread
from rocm_audit.errors import FormatError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.llvm.linkage import EMPTY as EMPTY_LINKAGE
from rocm_audit.llvm.linkage import Linkage, read_linkage
from rocm_audit.llvm.roles import ClFacts, Role, classify
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


def linkage_facts_of(inventory: Inventory, record: FileRecord) -> Linkage | None:
    """The linkage fact (linkage.py) of an exporter, registrant or private copy, read in the same
    fact pass as its role (tree/facts.py); None for other libraries."""
    if not reads_linkage(role_facts_of(inventory, record)):
        return None
    dynamic = inventory.dynamic(record)
    return inventory.facts.get(record, LINKAGE_FACT, lambda view: read_linkage(record.path, dynamic, view))
