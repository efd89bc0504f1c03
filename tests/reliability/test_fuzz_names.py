"""Hypothesis over the name parsers: target ids on the command line, bundle entry ids, and the
per-arch names of kernel databases (Tensile, MIOpen, AOTriton). Whatever the text: a parsed value,
None, or a usage/format error, never another exception."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocm_audit.errors import FormatError, UsageError
from rocm_audit.formats.offload_bundle import parse_entry_id
from rocm_audit.gpu import scanning
from rocm_audit.tree import targets

pytestmark = pytest.mark.fuzz  # hypothesis over generated names

EXAMPLES = 3000 if os.environ.get("ROCM_AUDIT_SLOW") == "1" else 300
NAMES = settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
# Text near the real vocabulary reaches deeper than arbitrary unicode alone.
VOCABULARY = st.sampled_from(
    [
        "gfx",
        "942",
        "950",
        "90a",
        "11xx",
        "-generic",
        ":",
        "sramecc",
        "xnack",
        "+",
        "-",
        "hipv4-",
        "amdgcn-amd-amdhsa-",
        "-unknown-",
        "host-x86_64-unknown-linux",
        ";",
        "_",
        "TensileLibrary_",
        ".co",
        ".hsaco",
        ".kdb",
        "amd-",
        "/",
        "strict",
        "\x00",
    ]
)
NEAR_REAL = st.lists(st.one_of(VOCABULARY, st.text(max_size=3)), max_size=12).map("".join)
ANY_TEXT = st.one_of(NEAR_REAL, st.text(max_size=60))


@NAMES
@given(ANY_TEXT)
def test_target_arguments_parse_or_give_a_usage_error(text):
    for spelled in targets.split_target_args([text]):
        try:
            required = targets.resolve_required(spelled)
        except UsageError as exc:
            assert exc.message
        else:
            assert required.agent.processor in targets.KNOWN_PROCESSORS
    parsed = targets.parse_target_id(text)
    assert parsed is None or parsed.processor


@NAMES
@given(ANY_TEXT)
def test_bundle_entry_ids_parse_or_give_a_format_error(text):
    try:
        parse_entry_id(text)
    except FormatError as exc:
        assert exc.reason


@NAMES
@given(
    st.lists(ANY_TEXT, min_size=1, max_size=5),
    st.sampled_from(["rocblas/library", "hipblaslt/library", "miopen/db", "aotriton.images", "anything"]),
)
def test_kernel_database_names_give_arch_lists(parts, root):
    path = "/sp/_rocm_sdk_libraries/lib/" + root + "/" + "/".join(p.replace("/", "_") or "x" for p in parts)
    found = scanning.database_root(path)
    if found is not None:
        kind, directory, _judged = found
        assert path.startswith(directory)
        arches = scanning.database_arches(kind, os.path.relpath(path, directory))
        assert all(isinstance(a, str) and a.startswith("gfx") for a in arches)
    assert all(t.startswith("gfx") for t in targets.arch_tokens(path))
