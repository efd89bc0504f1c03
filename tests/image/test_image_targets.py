"""Which GPU targets `rocm-audit image` verifies, and the report saying where they came from.

Order: --target; the auditing host's $GPU_ARCH; the image's Env (GPU_ARCH, PYTORCH_ROCM_ARCH); the
build args its history records (GPU_ARCH, PYTORCH_ROCM_ARCH, GPU_ARCHS, AMDGPU_TARGETS); its
dist_info.json (also under TheRock's nonce-renamed tree). Hand-made archives check the order; the
docker-marked tests build images with `ARG GPU_ARCH` and no ENV in a real engine (classic builder
and BuildKit) and read them through the daemon, `docker save`, skopeo and umoci.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from rocm_audit.image.targets import layer_steps, recorded_targets, run_step_args, step_text
from support.image.layer_writers import docker_save, layer, oci_layout
from support.toolchain import gfx942_code_object

SP = "usr/lib/python3/dist-packages"
CLASSIC_RUN = "|2 GPU_ARCH=gfx942;gfx950 PYTHON_VERSION=3.12 /bin/sh -c pip install x"
BUILDKIT_RUN = "RUN |2 GPU_ARCH=gfx942;gfx950 PYTHON_VERSION=3.12 /bin/sh -eu -c pip install x # buildkit"


def test_run_step_args_reads_both_builders_forms():
    for created_by in (CLASSIC_RUN, BUILDKIT_RUN):
        assert run_step_args(created_by) == {"GPU_ARCH": "gfx942;gfx950", "PYTHON_VERSION": "3.12"}
    assert run_step_args("/bin/sh -c #(nop)  ENV GPU_ARCH=gfx942") == {}
    assert run_step_args("COPY /a /b # buildkit") == {}
    # A value with a space runs to the next argument; the command's words are never a value.
    assert run_step_args("|2 GPU_ARCH=gfx942 gfx950 X=1 /bin/sh -c A=2 true") == {"GPU_ARCH": "gfx942 gfx950", "X": "1"}
    # The last value: its target words are kept, the command is not.
    assert run_step_args("|1 GPU_ARCH=gfx942 gfx950:xnack- /bin/sh -c true") == {"GPU_ARCH": "gfx942 gfx950:xnack-"}
    assert run_step_args("|1 NAME=a b /bin/sh -c true") == {"NAME": "a"}


def test_step_text_is_the_dockerfile_line_of_both_builders():
    assert step_text(CLASSIC_RUN) == step_text(BUILDKIT_RUN) == "RUN pip install x"
    assert step_text('/bin/sh -c #(nop)  CMD ["bash"]') == 'CMD ["bash"]'
    assert step_text("/bin/sh -c #(nop) ADD file:abc in / ") == "ADD file:abc in /"
    assert step_text("COPY kernels.hsaco /opt/k # buildkit") == "COPY kernels.hsaco /opt/k"
    assert step_text("RUN /bin/bash -o pipefail -c curl -fsS x | sh # buildkit") == "RUN curl -fsS x | sh"
    assert step_text("RUN /bin/sh -c apt-get update &&\\\n    apt-get install -y g++ # buildkit") == (
        "RUN apt-get update &&\\ apt-get install -y g++"  # one line
    )
    assert step_text("/bin/sh -c python -c 'print(1)'") == "RUN python -c 'print(1)'"
    assert step_text("") == ""


def test_layer_steps_skip_empty_layers_and_refuse_a_history_that_does_not_fit():
    history = [
        {"created_by": "/bin/sh -c #(nop) ADD file:abc in / "},
        {"created_by": "ARG GPU_ARCH", "empty_layer": True},
        {"created_by": BUILDKIT_RUN},
    ]
    assert layer_steps({"history": history}, 2) == ["ADD file:abc in /", "RUN pip install x"]
    assert layer_steps({"history": history}, 3) == []  # a tool rewrote the layers: no guess
    assert layer_steps({"history": [*history, "junk"]}, 2) == []
    assert layer_steps({}, 1) == [] and layer_steps({"history": "x"}, 1) == []


def test_recorded_targets_env_first_then_named_args_with_their_last_value():
    history = [
        "|1 AMDGPU_TARGETS=gfx90a /bin/sh -c make",
        "|1 GPU_ARCHS=gfx1100 /bin/sh -c make",
        "RUN |1 GPU_ARCHS=gfx1201 /bin/sh -c make # buildkit",
        "RUN |1 GPU_ARCH= /bin/sh -c true # buildkit",  # empty: not a target list
    ]
    found = recorded_targets({"PYTORCH_ROCM_ARCH": "gfx942", "PATH": "/bin"}, history)
    assert [(c.value, c.origin) for c in found] == [
        ("gfx942", {"kind": "image-env", "variable": "PYTORCH_ROCM_ARCH"}),
        ("gfx1201", {"kind": "image-build-arg", "variable": "GPU_ARCHS", "history_index": 2}),
        ("gfx90a", {"kind": "image-build-arg", "variable": "AMDGPU_TARGETS", "history_index": 0}),
    ]


@pytest.fixture(scope="module")
def carrier(tmp_path_factory) -> bytes:
    """A real gfx942-only code object: verify-arch fails for gfx950."""
    return gfx942_code_object(tmp_path_factory.mktemp("co")).read_bytes()


def _layers(carrier: bytes, dist_targets: str | None = None, tree: str = "_rocm_sdk_core_r7130") -> list[bytes]:
    members = [(f"{SP}/pkg/kernels.hsaco", carrier)]
    if dist_targets is not None:
        document = json.dumps({"dist_amdgpu_targets": dist_targets}).encode()
        members.append((f"{SP}/{tree}/share/therock/dist_info.json", document))
    return [layer(*members)]


def _image(run_cli, archive: Path, *extra: str, expect: int) -> dict:
    report = run_cli("image", "--archive", str(archive), *extra, "--format", "json", expect=expect).report
    return report


@pytest.mark.parametrize("writer", ["docker-save", "oci-layout"])
def test_targets_from_the_history_when_the_env_has_none(tmp_path, run_cli, carrier, monkeypatch, writer):
    monkeypatch.delenv("GPU_ARCH", raising=False)
    history = ["/bin/sh -c #(nop) ADD file:abc in /", BUILDKIT_RUN]
    if writer == "docker-save":
        archive = docker_save(tmp_path / "save.tar", _layers(carrier), history=history)
    else:
        archive = oci_layout(tmp_path / "oci", _layers(carrier), history=history)
    report = _image(run_cli, archive, expect=1)
    assert [t["target"] for t in report["targets"]] == ["gfx942", "gfx950"]
    assert report["targets_origin"] == {
        "kind": "image-build-arg",
        "variable": "GPU_ARCH",
        "history_index": 1,
        "value": "gfx942;gfx950",
    }
    assert report["targets_source"] == "image history: build arg GPU_ARCH of `RUN pip install x`"
    assert any(f["rule"].startswith("ARCH") and "gfx950" in f["message"] for f in report["findings"])
    text = run_cli("image", "--archive", str(archive), expect=1).output
    assert "(from image history: build arg GPU_ARCH of `RUN pip install x`)" in " ".join(text.split())


def test_each_layer_is_named_by_the_step_that_wrote_it(tmp_path, run_cli, carrier, monkeypatch):
    """JSON gives every layer its step; the text names the step of each layer holding device code."""
    monkeypatch.delenv("GPU_ARCH", raising=False)
    base = layer((f"{SP}/README", b"base"))
    history = [
        "/bin/sh -c #(nop) ADD file:abc in / ",
        {"created_by": "ARG GPU_ARCH=gfx942", "empty_layer": True},
        "RUN |1 GPU_ARCH=gfx942 /bin/sh -c pip install a-very-long-package-name-of-a-kernel-library # buildkit",
    ]
    archive = docker_save(tmp_path / "save.tar", [base, *_layers(carrier)], history=history)
    report = _image(run_cli, archive, expect=0)
    steps = [row.get("step") for row in report["image"]["layers"]]
    assert steps == ["ADD file:abc in /", "RUN pip install a-very-long-package-name-of-a-kernel-library"]
    text = run_cli("image", "--archive", str(archive), expect=0).output
    assert f"image: layer 1 ({steps[1][:45]}...) holds 3.2 KiB" in " ".join(text.split())  # clipped to 48


def test_order_target_then_host_then_env_then_history_then_dist_info(tmp_path, run_cli, carrier, monkeypatch):
    monkeypatch.delenv("GPU_ARCH", raising=False)
    history = ["|1 GPU_ARCH=gfx950 /bin/sh -c true"]
    full = docker_save(
        tmp_path / "full.tar", _layers(carrier, "gfx950"), env=["PYTORCH_ROCM_ARCH=gfx942"], history=history
    )
    # Env (PYTORCH_ROCM_ARCH) beats the history and dist_info.json: gfx942 passes.
    report = _image(run_cli, full, expect=0)
    assert report["targets_origin"]["kind"] == "image-env"
    assert report["targets_source"] == "image config Env PYTORCH_ROCM_ARCH"
    # The auditing host's $GPU_ARCH beats the image.
    monkeypatch.setenv("GPU_ARCH", "gfx950")
    report = _image(run_cli, full, expect=1)
    assert report["targets_origin"] == {"kind": "environment", "variable": "GPU_ARCH", "value": "gfx950"}
    assert report["targets_source"] == "$GPU_ARCH of the auditing host"
    # --target beats everything.
    report = _image(run_cli, full, "--target", "gfx942", expect=0)
    assert report["targets_origin"] == {"kind": "command-line", "value": "gfx942"}
    monkeypatch.delenv("GPU_ARCH")
    # Nothing in Env or history: dist_info.json of the nonce-renamed core tree.
    bare = docker_save(tmp_path / "bare.tar", _layers(carrier, "gfx942;gfx950"))
    report = _image(run_cli, bare, expect=1)
    assert report["targets_origin"]["kind"] == "dist-info"
    assert report["targets_origin"]["path"] == f"/{SP}/_rocm_sdk_core_r7130/share/therock/dist_info.json"
    assert [t["target"] for t in report["targets"]] == ["gfx942", "gfx950"]
    text = run_cli("image", "--archive", str(bare), expect=1).output
    assert f"(from /{SP}/_rocm_sdk_core_r7130/share/therock/dist_info.json)" in " ".join(text.split())


def test_no_recorded_target_is_still_chk001(tmp_path, run_cli, carrier, monkeypatch):
    monkeypatch.delenv("GPU_ARCH", raising=False)
    report = _image(run_cli, docker_save(tmp_path / "s.tar", _layers(carrier)), expect=0)
    assert "CHK001" in {f["rule"] for f in report["findings"]}
    assert "targets" not in report


def test_positional_words_that_are_targets_are_targets(tmp_path, run_cli, carrier, monkeypatch):
    """`image --archive A gfx942`: the word is a target (not an image name), as with -t; a product
    name is its processor; the rest of the words is the image reference."""
    monkeypatch.delenv("GPU_ARCH", raising=False)
    archive = docker_save(tmp_path / "save.tar", _layers(carrier), tag="test/image:1")
    passing = _image(run_cli, archive, "gfx942", expect=0)
    assert passing["targets_origin"] == {"kind": "command-line", "value": "gfx942"}
    failing = _image(run_cli, archive, "GFX950", expect=1)  # the carrier is gfx942-only
    assert [t["target"] for t in failing["targets"]] == ["gfx950"]
    assert any(f["rule"] == "ARCH001" for f in failing["findings"])
    product = run_cli("image", "--archive", str(archive), "MI355X", "--format", "json", expect=1)
    assert product.stderr.splitlines()[0] == "MI355X is gfx950"
    assert [t["target"] for t in product.report["targets"]] == ["gfx950"]
    # Words and -t add up; the image reference may come before or after the targets.
    both = _image(run_cli, archive, "gfx942", "test/image:1", "-t", "gfx950", expect=1)
    assert [t["target"] for t in both["targets"]] == ["gfx942", "gfx950"]  # in numeric order, however given
    assert both["image"]["source"]["tags"] == ["test/image:1"]
    assert not any(f["rule"] == "IMG001" for f in both["findings"])  # the reference was found


def test_a_word_that_is_no_target_stays_the_image_reference(tmp_path, run_cli, carrier, monkeypatch):
    monkeypatch.delenv("GPU_ARCH", raising=False)
    archive = docker_save(tmp_path / "save.tar", _layers(carrier), tag="rocm/pytorch:latest")
    named = _image(run_cli, archive, "rocm/pytorch:latest", "gfx942", expect=0)
    assert named["targets_origin"]["kind"] == "command-line"
    # `img` is a reference this archive does not hold: said once, as the image's, without "image: image:".
    missing = run_cli("image", "--archive", str(archive), "img", "gfx942", "--fail-on", "never")
    assert missing.exit_code == 2  # nothing to audit: an error, not a finding --fail-on could pass
    assert missing.stderr == f"rocm-audit: error: no image tagged 'img' in {archive} (its tags: rocm/pytorch:latest)\n"
    # Two words that are no targets: a usage error naming both.
    two = run_cli("image", "--archive", str(archive), "img", "other", "gfx942", expect=2)
    assert two.stderr.splitlines() == [
        "rocm-audit: error: image takes one image reference, not 'img' and 'other'; neither is a GPU "
        "target (gfx942, MI300X)"
    ]
    three = run_cli("image", "--archive", str(archive), "a", "b", "c", expect=2)
    assert "not 3: 'a', 'b', 'c'; none is a GPU target" in three.stderr
    # A word that looks like a target but is none is reported as a target, not looked up as an image.
    near = run_cli("image", "--archive", str(archive), "gfx9500", expect=2)
    assert near.stderr.splitlines()[0] == "rocm-audit: error: unknown GPU target 'gfx9500'; did you mean gfx950?"


# ---------------------------------------------------------------------------------------------
# Real builds: ARG GPU_ARCH and no ENV, classic builder and BuildKit.

ARG_ONLY_DOCKERFILE = """\
ARG BASE_IMAGE
ARG GPU_ARCH="gfx90a"
FROM ${BASE_IMAGE}
ARG GPU_ARCH
ARG PYTHON_VERSION=3.11
COPY kernels.hsaco /usr/lib/python3/dist-packages/pkg/kernels.hsaco
RUN echo "building for ${GPU_ARCH}" > /built-for
"""


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} not found: scripts/test installs it"
    return path


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def arg_images(docker, base_image, carrier, tmp_path_factory) -> dict[str, str]:
    context = tmp_path_factory.mktemp("arg-context")
    (context / "kernels.hsaco").write_bytes(carrier)
    (context / "Dockerfile").write_text(ARG_ONLY_DOCKERFILE)
    made = {}
    for builder, buildkit in (("classic", False), ("buildkit", True)):
        tag = f"rocm-audit-test/arg-only:{builder}"
        args = {"BASE_IMAGE": base_image, "GPU_ARCH": "gfx942;gfx950"}
        docker.build(context, tag, context / "Dockerfile", args, buildkit=buildkit)
        made[builder] = tag
    return made


@pytest.mark.docker
@pytest.mark.parametrize("builder", [pytest.param("classic", marks=pytest.mark.long), "buildkit"])
def test_real_build_with_arg_only_daemon_and_docker_save(
    run_cli, docker, docker_env, arg_images, builder, tmp_path, monkeypatch
):
    monkeypatch.delenv("GPU_ARCH", raising=False)
    tag = arg_images[builder]
    config = json.loads(docker.run("image", "inspect", tag).stdout)[0]["Config"]
    assert not any(e.startswith("GPU_ARCH=") for e in config.get("Env") or []), "the build arg must not be an ENV"
    saved = tmp_path / "saved.tar"
    docker.run("save", "-o", str(saved), tag)
    for argv in (("image", tag), ("image", "--archive", str(saved))):
        report = run_cli(*argv, "--format", "json", expect=1).report
        assert [t["target"] for t in report["targets"]] == ["gfx942", "gfx950"], (builder, argv)
        assert report["targets_origin"]["kind"] == "image-build-arg"
        assert report["targets_origin"]["variable"] == "GPU_ARCH"
        assert any("gfx950" in f["message"] for f in report["findings"] if f["rule"].startswith("ARCH"))
        if argv[1] == "--archive":  # each layer named by the step that wrote it, as the builder recorded it
            steps = [row.get("step", "") for row in report["image"]["layers"]]
            assert steps[-1] == 'RUN echo "building for ${GPU_ARCH}" > /built-for', (builder, steps)
            assert steps[-2].startswith("COPY ") and steps[-2].endswith(f"/{SP}/pkg/kernels.hsaco"), (builder, steps)


@pytest.mark.docker
@pytest.mark.long
def test_skopeo_and_umoci_archives_carry_the_history(run_cli, docker, arg_images, tmp_path, monkeypatch):
    monkeypatch.delenv("GPU_ARCH", raising=False)
    skopeo, umoci = _tool("skopeo"), _tool("umoci")
    saved = tmp_path / "saved.tar"
    docker.run("save", "-o", str(saved), arg_images["buildkit"])
    layout, archive = tmp_path / "oci", tmp_path / "oci-archive.tar"
    _run(
        skopeo, "--insecure-policy", "copy", "--dest-compress-level", "1", f"docker-archive:{saved}", f"oci:{layout}:b"
    )
    _run(skopeo, "--insecure-policy", "copy", f"oci:{layout}:b", f"oci-archive:{archive}:b")
    for argv in (("--archive", str(layout), "b"), ("--archive", str(archive), "b")):
        report = run_cli("image", *argv, "--format", "json", expect=1).report
        assert report["targets_origin"]["kind"] == "image-build-arg", argv
        assert [t["target"] for t in report["targets"]] == ["gfx942", "gfx950"]
    # A later step (written by umoci) that records another GPU_ARCH: its value, the last one set, wins.
    (tmp_path / "empty.tar").write_bytes(layer((f"{SP}/pkg/README", b"x")))
    _run(
        umoci,
        "raw",
        "add-layer",
        "--image",
        f"{layout}:b",
        "--tag",
        "later",
        "--history.created_by",
        "RUN |1 GPU_ARCH=gfx942 /bin/sh -c true # buildkit",
        str(tmp_path / "empty.tar"),
    )
    report = run_cli("image", "--archive", str(layout), "later", "--format", "json", expect=0).report
    assert [t["target"] for t in report["targets"]] == ["gfx942"]
    assert report["targets_origin"]["variable"] == "GPU_ARCH"
    assert report["targets_origin"]["history_index"] > 0
