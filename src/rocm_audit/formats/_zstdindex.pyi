"""Types of the C extension _zstdindex.c (random access into a zstd frame)."""

from typing_extensions import Buffer

class Corrupt(ValueError): ...  # args: (offset into the input, reason)
class TooLarge(Exception): ...  # args: (reason,)

class FrameIndex:
    @property
    def size(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def read(self, offset: int, length: int, /) -> bytes: ...
    def decode_all(self) -> int: ...

def index_frame(
    data: Buffer, max_records: int, max_literals: int, step_budget: int, steps_per_byte: int
) -> FrameIndex: ...
