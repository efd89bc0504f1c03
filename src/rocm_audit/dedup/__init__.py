"""`rocm-audit dedup`: replace byte-identical SDK shared libraries by relative symlinks.

Why: glibc treats two paths as one library only when (st_dev, st_ino) match (formats.md 4), so
byte-identical copies of an LLVM registrant are loaded twice and abort with ``Option ... registered
more than once!`` (TheRock issue 7818, formats.md 1.5). A relative symlink to the runtime copy is
one inode for the loader, survives every image-layer copy, and leaves ``$ORIGIN`` unchanged.

Safety (peers.md 2): the plan records each file's stat; just before each replacement both files are
re-stat'ed and byte-compared; the link is made under a temporary name in the same directory and
renamed over the target, so the path never stops existing; links never cross filesystems or leave
the audited root; every planned change is journalled (fsync'ed) in a manifest before the first
change, so ``--revert`` works from any interrupted state.
"""
