"""Build a TheRock-shaped SDK tree of real ELF shared libraries, fast.

One small gcc library is compiled once; ``objcopy --add-section`` gives it a one-byte payload
section, and every generated library is that template with the payload section grown to the wanted
size (section headers and the sections after the payload moved, exactly the layout objcopy writes
for a larger payload) and its own GNU build-id. Payload bytes are slices of a random pool taken at
random offsets, so writing costs what the page cache costs, not what a PRNG costs.

Layout (site-packages of a TheRock wheel install):

    site/_rocm_sdk_core/{bin,lib,lib/llvm/lib,...}
    site/_rocm_sdk_libraries_gfx94X_dcgpu/lib/...
    site/_rocm_sdk_devel/{include,lib,lib/cmake}/...   devel copies of runtime libraries, same relative names

About a third of all bytes are devel copies (distinct inodes) of runtime libraries. Same-size files
with different content: pairs with different build-ids (differ in the first 4 KiB), and pairs built
from one library that differ only just after the head, only just before the last 4 KiB, or only
inside the last 4 KiB. A few non-library duplicates (an executable, a header) exist too: peers group
them, rocm-audit must not (it links only shared libraries).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

CORE = "_rocm_sdk_core"
LIBS = "_rocm_sdk_libraries_gfx94X_dcgpu"
DEVEL = "_rocm_sdk_devel"
PAYLOAD_SECTION = ".rocm_bench_payload"

LIB_SOURCE = "int bench_value(int x) { return x * 7 + 1; }\n"
EXE_SOURCE = '#include <stdio.h>\nint main(void) { puts("rocm tool"); return 0; }\n'

BIG_NAMES = [
    "lib/libhipblaslt.so.0",
    "lib/librocblas.so.5",
    "lib/libMIOpen.so.1",
    "lib/llvm/lib/libLLVM.so.20.0git",
    "lib/librccl.so.1",
    "lib/libamd_comgr.so.3",
]
MEDIUM_STEMS = [
    "rocsolver",
    "rocfft",
    "hipsparse",
    "rocsparse",
    "rocrand",
    "hiprand",
    "hipfft",
    "rocprim_dev",
    "hipsolver",
    "roctracer64",
    "rocprofiler-sdk",
    "amdhip64",
    "hsa-runtime64",
    "rocm_smi64",
    "hipblas",
    "rocalution",
    "migraphx",
    "rocwmma",
    "hipcub_dev",
    "rocdecode",
    "rocjpeg",
    "hiprtc",
    "amd_smi",
    "rocm-core",
    "hipsparselt",
    "composable_kernel",
    "rocroller",
    "origami",
    "tensile_host",
    "hipdnn",
    "rpp",
    "mivisionx",
    "rocal",
    "rocshmem",
    "rdc",
    "rocprofiler-register",
]
SUBDIRS = [
    "lib",
    "lib",
    "lib",
    "lib/host-math/lib",
    "lib/rocm_sysdeps/lib",
    "lib/llvm/lib",
    "lib/rocprofiler-sdk",
    "lib/hipblaslt/library",
    "lib/rocblas/library",
    "lib/migraphx/lib",
]


@dataclass(frozen=True)
class Profile:
    """How many libraries of which sizes (bytes) the tree holds."""

    big: tuple[int, ...]  # exact sizes
    medium: tuple[int, int, int]  # count, min, max (uniform)
    mid: tuple[int, int, int]  # count, min, max (log-uniform)
    small: tuple[int, int, int]  # count, min, max (uniform)
    twins: int  # same-size look-alike pairs of each kind
    headers: int  # devel-only non-ELF text files
    pool_bytes: int


MB = 1_000_000
FULL = Profile(
    big=(900 * MB, 500 * MB, 260 * MB, 140 * MB),
    medium=(30, 5 * MB, 60 * MB),
    mid=(300, 10_000, 2 * MB),
    small=(1500, 16_000, 64_000),
    twins=6,
    headers=300,
    pool_bytes=64 << 20,
)
MEDIUM = Profile(
    big=(120 * MB, 60 * MB),
    medium=(8, 5 * MB, 30 * MB),
    mid=(150, 10_000, 2 * MB),
    small=(1200, 16_000, 64_000),
    twins=4,
    headers=300,
    pool_bytes=32 << 20,
)
SMOKE = Profile(
    big=(2 * MB,),
    medium=(3, 300_000, 900_000),
    mid=(20, 20_000, 200_000),
    small=(60, 16_000, 40_000),
    twins=2,
    headers=20,
    pool_bytes=4 << 20,
)


@dataclass
class Template:
    data: bytes
    payload_offset: int  # where the one-byte payload sits
    after: int  # offset of the first section placed after the payload (align 8)
    shoff: int
    shnum: int
    shentsize: int
    build_id_offset: int  # 20-byte build-id descriptor

    @property
    def overhead(self) -> int:
        return len(self.data) - 1


@dataclass
class TreeManifest:
    site: str
    total_bytes: int = 0
    duplicate_bytes: int = 0
    libraries: list[str] = field(default_factory=list)  # relative paths of every ELF shared library
    executables: list[str] = field(default_factory=list)
    other_files: list[str] = field(default_factory=list)
    symlinks: list[str] = field(default_factory=list)
    groups: list[list[str]] = field(default_factory=list)  # expected library duplicate groups
    non_library_groups: list[list[str]] = field(default_factory=list)  # identical, but not libraries
    lookalikes: dict[str, list[list[str]]] = field(default_factory=dict)  # kind -> same-size different pairs

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.__dict__, indent=1))

    @classmethod
    def load(cls, path: Path) -> TreeManifest:
        return cls(**json.loads(path.read_text()))


def _run(*argv: str, cwd: Path | None = None) -> None:
    subprocess.run(argv, check=True, capture_output=True, cwd=cwd, timeout=300)


def build_template(work: Path) -> Template:
    work.mkdir(parents=True, exist_ok=True)
    (work / "t.c").write_text(LIB_SOURCE)
    _run(
        "gcc",
        "-shared",
        "-fPIC",
        "-O2",
        "-Wl,--build-id=sha1",
        "-Wl,-soname,libbench.so.1",
        "-o",
        str(work / "t.so"),
        str(work / "t.c"),
    )
    (work / "one").write_bytes(b"\xa5")
    _run("objcopy", "--add-section", f"{PAYLOAD_SECTION}={work / 'one'}", str(work / "t.so"), str(work / "tp.so"))
    data = (work / "tp.so").read_bytes()
    assert data[:6] == b"\x7fELF\x02\x01", "expected a 64-bit little-endian ELF"
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab_off = sections[shstrndx][4]

    def name(sec: tuple[int, ...]) -> str:
        start = strtab_off + sec[0]
        return data[start : data.index(b"\0", start)].decode()

    payload = next(s for s in sections if name(s) == PAYLOAD_SECTION)
    note = next(s for s in sections if name(s) == ".note.gnu.build-id")
    later = [s[4] for s in sections if s[4] > payload[4] and s[1] != 8]  # not NOBITS
    after = min(later) if later else shoff
    assert after % 8 == 0 and shoff > payload[4]
    return Template(
        data=data,
        payload_offset=payload[4],
        after=after,
        shoff=shoff,
        shnum=shnum,
        shentsize=shentsize,
        build_id_offset=note[4] + 16,
    )


def fit(template: Template, size: int) -> int:
    """The nearest size >= size a library can have (the sections after the payload stay 8-aligned)."""
    rest = len(template.data) - template.after
    size = max(size, template.payload_offset + rest + 1)
    return size + (rest - size) % 8


def layout(template: Template, total_size: int) -> tuple[bytes, int, bytes]:
    """(head bytes, payload length, tail bytes) of a library of exactly total_size bytes."""
    t = template
    rest = len(t.data) - t.after
    n = total_size - t.payload_offset - rest
    if n < 1 or (total_size - rest) % 8:
        raise ValueError(f"{total_size}: not a size this template can have (use fit())")
    delta = t.payload_offset + n - t.after
    head = bytearray(t.data[: t.payload_offset])
    tail = bytearray(t.data[t.after :])
    struct.pack_into("<Q", head, 0x28, t.shoff + delta)  # e_shoff
    sh_in_tail = t.shoff - t.after
    for i in range(t.shnum):
        at = sh_in_tail + i * t.shentsize
        (off,) = struct.unpack_from("<Q", tail, at + 24)
        if off == t.payload_offset:
            struct.pack_into("<Q", tail, at + 32, n)  # sh_size of the payload section
        elif off >= t.after:
            struct.pack_into("<Q", tail, at + 24, off + delta)
    return bytes(head), n, bytes(tail)


class Writer:
    def __init__(self, template: Template, rng: random.Random, pool_bytes: int) -> None:
        self.template = template
        self.rng = rng
        self.pool = os.urandom(pool_bytes)
        self.piece = min(1 << 20, pool_bytes // 4)

    def write_library(self, path: Path, size: int, build_id: bytes | None = None) -> None:
        head, n, tail = layout(self.template, size)
        head = bytearray(head)
        head[self.template.build_id_offset : self.template.build_id_offset + 20] = build_id or self.rng.randbytes(20)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o755)
        try:
            os.write(fd, head)
            left = n
            pool, piece, rng = self.pool, self.piece, self.rng
            while left:
                k = min(piece, left)
                start = rng.randrange(len(pool) - k)
                os.write(fd, memoryview(pool)[start : start + k])
                left -= k
            os.write(fd, tail)
        finally:
            os.close(fd)
        assert path.stat().st_size == size, (path, size)


def copy_file(src: Path, dst: Path) -> None:
    """A new inode with the same bytes (what a split COPY --from or cp -r leaves)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        left = os.fstat(fin.fileno()).st_size
        while left:
            sent = os.copy_file_range(fin.fileno(), fout.fileno(), left)
            if sent == 0:
                raise OSError("short copy")
            left -= sent
    os.chmod(dst, 0o755)


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x5A]))


def build_tree(site: Path, profile: Profile, seed: int = 7818, work: Path | None = None) -> TreeManifest:
    """Create the tree under site (which must not exist). Returns what it holds."""
    rng = random.Random(seed)
    if site.exists():
        shutil.rmtree(site)
    site.mkdir(parents=True)
    scratch = work or site.parent / "template"
    template = build_template(scratch)
    writer = Writer(template, rng, profile.pool_bytes)
    m = TreeManifest(site=str(site))
    runtime: list[tuple[str, int]] = []  # (relative path inside site, size)
    used: set[str] = set()

    def place(tree: str, rel: str) -> str:
        path = f"{tree}/{rel}"
        while path in used:
            stem, dot, rest = rel.partition(".so")
            rel = f"{stem}x{dot}{rest}"
            path = f"{tree}/{rel}"
        used.add(path)
        return path

    def pick_tree() -> str:
        return CORE if rng.random() < 0.4 else LIBS

    for i, size in enumerate(profile.big):
        runtime.append(
            (
                place(
                    CORE if "LLVM" in BIG_NAMES[i % len(BIG_NAMES)] or "comgr" in BIG_NAMES[i] else LIBS,
                    BIG_NAMES[i % len(BIG_NAMES)],
                ),
                size,
            )
        )
    count, lo, hi = profile.medium
    for i in range(count):
        stem = MEDIUM_STEMS[i % len(MEDIUM_STEMS)]
        runtime.append((place(pick_tree(), f"lib/lib{stem}.so.{1 + i // len(MEDIUM_STEMS)}"), rng.randint(lo, hi)))
    count, lo, hi = profile.mid
    for i in range(count):
        size = int(lo * (hi / lo) ** rng.random())
        runtime.append((place(pick_tree(), f"{rng.choice(SUBDIRS)}/libmid{i:04d}.so.1"), size))
    count, lo, hi = profile.small
    for i in range(count):
        runtime.append(
            (place(pick_tree(), f"{rng.choice(SUBDIRS)}/libsmall{i:05d}.so.{rng.randint(0, 9)}"), rng.randint(lo, hi))
        )
    runtime = [(p, fit(template, s)) for p, s in runtime]
    for path, size in runtime:
        writer.write_library(site / path, size)
        m.libraries.append(path)
    runtime_bytes = sum(s for _, s in runtime)

    # Same-size look-alikes. "head": another library (own build-id) of the same size; the others are
    # copies of one library with one byte changed just after the first 4 KiB, just before the last
    # 4 KiB, or inside the last 4 KiB.
    extra: list[tuple[str, int]] = []
    kinds = ("head", "after-head", "before-tail", "in-tail")
    pools = [x for x in runtime if x[1] >= 64_000]
    for kind in kinds:
        m.lookalikes[kind] = []
        for j in range(profile.twins):
            base_path, size = pools[rng.randrange(len(pools))] if j % 2 else runtime[rng.randrange(len(runtime))]
            twin = place(pick_tree(), f"lib/lookalike/lib{kind.replace('-', '_')}{j:02d}.so.1")
            if kind == "head":
                writer.write_library(site / twin, size)
            else:
                copy_file(site / base_path, site / twin)
                payload_end = size - (len(template.data) - template.after)
                offset = {
                    "after-head": max(4096, template.payload_offset) + 16,
                    "before-tail": size - 4096 - 512,
                    "in-tail": payload_end - 1,
                }[kind]
                offset = max(template.payload_offset, min(offset, payload_end - 1))
                flip_byte(site / twin, offset)
            extra.append((twin, size))
            m.libraries.append(twin)
            m.lookalikes[kind].append([base_path, twin])
    runtime += extra
    runtime_bytes += sum(s for _, s in extra)

    # Devel copies of runtime libraries, under the same relative names, until they are a third of
    # all bytes: the biggest-but-one library, then random others.
    target = runtime_bytes // 2
    order = sorted(runtime[: len(profile.big)], key=lambda x: -x[1])[1:2] + rng.sample(
        runtime[len(profile.big) :], len(runtime) - len(profile.big)
    )
    chosen, dup_bytes = [], 0
    for path, size in order:
        if dup_bytes + size > target * 1.03 or "lookalike" in path and rng.random() < 0.5:
            continue
        chosen.append((path, size))
        dup_bytes += size
        if dup_bytes >= target * 0.98:
            break
    for path, size in chosen:
        rel = path.split("/", 1)[1]
        devel_path = place(DEVEL, rel)
        copy_file(site / path, site / devel_path)
        m.libraries.append(devel_path)
        group = [path, devel_path]
        if len(m.groups) % 25 == 3 and path.startswith(CORE):
            # a third copy in the libraries tree: a group of three
            third = place(LIBS, rel)
            copy_file(site / path, site / third)
            m.libraries.append(third)
            group.append(third)
            dup_bytes += size
        m.groups.append(sorted(group))
    m.duplicate_bytes = dup_bytes

    # Soname names (libfoo.so for libfoo.so.N): mostly symlinks; some small ones as copies in the same
    # tree, what a wheel install leaves since wheels cannot hold symlinks (peers.md 6).
    group_of = {p: g for g in m.groups for p in g}
    for path in list(m.libraries):
        if path.count(".so.") == 1 and rng.random() < 0.3:
            link = path.split(".so.")[0] + ".so"
            if link in used or os.path.lexists(site / link):
                continue
            used.add(link)
            if "lookalike" not in path and (site / path).stat().st_size < 2 * MB and rng.random() < 0.15:
                copy_file(site / path, site / link)
                m.libraries.append(link)
                group = group_of.get(path)
                if group is None:
                    group = [path]
                    m.groups.append(group)
                group.append(link)
                group_of[link] = group_of[path] = group
                dup_bytes += (site / path).stat().st_size
            else:
                os.symlink(os.path.basename(path), site / link)
                m.symlinks.append(link)
    m.groups = [sorted(g) for g in m.groups]
    m.duplicate_bytes = dup_bytes
    exe_dir = site / CORE / "bin"
    exe_dir.mkdir(parents=True, exist_ok=True)
    (scratch / "tool.c").write_text(EXE_SOURCE)
    _run("gcc", "-O2", "-o", str(scratch / "tool"), str(scratch / "tool.c"))
    for n, name in enumerate(("amdclang", "hipcc", "rocminfo", "rocm-smi", "amd-smi")):
        shutil.copy2(scratch / "tool", exe_dir / name)
        # distinct, same size: change one byte of the .comment text; peers compare them, we skip them
        flip_byte(exe_dir / name, (scratch / "tool").read_bytes().index(b"GCC: (") + 6 + n)
        m.executables.append(f"{CORE}/bin/{name}")
    copy_file(exe_dir / "amdclang", site / DEVEL / "bin" / "amdclang")
    m.executables.append(f"{DEVEL}/bin/amdclang")
    m.non_library_groups.append(sorted([f"{CORE}/bin/amdclang", f"{DEVEL}/bin/amdclang"]))
    for i in range(profile.headers):
        rel = f"{DEVEL}/include/{rng.choice(['hip', 'rocblas', 'hipblaslt', 'rocprim', 'hipcub'])}/h{i:04d}.h"
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        text = f"// header {i}\n" + "".join(
            f"#define BENCH_{i}_{k} {rng.getrandbits(48)}\n" for k in range(rng.randint(5, 400))
        )
        (site / rel).write_text(text)
        m.other_files.append(rel)
    same = f"{DEVEL}/include/hip/amd_detail/same_header.h"
    (site / same).parent.mkdir(parents=True, exist_ok=True)
    (site / same).write_text("// identical header\n" * 50)
    shutil.copyfile(site / same, site / f"{CORE}/include_same_header.h")
    m.other_files += [same, f"{CORE}/include_same_header.h"]
    m.non_library_groups.append(sorted([same, f"{CORE}/include_same_header.h"]))
    (site / DEVEL / "lib" / "cmake").mkdir(parents=True, exist_ok=True)
    for stem in MEDIUM_STEMS[:20]:
        rel = f"{DEVEL}/lib/cmake/{stem}-config.cmake"
        (site / rel).write_text(f"# {stem}\nset({stem}_FOUND TRUE)\n" + "#" * rng.randint(10, 3000) + "\n")
        m.other_files.append(rel)

    m.libraries.sort()
    m.groups.sort()
    m.total_bytes = sum((site / p).stat().st_size for p in m.libraries + m.executables + m.other_files)
    shutil.rmtree(scratch, ignore_errors=True)
    return m
