"""Filesystem floor of an applying dedup run: for each [path, link_text] in the JSON list, make the
symlink under a temporary name and rename it over the path. No reading, no checks: what the
filesystem charges for the change itself (inode and symlink creation, freeing the duplicate's
blocks, journal). Run with ``python -S``."""

import json
import os
import sys

for path, text in json.load(open(sys.argv[1])):
    temp = os.path.join(os.path.dirname(path), ".bench-tmp." + os.path.basename(path))
    os.symlink(text, temp)
    os.replace(temp, path)
