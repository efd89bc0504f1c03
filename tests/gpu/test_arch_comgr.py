"""The entry rocm-audit says the HIP runtime picks, against a real comgr (slow: a 169 MB wheel).

CLR hands a registered fat binary's bundle header to comgr's ``amd_comgr_lookup_code_object`` with
one query per ISA name it accepts (the device's own, its generic, both SPIR-V spellings) and takes
the native answer first (hip_fatbin.cpp PopulateCodeObjectMap). This calls the comgr that
pytorch-triton-rocm 2.1.0 ships (pinned by sha256) the same way, in a child process (comgr carries
its own LLVM), on bundles written here, and compares its choice with ``choose_entry``. That comgr
predates gfx942 and the generic targets, so the cases use gfx90a and gfx1030.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rocm_audit.formats.offload_bundle import parse_bundle
from rocm_audit.tree.targets import choose_entry, resolve_required
from support.gpu.arch_writers import amdgpu_header, bundle
from support.vendor import triton_rocm_wheel

pytestmark = pytest.mark.slow

COMGR_MEMBERS = ("triton/third_party/rocm/lib/libamd_comgr.so", "triton/third_party/rocm/lib/libtinfo.so")

_LOOKUP = """
import ctypes, json, sys
comgr = ctypes.CDLL(sys.argv[1])
image = open(sys.argv[2], "rb").read()[:4096]  # CLR: min(4096, bound) bytes of a registered image
isas = json.loads(sys.argv[3])

class Handle(ctypes.Structure):
    _fields_ = [("handle", ctypes.c_uint64)]

class Query(ctypes.Structure):
    _fields_ = [("isa", ctypes.c_char_p), ("size", ctypes.c_size_t), ("offset", ctypes.c_uint64)]

data = Handle()
assert comgr.amd_comgr_create_data(0x10, ctypes.byref(data)) == 0  # AMD_COMGR_DATA_KIND_FATBIN
buffer = ctypes.create_string_buffer(image, len(image))
assert comgr.amd_comgr_set_data(data, ctypes.c_size_t(len(image)), buffer) == 0
queries = (Query * len(isas))(*[Query(name.encode(), 0, 0) for name in isas])
status = comgr.amd_comgr_lookup_code_object(data, queries, ctypes.c_size_t(len(isas)))
print(json.dumps({"status": status, "found": {q.isa.decode(): [q.offset, q.size] for q in queries}}))
"""


@pytest.fixture(scope="module")
def comgr(cache_dir) -> Path:
    wheel = triton_rocm_wheel(str(cache_dir))
    target = Path(cache_dir) / "comgr-pytorch-triton-rocm-2.1.0"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target, COMGR_MEMBERS)
    return target / COMGR_MEMBERS[0]


def _comgr_choice(comgr: Path, image: Path, agent: str) -> int | None:
    """Which entry (by offset) comgr gives the device's own ISA name, as CLR queries it."""
    native = f"amdgcn-amd-amdhsa--{agent}"
    isas = [native, "spirv64-amd-amdhsa--amdgcnspirv", "spirv64-amd-amdhsa-unknown-amdgcnspirv"]
    done = subprocess.run(
        [sys.executable, "-c", _LOOKUP, str(comgr), str(image), json.dumps(isas)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    answer = json.loads(done.stdout)
    assert answer["status"] == 0, answer
    offset, size = answer["found"][native]
    if size == 0:
        return None
    entries = parse_bundle(image.read_bytes(), 0, image.stat().st_size).entries
    return next(index for index, entry in enumerate(entries) if entry.offset == offset)


# (device target ids in the bundle, after the host entry) and the agent as `verify-arch` spells it.
CASES = [
    (["gfx90a", "gfx90a:xnack-"], "gfx90a"),
    (["gfx90a:xnack+", "gfx90a:xnack-"], "gfx90a"),
    (["gfx90a:sramecc+:xnack-", "gfx90a"], "gfx90a"),
    (["gfx90a:xnack+"], "gfx90a"),
    (["gfx90a:sramecc-"], "gfx90a"),
    (["gfx90a:xnack+", "gfx90a"], "gfx90a:xnack+"),
    (["gfx1030", "gfx90a"], "gfx90a"),
    (["gfx1030:xnack-"], "gfx1030"),
    (["gfx906:xnack-", "gfx906"], "gfx906"),
]


@pytest.mark.parametrize(("targets", "spelled"), CASES, ids=[f"{'+'.join(t)}@{a}" for t, a in CASES])
def test_the_entry_chosen_is_the_one_comgr_returns(comgr, tmp_path, targets, spelled):
    entries = [("host-x86_64-unknown-linux--", b"")]
    entries += [(f"hipv4-amdgcn-amd-amdhsa--{t}", amdgpu_header(0x53F) + bytes(192)) for t in targets]
    image = tmp_path / "fatbin.bundle"
    image.write_bytes(bundle(entries))
    agent = resolve_required(spelled).agent
    chosen = choose_entry([None, *targets], agent)
    ours = None if chosen is None else chosen[0]
    assert ours == _comgr_choice(comgr, image, str(agent)), (targets, str(agent), chosen)


# Entry ids as writers spelled them: ROCm 4.0's 3-field triple (cupy-rocm-4-0, tensorflow-rocm 2.2-2.4,
# tensorflow-rocm 2.12's MLIR kernels), the 4-field ones of every later clang, Tensile's "unknown"
# environment (in CCOBs, which comgr unbundles by another path).
ID_FORMS = [
    ("hip-amdgcn-amd-amdhsa-gfx90a", False),
    ("hcc-amdgcn-amd-amdhsa-gfx90a", False),
    ("hip-amdgcn-amd-amdhsa--gfx90a", True),
    ("hipv4-amdgcn-amd-amdhsa--gfx90a", True),
    ("hipv4-amdgcn-amd-amdhsa-unknown-gfx90a", False),  # Tensile's spelling, which it compresses
    ("hcc-amdgcn-amd-amdhsa--gfx90a", True),
]


@pytest.mark.parametrize(("entry_id", "selected"), ID_FORMS, ids=[i for i, _ in ID_FORMS])
def test_comgr_selects_an_entry_exactly_when_its_id_is_an_isa_name_it_knows(comgr, tmp_path, entry_id, selected):
    """What ``offload_bundle.comgr_selectable`` says of an id in an uncompressed bundle is what the
    real comgr does with it: the 3-field ``hip-amdgcn-amd-amdhsa-gfx90a`` is never returned."""
    from rocm_audit.formats.offload_bundle import comgr_selectable, parse_entry_id

    image = tmp_path / "fatbin.bundle"
    image.write_bytes(bundle([("host-x86_64-unknown-linux--", b""), (entry_id, amdgpu_header(0x53F) + bytes(192))]))
    assert (_comgr_choice(comgr, image, "gfx90a:sramecc+:xnack-") == 1) is selected
    assert comgr_selectable(parse_entry_id(entry_id)) is selected
