"""The layer tar reader's header checksum: both sums tar writers have used, nothing else."""

from __future__ import annotations

import io
import tarfile

import pytest

from rocm_audit.errors import FormatError
from rocm_audit.image import tarstream

NAME = "usr/lib/caf\u00e9/libx.so"  # UTF-8 bytes above 127 make the two sums differ


def _archive(checksum: str) -> bytes:
    """A one-member ustar archive (Python's tarfile) whose header checksum is rewritten."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT, encoding="utf-8") as tar:
        info = tarfile.TarInfo(NAME)
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    data = bytearray(out.getvalue())
    header = bytes(data[:148]) + b" " * 8 + bytes(data[156:512])
    unsigned = sum(header)
    signed = sum(b - 256 if b > 127 else b for b in header)
    assert unsigned != signed
    value = {"unsigned": unsigned, "signed": signed, "neither": unsigned - 1}[checksum]
    data[148:156] = b"%06o\0 " % value
    return bytes(data)


@pytest.mark.parametrize("checksum", ["unsigned", "signed"])
def test_a_header_summed_either_way_is_read(checksum):
    entries = [(entry.name, b"".join(data)) for entry, data in tarstream.iter_entries(io.BytesIO(_archive(checksum)))]
    assert entries == [(NAME, b"hello")]


def test_a_header_of_another_sum_is_refused_at_its_offset():
    with pytest.raises(FormatError) as caught:
        list(tarstream.iter_entries(io.BytesIO(_archive("neither"))))
    assert caught.value.offset == 0
    assert "checksum mismatch" in caught.value.reason
