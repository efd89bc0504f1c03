"""HIP host libraries for the `prune --fatbins` tests: the clang++-19 flags and translation units,
a stand-in HIP runtime, and a child that loads a library against it and reads back what each
wrapper registered.

No AMD GPU and no ROCm runtime can run here, so the stand-in is the one mock of these tests: it
exports the registration entry points a HIP host library's constructor calls and records the
binary pointer (and magic) each 24-byte wrapper hands `__hipRegisterFatBinary`. Everything else
is real: the library is built by clang++-19, loaded by glibc with RTLD_NOW, and its fat binaries
are read from the process's memory where the runtime would read them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.run import run_checked

HIP_FLAGS = ["-x", "hip", "-nogpulib", "-nogpuinc", "-no-hip-rt", "-fPIC"]
# What a kernel's translation unit needs without HIP headers (hipLaunchKernel is the stand-in's).
PRELUDE = """\
struct dim3 { unsigned x, y, z; };
typedef struct ihipStream_t* hipStream_t;
extern "C" int hipLaunchKernel(const void*, dim3, dim3, void**, unsigned long, hipStream_t);
"""
# One kernel: TU % (name, value).
TU = PRELUDE + 'extern "C" __attribute__((global)) void %s(int* out) { *out = %d; }\n'

STUB_HIP = r"""
#include <stdint.h>
struct wrapper { uint32_t magic, version; const void* binary; void* reserved; };
static const void* registered[256]; static uint32_t magics[256]; static int count;
static void* handle;
void** __hipRegisterFatBinary(const struct wrapper* w) {
  if (count < 256) { magics[count] = w->magic; registered[count++] = w->binary; }
  return &handle;
}
void __hipUnregisterFatBinary(void** h) { (void)h; }
void __hipRegisterFunction(void) {}
void __hipRegisterVar(void) {}
void __hipRegisterManagedVar(void) {}
void __hipRegisterSurface(void) {}
void __hipRegisterTexture(void) {}
int __hipPopCallConfiguration(void) { return 0; }
int __hipPushCallConfiguration(void) { return 0; }
int hipLaunchKernel(void) { return 0; }
int stub_count(void) { return count; }
const void* stub_binary(int i) { return registered[i]; }
uint32_t stub_magic(int i) { return magics[i]; }
"""
# The registration entry points the stand-in exports (left out of generated stand-ins).
STUB_NAMES = [
    "__hipRegisterFatBinary",
    "__hipUnregisterFatBinary",
    "__hipRegisterFunction",
    "__hipRegisterVar",
    "__hipRegisterManagedVar",
    "__hipRegisterSurface",
    "__hipRegisterTexture",
]

# The child: the stand-in runtime globally, the library RTLD_NOW; each registered fat binary as the
# runtime sees it in memory (a CCOB up to its total size, a plain bundle up to the end of its last
# entry), and thrower(1) when the library has it.
CHILD = r"""
import ctypes, json, os, struct, sys
stub = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
lib = ctypes.CDLL(sys.argv[2], mode=os.RTLD_NOW)
stub.stub_binary.restype = ctypes.c_void_p
out = []
for i in range(stub.stub_count()):
    ptr = stub.stub_binary(i)
    head = ctypes.string_at(ptr, 32)
    if head[:4] == b"CCOB":
        version = struct.unpack_from("<H", head, 4)[0]
        total = struct.unpack_from("<I" if version == 2 else "<Q", head, 8)[0]
        data = ctypes.string_at(ptr, total)
    else:
        count = struct.unpack_from("<Q", head, 24)[0]
        pos, end = 32, 0
        for _ in range(count):
            offset, size, id_len = struct.unpack("<QQQ", ctypes.string_at(ptr + pos, 24))
            end = max(end, offset + size)
            pos += 24 + id_len
        data = ctypes.string_at(ptr, max(end, pos))
    out.append(data.hex())
caught = lib.thrower(1) if hasattr(lib, "thrower") else None
json.dump({"bundles": out, "caught": caught}, sys.stdout)
"""


def build_stub(out: Path) -> Path:
    """The stand-in HIP runtime, built with gcc into ``out``."""
    (out / "stub.c").write_text(STUB_HIP)
    run_checked(["gcc", "-shared", "-fPIC", "-o", "libstubhip.so", "stub.c"], out)
    return out / "libstubhip.so"


def load_and_read(
    stub: Path, library: Path, env: dict[str, str] | None = None, python: str = sys.executable, timeout: int = 300
) -> dict[str, Any]:
    """Load ``library`` in a child against ``stub``: ``{"bundles": [bytes, ...], "caught": ...}``."""
    done = subprocess.run(
        [python, "-c", CHILD, str(stub), str(library)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded: dict[str, Any] = json.loads(done.stdout)
    loaded["bundles"] = [bytes.fromhex(h) for h in loaded["bundles"]]
    return loaded


def record_hash(data: bytes) -> str:
    """A RECORD row's hash field as pip writes it."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def hippkg_site(root: Path, libraries: dict[str, Path]) -> Path:
    """A site-packages at ``root``: one distribution (hippkg 1.0) owning copies of ``libraries``
    (name -> built file) under hippkg/, with a RECORD as pip writes it."""
    (root / "hippkg").mkdir(parents=True)
    info = root / "hippkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hippkg\nVersion: 1.0\n")
    rows = []
    for name, built in libraries.items():
        shutil.copy2(built, root / "hippkg" / name)
        data = (root / "hippkg" / name).read_bytes()
        rows.append(f"hippkg/{name},{record_hash(data)},{len(data)}")
    rows += ["hippkg-1.0.dist-info/METADATA,,", "hippkg-1.0.dist-info/RECORD,,"]
    (info / "RECORD").write_text("\n".join(rows) + "\n")
    return root
