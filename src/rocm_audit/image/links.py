"""Aim every symbolic link of the merged view at what the container's kernel resolves it to.

Split from image/merge.py (which builds the view): a link is stored as its layer gives it
(``stored_link_text``), and the view's links are re-aimed once, after the last layer, so nothing
in it points outside the private root.
"""

from __future__ import annotations

import os
import posixpath
import stat


def aim_links(root: str) -> None:
    """After the last layer: aim every symbolic link at what the container's kernel resolves it to.

    The kernel resolves a link inside the container's root: ``..`` at the root stays there, and
    ``..`` after a link is taken from where that link led. On the host, inside the private
    directory, the same text could climb out of it or, after a link, land elsewhere. So each link
    is resolved as the container would (``_resolve_in_root``) and, where the host would resolve it
    differently, its text is replaced by the relative path to that place: the merged view then
    resolves as the container does, and nothing in it points outside the root. A link the kernel
    could not resolve (a loop) is made to point at itself, which fails the same way."""
    for directory, name in _links(root):
        path = os.path.join(directory, name)
        rel = os.path.relpath(path, root)
        resolved = _resolve_in_root(root, posixpath.dirname(rel), os.readlink(path))
        if resolved is None:
            text = name
        else:
            place = os.path.join(root, resolved) if resolved else root
            if os.path.realpath(path) == place:
                continue
            text = os.path.relpath(place, directory)
        os.unlink(path)
        os.symlink(text, path)


def _links(root: str) -> list[tuple[str, str]]:
    """(directory, name) of every symbolic link under ``root``, its directories listed before any
    link is changed; the kind comes with the listing (no stat of each of a tree's files)."""
    found: list[tuple[str, str]] = []
    pending = [root]
    while pending:
        directory = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue  # as os.walk: a directory that cannot be listed holds nothing to aim
        for entry in entries:
            if entry.is_symlink():
                found.append((directory, entry.name))
            elif entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
    return found


MAX_LINKS_FOLLOWED = 40  # the kernel's limit on links in one resolution (fs/namei.c MAXSYMLINKS)


def _resolve_in_root(root: str, directory: str, text: str) -> str | None:
    """Where a link at ``directory`` (root-relative, real directories) with ``text`` leads in the
    container: the root-relative path, "" for the root, None for a loop. Past the first part that
    does not exist (or is no directory) the rest is taken lexically: the link dangles there."""
    stack = [] if text.startswith("/") or not directory else directory.split("/")
    parts = [p for p in reversed(text.split("/")) if p not in ("", ".")]
    followed = 0
    while parts:
        part = parts.pop()
        if part == "..":
            if stack:
                stack.pop()
            continue
        stack.append(part)
        try:
            mode = os.lstat(os.path.join(root, *stack)).st_mode
        except OSError:  # missing, a file on the way, a name too long: the link dangles here
            return _lexical(stack, parts)
        if stat.S_ISLNK(mode):
            followed += 1
            if followed > MAX_LINKS_FOLLOWED:
                return None
            inner = os.readlink(os.path.join(root, *stack))
            stack.pop()
            if inner.startswith("/"):
                stack = []
            parts.extend(p for p in reversed(inner.split("/")) if p not in ("", "."))
        elif not stat.S_ISDIR(mode) and parts:
            return _lexical(stack, parts)
    return "/".join(stack)


def _lexical(stack: list[str], parts: list[str]) -> str:
    """The rest of a resolution that left the existing tree (``parts`` reversed), ``..`` applied
    to the names before it."""
    for part in reversed(parts):
        if part != "..":
            stack.append(part)
        elif stack:
            stack.pop()
    return "/".join(stack)


def stored_link_text(rel: str, link_text: str) -> str | None:
    """The link text to store: an absolute target is taken from the image root (``../`` once per
    directory above the link, then the text unchanged: its ``..`` must stay physical); None for an
    empty text or one holding NUL. ``aim_links`` re-aims what would resolve otherwise on the host."""
    if not link_text or "\0" in link_text:
        return None
    if not link_text.startswith("/"):
        return link_text
    depth = rel.count("/")
    rest = link_text.lstrip("/")
    return ("../" * depth + rest) or "."
