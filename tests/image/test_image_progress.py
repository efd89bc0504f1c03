"""`rocm-audit image --archive` on a terminal: each layer is named with its number and the bytes
read so far, then every phase of the audit of the merged view (tests/cli/test_progress.py has the
rules: terminal only, width, rate)."""

from __future__ import annotations

import os
import re

from support.image.layer_writers import docker_save, layer
from support.sdk_tree import build_library
from support.terminal import run_on_terminal

SP = "usr/lib/python3/dist-packages"


def test_image_names_each_layer_and_every_phase_after_it(tmp_path):
    comgr = build_library(tmp_path / "libs", "comgr", "libamd_comgr.so.3", payload=os.urandom(80_000)).read_bytes()
    layers = [
        layer((f"{SP}/_rocm_sdk_core/lib/libamd_comgr.so.3", comgr)),
        layer((f"{SP}/_rocm_sdk_devel/lib/libamd_comgr.so.3", comgr), (f"{SP}/_rocm_sdk_devel/include/a.h", b"a")),
        layer((f"{SP}/_rocm_sdk_devel/include/b.h", b"b" * 5000)),
    ]
    archive = docker_save(tmp_path / "save.tar", layers, env=["GPU_ARCH=gfx942"])
    done = run_on_terminal("image", "--archive", str(archive), env={"ROCM_AUDIT_TEST_REDRAW_S": "0"})
    assert done.returncode in (0, 1), done.output
    drawn = [line for line in done.drawn() if line]
    assert all(line.startswith("image: ") for line in drawn), drawn
    phases = []
    for line in drawn:
        phase = re.sub(r": \d+(/\d+)?(,? .*)?$", "", line.removeprefix("image: "))
        if not phases or phases[-1] != phase:
            phases.append(phase)
    expected = [
        "reading layer 0 (0 to 2)",  # numbered from 0, as in the findings and the JSON report
        "reading layer 1 (0 to 2)",
        "reading layer 2 (0 to 2)",
        "merging the layers",
        "listing files",
        "scanning",
        "comparing 1 candidate group",
        "reading GPU code and ELF facts",
        "post-build checks: symbol versions and DT_NEEDED",
        "placing identical copies in their layers",
    ]
    at = 0
    for label in expected:
        assert label in phases[at:], (label, phases)
        at = phases.index(label, at)
    # how far into a layer: its entries and the bytes read (binary units)
    into = r"image: reading layer 1 \(0 to 2\): \d+ entr(y|ies), \d+\.\d KiB"
    assert any(re.fullmatch(into, line) for line in drawn), drawn
    assert done.drawn()[-1] == ""  # cleared before the report


def test_elapsed_is_the_whole_run_and_the_checks_own_time_is_labelled(tmp_path, run_cli):
    # 24 MiB of layers to read and hash (three files of one size), hardly anything for the checks.
    import time

    bulk = [layer((f"opt/data/{i}.bin", os.urandom(8 << 20))) for i in range(3)]
    archive = docker_save(tmp_path / "save.tar", [layer((f"{SP}/pkg/a.py", b"x = 1\n")), *bulk])
    started = time.monotonic()
    result = run_cli("image", "--archive", str(archive), "--format", "json", expect=0)
    wall = time.monotonic() - started
    report = result.report
    elapsed, checks = report["summary"]["elapsed_s"], report["image"]["checks_elapsed_s"]
    assert checks + 0.02 <= elapsed <= wall + 0.01, (checks, elapsed, wall)  # the run, not its checks
    said = re.search(r", (\d+\.\d) s in all; check: ", result.stderr)
    assert said and abs(float(said.group(1)) - elapsed) <= 0.06, result.stderr


def test_a_container_export_is_said_to_be_flattened_not_one_layer(tmp_path, run_cli):
    # The daemon's export (no --layers) is one tar of the merged files: it has no layers to count.
    from rocm_audit.output.markdown import context_lines
    from rocm_audit.output.text_sections import image_lines

    archive = docker_save(tmp_path / "save.tar", [layer((f"{SP}/pkg/a.py", b"x = 1\n"))] * 2)
    report = run_cli("image", "--archive", str(archive), "--format", "json", expect=0).report
    assert image_lines(report)[0].startswith(f"image: {archive} (docker-save, 2 layers); audited ")
    report["image"]["source"] = {"kind": "daemon", "ref": "qa-rocm:1", "format": "container export", "tags": []}
    report["image"]["layers"] = report["image"]["layers"][:1]
    said = "qa-rocm:1 (flattened: the daemon's container export; --layers reads each layer); audited "
    assert image_lines(report)[0].startswith(f"image: {said}")
    assert context_lines(report)[0].startswith(f"Image {said}")
