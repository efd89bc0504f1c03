"""Peak resident memory, measured so that a test can fail.

`getrusage().ru_maxrss` survives execve on Linux: a child started from a 300 MB pytest reports
at least 300 MB whatever it did. VmHWM in /proc/self/status belongs to the process's own address
space, so a freshly exec'ed child starts from zero; inside pytest, writing "5" to
/proc/self/clear_refs resets it to the current RSS (Linux >= 4.0), so a delta can be measured.
"""

from __future__ import annotations

import ctypes

# For `python -c` probes: prints the child's own peak RSS in KiB.
PEAK_RSS_KIB_EXPR = "int(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')))"


def fresh_peak(argv: list[str]) -> list[str]:
    """``argv`` run as a grandchild through sh, so that its ``ru_maxrss`` starts from zero: a child
    exec'ed straight from pytest inherits pytest's high-water mark (1 GB late in the full run),
    which libFuzzer's ``-rss_limit_mb`` reads as the fuzzer's own; a forked child gets a fresh
    one. (``"$@"; exit $?`` keeps sh from exec'ing the command in its own place.)"""
    return ["sh", "-c", '"$@"; exit $?', "sh", *argv]


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return int(next(line.split()[1] for line in status if line.startswith(field + ":")))


def reset_peak_rss() -> int:
    """Reset this process's peak RSS to its current RSS; return that RSS in KiB."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    return _status_kib("VmRSS")


def give_back_freed_memory() -> None:
    """Have glibc return the memory freed so far in this process (``malloc_trim``). Kept in its
    arenas, freed memory counts as resident, and a later allocation reuses it without growing the
    RSS: late in the full run, after tests that freed hundreds of MiB, a 128 MiB window can then
    be allocated without any growth to measure."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc only
    if trim is not None:
        trim(0)


def peak_rss_kib() -> int:
    return _status_kib("VmHWM")
