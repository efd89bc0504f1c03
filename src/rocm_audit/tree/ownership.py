"""Who owns a file of an SDK tree, from the RECORD files of the distributions installed beside it.

A RECORD row with a hash is content pip installed from that distribution's wheel: the distribution
owns it, `pip uninstall` removes it, and `pip install --force-reinstall` writes it again. A row
without a hash (``path,,``) is a file the distribution's code created after install: TheRock's
``rocm-sdk init`` appends one for every member of the devel tarball it expands, and its device
reconcile one for every device file it hardlinks into devel (rocm_sdk/_devel.py
``_expand_devel_contents``, ``_reconcile_device_links``). Those are expansions of runtime content,
which a link to the runtime copy may replace. Files in no RECORD are unknown to pip.

Why it matters (TheRock issue 15 of this project): replacing a file one distribution owns by a link
into another distribution leaves a dangling link when the other is uninstalled, and a reinstall
writes a regular file over the link again.
"""

from __future__ import annotations

import ast
import csv
import io
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from email.message import Message
from email.parser import HeaderParser

from rocm_audit.findings import ShippedBy
from rocm_audit.tree.discovery import is_sdk_tree_name
from rocm_audit.tree.identical import CompareStats, ReadFailure, same_bytes
from rocm_audit.tree.smallfile import read_small

DEVICE_DISTRIBUTION_PREFIX = "rocm_sdk_device"  # rocm-sdk-device-<arch>, normalised as in dist-info names
# TheRock rocm_sdk/_dist_info.py PackageEntry "libraries": a legacy (not kpack-split) family's runtime wheel.
FAMILY_LIBRARIES_DISTRIBUTION = "rocm-sdk-libraries-{family}"
# The generated _dist_info.py of a TheRock wheel is some 10 kB; anything far larger is not one.
MAX_DIST_INFO_MODULE_BYTES = 1 << 20
_FAMILY_PREFIX = re.sub(r"[-_.]+", "_", FAMILY_LIBRARIES_DISTRIBUTION.split("{", 1)[0]).lower()
# A RECORD lists a row per file (an expanded TheRock devel: some 50,000 rows, 5 MB); METADATA
# holds the long description. Far above any real one, and a bound on what a hostile one costs.
MAX_RECORD_BYTES = 256 << 20
MAX_METADATA_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class RecordRow:
    distribution: str  # normalised name, as in ``<name>-<version>.dist-info``
    hashed: bool  # installed from the wheel (owned content); False: created after install (an expansion)
    site_dir: str = ""  # where the RECORD that lists it lives: one distribution name per site directory


@dataclass(slots=True)
class Ownership:
    """RECORD rows by absolute path, for the directories holding the audited SDK trees."""

    rows: dict[str, RecordRow]
    records: dict[str, str]  # distribution -> its RECORD path
    # (site dir, distribution) -> the pure package of the generated ``_dist_info.py`` its wheel installed
    dist_info_modules: dict[tuple[str, str], str] = field(default_factory=dict)
    _made_for: dict[tuple[str, str], str | None] = field(default_factory=dict)

    @classmethod
    def of_trees(cls, sdk_trees: Iterable[str]) -> Ownership:
        rows: dict[str, RecordRow] = {}
        records: dict[str, str] = {}
        modules: dict[tuple[str, str], str] = {}
        for site_dir in sorted({os.path.dirname(tree) for tree in sdk_trees}):
            for name in _dist_info_names(site_dir):
                record = os.path.join(site_dir, name, "RECORD")
                distribution = name[: -len(".dist-info")].split("-", 1)[0].lower()
                try:
                    text = read_small(record, MAX_RECORD_BYTES, follow_symlinks=False).decode("utf-8")
                    lines = list(csv.reader(io.StringIO(text, newline="")))
                except (OSError, UnicodeDecodeError, csv.Error):
                    continue  # an unreadable RECORD owns nothing we can prove
                records[distribution] = record
                for line in lines:
                    if not line or not line[0]:
                        continue
                    path = os.path.normpath(os.path.join(site_dir, line[0]))
                    hashed = len(line) > 1 and bool(line[1])
                    top, _, rest = line[0].partition("/")
                    if hashed and rest == "_dist_info.py" and not is_sdk_tree_name(top):
                        modules[(site_dir, distribution)] = top
                    previous = rows.get(path)
                    # A hashed row wins: a device wheel's reconcile may also list a file another wheel installed.
                    if previous is None or (hashed and not previous.hashed):
                        rows[path] = RecordRow(distribution, hashed, site_dir)
        return cls(rows, records, modules)

    def row(self, path: str) -> RecordRow | None:
        return self.rows.get(path)

    def owner(self, path: str) -> str | None:
        """The distribution that installed this file from its wheel (a hashed row), else None."""
        row = self.rows.get(path)
        return row.distribution if row is not None and row.hashed else None

    def is_owned(self, path: str) -> bool:
        return self.owner(path) is not None

    def is_expansion(self, path: str) -> bool:
        """Created after install by a distribution's own code (``rocm-sdk init``, the device reconcile)."""
        row = self.rows.get(path)
        return row is not None and not row.hashed

    def is_device_link(self, path: str) -> bool:
        """A devel path that TheRock's device reconcile hardlinks on every init/path/test."""
        row = self.rows.get(path)
        return row is not None and not row.hashed and row.distribution.startswith(DEVICE_DISTRIBUTION_PREFIX)

    def made_for(self, path: str) -> str | None:
        """The runtime distribution an expansion was built to link into, when its distribution says:
        a legacy per-family ``rocm-sdk-devel`` links into its own family's libraries tree only
        (build_python_packages.py ``_run_legacy``; py_packaging.py ``_find_populated``), and names
        that family as ``THIS_TARGET_FAMILY`` in its generated ``_dist_info.py``. None otherwise."""
        row = self.rows.get(path)
        if row is None or row.hashed:
            return None
        key = (row.site_dir, row.distribution)
        if key not in self._made_for:
            package = self.dist_info_modules.get(key)
            family = this_target_family(row.site_dir, package) if package is not None else None
            self._made_for[key] = (
                None if family is None else distribution_key(FAMILY_LIBRARIES_DISTRIBUTION.format(family=family))
            )
        return self._made_for[key]


def is_family_distribution(distribution: str) -> bool:
    """A legacy per-family libraries wheel (``rocm_sdk_libraries_gfx94x_dcgpu``), as Ownership keys it;
    the kpack split's family-neutral ``rocm_sdk_libraries`` is not one."""
    return distribution.startswith(_FAMILY_PREFIX)


def distribution_key(name: str) -> str:
    """A distribution name as Ownership keys it: the ``.dist-info`` spelling (PEP 427: runs of
    ``-_.`` are one ``_``), lower case."""
    return re.sub(r"[-_.]+", "_", name).lower()


def this_target_family(site_dir: str, package: str) -> str | None:
    """``THIS_TARGET_FAMILY`` of the generated ``<site_dir>/<package>/_dist_info.py`` of a TheRock
    wheel, read as data (parsed, never run): the last top-level assignment of a string to it,
    without its ``:xnack`` suffix (PackageEntry.get_dist_package_name strips it). None when absent,
    None-valued or unreadable, and when the package directory or the module is a link or the module
    is no regular file: it is read from the audited site directory only, never through a link."""
    if not package or package in (".", "..") or "/" in package:
        return None
    directory = os.path.join(site_dir, package)
    try:
        if os.path.realpath(directory) != os.path.join(os.path.realpath(site_dir), package):
            return None
        source = read_small(os.path.join(directory, "_dist_info.py"), MAX_DIST_INFO_MODULE_BYTES, follow_symlinks=False)
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    family: str | None = None
    for statement in tree.body:
        if (
            isinstance(statement, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "THIS_TARGET_FAMILY" for t in statement.targets)
            and isinstance(statement.value, ast.Constant)
        ):
            value = statement.value.value
            family = value.split(":")[0] if isinstance(value, str) and value else None
    return family


def _dist_info_names(site_dir: str) -> list[str]:
    """The ``.dist-info`` directory names in site_dir, sorted; none when it cannot be listed."""
    try:
        return sorted(name for name in os.listdir(site_dir) if name.endswith(".dist-info"))
    except OSError:
        return []


def tree_relpath(path: str, sdk_tree: str) -> str:
    """The path of a file inside its ``_rocm_sdk_*`` tree (``lib/librocblas.so.5``)."""
    return os.path.relpath(path, sdk_tree)


def sibling_trees(sdk_tree: str, sdk_trees: Iterable[str]) -> list[str]:
    """The other ``_rocm_sdk_*`` trees in the directory holding ``sdk_tree``."""
    parent = os.path.dirname(sdk_tree)
    return sorted(
        t for t in sdk_trees if t != sdk_tree and os.path.dirname(t) == parent and is_sdk_tree_name(os.path.basename(t))
    )


def runtime_twin(path: str, sdk_tree: str, ownership: Ownership) -> str | None:
    """The runtime file an expansion mirrors, when only the expansion's tree was audited: the same
    path inside a sibling ``_rocm_sdk_*`` tree, installed by a wheel, with the same bytes. That is
    the copy dedup keeps (it widens a tree path to its siblings), so a fix text names it too. The twin
    on the expansion's own inode comes first; of equal bytes in two owners' trees (legacy per-family
    wheels), the one its distribution was built against (``Ownership.made_for``), else neither, as
    dedup links to neither (dedup/plan.py)."""
    if not ownership.is_expansion(path):
        return None
    relpath = tree_relpath(path, sdk_tree)
    parent = os.path.dirname(sdk_tree)
    try:
        names = sorted(os.listdir(parent))
        here = os.stat(path)
    except OSError:
        return None
    equal: dict[str, str] = {}  # twin -> its owner
    for name in names:
        twin = os.path.join(parent, name, relpath)
        owner = ownership.owner(twin) if name != os.path.basename(sdk_tree) and is_sdk_tree_name(name) else None
        if not owner:
            continue
        try:
            there = os.lstat(twin)
            if (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino):
                return twin
            if there.st_size == here.st_size and same_bytes(twin, path, here.st_size, CompareStats()):
                equal[twin] = owner
        except (OSError, ReadFailure):
            continue
    if len(set(equal.values())) == 1:
        return next(iter(equal))
    made_for = ownership.made_for(path)
    return next((twin for twin, owner in equal.items() if owner == made_for), None)


# ---------------------------------------------------------------------------------------------
# Whole distributions: what ``pip uninstall`` of one would remove (prune), with name and version.


@dataclass(slots=True)
class Distribution:
    name: str  # as METADATA spells it
    version: str
    dist_info: str  # absolute path of the .dist-info directory
    site_dir: str  # the directory RECORD paths are relative to
    files: dict[str, bool] = field(default_factory=dict)  # absolute path -> recorded with a hash
    report_to: str = ""  # where its users report problems (METADATA Project-URL or Home-page)

    @property
    def normalized(self) -> str:
        return normalize(self.name)

    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


def normalize(name: str) -> str:
    """PEP 503 name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _site_dirs(roots: list[str], sdk_trees: list[str]) -> list[str]:
    """Directories that may hold ``.dist-info``: each audited directory and the parent of each SDK tree."""
    found: list[str] = []
    for directory in [*roots, *(os.path.dirname(tree) for tree in sdk_trees)]:
        if os.path.isdir(directory) and directory not in found:
            found.append(directory)
    return found


def read_distributions(roots: list[str], sdk_trees: list[str]) -> list[Distribution]:
    """Every distribution whose ``.dist-info`` sits in an audited site directory, by name."""
    distributions: list[Distribution] = []
    for site_dir in _site_dirs(roots, sdk_trees):
        for name in _dist_info_names(site_dir):
            distribution = _read_one(site_dir, os.path.join(site_dir, name))
            if distribution is not None:
                distributions.append(distribution)
    return sorted(distributions, key=lambda d: (d.normalized, d.dist_info))


def _read_one(site_dir: str, dist_info: str) -> Distribution | None:
    try:
        metadata = read_small(os.path.join(dist_info, "METADATA"), MAX_METADATA_BYTES, follow_symlinks=False)
        record_text = read_small(os.path.join(dist_info, "RECORD"), MAX_RECORD_BYTES, follow_symlinks=False).decode(
            "utf-8", "surrogateescape"
        )
    except OSError:
        return None
    headers = HeaderParser().parsestr(metadata.decode("utf-8", "surrogateescape"), headersonly=True)
    name, version = headers.get("Name"), headers.get("Version")
    if not name or not version:
        return None
    distribution = Distribution(str(name), str(version), dist_info, site_dir, report_to=_report_url(headers))
    try:
        rows = list(csv.reader(io.StringIO(record_text)))
    except csv.Error:
        return None  # a RECORD csv cannot read (a field over its limit) lists nothing we can trust
    for row in rows:
        if not row or not row[0]:
            continue
        path = os.path.normpath(os.path.join(site_dir, row[0]))
        distribution.files[path] = len(row) > 1 and bool(row[1])
    return distribution


# Project-URL labels, most useful first for someone reporting a problem (PEP 753 well-known labels
# and their common spellings), then the Home-page field.
_URL_PREFERENCE = (
    re.compile(r"issue|bug|tracker", re.IGNORECASE),
    re.compile(r"source|repository|code|github", re.IGNORECASE),
    re.compile(r"home", re.IGNORECASE),
)


def _report_url(headers: Message) -> str:
    """The URL to report a problem to: an issue tracker, else the source, else the home page."""
    labelled: list[tuple[str, str]] = []
    for value in headers.get_all("Project-URL") or []:
        label, _, url = str(value).partition(",")
        if url.strip().startswith(("https://", "http://")):
            labelled.append((label.strip(), url.strip()))
    for preferred in _URL_PREFERENCE:
        for label, url in labelled:
            if preferred.search(label):
                return url
    home = str(headers.get("Home-page") or "").strip()
    if home.startswith(("https://", "http://")):
        return home
    return labelled[0][1] if labelled else ""


def shippers_of(paths: Iterable[str]) -> dict[str, ShippedBy]:
    """For each of ``paths`` that an installed distribution's RECORD lists: who shipped it.

    The site directory of a path is its nearest parent holding ``.dist-info`` directories; each is
    read once. A file no RECORD lists is the user's own (built here, or copied in by hand)."""
    site_of_dir: dict[str, str | None] = {}
    owned_in_site: dict[str, dict[str, Distribution]] = {}
    found: dict[str, ShippedBy] = {}
    for path in sorted(set(paths)):
        site = site_dir_of(os.path.dirname(path), site_of_dir)
        if site is None:
            continue
        if site not in owned_in_site:
            distributions = [d for d in (_read_one(site, os.path.join(site, n)) for n in _dist_info_names(site)) if d]
            owned_in_site[site] = owners(distributions)
        # A row with a hash is content of the wheel; a row without one is still the distribution's
        # (onnxruntime-rocm 1.22.2.post3 lists its ROCm provider as `path,,size`; rocm-sdk init
        # appends rows for what it creates): either way the file is that project's, not the user's.
        owner = owned_in_site[site].get(os.path.normpath(path))
        if owner is not None:
            found[path] = ShippedBy(owner.name, owner.version, owner.report_to)
    return found


def site_dir_of(directory: str, cache: dict[str, str | None]) -> str | None:
    """The nearest of ``directory`` and its parents that holds a ``.dist-info`` directory."""
    walked = []
    while directory not in cache:
        walked.append(directory)
        if _dist_info_names(directory):
            cache[directory] = directory
            break
        parent = os.path.dirname(directory)
        if parent == directory:
            cache[directory] = None
            break
        directory = parent
    for one in walked:
        cache[one] = cache[directory]
    return cache[directory]


def owners(distributions: list[Distribution]) -> dict[str, Distribution]:
    """Absolute path -> the distribution that installed it with a hash (else the one that lists it)."""
    owned: dict[str, Distribution] = {}
    for distribution in distributions:
        for path, hashed in distribution.files.items():
            if hashed or path not in owned:
                owned[path] = distribution
    return owned
