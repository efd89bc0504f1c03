"""The snippets of README.md and docs/dockerfile-ci.md, extracted (no copy is kept here) and run
as written (tests/test_readme.py checks that the two files show the same Dockerfile and GitHub
Actions snippets).

- Set-up: the install command (a read-only `check`), in a fresh bookworm container as root (no sudo there) and as a
  normal user with sudo. It installs from the clone; `./scripts/test` (the whole suite) is not run.
- Dockerfile: built as written by the real engine (its build args pointed at the test wheelhouse),
  passing for GPU_ARCH=gfx942 and failing for a missing target; its audit lines are Dockerfile.rocm's.
- GitHub Actions (README) and GitLab CI (docs/dockerfile-ci.md): every shell step, in order, in a
  clean bookworm container standing in for the runner (GitHub's GITHUB_PATH and GITHUB_STEP_SUMMARY
  files, one `bash -e` per step; GitLab's script as one `bash -e`), in a clone of rocm-audit
  holding an image.tar whose history asks for gfx950, which its code object lacks: every report is
  written and the gate fails.
- No snippet installs rocm-audit from an index by name, and no set-up command starts with a bare sudo.

The containers use the host network only to reach Debian's mirror (apt-get update) and the
wheelhouse this session serves on 127.0.0.1 (PIP_INDEX_URL, as a CI job would set a mirror).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from support.image.image_base import REPO
from support.image.layer_writers import docker_save, layer
from support.toolchain import gfx942_code_object

README = REPO / "README.md"
DOCKERFILE_AND_CI = REPO / "docs" / "dockerfile-ci.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def readme_blocks(page: Path = README) -> list[tuple[str, str, str]]:
    """(section heading, fence language, text) of every fenced block of a page (the README)."""
    text = page.read_text()
    blocks = []
    for match in _FENCE.finditer(text):
        headings = re.findall(r"^## (.+)$", text[: match.start()], re.MULTILINE)
        blocks.append((headings[-1] if headings else "", match.group(1), match.group(2)))
    return blocks


def block(section: str, language: str, index: int = 0, page: Path = README) -> str:
    found = [text for heading, lang, text in readme_blocks(page) if heading.startswith(section) and lang == language]
    assert len(found) > index, f"{page.name} has no {language} block #{index} under '## {section}'"
    return found[index]


def setup_command() -> str:
    """The set-up block's install command (the first command line; comments dropped)."""
    lines = [line for line in block("Set-up", "sh").splitlines() if line.strip() and not line.startswith("#")]
    assert lines[-1] == "./scripts/test"
    return lines[0]


def test_no_snippet_installs_rocm_audit_from_an_index_or_starts_with_sudo():
    by_name = re.compile(
        r"""pip\s+install\b[^\n]*?(?<![\w./-])['"]?rocm[-_]audit(\[[^\]]*\])?(==[^\s'"]*)?['"]?(?=\s|$)"""
    )
    for heading, language, text in readme_blocks() + readme_blocks(DOCKERFILE_AND_CI):
        assert not by_name.search(text), (heading, language, text)
        if language in ("sh", "yaml", "dockerfile"):
            for line in text.splitlines():
                code = line.split("#", 1)[0] if language != "yaml" else line
                assert not re.search(r"(?<!command -v )(?<![\w-])sudo\s", code), (heading, line)
    assert "$(command -v sudo) apt-get update" in setup_command()


def test_the_dockerfile_snippet_runs_dockerfile_rocms_audit_lines():
    snippet = block("In a Dockerfile", "dockerfile").splitlines()
    shipped = (REPO / "Dockerfile.rocm").read_text().splitlines()
    audit = [line for line in snippet if "from=rocm-audit" in line or "/opt/rocm-audit/bin/rocm-audit " in line]
    assert len(audit) == 4, audit
    positions = [shipped.index(line) for line in audit]  # ValueError names a line the file lacks
    assert positions == sorted(positions) and positions[-1] - positions[0] <= 8


# ---------------------------------------------------------------------------------------------
# Run in the real engine.


@pytest.fixture(scope="module")
def clone(build_context, tmp_path_factory) -> Path:
    """A writable copy of what a clone of rocm-audit holds (the set-up and CI steps run in it)."""
    target = tmp_path_factory.mktemp("clone") / "rocm-audit"
    shutil.copytree(build_context, target)
    target.chmod(0o777)  # the normal user in the container writes .venv here
    return target


def _container(docker, image: str, script: str, *, mounts: dict[Path, str], env: dict[str, str], user: str = ""):
    argv = ["run", "--rm", "--network", "host", "--entrypoint", ""]
    for source, target in mounts.items():
        argv += ["-v", f"{source}:{target}"]
    for key, value in env.items():
        argv += ["-e", f"{key}={value}"]
    if user:
        argv += ["--user", user]
    return docker.run(*argv, image, "bash", "-c", script, check=False, timeout=900)


@pytest.fixture(scope="module")
def sudo_image(docker, base_image, tmp_path_factory) -> str:
    """The base plus sudo and a normal user allowed to use it, as on a developer's machine."""
    context = tmp_path_factory.mktemp("sudo")
    (context / "Dockerfile").write_text(
        f"FROM {base_image}\n"
        "RUN apt-get update -qq && apt-get install -y -qq sudo >/dev/null \\\n"
        " && useradd -m builder && echo 'builder ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/builder\n"
    )
    docker.build(context, "rocm-audit-test/sudo:bookworm", context / "Dockerfile", {})
    return "rocm-audit-test/sudo:bookworm"


@pytest.mark.docker
@pytest.mark.parametrize("as_user", ["root", pytest.param("builder", marks=pytest.mark.long)])
def test_setup_command_runs_as_written(docker, base_image, sudo_image, clone, index_url, as_user, tmp_path):
    work = tmp_path / "clone"
    shutil.copytree(clone, work)
    for folder, _, _ in os.walk(work):  # the user's own clone: the build writes its egg-info in src/
        os.chmod(folder, 0o777)
    image = base_image if as_user == "root" else sudo_image
    if as_user == "root":
        assert _container(docker, image, "command -v sudo", mounts={}, env={}).returncode == 1, "fresh: no sudo"
    done = _container(
        docker,
        image,
        # ... and the zstd frame index was built (the command installs a compiler and headers)
        f"cd /clone && {setup_command()} && .venv/bin/python -c 'import rocm_audit.formats._zstdindex'",
        mounts={work: "/clone"},
        env={"PIP_INDEX_URL": index_url},
        user="" if as_user == "root" else "builder",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # A read-only audit of the system python3's site-packages: a summary, no error (no SDK there).
    assert "check: 0 errors" in done.stdout, done.stdout[-2000:]


@pytest.mark.docker
def test_dockerfile_snippet_builds_as_written(docker, base_image, index_url, tmp_path):
    context = tmp_path / "context"
    wheels = context / "rocm-audit-wheel"
    # As the README says: a wheel without the C part, which any base image's Python installs.
    assert "ROCM_AUDIT_PURE_WHEEL=1 python3 -m pip wheel --no-deps -w rocm-audit-wheel" in " ".join(
        README.read_text().split()
    )
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "ROCM_AUDIT_PURE_WHEEL": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (built_wheel,) = wheels.iterdir()
    assert built_wheel.name.startswith("rocm_audit-") and built_wheel.name.endswith("-py3-none-any.whl")
    (context / "Dockerfile").write_text(block("In a Dockerfile", "dockerfile"))
    args = {"BASE_IMAGE": base_image, "ROCM_INDEX_URL": index_url, "PIP_INDEX_URL": index_url}
    built = docker.build(context, "rocm-audit-test/readme:ok", context / "Dockerfile", {**args, "GPU_ARCH": "gfx942"})
    log = built.stdout + built.stderr
    assert "verify-arch: 0 errors" in log and "dedup: 0 errors" in log, log[-3000:]
    # The auditor was mounted, never copied: at most the empty mount point is left (BuildKit of
    # Docker 20.10 keeps the directory it created for the mount; newer BuildKit removes it).
    listed = docker.run(
        "run", "--rm", "--network", "none", "--entrypoint", "", "rocm-audit-test/readme:ok",
        "sh", "-c", "ls /opt; find /opt/rocm-audit -mindepth 1 2>/dev/null | head -3",
    )  # fmt: skip
    assert listed.stdout.split() in (["venv"], ["rocm-audit", "venv"]), listed.stdout
    failed = docker.build(
        context,
        "rocm-audit-test/readme:gfx950",
        context / "Dockerfile",
        {**args, "GPU_ARCH": "gfx942;gfx950"},
        check=False,
    )
    assert failed.returncode != 0 and "gfx950" in failed.stdout + failed.stderr


@pytest.fixture(scope="module")
def image_tar(tmp_path_factory) -> Path:
    """The image a build job would leave: a gfx942 code object, built with GPU_ARCH=gfx942;gfx950."""
    out = tmp_path_factory.mktemp("ci-image")
    code = gfx942_code_object(out / "co").read_bytes()
    sp = "opt/venv/lib/python3.11/site-packages"
    history = ["/bin/sh -c #(nop) ADD file:0 in /", "RUN |1 GPU_ARCH=gfx942;gfx950 /bin/sh -c pip install . # buildkit"]
    return docker_save(out / "image.tar", [layer((f"{sp}/app/kernels.hsaco", code))], history=history)


_GITHUB_DRIVER = """\
set -u
export RUNNER_TEMP=/runner/temp GITHUB_PATH=/runner/path GITHUB_STEP_SUMMARY=/runner/summary.md
mkdir -p "$RUNNER_TEMP" && : > "$GITHUB_PATH" && : > "$GITHUB_STEP_SUMMARY"
cd /workspace
for step in /runner/steps/*.sh; do
  added=$(tac "$GITHUB_PATH" | paste -sd: -)
  PATH="${added:+$added:}$PATH" bash -e "$step"
  code=$?
  echo "${step##*/} $code" >> /runner/codes
done
"""


@pytest.mark.docker
def test_github_actions_snippet_steps_run_as_written(
    docker, base_image, clone, image_tar, index_url, tmp_path, report_validator
):
    workflow = yaml.safe_load(block("Use in CI", "yaml", 0))
    (job,) = workflow["jobs"].values()
    workspace, runner = tmp_path / "workspace", tmp_path / "runner"
    shutil.copytree(clone, workspace)
    (runner / "steps").mkdir(parents=True)
    uses = []
    for index, step in enumerate(job["steps"]):
        if "uses" in step:
            uses.append(step["uses"].split("@")[0])
            if step["uses"].startswith("github/codeql-action/upload-sarif"):
                # after the gate: it must run when the audit found something (exit 1)
                assert index == len(job["steps"]) - 1 and "!cancelled()" in step["if"], step
            if step["uses"].startswith("actions/download-artifact"):
                assert step["with"]["name"] == "image"
                shutil.copy2(image_tar, workspace / "image.tar")
            continue
        (runner / "steps" / f"{index:02}.sh").write_text(step["run"] + "\n")
    assert uses == ["actions/checkout", "actions/download-artifact", "github/codeql-action/upload-sarif"]
    done = _container(
        docker,
        base_image,
        _GITHUB_DRIVER,
        mounts={workspace: "/workspace", runner: "/runner"},
        env={"PIP_INDEX_URL": index_url},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    codes = [int(line.split()[1]) for line in (runner / "codes").read_text().splitlines()]
    assert codes[:-1] == [0] * (len(codes) - 1), (codes, done.stdout[-3000:], done.stderr[-3000:])
    assert codes[-1] == 1, "the last step is the gate: gfx950 is missing"
    assert len(codes) == 2, "one audit run writes every report: the image is read once"
    assert "::error file=/opt/venv/lib/python3.11/site-packages/app/kernels.hsaco" in done.stdout
    assert (workspace / "rocm-audit.sarif").is_file(), (done.stdout[-3000:], done.stderr[-3000:])
    sarif = json.loads((workspace / "rocm-audit.sarif").read_text())  # what upload-sarif would send
    assert sarif["version"] == "2.1.0" and sarif["runs"][0]["results"]
    summary = (runner / "summary.md").read_text()
    assert summary.startswith("### rocm-audit image") and "| library | gfx942 | gfx950 |" in summary
    assert "build arg GPU_ARCH" in summary


@pytest.mark.docker
@pytest.mark.long
def test_gitlab_ci_snippet_script_runs_as_written(
    docker, base_image, clone, image_tar, index_url, tmp_path, report_validator
):
    config = yaml.safe_load(block("Use in CI", "yaml", 1, DOCKERFILE_AND_CI))
    (job,) = config.values()
    workspace = tmp_path / "workspace"
    shutil.copytree(clone, workspace)
    shutil.copy2(image_tar, workspace / "image.tar")  # the artifact of the `build` job it needs
    script = "cd /workspace\n" + "\n".join(job["script"]) + "\n"
    done = _container(docker, base_image, script, mounts={workspace: "/workspace"}, env={"PIP_INDEX_URL": index_url})
    assert done.returncode == 1, (done.returncode, done.stdout[-3000:], done.stderr[-3000:])  # the gate
    for artifact in [job["artifacts"]["reports"]["junit"], *job["artifacts"]["paths"]]:
        assert (workspace / artifact).is_file(), artifact
    from junitparser import JUnitXml

    suites = JUnitXml.fromfile(str(workspace / "rocm-audit.xml"))
    assert any(case.result for suite in suites for case in suite), "the missing target is a failure"
    report = json.loads((workspace / "rocm-audit.json").read_text())
    report_validator.validate(report)
    assert report["targets_origin"]["kind"] == "image-build-arg"
    assert shlex.split(job["script"][0])[:3] == ["python3", "-m", "venv"]
