"""The shipped Dockerfile.rocm, built in a real Docker engine against the test wheelhouse.

(a) Without the audit, two separate `COPY --from` of the SDK trees split rocm-sdk init's hardlink
    into two files, and loading both copies of the LLVM registrant aborts (TheRock #7818).
(b) Built by Dockerfile.rocm, the devel path is a relative symlink (in the image and after the same
    two COPY steps), and the same load succeeds.
(c) The build fails when GPU_ARCH asks for a target a library lacks, and the log names it.
"""

from __future__ import annotations

import os

import pytest

from support.image.image_base import LOAD_TWO, REPO, SITE
from support.image.image_wheels import CARRIER_942, CARRIER_ALL, FAMILY_TREE, REGISTRANT

pytestmark = pytest.mark.docker

CORE_COPY = f"{SITE}/_rocm_sdk_core/{REGISTRANT}"
DEVEL_COPY = f"{SITE}/_rocm_sdk_devel/{REGISTRANT}"
STAT = (
    "import os, sys\n"
    "for p in sys.argv[1:]:\n"
    "    link = os.readlink(p) if os.path.islink(p) else ''\n"
    "    print(p, os.lstat(p).st_ino, os.path.islink(p), link)\n"
)


def _in_container(docker, image: str, *argv: str):
    return docker.run("run", "--rm", "--network", "none", "--entrypoint", "", image, *argv, check=False)


def _stat(docker, image: str, *paths: str) -> dict[str, tuple[int, bool, str]]:
    done = _in_container(docker, image, "/usr/bin/python3", "-c", STAT, *paths)
    assert done.returncode == 0, done.stderr
    facts = {}
    for line in done.stdout.splitlines():
        path, inode, is_link, text = (line.split(" ") + [""])[:4]
        facts[path] = (int(inode), is_link == "True", text)
    return facts


def test_dockerfile_declares_global_args_before_the_first_from():
    text = (REPO / "Dockerfile.rocm").read_text()
    head = text[: text.index("\nFROM ")]
    for name in ("GPU_ARCH", "PYTHON_VERSION", "BASE_IMAGE", "ROCM_INDEX_URL", "ROCM_SDK_SPEC"):
        assert f"\nARG {name}" in head, name
    assert "# syntax=" not in text
    audit = "/opt/rocm-audit/bin/rocm-audit"
    for step in ('dedup --python "${VENV}/bin/python"', 'verify-arch --python "${VENV}/bin/python" "${GPU_ARCH}"'):
        assert f"{audit} {step}" in text, step
    # The auditor is mounted into the SDK's RUN, never copied into a stage the image is made of.
    assert "--mount=type=bind,from=rocm-audit,source=/opt/rocm-audit,target=/opt/rocm-audit" in text
    assert "COPY --from=rocm-audit" not in text


def test_a_two_copy_steps_split_the_hardlink_and_loading_both_aborts(docker, images):
    sdk = _stat(docker, images.plain, CORE_COPY, DEVEL_COPY)
    assert sdk[CORE_COPY][0] == sdk[DEVEL_COPY][0], "rocm-sdk init should have made a hardlink"
    split = _stat(docker, images.split_plain, CORE_COPY, DEVEL_COPY)
    assert split[CORE_COPY][0] != split[DEVEL_COPY][0], "two COPY --from should split the hardlink"
    assert not split[DEVEL_COPY][1]
    crashed = _in_container(docker, images.split_plain, "/usr/bin/python3", "-c", LOAD_TWO, CORE_COPY, DEVEL_COPY)
    assert crashed.returncode != 0, crashed
    assert "registered more than once!" in crashed.stderr, crashed.stderr[-2000:]
    assert "both loaded" not in crashed.stdout


def test_b_the_audit_step_leaves_relative_symlinks_and_the_load_succeeds(docker, images):
    for image in (images.audited, images.split_audited):
        facts = _stat(docker, image, DEVEL_COPY, f"{SITE}/_rocm_sdk_devel/{CARRIER_ALL}")
        inode, is_link, text = facts[DEVEL_COPY]
        assert is_link and text == f"../../../../_rocm_sdk_core/{REGISTRANT}", (image, facts)
        assert facts[f"{SITE}/_rocm_sdk_devel/{CARRIER_ALL}"][2] == f"../../{FAMILY_TREE}/{CARRIER_ALL}"
        loaded = _in_container(docker, image, "/usr/bin/python3", "-c", LOAD_TWO, CORE_COPY, DEVEL_COPY)
        assert loaded.returncode == 0, (image, loaded.stderr[-2000:])
        assert loaded.stdout.strip() == "both loaded"
    # The audit ran in the RUN that installed the SDK, and said what it did (its own output lines).
    log = images.audited_log
    assert "  linked     " in log and "dedup: 0 errors" in log, log[-3000:]
    assert "verify-arch: 0 errors" in log and "llvm: 0 errors" in log


FIND_TOOLS = (
    "import glob, os, sys\n"
    "site = glob.glob(sys.argv[1] + '/lib/python*/site-packages')[0]\n"
    "names = sorted(n for n in os.listdir(site) if n.split('-')[0].split('.')[0].lower() in "
    "('rocm_audit', 'typer', 'rich', 'click', 'shellingham', 'pygments', 'markdown_it'))\n"
    "print(site, os.path.exists('/opt/rocm-audit'), names)\n"
)


def test_d_the_auditor_is_in_no_layer_of_the_image(docker, images):
    """rocm-audit and its dependencies stay out of the application venv and out of the image."""
    for image in (images.audited, images.split_audited):
        done = _in_container(docker, image, "/usr/bin/python3", "-c", FIND_TOOLS, "/opt/venv")
        assert done.returncode == 0, done.stderr
        site, auditor_present, names = done.stdout.split(" ", 2)
        assert site == SITE and auditor_present == "False", done.stdout
        assert names.strip() == "[]", done.stdout
        # The SDK itself is there: the audit had something to audit.
        listed = _in_container(docker, image, "/bin/ls", SITE)
        assert "_rocm_sdk_core" in listed.stdout and "_rocm_sdk_devel" in listed.stdout


def test_c_the_build_fails_when_gpu_arch_asks_for_a_missing_target(docker, build_context, dockerfile_args):
    args = {**dockerfile_args, "GPU_ARCH": "gfx942;gfx950"}
    failed = docker.build(build_context, "rocm-audit-test/sdk:gfx950", REPO / "Dockerfile.rocm", args, check=False)
    log = failed.stdout + failed.stderr
    assert failed.returncode != 0, log[-3000:]
    assert os.path.basename(CARRIER_942) in log, log[-3000:]
    assert "gfx950" in log
    # The carrier that has gfx950 is not blamed.
    blamed = [line for line in log.splitlines() if "ARCH" in line and os.path.basename(CARRIER_ALL) in line]
    assert not blamed, blamed
