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
from image_base import LOAD_TWO, REPO, SITE
from image_wheels import CARRIER_942, CARRIER_ALL, FAMILY_TREE, REGISTRANT

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
    assert 'rocm-audit dedup && rocm-audit verify-arch "${GPU_ARCH}" && rocm-audit llvm' in text


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
    # The audit ran in the RUN that installed the SDK, and said what it did.
    assert "rocm-audit" in images.audited_log and "dedup" in images.audited_log


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
