"""The engine decides how layers merge: hand-built layers loaded into the real daemon, exported with
`docker export`, and compared with rocm-audit's merged view path by path.

The layers hold the shapes where a reading of the OCI spec and the engine part ways: rooted and
`..`-holding member names, links that climb above the root or pass `..` after a link, a lower
layer's link or file under an upper layer's entry, whiteouts below such a parent, the root's opaque
marker, hardlinks by rooted names. Links are compared by where they resolve: in the export, by
the kernel inside a chroot (the container's view); in the merged view, by the host kernel with
no chroot (what every check of the audit sees). They must land on the same path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from rocm_audit.image import merge
from rocm_audit.image.audit import ImageOptions, extract_archive, new_state
from support.image.layer_writers import docker_save, layer, member

pytestmark = pytest.mark.docker

SYM, HARD = tarfile.SYMTYPE, tarfile.LNKTYPE

LOWER = layer(
    ("a/", None),
    member("a/s", kind=SYM, link=".."),
    member("a/l", kind=SYM, link="s/../.."),
    member("a/m", kind=SYM, link="s/a/s/a/.."),
    ("usr/lib/deep/er/", None),
    ("usr/lib/deep/x", b"deep x"),
    member("usr/lib/hop", kind=SYM, link="deep/er"),
    member("usr/lib/via", kind=SYM, link="hop/../x"),  # physical: deep/er/.. is deep
    member("usr/lib/abs-via", kind=SYM, link="/usr/lib/hop/../x"),
    ("etc/f", b"etc f"),
    member("up", kind=SYM, link="../../../../etc/f"),  # climbs above the root: stops there
    member("etc/abs", kind=SYM, link="/etc/f"),
    ("real/keep.txt", b"kept"),
    ("real/gone.txt", b"gone"),
    member("sp", kind=SYM, link="real"),
    ("real2/k", b"k"),
    member("sp2", kind=SYM, link="real2"),
    ("file-parent", b"a file below"),
    ("/rooted.txt", b"r"),  # a rooted name: from the root
    ("usr/../etc/g", b"g"),  # '..' inside a name: lexical
    ("opt/big", b"B" * 9000),
    member("usr/hard", kind=HARD, link="/opt/big"),  # a rooted hardlink name
    member("loop1", kind=SYM, link="loop2"),
    member("loop2", kind=SYM, link="loop1"),
    member("dangling", kind=SYM, link="nowhere/x"),
    ("opq/lower.txt", b"lower"),
)
UPPER = layer(
    ("sp/new.txt", b"new"),  # below the lower link: sp becomes a directory
    member("sp2/.wh.k", b""),  # a whiteout below a lower link: a directory, real2/k stays
    ("file-parent/child", b"child"),  # below the lower file: a directory
    member(".wh..wh..opq", b""),  # the root's opaque mark: overlayfs ignores it
    member("real/.wh.gone.txt", b""),
    member("opq/.wh..wh..opq", b""),
    ("opq/upper.txt", b"upper"),
    member("usr/lib/hop", kind=SYM, link="/usr/lib"),  # replaced: hop/.. is now usr
    ("usr/x", b"usr x"),
)
TOP = layer(
    ("keep/c", b"C" * 5000),
    member("keep/c-link", kind=HARD, link="keep/c"),
    member("keep/to-up", kind=SYM, link="../../up"),
)

# In the chroot of the export (the container's root) or on the host: every symbolic link's target
# by device and inode, mapped back to a root-relative path through a walk of the tree.
RESOLVE = r"""
import json, os, sys
root, chroot = sys.argv[1], sys.argv[2] == "1"
if chroot:
    os.chroot(root)
    root = "/"
places, links = {}, []
for directory, dirs, files in os.walk(root):
    for name in dirs + files:
        path = os.path.join(directory, name)
        info = os.lstat(path)
        rel = os.path.relpath(path, root)
        if os.path.islink(path):
            links.append(rel)
        else:
            places.setdefault((info.st_dev, info.st_ino), rel)
places.setdefault((os.stat(root).st_dev, os.stat(root).st_ino), "")
out = {}
for rel in links:
    try:
        info = os.stat(os.path.join(root, rel))
        out[rel] = places.get((info.st_dev, info.st_ino), "<outside the root>")
    except OSError:
        out[rel] = None
print(json.dumps(out))
"""


def merged(tmp_path: Path, archive: Path) -> tuple[merge.MergeState, Path]:
    work = tmp_path / "work"
    work.mkdir()
    state = new_state(str(work), ImageOptions(full=True))
    extract_archive(str(archive), str(work), state)
    merge.finish(state)
    return state, Path(state.root)


def resolutions(root: Path, *, chroot: bool) -> dict[str, str | None]:
    done = subprocess.run(
        [sys.executable, "-c", RESOLVE, str(root), "1" if chroot else "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def tree(root: Path) -> dict[str, tuple[str, bytes | None]]:
    """Every path below ``root``: its kind and, for a regular file, its bytes."""
    shape: dict[str, tuple[str, bytes | None]] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory, name)
            rel = str(path.relative_to(root))
            if path.is_symlink():
                shape[rel] = ("link", None)
            elif path.is_dir():
                shape[rel] = ("dir", None)
            else:
                shape[rel] = ("file", path.read_bytes())
    return shape


def hardlink_groups(root: Path) -> set[frozenset[str]]:
    groups: dict[int, set[str]] = {}
    for directory, _dirs, files in os.walk(root):
        for name in files:
            path = Path(directory, name)
            info = path.lstat()
            if not path.is_symlink() and info.st_nlink > 1:
                groups.setdefault(info.st_ino, set()).add(str(path.relative_to(root)))
    return {frozenset(group) for group in groups.values() if len(group) > 1}


@pytest.mark.skipif(os.geteuid() != 0, reason="chroot needs root (the daemon does too)")
def test_merged_view_is_what_docker_export_shows(docker, tmp_path):
    archive = docker_save(tmp_path / "save.tar", [LOWER, UPPER, TOP], tag="rocm-audit-test/engine:1")
    docker.run("load", "-i", str(archive))
    container = docker.run("create", "rocm-audit-test/engine:1", "/none").stdout.strip()
    try:
        docker.run("export", "-o", str(tmp_path / "export.tar"), container)
    finally:
        docker.run("rm", container)
        docker.run("rmi", "rocm-audit-test/engine:1")
    exported = tmp_path / "export"
    exported.mkdir()
    # GNU tar as root keeps link texts verbatim (absolute ones too) and makes the hardlinks.
    subprocess.run(["tar", "-xpf", str(tmp_path / "export.tar"), "-C", str(exported)], check=True)
    # What the engine adds to every container, not in any layer.
    engine_made = {".dockerenv", "dev", "proc", "sys", "etc/hosts", "etc/hostname", "etc/resolv.conf", "etc/mtab"}

    state, root = merged(tmp_path, archive)
    assert not [f for f in state.findings if f.rule == "IMG002"], state.findings

    def ours(shape: dict) -> dict:
        return {k: v for k, v in shape.items() if k not in engine_made and not k.startswith(("dev/", "proc/", "sys/"))}

    engine_tree, our_tree = ours(tree(exported)), ours(tree(root))
    assert our_tree == engine_tree
    # A few the list above must hold, so the comparison cannot pass on two empty trees.
    assert engine_tree["sp"][0] == engine_tree["file-parent"][0] == engine_tree["sp2"][0] == "dir"
    assert engine_tree["rooted.txt"] == ("file", b"r") and engine_tree["etc/g"] == ("file", b"g")
    assert "real/gone.txt" not in engine_tree and "opq/lower.txt" not in engine_tree
    assert engine_tree["real2/k"] == ("file", b"k")

    in_container = ours(resolutions(exported, chroot=True))
    on_host = resolutions(root, chroot=False)
    assert on_host == in_container
    assert in_container["a/l"] == in_container["a/m"] == ""  # the root
    assert in_container["up"] == in_container["keep/to-up"] == "etc/f"
    assert in_container["usr/lib/via"] == in_container["usr/lib/abs-via"] == "usr/x"
    assert in_container["loop1"] is None and in_container["dangling"] is None

    groups = hardlink_groups(exported)
    assert frozenset({"keep/c", "keep/c-link"}) in groups and frozenset({"opt/big", "usr/hard"}) in groups
    assert hardlink_groups(root) == groups
