"""Comparing two `image` JSON reports of one archive: what differs by nature between two runs."""

from __future__ import annotations

import json
import re
from typing import Any

# The private view's path differs from run to run, as do inode numbers, timings and the words that
# say how much of the image was extracted.
_VIEW = re.compile(r"[^\"\s]*/rocm-audit-image-[A-Za-z0-9_]+/rootfs")
_UNSTABLE = {"inode", "elapsed_s", "checks_elapsed_s", "extracted"}


def comparable(text: str) -> dict[str, Any]:
    """The report without what differs between two runs over the same archive."""

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k not in _UNSTABLE}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    document: dict[str, Any] = clean(json.loads(_VIEW.sub("", text)))
    document["findings"] = sorted(json.dumps(f, sort_keys=True) for f in document["findings"])
    return document
