"""Targets as users write them: any case, product names, near misses, features without a sign,
and the same wording and usage line on every command that takes targets (library and CLI)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rocm_audit.errors import UsageError
from rocm_audit.tree.products import GPU_PRODUCTS, PRODUCT_SOURCES, find_product
from rocm_audit.tree.targets import (
    KNOWN_PROCESSORS,
    kept_target,
    named_products,
    processor_sort_key,
    resolve_required,
    separate_targets,
    split_target_args,
)
from support.toolchain import gfx942_code_object

TARGET_COMMANDS = ("verify-arch", "prune", "check", "image")


def usage_error(spelled: str) -> UsageError:
    with pytest.raises(UsageError) as caught:
        resolve_required(spelled)
    return caught.value


# ---------------------------------------------------------------------------------------------
# Library


@pytest.mark.parametrize(
    ("spelled", "lower"),
    [("GFX942", "gfx942"), ("Gfx950:SRAMECC+", "gfx950:sramecc+"), ("gfx90A:Xnack-", "gfx90a:xnack-")],
)
def test_case_is_folded_and_the_agent_is_the_lower_case_ones(spelled, lower):
    read = resolve_required(spelled)
    assert read.spelled == lower
    assert read.agent == resolve_required(lower).agent
    assert kept_target(spelled) == kept_target(lower)


def test_near_misses_say_did_you_mean():
    assert usage_error("gfx9500").message == "unknown GPU target 'gfx9500'; did you mean gfx950?"
    assert usage_error("gfx1201x").message == "unknown GPU target 'gfx1201x'; did you mean gfx1201?"
    assert usage_error("mi300").message.endswith("did you mean MI300A or MI300X?")
    assert usage_error("MI300Y").message.endswith("did you mean MI300A or MI300X?")
    assert usage_error("mi30ox").message.endswith("did you mean MI300X?")
    # Guesses as near as the best are named too, as many as fit on the line: XT and XTX are as
    # near as each other, and only the first fits.
    rx = usage_error("RX 7900 XTZ").message
    assert rx.endswith("did you mean Radeon RX 7900 XT?") and len(f"rocm-audit: error: {rx}") <= 100
    # Nothing near: no guess, and the hint says what a target looks like.
    far = usage_error("banana")
    assert far.message == "unknown GPU target 'banana'"
    assert far.hint is not None and "gfx942" in far.hint and "MI300X" in far.hint
    # An NVIDIA architecture (a CUDA build's habit) is named as one, with no AMD "nearest" guesses
    for cuda in ("sm_90", "SM_90a", "compute_80"):
        said = usage_error(cuda)
        assert said.message.endswith("is an NVIDIA CUDA architecture: rocm-audit checks code for AMD GPUs")
        assert said.hint is not None and "nearest" not in said.hint and "gfx942" in said.hint


@pytest.mark.parametrize("spelled", ["gfx9500", "gfx90", "gfx1201x", "gfx", "mi300", "7900xtx", "rx 7900"])
def test_the_known_names_in_an_error_are_few_sorted_and_fit_a_line(spelled):
    error = usage_error(spelled)
    assert error.hint is not None
    match = re.fullmatch(r"nearest: (.*); all: rocm-audit verify-arch --list-targets", error.hint)
    assert match, error.hint
    names = match.group(1).split(", ")
    assert 1 <= len(names) <= 5
    if spelled.startswith("gfx"):
        assert names == sorted(names, key=processor_sort_key) and set(names) <= KNOWN_PROCESSORS
    else:
        assert all(find_product(name) is not None for name in names)
    assert len(f"rocm-audit: error: {error.message}") <= 100 and len(f"hint: {error.hint}") <= 100


def test_processor_order_is_numeric():
    assert sorted(["gfx1100", "gfx942", "gfx90a", "gfx1010", "gfx803", "gfx900"], key=processor_sort_key) == [
        "gfx803",
        "gfx900",
        "gfx90a",
        "gfx942",
        "gfx1010",
        "gfx1100",
    ]
    ordered = sorted(KNOWN_PROCESSORS, key=processor_sort_key)
    assert ordered.index("gfx1250") < ordered.index("gfx1250-strict") < ordered.index("gfx1251")


@pytest.mark.parametrize(
    ("spelled", "message"),
    [
        ("gfx942:xnack", "GPU target 'gfx942:xnack': a feature needs + or -: gfx942:xnack+ or gfx942:xnack-"),
        ("GFX950:SRAMECC", "GPU target 'GFX950:SRAMECC': a feature needs + or -: gfx950:sramecc+ or gfx950:sramecc-"),
        ("gfx1100:sramecc+", "GPU target 'gfx1100:sramecc+': gfx1100 has no sramecc feature; write gfx1100 alone"),
        ("gfx900:sramecc-", "GPU target 'gfx900:sramecc-': gfx900 has no sramecc feature; its features: xnack"),
        ("gfx942:xnack+:xnack-", "GPU target 'gfx942:xnack+:xnack-': xnack is given both + and -"),
    ],
)
def test_features_are_explained(spelled, message):
    assert usage_error(spelled).message == message


def test_a_feature_name_that_is_none_is_named():
    message = usage_error("gfx942:tgsplit+").message
    assert "tgsplit+ is not a feature" in message and "sramecc and xnack" in message


# The rows the issue names, written out here (not read from the table): a wrong row fails.
EXPECTED_PRODUCTS = {
    "MI300X": "gfx942",
    "MI300A": "gfx942",
    "MI325X": "gfx942",
    "MI350X": "gfx950",
    "MI355X": "gfx950",
    "MI250X": "gfx90a",
    "MI250": "gfx90a",
    "MI210": "gfx90a",
    "MI100": "gfx908",
    "MI50": "gfx906",
    "MI60": "gfx906",
    "Radeon RX 7900 XTX": "gfx1100",
    "Radeon PRO W7900": "gfx1100",
    "Radeon RX 9070 XT": "gfx1201",
    "Radeon RX 6800 XT": "gfx1030",
}


@pytest.mark.parametrize(("name", "processor"), sorted(EXPECTED_PRODUCTS.items()))
def test_named_products_are_their_processors(name, processor):
    read = resolve_required(name)
    assert (read.spelled, read.agent) == (processor, resolve_required(processor).agent)
    assert read.product is not None and read.product.name == name


def test_every_row_of_the_table_resolves_and_cites_a_source():
    names = [p.name for p in GPU_PRODUCTS]
    assert len(names) == len(set(names))
    for product in GPU_PRODUCTS:
        assert product.processor in KNOWN_PROCESSORS, product
        assert product.sources and set(product.sources) <= set(PRODUCT_SOURCES), product
        assert find_product(product.name) is product  # no other row takes its spelling
        read = resolve_required(product.name)
        assert read.spelled == product.processor and read.product is product


@pytest.mark.parametrize(
    ("spelled", "name"),
    [
        ("MI300X", "MI300X"),
        ("mi300x", "MI300X"),
        ("Instinct MI300X", "MI300X"),
        ("AMD Instinct MI300X", "MI300X"),
        ("mi-300x", "MI300X"),
        ("Radeon Instinct MI50", "MI50"),
        ("RX 7900 XTX", "Radeon RX 7900 XTX"),
        ("rx7900xtx", "Radeon RX 7900 XTX"),
        ("AMD Radeon RX 7900 XTX", "Radeon RX 7900 XTX"),
        ("W7900", "Radeon PRO W7900"),
        ("radeon vii", "Radeon VII"),
    ],
)
def test_product_spellings(spelled, name):
    assert resolve_required(spelled).product.name == name


def test_a_product_takes_features_and_vii_alone_names_nothing():
    read = resolve_required("MI300X:xnack+")
    assert read.spelled == "gfx942:xnack+" and str(read.agent) == "gfx942:sramecc+:xnack+"
    assert find_product("VII") is None  # "Radeon VII" needs its brand: VII alone is no model number


def test_lists_keep_product_names_with_spaces_whole():
    assert split_target_args(["RX", "7900", "XTX", "gfx942;Instinct MI300X", "gfx942"]) == [
        "RX 7900 XTX",
        "gfx942",
        "Instinct MI300X",
    ]
    assert [(given, p.name) for given, p in named_products(["mi300x", "MI300X", "gfx942", "rx7900xtx"])] == [
        ("mi300x", "MI300X"),
        ("rx7900xtx", "Radeon RX 7900 XTX"),
    ]


def test_which_words_are_targets():
    words = ["img", "gfx942", "rocm/pytorch:latest", "MI300X", "RX", "7900", "XTX", "gfx942:xnack", "gfx9500"]
    assert separate_targets(words) == (
        ["gfx942", "MI300X", "RX 7900 XTX", "gfx942:xnack", "gfx9500"],
        ["img", "rocm/pytorch:latest"],
    )
    assert separate_targets(["gfx942;gfx950", "sha256:0123abcd", "localhost:5000/app"]) == (
        ["gfx942;gfx950"],
        ["sha256:0123abcd", "localhost:5000/app"],
    )


# ---------------------------------------------------------------------------------------------
# CLI


@pytest.fixture(scope="module")
def gfx942_dir(tmp_path_factory) -> Path:
    """A directory holding one real gfx942-only code object: gfx942 passes, gfx950 is missing."""
    directory = tmp_path_factory.mktemp("gfx942")
    gfx942_code_object(directory)
    return directory


@pytest.fixture(scope="module")
def tiny_archive(tmp_path_factory) -> Path:
    """A one-layer `docker save` archive with no GPU code, for `image --archive`."""
    from support.image.layer_writers import docker_save, layer

    return docker_save(tmp_path_factory.mktemp("img") / "img.tar", [layer(("etc/", None), ("etc/hostname", b"x\n"))])


def _where(command: str, gfx942_dir: Path, tiny_archive: Path) -> list[str]:
    return ["--archive", str(tiny_archive)] if command == "image" else ["-p", str(gfx942_dir)]


def test_usage_lines_name_targets_the_same_way(run_cli):
    usage = {}
    for command in TARGET_COMMANDS:
        help_text = run_cli(command, "--help", expect=0).output
        (line,) = [line for line in help_text.splitlines() if line.startswith("Usage:")]
        usage[command] = line
    assert usage == {
        "verify-arch": "Usage: rocm-audit verify-arch [OPTIONS] [TARGET]...",
        "prune": "Usage: rocm-audit prune [OPTIONS] [TARGET]...",
        "check": "Usage: rocm-audit check [OPTIONS] [TARGET]...",
        "image": "Usage: rocm-audit image [OPTIONS] [REF] [TARGET]...",
    }


@pytest.mark.parametrize("command", TARGET_COMMANDS)
def test_a_wrong_target_reads_the_same_on_every_command(run_cli, command, gfx942_dir, tiny_archive, monkeypatch):
    monkeypatch.delenv("GPU_ARCH", raising=False)
    where = _where(command, gfx942_dir, tiny_archive)
    near = run_cli(command, "gfx9500", *where, expect=2)
    assert near.stderr.splitlines() == [
        "rocm-audit: error: unknown GPU target 'gfx9500'; did you mean gfx950?",
        "hint: nearest: gfx900, gfx902, gfx904, gfx906, gfx950; all: rocm-audit verify-arch --list-targets",
    ]
    feature = run_cli(command, "gfx942:xnack", *where, expect=2)
    assert feature.stderr.splitlines() == [
        "rocm-audit: error: GPU target 'gfx942:xnack': a feature needs + or -: gfx942:xnack+ or gfx942:xnack-"
    ]
    assert "Traceback" not in near.output + feature.output


@pytest.mark.parametrize("command", ["verify-arch", "prune", "check"])
def test_products_and_any_case_on_every_command(run_cli, command, gfx942_dir, monkeypatch):
    monkeypatch.delenv("GPU_ARCH", raising=False)
    extra = ["--dry-run"] if command == "prune" else []
    result = run_cli(command, "Instinct MI300X", "mi300x", "GFX942", *extra, "-p", str(gfx942_dir), "--format", "json")
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == "MI300X is gfx942"
    assert result.stderr.count("MI300X is gfx942") == 1  # once, however often it is named
    section = result.report["prune"] if command == "prune" else result.report
    if command == "prune":
        assert section["targets"] == ["gfx942"]
    else:
        assert section["targets"] == [{"target": "gfx942", "agent": "gfx942:sramecc+:xnack-"}]
    quiet = run_cli(command, "MI300X", *extra, "-p", str(gfx942_dir), "-q", "--format", "json", expect=0)
    assert quiet.stderr == ""


def test_a_product_name_judges_as_its_processor(run_cli, gfx942_dir):
    """Verdicts do not change: a product is judged exactly as its processor."""
    for product, processor, code in (("MI325X", "gfx942", 0), ("MI355X", "gfx950", 1), ("RX 7900 XTX", "gfx1100", 1)):
        by_name = run_cli("verify-arch", product, "-p", str(gfx942_dir), "--format", "json", expect=code).report
        by_gfx = run_cli("verify-arch", processor, "-p", str(gfx942_dir), "--format", "json", expect=code).report
        assert by_name["carriers"] == by_gfx["carriers"] and by_name["targets"] == by_gfx["targets"]
        assert [c["missing"] for c in by_name["carriers"]] == [[] if code == 0 else [processor]]


def test_prune_without_targets_says_how_to_give_them(run_cli, tmp_path, monkeypatch):
    monkeypatch.delenv("GPU_ARCH", raising=False)
    result = run_cli("prune", "--dry-run", "-p", str(tmp_path), expect=2)
    line, hint = result.stderr.splitlines()
    assert "rocm-audit prune gfx942 gfx950" in line and "GPU_ARCH" in line and "dist_info.json" in hint
    assert "verify-arch" not in line + hint


def test_list_targets_is_sorted_and_fits_the_screen(run_cli):
    result = run_cli("verify-arch", "--list-targets", expect=0)
    lines = result.stdout.splitlines()
    assert all(len(line) <= 100 for line in lines)
    rows = [line.split()[0] for line in lines[1:] if line[:3] == "gfx"]
    assert rows == sorted(KNOWN_PROCESSORS, key=processor_sort_key)
    (gfx942,) = [line for line in lines if line.startswith("gfx942 ")]
    assert gfx942.split(None, 3)[1:] == ["sramecc", "xnack", "MI325X, MI300X, MI300A"]
    assert "Product names from: ROCm GPU hardware specifications" in result.stdout


def test_target_errors_fit_100_columns(run_cli, gfx942_dir, monkeypatch):
    """What a person meets first when a target is wrong or missing: lines of 100 columns at most."""
    monkeypatch.delenv("GPU_ARCH", raising=False)
    for args in (["verify-arch", "gfx9-generic"], ["verify-arch"], ["prune"], ["verify-arch", "sm_90"]):
        said = run_cli(*args, "-p", str(gfx942_dir), expect=2).stderr
        assert said.startswith("rocm-audit: error: ") and all(len(line) <= 100 for line in said.splitlines()), said
