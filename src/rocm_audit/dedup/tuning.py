"""Sizes that decide how a run shares its reading among processes. Modules read them at call time
(``tuning.PIECE_BYTES``), so one assignment here changes the plan and the apply alike."""

from __future__ import annotations

# Below this many candidate bytes a plan or an apply compares in this process alone: a fork costs more.
PARALLEL_MIN_BYTES = 64 << 20
# With helpers, a bucket that would read more than this is compared in pieces of about this many
# bytes (after its head and tail, here), so that the processes share even one pair of 1 GB
# libraries evenly. Alone, a bucket is compared whole: a difference then stops all reading.
# An apply cuts each pair into pieces of half this (two files are read per piece).
PIECE_BYTES = 64 << 20
SNAPSHOT_SHARE = 256  # libraries per share: each is a few ms of reading dynamic sections
