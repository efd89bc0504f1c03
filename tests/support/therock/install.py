"""Install the fixture's wheels with real pip into a fresh venv, and the operations that split hardlinks."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from support.therock.artifacts import ArtifactTree, build_artifacts
from support.therock.packaging import BuiltIndex, build_index

ARCHES = ("gfx90a", "gfx942")
SPLIT_KINDS = ("cp-r", "devel-copy", "per-tree", "tar-hard-dereference", "reinstall-core", "reinstall-libraries")

_session_root: Path | None = None
_artifact_cache: dict[tuple[bool, str], ArtifactTree] = {}
_index_cache: dict[tuple[object, ...], BuiltIndex] = {}


def _session_dir() -> Path:
    """One temp dir per Python process for compiled artifacts and wheel indexes (removed at exit)."""
    global _session_root
    if _session_root is None:
        _session_root = Path(tempfile.mkdtemp(prefix="therock-fixture-"))
        atexit.register(shutil.rmtree, _session_root, True)
    return _session_root


def cached_index(
    *,
    nonce: str = "",
    legacy_families: tuple[str, ...] = (),
    kpack: bool = True,
    member_order: str = "sorted",
    compress_devel: bool = False,
    kpack_flow: str = "kpm",
    flow: str = "kpack-split",
) -> BuiltIndex:
    """Artifacts are compiled once per process; each option set is packaged once."""
    built = (kpack, kpack_flow)
    if built not in _artifact_cache:
        _artifact_cache[built] = build_artifacts(
            _session_dir() / f"artifacts-kpack{int(kpack)}-{kpack_flow}", ARCHES, kpack=kpack, kpack_flow=kpack_flow
        )
    key = (nonce, tuple(legacy_families), kpack, member_order, compress_devel, kpack_flow, flow)
    if key not in _index_cache:
        name = f"index-{len(_index_cache)}"
        _index_cache[key] = build_index(
            _artifact_cache[built],
            _session_dir() / name,
            nonce=nonce,
            legacy_families=tuple(legacy_families),
            member_order=member_order,
            compress_devel=compress_devel,
            flow=flow,
        )
    return _index_cache[key]


@dataclass
class TheRockInstall:
    """A venv holding ``rocm[libraries,devel,device-gfx90a,device-gfx942]`` installed by pip from ``index_dir``.

    ``platform_dir(logical)`` gives ``site_packages / "_rocm_sdk_<logical>" + nonce`` (core, libraries, devel).
    """

    venv: Path
    python: Path
    site_packages: Path
    index_dir: Path
    version: str
    nonce: str
    arches: tuple[str, ...]
    legacy_families: tuple[str, ...]
    # More wheel directories pip searches: a legacy build's dist/<family>/ (its devel and meta).
    extra_links: tuple[Path, ...] = ()

    def platform_dir(self, logical: str) -> Path:
        return self.site_packages / f"_rocm_sdk_{logical.replace('-', '_')}{self.nonce}"

    @property
    def core(self) -> Path:
        return self.platform_dir("core")

    @property
    def libraries(self) -> Path:
        return self.platform_dir("libraries")

    @property
    def devel(self) -> Path:
        return self.platform_dir("devel")

    def env(self) -> dict[str, str]:
        # `rocm-sdk test` expects the venv to be active (tools on PATH).
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.venv)
        return env

    def run_python(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.python), *args], capture_output=True, text=True, env=self.env(), timeout=timeout, cwd=self.venv
        )

    def run_rocm_sdk(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``python -m rocm_sdk <args>`` in the venv; never raises on a non-zero exit."""
        return self.run_python("-m", "rocm_sdk", *args, timeout=timeout)

    def pip(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The project's pip driving this venv's interpreter (``pip --python``), offline, from ``index_dir``."""
        argv = [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(self.python),
            "--disable-pip-version-check",
            "--no-input",
            *args,
        ]
        if args and args[0] == "install":
            argv += ["--no-index", "--find-links", str(self.index_dir)]
            for directory in self.extra_links:
                argv += ["--find-links", str(directory)]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise RuntimeError(f"pip {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
        return result

    def preload_after_devel_hip(self) -> subprocess.CompletedProcess[str]:
        """Load devel's ``lib/libamdhip64.so`` RTLD_GLOBAL, then upstream's standard preload (the #7818 path)."""
        code = (
            "import ctypes, sys, rocm_sdk; ctypes.CDLL(sys.argv[1], ctypes.RTLD_GLOBAL); "
            "rocm_sdk.preload_libraries('amd_comgr', 'amdhip64', 'hiprtc', 'rocm_kpack'); print('loaded')"
        )
        return self.run_python("-c", code, str(self.devel / "lib" / "libamdhip64.so"))

    def split(self, kind: str) -> None:
        """Apply one hardlink-splitting operation in place (see SPLIT_KINDS)."""
        sp = self.site_packages
        if kind == "cp-r":
            _replace_with(sp, ["cp", "-r"])  # no hardlink preservation anywhere
        elif kind == "devel-copy":
            _replace_with(self.devel, ["cp", "-a"])  # devel copied on its own: keeps devel's inner links
        elif kind == "per-tree":
            # One `COPY --from` per tree: hardlinks kept inside each tree, split between trees.
            for tree in sorted(sp.glob("_rocm_sdk_*")):
                _replace_with(tree, ["cp", "-a"])
        elif kind == "tar-hard-dereference":
            staging = sp.with_name(sp.name + ".tar-split")
            staging.mkdir()
            archive = subprocess.Popen(
                ["tar", "--hard-dereference", "-C", str(sp), "-cf", "-", "."], stdout=subprocess.PIPE
            )
            subprocess.run(["tar", "-C", str(staging), "-xf", "-"], stdin=archive.stdout, check=True)
            assert archive.wait() == 0
            shutil.rmtree(sp)
            staging.rename(sp)
        elif kind == "reinstall-core":
            self.pip("install", "--force-reinstall", "--no-deps", f"rocm-sdk-core=={self.version}")
        elif kind == "reinstall-libraries":
            self.pip("install", "--force-reinstall", "--no-deps", f"rocm-sdk-libraries=={self.version}")
        else:
            raise ValueError(f"unknown split kind {kind!r} (one of {SPLIT_KINDS})")


def _replace_with(directory: Path, copy_argv: list[str]) -> None:
    copy = directory.with_name(directory.name + ".split-copy")
    subprocess.run([*copy_argv, str(directory), str(copy)], check=True)
    shutil.rmtree(directory)
    copy.rename(directory)


def build_therock_install(
    tmp_path: Path,
    *,
    nonce: str = "",
    legacy_families: tuple[str, ...] = (),
    kpack: bool = True,
    extras: tuple[str, ...] | None = None,
    member_order: str = "sorted",
    compress_devel: bool = False,
    init: bool = False,
    kpack_flow: str = "kpm",
    flow: str = "kpack-split",
) -> TheRockInstall:
    """Build (cached per process) and pip-install a TheRock-faithful ROCm wheel SDK into ``tmp_path / "venv"``.

    ``extras`` defaults to ``libraries, devel, device-<arch>`` for every arch; ``legacy_families`` (e.g.
    ``("gfx94X-dcgpu", "gfx90X-dcgpu")``) also installs those per-family libraries wheels; ``init`` runs
    ``rocm-sdk init`` (otherwise devel stays a tarball until the first init/path/test); ``kpack_flow`` picks the
    kpack splitter the artifacts went through (``artifacts.build_artifacts``). ``flow="legacy"`` packages
    as ``_run_legacy`` does (``packaging.build_index``; give ``kpack=False``): pip installs ``rocm[<extras>]``
    (default ``libraries, devel``) of the first of ``legacy_families`` from its ``dist/<family>/``, and the
    other families' libraries wheels beside it.
    """
    index = cached_index(
        nonce=nonce,
        legacy_families=legacy_families,
        kpack=kpack,
        member_order=member_order,
        compress_devel=compress_devel,
        kpack_flow=kpack_flow,
        flow=flow,
    )
    legacy_flow = flow == "legacy"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    site_packages = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('platlib'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    install = TheRockInstall(
        venv,
        python,
        site_packages,
        index.index_dir,
        index.version,
        nonce,
        index.arches,
        tuple(legacy_families),
        extra_links=(index.index_dir / legacy_families[0],) if legacy_flow else (),
    )
    default_extras = (
        ("libraries", "devel") if legacy_flow else ("libraries", "devel", *(f"device-{a}" for a in index.arches))
    )
    chosen = extras if extras is not None else default_extras
    requirements = [f"rocm[{','.join(chosen)}]=={index.version}"]
    also = legacy_families[1:] if legacy_flow else legacy_families
    requirements += [f"rocm-sdk-libraries-{family}=={index.version}" for family in also]
    install.pip("install", *requirements)
    if init:
        result = install.run_rocm_sdk("init")
        if result.returncode != 0:
            raise RuntimeError(f"rocm-sdk init failed:\n{result.stdout}\n{result.stderr}")
    return install
