"""Undefined symbols resolved in the real load scope (POST006) and Python API an extension needs
that the audited interpreter lacks (POST007).

How glibc binds a symbol (elf/dl-lookup.c ``do_lookup_x`` and ``check_match``):

* The scope of an object a process ``dlopen``s is the global scope (the executable and its
  DT_NEEDED closure, breadth first) followed by the search list of the object it dlopened (that
  object and its DT_NEEDED closure, breadth first; elf/dl-object.c ``_dl_new_object`` gives every
  dependency the scope of its outermost loader). DT_SYMBOLIC puts the object itself first. The
  order decides which definition wins; whether one exists is what decides a load.
* A definition counts when it is defined (``st_shndx`` not UNDEF), global, weak or unique, of a
  data, function, TLS, common or ifunc type.
* A reference with a version (``foo@GLIBC_2.34``, from .gnu.version_r) binds only to a definition
  of exactly that version, or to an unversioned or base definition that is not hidden; one
  without a version binds to an unversioned definition, to one of the base or first version
  index, or to the only default (non-hidden) versioned definition of the name in that object.
* An undefined weak reference that nothing defines is bound to 0 and the load goes on.

Python loads every extension module and every ctypes library with RTLD_NOW. Imports: CPython
Python/dynload_shlib.c ``_PyImport_FindSharedFuncptr`` calls ``dlopen(pathname, dlopenflags)``
with ``_PyImport_GetDLOpenFlags``, which Python/pystate.c sets to RTLD_NOW for every interpreter
(``sys.setdlopenflags`` can change it; nothing in a wheel does). ctypes: Modules/_ctypes/callproc.c
``py_dl_open`` starts from ``RTLD_NOW | RTLD_LOCAL`` and adds RTLD_NOW to whatever mode it is
given. So every undefined non-weak symbol of such a file, and of the libraries it
maps, that no object of its scope defines stops the load with "undefined symbol". Lazy binding
(function calls bound at first call under RTLD_LAZY) only matters for executables and for
programs other than Python that dlopen lazily; this check judges shared libraries as Python loads
them.

Memory stays bounded: the undefined names of every audited file are read first; a provider's
definitions are then kept only for those names (libLLVM defines 150 000 symbols; its consumers
ask for a few thousand), once per file (st_dev, st_ino).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from rocm_audit.elf import read as elfread
from rocm_audit.elf.view import VERSYM_HIDDEN, ElfView, open_view
from rocm_audit.errors import FormatError
from rocm_audit.findings import Finding, make_finding
from rocm_audit.tree.inventory import FileKind, FileRecord, Inventory
from rocm_audit.tree.loader import NOT_EXTRACTED, LoaderModel

Identity = tuple[int, int]
T = TypeVar("T")

STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE = 1, 2, 10
# STT_NOTYPE, OBJECT, FUNC, COMMON, TLS, GNU_IFUNC: the types check_match accepts (ALLOWED_STT).
_ALLOWED_TYPES = frozenset((0, 1, 2, 5, 6, 10))
_DEFINED_BINDS = frozenset((STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE))
MAX_CLOSURE = 4096  # objects one load maps; a larger closure is cut short
MAX_NAMES_SHOWN = 5  # in the one-line message; the detail names up to MAX_NAMES_DETAIL
MAX_NAMES_DETAIL = 200
MAX_DEMANGLE = 20000  # names handed to c++filt in one run
DEMANGLE_TIMEOUT_S = 60.0
# A Python extension module: name.cpython-312-x86_64-linux-gnu.so, name.abi3.so, name.so in a package.
_EXTENSION = re.compile(r"\.(cpython-\d+[a-z]*-[^.]+|abi3)\.so$")
_PYTHON_API = re.compile(r"_?Py[A-Z_]")


@dataclass(frozen=True, slots=True)
class Reference:
    """An undefined non-weak symbol: its version and the DT_NEEDED name that carries the version."""

    name: str
    version: str | None
    expected_from: str | None  # vn_file of the version node; None for an unversioned reference


@dataclass(frozen=True, slots=True)
class Definitions:
    """What one provider defines of the names some audited file asks for.

    ``entries``: name -> (version index, version name or None, hidden) of each definition."""

    versioned: bool  # the file has .gnu.version
    entries: dict[str, tuple[tuple[int, str | None, bool], ...]]
    version_names: frozenset[str] = frozenset()  # every version node it defines

    def binds(self, ref: Reference) -> bool:
        """Whether ``ref`` binds to a definition of this object (glibc ``check_match``)."""
        found = self.entries.get(ref.name)
        if not found:
            return False
        if not self.versioned:
            return True
        if ref.version is not None:
            return any(name == ref.version or (index < 2 and not hidden) for index, name, hidden in found)
        if any(index < 3 for index, _name, _hidden in found):
            return True
        return sum(1 for _index, _name, hidden in found if not hidden) == 1


def read_references(view: ElfView) -> tuple[Reference, ...]:
    """The undefined non-weak dynamic symbols of a file, with their versions. Raises FormatError."""
    table = view.symbol_table()
    if table is None:
        return ()
    strings = view.read(view.linked(table))
    versions = view.symbol_versions()
    needed = {other: (need.file, name) for need in view.version_needs for other, name in need.versions}
    found: dict[str, Reference] = {}
    for base, rows in view.symbol_rows(table):
        for index, (st_name, info, _other, shndx, _value) in enumerate(rows, base):
            if shndx != 0 or index == 0 or info >> 4 != STB_GLOBAL:
                continue  # defined, the null symbol, or weak (bound to 0 when absent)
            name = _name_at(strings, st_name)
            if not name:
                continue
            raw = versions[index] & ~VERSYM_HIDDEN if index < len(versions) else 0
            file_version = needed.get(raw) if raw >= 2 else None
            version, expected = (file_version[1], file_version[0]) if file_version else (None, None)
            found.setdefault(name, Reference(name, version, expected))
    return tuple(found.values())


def read_definitions(view: ElfView, wanted: frozenset[str]) -> Definitions:
    """What the file defines of ``wanted`` (see Definitions). Raises FormatError."""
    table = view.symbol_table()
    if table is None:
        return Definitions(False, {})
    strings = view.read(view.linked(table))
    versions = view.symbol_versions()
    names = view.defined_version_names()
    entries: dict[str, list[tuple[int, str | None, bool]]] = {}
    for base, rows in view.symbol_rows(table):
        for index, (st_name, info, _other, shndx, value) in enumerate(rows, base):
            if shndx == 0 or info >> 4 not in _DEFINED_BINDS or info & 0xF not in _ALLOWED_TYPES:
                continue
            if value == 0 and info & 0xF != 6:  # check_match: st_value 0 is no definition (but TLS)
                continue
            name = _name_at(strings, st_name)
            if name not in wanted:
                continue
            raw = versions[index] if index < len(versions) else 0
            ver_index = raw & ~VERSYM_HIDDEN
            entries.setdefault(name, []).append((ver_index, names.get(ver_index), bool(raw & VERSYM_HIDDEN)))
    return Definitions(
        bool(versions), {name: tuple(found) for name, found in entries.items()}, frozenset(names.values())
    )


def _name_at(strings: bytes, offset: int) -> str:
    end = strings.find(b"\0", offset)
    if offset >= len(strings) or end < 0:
        return ""
    return strings[offset:end].decode("utf-8", "surrogateescape")


@dataclass(frozen=True, slots=True)
class PythonHost:
    """The executable every audited library is loaded into: a Python interpreter."""

    executable: str  # the path to read (a host path; under the sysroot for an image)
    version: str  # "3.11"
    libpython: str | None = None  # its shared libpython when the executable needs one
    judged: bool = True  # False: a stand-in (rocm-audit's own); Python API is then not judged
    described: str = ""  # for people: which interpreter and why


def is_extension(path: str) -> bool:
    return bool(_EXTENSION.search(os.path.basename(path)))


@dataclass(slots=True)
class _Object:
    path: str
    identity: Identity
    dynamic: elfread.DynamicInfo
    names: set[str]
    loader: _Object | None


@dataclass(frozen=True, slots=True)
class LoadScope:
    """The objects one load makes visible to ``root``'s relocations, in glibc's lookup order."""

    root: str
    objects: tuple[tuple[str, Identity], ...]  # host objects first, then root's closure
    missing: tuple[tuple[str, str], ...]  # (requesting path, DT_NEEDED name) nothing provides
    unknown: bool  # some object is outside what the audit can read (not extracted, cut short)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What loading ``root`` alone into the host does: loads, or fails naming what is missing."""

    root: str
    missing_libraries: tuple[str, ...]
    missing_symbols: tuple[tuple[str, Reference], ...]  # (path of the object, reference)
    unknown: bool

    @property
    def loads(self) -> bool:
        return not self.missing_libraries and not self.missing_symbols


@dataclass(slots=True)
class Resolver:
    """Load scopes and symbol binding over one loader model (one run)."""

    loader: LoaderModel
    host: PythonHost | None = None
    inventory: Inventory | None = None
    _references: dict[Identity, tuple[Reference, ...] | None] = field(default_factory=dict)
    _definitions: dict[Identity, Definitions | None] = field(default_factory=dict)
    _records: dict[Identity, FileRecord] = field(default_factory=dict)
    _records_by_path: dict[str, FileRecord] = field(default_factory=dict)
    _host_objects: list[_Object] | None = None
    _scopes: dict[str, LoadScope] = field(default_factory=dict)
    _wanted: frozenset[str] = frozenset()
    # For loaded_by: identity -> the roots whose scope maps it; (root, identity) -> names unfound
    _mapped_by: dict[Identity, list[str]] | None = None
    _unfound: dict[tuple[str, Identity | None], set[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.inventory is not None:
            self._records = {r.identity: r for r in self.inventory.maybe_elf()}
            self._records_by_path = {r.path: r for r in self.inventory.maybe_elf()}

    # -- facts, each read once per file ------------------------------------------------------------

    def references(self, path: str, identity: Identity) -> tuple[Reference, ...] | None:
        if identity not in self._references:
            record = self._records.get(identity)
            try:
                if record is not None and self.inventory is not None:
                    self._references[identity] = self.inventory.facts.get(record, "references", read_references)
                else:
                    self._references[identity] = _read(path, read_references)
            except (OSError, FormatError):
                self._references[identity] = None
        return self._references[identity]

    def want(self, names: Iterable[str]) -> None:
        """Names whose definitions are kept; definitions read before for fewer names are dropped."""
        added = frozenset(names) - self._wanted
        if added:
            self._wanted = self._wanted | added
            self._definitions.clear()

    def definitions(self, path: str, identity: Identity) -> Definitions | None:
        if identity not in self._definitions:
            wanted = self._wanted
            try:
                self._definitions[identity] = _read(path, lambda view: read_definitions(view, wanted))
            except (OSError, FormatError):
                self._definitions[identity] = None
        return self._definitions[identity]

    # -- load scopes -------------------------------------------------------------------------------

    def _host(self) -> list[_Object]:
        if self._host_objects is None:
            self._host_objects = []
            if self.host is not None:
                objects: list[_Object] = []
                self._map_closure(self.host.executable, objects, [])
                if self.host.libpython and not any(o.path == self.host.libpython for o in objects):
                    self._map_closure(self.host.libpython, objects, [])
                self._host_objects = objects
        return self._host_objects

    def scope(self, root: str) -> LoadScope:
        """The scope of ``root`` dlopened into a fresh process of the host (computed once)."""
        if root not in self._scopes:
            self._scopes[root] = self._scope(root)
        return self._scopes[root]

    def loaded_by(self, record: FileRecord) -> dict[str, frozenset[str]]:
        """The shared libraries of the inventory whose load maps ``record``'s file (none without an
        inventory), each with the DT_NEEDED names of that file its load does not find: the one
        consumer map of POST002 and POST006. A load the model cannot follow to its end (a file not
        extracted, a closure cut short) is left out: it can neither vouch for the file nor fail it."""
        if self.inventory is None:
            return {}
        if self._mapped_by is None:
            self._mapped_by = {}
            host = {o.identity for o in self._host()}  # the interpreter's own objects load nothing here
            for other in self.inventory.by_kind(FileKind.SHARED_LIBRARY):
                scope = self.scope(other.path)
                if scope.unknown:
                    continue
                identities = dict(scope.objects)
                for _path, identity in scope.objects:
                    if identity != other.identity and identity not in host:
                        self._mapped_by.setdefault(identity, []).append(other.path)
                for requester, name in scope.missing:
                    self._unfound.setdefault((other.path, identities.get(requester)), set()).add(name)
        return {
            consumer: frozenset(self._unfound.get((consumer, record.identity), ()))
            for consumer in self._mapped_by.get(record.identity, [])
        }

    def prepare(self, roots: Iterable[str]) -> None:
        """Compute the scope of every root and keep the definitions of every name their objects ask
        for (so that definitions are read once, after every wanted name is known)."""
        names: set[str] = set()
        seen: set[Identity] = set()
        for root in roots:
            for path, identity in self.scope(root).objects:
                if identity not in seen:
                    seen.add(identity)
                    names.update(ref.name for ref in self.references(path, identity) or ())
        self.want(names)

    def _scope(self, root: str) -> LoadScope:
        objects = list(self._host())
        start = len(objects)
        missing: list[tuple[str, str]] = []
        unknown = self._map_closure(root, objects, missing)
        own = objects[start:]
        if own and own[0].dynamic.symbolic:
            objects = [own[0], *objects[:start], *own[1:]]  # DT_SYMBOLIC: itself first
        return LoadScope(root, tuple((o.path, o.identity) for o in objects), tuple(missing), unknown)

    def _map_closure(self, root: str, objects: list[_Object], missing: list[tuple[str, str]]) -> bool:
        """Map root and its DT_NEEDED closure breadth first into ``objects`` with glibc's reuse
        rules (formats.md 4); True when some object cannot be known (not extracted, cut short)."""
        view = self.loader.view
        identity = view.identity(root)
        if identity is None:
            missing.append(("", root))
            return False
        if any(o.identity == identity for o in objects):
            return False
        first = _Object(root, identity, self._dynamic(root), {root}, None)
        objects.append(first)
        queue, unknown = [first], False
        want = view.elf_key(root)
        while queue:
            requester = queue.pop(0)
            for name in requester.dynamic.needed:
                if any(name in o.names or ("/" not in name and o.dynamic.soname == name) for o in objects):
                    continue
                found, not_extracted = self._find(name, requester, want)
                if found is None:
                    if not_extracted:
                        unknown = True
                    else:
                        missing.append((requester.path, name))
                    continue
                found_identity = view.identity(found)
                same = next((o for o in objects if o.identity == found_identity), None)
                if same is not None or found_identity is None:
                    if same is not None:
                        same.names.add(name)
                    continue
                if len(objects) >= MAX_CLOSURE:
                    return True
                mapped = _Object(found, found_identity, self._dynamic(found), {name, found}, requester)
                objects.append(mapped)
                queue.append(mapped)
        return unknown

    def _find(self, name: str, requester: _Object, want: tuple[int, int] | None) -> tuple[str | None, bool]:
        """(the path glibc maps for DT_NEEDED ``name`` of requester, or None; whether the file
        is one the image holds but the audit did not extract)."""
        chain: list[tuple[str, elfread.DynamicInfo]] = []
        owner = requester.loader
        while owner is not None:
            chain.append((owner.path, owner.dynamic))
            owner = owner.loader
        chain.reverse()  # LoaderModel.search_order wants the outermost loader first
        found = self.loader.find(name, requester.path, requester.dynamic, chain, want)
        if isinstance(found, str):
            return None, found.startswith(NOT_EXTRACTED)
        return found[0], False

    def _dynamic(self, path: str) -> elfread.DynamicInfo:
        # An audited file's dynamic section was read by the fact pass: no second open.
        record = self._records_by_path.get(path)
        if record is not None and self.inventory is not None:
            try:
                return self.inventory.dynamic(record)
            except (OSError, FormatError):
                return elfread.EMPTY_DYNAMIC
        return self.loader.dynamic_of(path) or elfread.EMPTY_DYNAMIC

    # -- binding -----------------------------------------------------------------------------------

    def unbound(self, references: Iterable[Reference], scope: LoadScope) -> list[Reference]:
        """The references no object of the scope defines (glibc check_match, every object)."""
        pending: dict[str, list[Reference]] = {}
        for ref in references:
            pending.setdefault(ref.name, []).append(ref)
        for path, identity in scope.objects:
            if not pending:
                break
            defined = self.definitions(path, identity)
            if defined is None:
                continue
            for name in pending.keys() & defined.entries.keys():
                left = [ref for ref in pending[name] if not defined.binds(ref)]
                if left:
                    pending[name] = left
                else:
                    del pending[name]
        return [ref for refs in pending.values() for ref in refs]

    def verdict(self, root: str) -> Verdict:
        """Loading root alone into the host (after the host's own objects): every object of its
        closure bound over root's scope. Call ``want`` with every name first (see check)."""
        scope = self.scope(root)
        failing: list[tuple[str, Reference]] = []
        host_count = len(self._host())
        for path, identity in scope.objects:
            if any(identity == o.identity for o in self._host()[:host_count]):
                continue  # the interpreter's own objects loaded already
            references = self.references(path, identity)
            if references:
                failing.extend((path, ref) for ref in self.unbound(references, scope))
        return Verdict(root, tuple(name for _requester, name in scope.missing), tuple(failing), scope.unknown)


def _read(path: str, reader: Callable[[ElfView], T]) -> T:
    """One reader over the file at path (a file outside the inventory: read once per run)."""
    fd, view = open_view(path, follow_symlinks=True)
    try:
        return reader(view)
    finally:
        os.close(fd)


# -- the interpreter a load happens in ---------------------------------------------------------------


def host_of_interpreter(executable: str, version: str, libpython: str, judged: bool, described: str) -> PythonHost:
    """The host for an interpreter that answered (check: --python or the site's owner)."""
    major_minor = ".".join(version.split(".")[:2])
    return PythonHost(os.path.realpath(executable), major_minor, libpython or None, judged=judged, described=described)


_IMAGE_SITE = re.compile(r"^(?P<prefix>.*)/lib(?:64)?/python(?P<version>3(?:\.\d+)?)t?/(?:site|dist)-packages$")
_VERSIONED_PYTHON = re.compile(r"^python(3\.\d+)$")


def host_of_image(sysroot: str, package_dirs: Sequence[str]) -> PythonHost | None:
    """The interpreter of an unpacked image, read from its files and never run: its version from
    ``<prefix>/lib/pythonX.Y/site-packages`` (Debian's ``lib/python3/dist-packages``: from the
    ``pythonX.Y`` file in ``<prefix>/bin``), the executable ``<prefix>/bin/pythonX.Y``, and
    ``libpythonX.Y.so.1.0`` from the prefix's lib or the default directories when there is one.
    None when the image holds no interpreter there."""
    for directory in package_dirs:
        matched = _IMAGE_SITE.match(directory.rstrip("/"))
        if matched is None:
            continue
        prefix, version = matched.group("prefix"), matched.group("version")
        if version == "3":
            try:
                named = sorted(
                    found.group(1) for one in os.listdir(f"{prefix}/bin") if (found := _VERSIONED_PYTHON.match(one))
                )
            except OSError:
                named = []
            if not named:
                continue
            version = named[-1]
        executable = f"{prefix}/bin/python{version}"
        if os.path.islink(executable) or not os.path.isfile(executable):
            executable = ""
        library = next(
            (
                one
                for one in (
                    f"{prefix}/lib/libpython{version}.so.1.0",
                    os.path.join(sysroot, f"usr/lib/x86_64-linux-gnu/libpython{version}.so.1.0"),
                    os.path.join(sysroot, f"usr/local/lib/libpython{version}.so.1.0"),
                )
                if os.path.isfile(one)
            ),
            None,
        )
        if not executable and library is None:
            continue
        first = executable or library or ""
        return PythonHost(
            first, version, library, judged=True, described=f"Python {version} of the image ({_inside(first, sysroot)})"
        )
    return None


def _inside(path: str, sysroot: str) -> str:
    if sysroot in ("", "/"):
        return path
    return "/" + os.path.relpath(path, sysroot)


# -- findings ------------------------------------------------------------------------------------------


def symbol_findings(
    inventory: Inventory,
    loader: LoaderModel,
    host: PythonHost | None,
    skip: frozenset[str] = frozenset(),
    resolver: Resolver | None = None,
) -> list[Finding]:
    """POST006 and POST007 over every shared library of the inventory (``skip``: paths another
    finding already says cannot be imported, POST003; ``resolver``: the run's load scopes, made
    here when not given)."""
    resolver = resolver or Resolver(loader, host, inventory)
    records = [r for r in inventory.by_kind(FileKind.SHARED_LIBRARY) if r.path not in skip]
    resolver.prepare(r.path for r in records)
    misses: dict[str, list[Reference]] = {}
    for record in records:
        found = _own_misses(resolver, record)
        if found:
            misses[record.path] = found
    if not misses:
        return []
    demangled = _demangle(sorted({ref.name for refs in misses.values() for ref in refs}))
    findings: list[Finding] = []
    by_path = {r.path: r for r in records}
    for path, refs in sorted(misses.items()):
        record = by_path[path]
        if not is_extension(path):
            # A library whose symbols come from what its consumers map (linked without its own
            # dependencies) loads fine as their dependency: judged in the consumers' scopes, and
            # quiet only when every one of them binds its names (as POST002 judges DT_NEEDED).
            consumers = [c for c in resolver.loaded_by(record) if c not in skip]
            if consumers and all(not resolver.unbound(refs, resolver.scope(c)) for c in consumers):
                continue
        python_api = [r for r in refs if _PYTHON_API.match(r.name) and r.expected_from is None]
        others = [r for r in refs if r not in python_api]
        if python_api and host is not None and host.judged:
            findings.append(_python_finding(path, python_api, host))
        if others:
            findings.append(_symbol_finding(path, others, host, demangled))
    return findings


def _own_misses(resolver: Resolver, record: FileRecord) -> list[Reference]:
    """The file's own references nothing in its scope binds, minus what another finding says:
    names a missing library (POST002) may provide, versions its provider lacks (POST001), and
    Python API when the interpreter is only a stand-in."""
    references = resolver.references(record.path, record.identity)
    if not references:
        return []
    scope = resolver.scope(record.path)
    unbound = resolver.unbound(references, scope)
    if not unbound:
        return []
    present: dict[str, tuple[str, Identity]] = {}
    for path, identity in scope.objects:
        dynamic = resolver.loader.dynamic_of(path)
        for name in (os.path.basename(path), dynamic.soname if dynamic else None):
            if name:
                present.setdefault(name, (path, identity))
    incomplete = bool(scope.missing) or scope.unknown
    kept: list[Reference] = []
    for ref in unbound:
        if ref.expected_from is None:
            if incomplete:
                continue  # a library that is not there may define it
            if _PYTHON_API.match(ref.name) and (resolver.host is None or not resolver.host.judged):
                continue
            kept.append(ref)
            continue
        provider = present.get(ref.expected_from)
        if provider is None:
            continue  # its library is missing: POST002 says so
        defined = resolver.definitions(*provider)
        if defined is None or (defined.versioned and ref.version not in defined.version_names):
            continue  # the version itself is missing: POST001 says so
        kept.append(ref)
    return kept


def _listed(names: list[str], limit: int) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _symbol_finding(path: str, refs: list[Reference], host: PythonHost | None, demangled: dict[str, str]) -> Finding:
    groups: dict[str, list[str]] = {}
    for ref in sorted(refs, key=lambda r: r.name):
        where = f"{ref.expected_from} (version {ref.version})" if ref.expected_from else "none of its libraries"
        groups.setdefault(where, []).append(ref.name)
    names = [demangled.get(r.name, r.name) for r in sorted(refs, key=lambda r: r.name)]
    process = host.described if host is not None else "a process"
    readable = {where: [demangled.get(n, n) for n in found] for where, found in groups.items()}
    return make_finding(
        "POST006",
        path,
        f"{len(names)} undefined symbol(s) no library of its load defines: {_listed(names, MAX_NAMES_SHOWN)}",
        detail=(
            "; ".join(
                f"expected from {where}: {_listed(readable[where], MAX_NAMES_DETAIL)}" for where in sorted(groups)
            )
            + f". Loaded into {process}, the loader searches the program, then this file and the "
            "libraries it needs, breadth first; Python opens every module and ctypes library with "
            'RTLD_NOW, so the first of these stops the load with "undefined symbol".'
        ),
        data={"missing": sorted(r.name for r in refs), "expected_from": dict(sorted(groups.items()))},
    )


def _python_finding(path: str, refs: list[Reference], host: PythonHost) -> Finding:
    names = sorted(r.name for r in refs)
    match = _EXTENSION.search(os.path.basename(path))
    tag = match.group(1) if match else "library"
    built = {"abi3": "a stable-ABI (abi3) module built for a newer Python", "library": "a library a module loads"}.get(
        tag, f"a {tag} module"
    )
    return make_finding(
        "POST007",
        path,
        f"uses Python API that Python {host.version} does not have: {_listed(names, MAX_NAMES_SHOWN)}",
        detail=(
            f"{built}; the interpreter ({host.described}) defines none of: "
            f'{_listed(names, MAX_NAMES_DETAIL)}. `import` fails with "undefined symbol".'
        ),
        data={"missing": names, "interpreter": host.version, "tag": tag},
    )


def _demangle(names: list[str]) -> dict[str, str]:
    """C++ names demangled by one c++filt run (binutils), bounded; names it cannot read stay."""
    mangled = [n for n in names if n.startswith("_Z") and "\n" not in n][:MAX_DEMANGLE]
    tool = shutil.which("c++filt")
    if not mangled or tool is None:
        return {}
    try:
        done = subprocess.run(
            [tool],
            input="\n".join(mangled) + "\n",
            capture_output=True,
            text=True,
            errors="replace",
            timeout=DEMANGLE_TIMEOUT_S,
            env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C"},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) != len(mangled):
        return {}
    return dict(zip(mangled, lines, strict=True))
