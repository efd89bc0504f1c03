"""What the image tests agree on: the base image, its venv and a two-library load script."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DOCKER_HOST_ENV = "ROCM_AUDIT_TEST_DOCKER_HOST"
BASE_SUITE = "bookworm"
# libLLVM-15.so.1, which libclang-cpp.so.15 (the test registrant) needs; venv brings pip.
BASE_PACKAGES = ("libllvm15", "python3-venv")
BASE_TAG = "rocm-audit-test/base:bookworm"
PYTHON_VERSION = "3.11"  # bookworm's python3
VENV = "/opt/venv"
SITE = f"{VENV}/lib/python{PYTHON_VERSION}/site-packages"


LOAD_TWO = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(sys.argv[1], mode=os.RTLD_LOCAL)\n"
    "ctypes.CDLL(sys.argv[2], mode=os.RTLD_LOCAL)\n"
    "print('both loaded')\n"
)
