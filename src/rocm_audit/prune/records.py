"""Which installed distribution owns a file: the ``RECORD`` of every ``*.dist-info`` in the audited
site-packages directories (PEP 376/627).

A row with a hash is content the distribution's wheel installed; a row without one was added after
installation (``rocm-sdk init`` records devel expansions and device links as ``path,,``). Paths
are resolved against the directory that holds the ``.dist-info``, as pip does.
"""

from __future__ import annotations

import csv
import io
import os
import re
from dataclasses import dataclass, field
from email.parser import HeaderParser


@dataclass(slots=True)
class Distribution:
    name: str  # as METADATA spells it
    version: str
    dist_info: str  # absolute path of the .dist-info directory
    site_dir: str  # the directory RECORD paths are relative to
    files: dict[str, bool] = field(default_factory=dict)  # absolute path -> recorded with a hash

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
        try:
            names = sorted(os.listdir(site_dir))
        except OSError:
            continue
        for name in names:
            if not name.endswith(".dist-info"):
                continue
            distribution = _read_one(site_dir, os.path.join(site_dir, name))
            if distribution is not None:
                distributions.append(distribution)
    return sorted(distributions, key=lambda d: (d.normalized, d.dist_info))


def _read_one(site_dir: str, dist_info: str) -> Distribution | None:
    try:
        with open(os.path.join(dist_info, "METADATA"), encoding="utf-8", errors="surrogateescape") as handle:
            headers = HeaderParser().parse(handle, headersonly=True)
        with open(os.path.join(dist_info, "RECORD"), encoding="utf-8", errors="surrogateescape") as handle:
            record_text = handle.read()
    except OSError:
        return None
    name, version = headers.get("Name"), headers.get("Version")
    if not name or not version:
        return None
    distribution = Distribution(str(name), str(version), dist_info, site_dir)
    for row in csv.reader(io.StringIO(record_text)):
        if not row or not row[0]:
            continue
        path = os.path.normpath(os.path.join(site_dir, row[0]))
        distribution.files[path] = len(row) > 1 and bool(row[1])
    return distribution


def owners(distributions: list[Distribution]) -> dict[str, Distribution]:
    """Absolute path -> the distribution that installed it with a hash (else the one that lists it)."""
    owned: dict[str, Distribution] = {}
    for distribution in distributions:
        for path, hashed in distribution.files.items():
            if hashed or path not in owned:
                owned[path] = distribution
    return owned
