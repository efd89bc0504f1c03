"""Fixtures for the image tests: a private Docker daemon, an offline base image, wheels, builds.

The daemon is started and stopped by the test script (scripts/dockerd-for-tests); tests find it in
$ROCM_AUDIT_TEST_DOCKER_HOST. Unset: the docker tests fail under CI (CI=true) and skip locally,
with the reason. Images are built once per session with BuildKit through the docker.io CLI
(Docker 20.10: its built-in Dockerfile frontend, no frontend image to pull). Builds use the host
network only to reach the wheel index this session serves on 127.0.0.1.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10
    import tomli as tomllib


from support.image import image_wheels
from support.image.image_base import (
    BASE_PACKAGES,
    BASE_SUITE,
    BASE_TAG,
    DOCKER_HOST_ENV,
    PYTHON_VERSION,
    REPO,
    SITE,
    VENV,
)


def audit_requirements() -> list[str]:
    """What installing rocm-audit in the image needs: its dependencies, its `fast` extra (the CI
    recipes install it to read image layers) and its build backend."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    fast = project["project"]["optional-dependencies"]["fast"]
    return sorted([*project["project"]["dependencies"], *fast, *project["build-system"]["requires"]])


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class Docker:
    """The docker.io CLI against the test daemon (BuildKit on)."""

    host: str
    binary: str

    @property
    def env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "DOCKER_HOST": self.host,
            "DOCKER_BUILDKIT": "1",
        }

    def run(
        self, *args: str, timeout: float = 900, check: bool = True, buildkit: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [self.binary, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**self.env, "DOCKER_BUILDKIT": "1" if buildkit else "0"},
            check=False,
        )
        if check:
            assert done.returncode == 0, (
                f"docker {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
            )
        return done

    def has_image(self, tag: str) -> bool:
        return self.run("image", "inspect", tag, check=False).returncode == 0

    def build(
        self,
        context: Path,
        tag: str,
        dockerfile: Path,
        args: dict[str, str],
        *,
        target: str | None = None,
        check: bool = True,
        buildkit: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        argv = [
            "build",
            "--network",
            "host",
            "--progress",
            "plain",
            "-f",
            str(dockerfile),
            "-t",
            tag,
        ]
        for key, value in args.items():
            argv += ["--build-arg", f"{key}={value}"]
        if target:
            argv += ["--target", target]
        if not buildkit:  # the classic builder has no --progress
            argv.remove("--progress")
            argv.remove("plain")
        return self.run(*argv, str(context), check=check, buildkit=buildkit)


@pytest.fixture(scope="session")
def docker_host() -> str:
    host = os.environ.get(DOCKER_HOST_ENV)
    if not host:
        reason = (
            f"{DOCKER_HOST_ENV} is not set: the image tests need the private daemon that "
            f"scripts/test "
            f'starts (eval "$(scripts/dockerd-for-tests start)")'
        )
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    return host


@pytest.fixture(scope="session")
def docker(docker_host) -> Docker:
    # The docker.io client (20.10) speaks BuildKit without the buildx plugin; newer clients need it.
    binary = "/usr/bin/docker" if os.access("/usr/bin/docker", os.X_OK) else shutil.which("docker")
    assert binary, "docker CLI not found: scripts/test installs docker.io"
    client = Docker(docker_host, binary)
    client.run("version")
    return client


@pytest.fixture(scope="session")
def docker_env(docker_host, monkeypatch_session):
    """DOCKER_HOST for the docker SDK inside rocm-audit (in-process CLI runs)."""
    monkeypatch_session.setenv("DOCKER_HOST", docker_host)
    return docker_host


@pytest.fixture(scope="session")
def monkeypatch_session():
    patcher = pytest.MonkeyPatch()
    yield patcher
    patcher.undo()


@pytest.fixture(scope="session")
def image_cache(cache_dir) -> Path:
    path = Path(cache_dir) / "image"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def base_image(docker, cache_dir) -> str:
    """bookworm + python3-venv + libllvm15 from mmdebstrap (no registry), cached as a tar."""
    key = hashlib.sha256(repr((BASE_SUITE, "apt", tuple(sorted(BASE_PACKAGES)))).encode()).hexdigest()[:12]
    tarball = Path(cache_dir) / f"rootfs-{BASE_SUITE}-{key}.tar"
    if not tarball.exists():
        assert shutil.which("mmdebstrap"), "mmdebstrap not found: scripts/test installs it"
        partial = tarball.with_suffix(".partial.tar")
        done = subprocess.run(
            [
                "mmdebstrap",
                "--variant=apt",
                f"--include={','.join(BASE_PACKAGES)}",
                BASE_SUITE,
                str(partial),
            ],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert done.returncode == 0, f"mmdebstrap failed:\n{done.stderr[-4000:]}"
        partial.rename(tarball)
    if not docker.has_image(BASE_TAG):
        docker.run("import", str(tarball), BASE_TAG)
    return BASE_TAG


@pytest.fixture(scope="session")
def audit_dependency_wheels(cache_dir) -> list[Path]:
    """Wheels of rocm-audit's dependencies for bookworm's CPython 3.11, downloaded once."""
    requirements = audit_requirements()
    key = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:12]
    target = Path(cache_dir) / f"image-pip-{key}"
    stamp = target / ".complete"
    if not stamp.exists():
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--dest",
                str(target),
                "--only-binary=:all:",
                "--python-version",
                PYTHON_VERSION,
                "--implementation",
                "cp",
                "--abi",
                "cp311",
                "--platform",
                "manylinux_2_28_x86_64",
                "--platform",
                "manylinux_2_17_x86_64",
                "--platform",
                "manylinux2014_x86_64",
                "--platform",
                "linux_x86_64",
                *requirements,
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, f"pip download failed:\n{done.stderr[-4000:]}"
        stamp.touch()
    return sorted(target.glob("*.whl"))


@pytest.fixture(scope="session")
def sdk_wheels(tmp_path_factory) -> list[Path]:
    work = tmp_path_factory.mktemp("image-wheels")
    carriers = image_wheels.build_carriers(work / "carriers")
    return image_wheels.build_sdk_wheels(work / "wheels", carriers)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="session")
def index_url(tmp_path_factory, sdk_wheels, audit_dependency_wheels):
    """A PEP 503 index on 127.0.0.1 with the SDK wheels and rocm-audit's dependencies."""
    root = tmp_path_factory.mktemp("index")
    image_wheels.write_simple_index(root, [*sdk_wheels, *audit_dependency_wheels])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def build_context(tmp_path_factory) -> Path:
    """What Dockerfile.rocm needs from a rocm-audit clone (not .git, not .venv)."""
    context = tmp_path_factory.mktemp("context")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, context / name)
    # What a clone holds: not the artefacts of this checkout's editable install (the built
    # extension for this interpreter, setuptools' egg-info).
    shutil.copytree(
        REPO / "src",
        context / "src",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.egg-info"),
    )
    return context


@pytest.fixture(scope="session")
def dockerfile_args(base_image, index_url) -> dict[str, str]:
    """Build arguments that point the shipped Dockerfile.rocm at the local wheelhouse."""
    return {
        "BASE_IMAGE": base_image,
        "PYTHON_VERSION": PYTHON_VERSION,
        "ROCM_INDEX_URL": index_url,
        "PIP_INDEX_URL": index_url,
        "APT_PACKAGES": "",
        "AUDIT_BUILD_PACKAGES": "",  # the offline test base has no apt source: the auditor streams CCOBs
        "GPU_ARCH": "gfx942",
        "VENV": VENV,
    }


@dataclass(frozen=True)
class BuiltImages:
    audited: str  # Dockerfile.rocm, final stage
    plain: str  # the same install without rocm-audit (the reference problem)
    split_plain: str  # _rocm_sdk_core and _rocm_sdk_devel copied by two COPY --from from `plain`
    split_audited: str  # the same two COPY --from from `audited`
    layered: str  # split_plain + a RUN that deletes a duplicate and replaces a directory
    audited_log: str


PLAIN_DOCKERFILE = """\
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG INDEX_URL
RUN python3 -m venv /opt/venv \\
 && /opt/venv/bin/python -m pip install --index-url "${INDEX_URL}" "rocm[libraries,devel]" \\
 && /opt/venv/bin/rocm-sdk init --quiet
"""
SPLIT_DOCKERFILE = f"""\
ARG BASE_IMAGE
ARG FROM_IMAGE
FROM ${{FROM_IMAGE}} AS sdk
FROM ${{BASE_IMAGE}}
COPY --from=sdk {SITE}/_rocm_sdk_core {SITE}/_rocm_sdk_core
COPY --from=sdk {SITE}/_rocm_sdk_devel {SITE}/_rocm_sdk_devel
"""
LAYERED_DOCKERFILE = f"""\
ARG FROM_IMAGE
FROM ${{FROM_IMAGE}}
RUN rm {SITE}/_rocm_sdk_devel/{image_wheels.REGISTRANT} \\
 && rm -rf {SITE}/_rocm_sdk_devel/include \\
 && mkdir -p {SITE}/_rocm_sdk_devel/include/hip \\
 && echo '#define HIP_VERSION 1001' > {SITE}/_rocm_sdk_devel/include/hip/hip_version.h
"""


@pytest.fixture(scope="session")
def images(docker, build_context, dockerfile_args, base_image, index_url, tmp_path_factory) -> BuiltImages:
    """Every image the tests look at, built once per session."""
    files = tmp_path_factory.mktemp("dockerfiles")
    for name, text in (
        ("plain", PLAIN_DOCKERFILE),
        ("split", SPLIT_DOCKERFILE),
        ("layered", LAYERED_DOCKERFILE),
    ):
        (files / f"{name}.Dockerfile").write_text(text)
    audited = docker.build(build_context, "rocm-audit-test/sdk:audited", REPO / "Dockerfile.rocm", dockerfile_args)
    docker.build(
        files,
        "rocm-audit-test/sdk:plain",
        files / "plain.Dockerfile",
        {"BASE_IMAGE": base_image, "INDEX_URL": index_url},
    )
    for source in ("plain", "audited"):
        docker.build(
            files,
            f"rocm-audit-test/split:{source}",
            files / "split.Dockerfile",
            {"BASE_IMAGE": base_image, "FROM_IMAGE": f"rocm-audit-test/sdk:{source}"},
        )
    docker.build(
        files,
        "rocm-audit-test/layered:plain",
        files / "layered.Dockerfile",
        {"FROM_IMAGE": "rocm-audit-test/split:plain"},
    )
    return BuiltImages(
        audited="rocm-audit-test/sdk:audited",
        plain="rocm-audit-test/sdk:plain",
        split_plain="rocm-audit-test/split:plain",
        split_audited="rocm-audit-test/split:audited",
        layered="rocm-audit-test/layered:plain",
        audited_log=audited.stdout + audited.stderr,
    )


@pytest.fixture(scope="session")
def saved(docker, images, tmp_path_factory) -> dict[str, Path]:
    """`docker save` archives of the built images (Docker 20.10 writes the legacy layout)."""
    out = tmp_path_factory.mktemp("saved")
    made = {}
    for name in ("split_plain", "layered", "audited"):
        path = out / f"{name}.tar"
        docker.run("save", "-o", str(path), getattr(images, name))
        made[name] = path
    return made
