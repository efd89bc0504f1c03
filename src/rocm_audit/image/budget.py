"""What reading an image may cost: the byte and entry limits, counted as the layers' tar streams
are read (``Budget``), and what each layer held (``LayerStats``)."""

from __future__ import annotations

from dataclasses import dataclass

from rocm_audit.errors import RocmAuditError
from rocm_audit.image import tarstream
from rocm_audit.progress import SILENT, Progress
from rocm_audit.units import size_text

# ROCm images are large: rocm/pytorch is 19-20 GB compressed, sglang's ROCm images 45-73 GB, and
# their libraries inflate 3-5 times. The scratch disk holds a fraction of what is read (the kept
# files, trimmed), so this bounds the time a decompression bomb can take, not the disk.
DEFAULT_MAX_BYTES = 256 << 30
DEFAULT_MAX_ENTRIES = 4_000_000


class LimitExceeded(RocmAuditError):
    """The image is larger than the extraction limits allow."""


@dataclass(slots=True)
class Limits:
    max_bytes: int = DEFAULT_MAX_BYTES  # tar bytes read, over all layers
    max_entries: int = DEFAULT_MAX_ENTRIES
    bytes_read: int = 0
    entries: int = 0


@dataclass(slots=True)
class LayerStats:
    index: int
    name: str  # digest or archive member
    entries: int = 0
    files: int = 0
    file_bytes: int = 0
    whiteouts: int = 0
    opaque_dirs: int = 0
    refused: int = 0


class Budget:
    """Counts every uncompressed tar byte against the image limit."""

    def __init__(
        self, raw: tarstream.Readable, limits: Limits, progress: Progress = SILENT, layer: LayerStats | None = None
    ) -> None:
        self.raw = raw
        self.limits = limits
        self.progress = progress
        self.layer = layer
        self.started_at = limits.bytes_read

    def read(self, size: int = -1, /) -> bytes:
        piece = self.raw.read(size)
        self.limits.bytes_read += len(piece)
        self.progress.update(self.layer.entries if self.layer else 0, self.limits.bytes_read - self.started_at)
        if self.limits.bytes_read > self.limits.max_bytes:
            allowed = size_text(self.limits.max_bytes)
            raise LimitExceeded(f"image is larger than the {allowed} allowed (raise --max-bytes)")
        return piece
