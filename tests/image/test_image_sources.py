"""`rocm-audit image` on images built in the real engine: through the daemon (docker SDK) and as
archives written by `docker save`, `skopeo copy` and `umoci` (with a whiteout and an opaque dir)."""

from __future__ import annotations

import json
import os
import shutil
import tarfile

import pytest

from support.image.image_base import SITE
from support.image.image_wheels import CARRIER_942, REGISTRANT
from support.image.layer_writers import layer, member
from support.run import run_checked

pytestmark = pytest.mark.docker

DEVEL_COPY = f"{SITE}/_rocm_sdk_devel/{REGISTRANT}"
CORE_COPY = f"{SITE}/_rocm_sdk_core/{REGISTRANT}"


def rules(report: dict) -> set[str]:
    return {f["rule"] for f in report["findings"]}


def dup_paths(report: dict) -> set[str]:
    return {p for f in report["findings"] if f["rule"] == "DUP001" for p in (f["path"], *f["related_paths"])}


def leftover_containers(docker) -> list[str]:
    done = docker.run("ps", "-a", "-q", "--filter", "label=org.rocm-audit.purpose")
    return done.stdout.split()


def tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} not found: scripts/test installs it"
    return path


def test_daemon_image_with_split_copies(run_cli, docker, docker_env, images):
    result = run_cli("image", images.split_plain, "--format", "json", expect=1)
    report = result.report
    assert report["image"]["source"]["kind"] == "daemon"
    assert {CORE_COPY, DEVEL_COPY} <= dup_paths(report)
    assert report["inputs"] == [images.split_plain]
    assert leftover_containers(docker) == []


def test_daemon_image_built_by_dockerfile_rocm_is_clean(run_cli, docker, docker_env, images):
    report = run_cli("image", images.audited, "--format", "json", expect=0).report
    assert "DUP001" not in rules(report)
    # GPU_ARCH comes from the image's ENV (Dockerfile.rocm keeps it there), not from this host.
    assert [t["target"] for t in report["targets"]] == ["gfx942"]
    assert SITE in report["image"]["audited_paths"]
    text = run_cli("image", images.audited, "--target", "gfx950", expect=1).output
    assert CARRIER_942.rsplit("/", 1)[1] in text
    assert leftover_containers(docker) == []


def test_daemon_layers_show_the_copies_in_two_layers(run_cli, docker, docker_env, images, caplog):
    with caplog.at_level("INFO", logger="rocm_audit.image.daemon"):
        report = run_cli("image", images.split_plain, "--layers", "--format", "json", expect=1).report
    # Whatever layout the engine writes (the legacy one of Debian's docker.io, or Docker 25+'s), a
    # layer no other place shares is applied before the export ends: as it streams past, or from
    # the spool once the layers below it are; none waits for the manifest.
    diff_ids = docker.run("image", "inspect", "--format", "{{json .RootFS.Layers}}", images.split_plain).stdout
    layers = json.loads(diff_ids)
    said = next(r.getMessage() for r in caplog.records if "applied as they streamed" in r.getMessage())
    numbers = [int(word) for word in said.replace(",", " ").split() if word.isdigit()]
    streamed, total, early = numbers[-3:]
    assert total == len(layers) == len(report["image"]["layers"])
    assert streamed >= 1  # the bottom layer (the base image, megabytes) has nothing below it
    if len(set(layers)) == len(layers):
        assert streamed + early == total, said
    waste = report["image"]["waste"]
    group = next(g for g in waste["groups"] if {c["path"] for c in g["copies"]} == {CORE_COPY, DEVEL_COPY})
    assert group["scope"] == "cross-layer" and len(group["layers"]) == 2
    assert waste["later_run_dedup_shrinks_image"] is False
    finding = next(f for f in report["findings"] if f["rule"] == "IMG008" and f["path"] == CORE_COPY)
    assert "no later step can free" in finding["message"]


def test_daemon_hardlink_into_the_sdk_from_a_file_not_extracted(run_cli, docker, docker_env, base_image, tmp_path):
    # A RUN stages a library outside the extracted directories and hardlinks the SDK's name to it;
    # the export lists /aaa before /opt, so its bytes stream past before the link: the audit reads
    # the export again for them, and the devel copy beside the link is found.
    core, devel = f"{SITE}/_rocm_sdk_core/lib/libz.so.1", f"{SITE}/_rocm_sdk_devel/lib/libz.so.1"
    (tmp_path / "Dockerfile").write_text(
        "ARG BASE_IMAGE\n"
        "FROM ${BASE_IMAGE}\n"
        f"RUN mkdir -p /aaa/stage {SITE}/_rocm_sdk_core/lib {SITE}/_rocm_sdk_devel/lib"
        " && cp -L /usr/lib/x86_64-linux-gnu/libz.so.1 /aaa/stage/libz.so.1"
        f" && ln /aaa/stage/libz.so.1 {core} && cp /aaa/stage/libz.so.1 {devel}\n"
    )
    tag = "rocm-audit-test/staged-hardlink:1"
    docker.build(tmp_path, tag, tmp_path / "Dockerfile", {"BASE_IMAGE": base_image})
    try:
        report = run_cli("image", tag, "--format", "json", expect=1).report
    finally:
        docker.run("rmi", tag)
    assert {core, devel} <= dup_paths(report)
    assert not [f for f in report["findings"] if f["rule"] == "IMG002"]
    assert leftover_containers(docker) == []


def test_missing_image_is_a_usage_error(run_cli, docker_env):
    result = run_cli("image", "rocm-audit-test/does-not-exist:1")
    assert result.exit_code == 2


def test_docker_save_with_whiteout_and_replaced_directory(run_cli, saved):
    report = run_cli("image", "--archive", str(saved["layered"]), "--format", "json").report
    assert report["image"]["source"]["format"] == "docker-save"
    assert DEVEL_COPY not in dup_paths(report)  # deleted by the top layer's whiteout
    top = report["image"]["layers"][-1]
    assert top["whiteouts"] + top["opaque_dirs"] >= 2, top
    group = next(g for g in report["image"]["waste"]["groups"] if g["size"] > 50_000_000)
    visible = {c["path"]: c["visible"] for c in group["copies"]}
    assert visible == {
        CORE_COPY: True,
        DEVEL_COPY: False,
    }  # hidden, but its bytes are still in the image
    assert group["scope"] == "cross-layer"
    # The engine's own legacy layout: every <id>/layer.tar checked against its config diff ID, and
    # each one matches (a layer named by its digest, no IMG005).
    assert all(layer["name"].startswith("sha256:") for layer in report["image"]["layers"])
    assert not [f for f in report["findings"] if f["rule"] == "IMG005"]


@pytest.mark.long
def test_skopeo_oci_layout_and_oci_archive_match_docker_save(run_cli, saved, tmp_path):
    skopeo = tool("skopeo")
    layout, archive = tmp_path / "oci", tmp_path / "oci-archive.tar"
    # Uncompressed layers in the layout, zstd in the archive: both as skopeo writes them, and
    # much faster than gzip on the 400 MB base layer.
    run_checked(
        [
            skopeo,
            "--insecure-policy",
            "copy",
            "--dest-oci-accept-uncompressed-layers",
            f"docker-archive:{saved['layered']}",
            f"oci:{layout}:layered",
        ],
        timeout=600,
    )
    run_checked(
        [
            skopeo,
            "--insecure-policy",
            "copy",
            "--dest-compress-format",
            "zstd",
            "--dest-compress-level",
            "1",
            f"oci:{layout}:layered",
            f"oci-archive:{archive}:layered",
        ],
        timeout=600,
    )

    def key(report: dict) -> list[tuple[str, str]]:
        return sorted((f["rule"], f["path"]) for f in report["findings"] if not f["rule"].startswith("IMG00"))

    from_save = run_cli("image", "--archive", str(saved["layered"]), "--format", "json").report
    from_layout = run_cli("image", "--archive", str(layout), "--format", "json").report
    from_archive = run_cli("image", "--archive", str(archive), "layered", "--format", "json").report
    assert from_layout["image"]["source"]["format"] == "oci-layout"
    with tarfile.open(archive) as packed:  # the archive's layers really are zstd
        index = json.load(packed.extractfile("index.json"))
        manifest = json.load(packed.extractfile("blobs/" + index["manifests"][0]["digest"].replace(":", "/")))
    assert {layer["mediaType"] for layer in manifest["layers"]} == {"application/vnd.oci.image.layer.v1.tar+zstd"}
    assert key(from_layout) == key(from_save) == key(from_archive)
    assert from_layout["image"]["waste"]["wasted_bytes"] == from_save["image"]["waste"]["wasted_bytes"]


@pytest.mark.long
def test_umoci_layer_with_whiteout_and_opaque_directory(run_cli, saved, tmp_path):
    skopeo, umoci = tool("skopeo"), tool("umoci")
    layout = tmp_path / "oci"
    run_checked(
        [
            skopeo,
            "--insecure-policy",
            "copy",
            "--dest-compress-level",  # gzip (umoci 0.4 reads nothing else), fast
            "1",
            f"docker-archive:{saved['split_plain']}",
            f"oci:{layout}:split",
        ],
        timeout=600,
    )
    sp = SITE.lstrip("/")
    top = layer(
        (f"{sp}/_rocm_sdk_devel/lib/llvm/lib/.wh.libclang-cpp.so.15", b""),  # deletes the duplicate
        (f"{sp}/_rocm_sdk_devel/include/.wh..wh..opq", b""),  # opaque directory
        (f"{sp}/_rocm_sdk_devel/include/new.h", b"#define NEW 1\n"),
        (f"{sp}/_rocm_sdk_core/.wh..wh.opq", b""),  # misspelled: hides nothing
        member(f"{sp}/_rocm_sdk_devel/evil", kind=tarfile.SYMTYPE, link="../../../../../../../../.."),
    )
    (tmp_path / "top.tar").write_bytes(top)
    run_checked(
        [
            umoci,
            "raw",
            "add-layer",
            "--image",
            f"{layout}:split",
            "--tag",
            "patched",
            str(tmp_path / "top.tar"),
        ],
        timeout=600,
    )
    report = run_cli("image", "--archive", str(layout), "patched", "--format", "json").report
    assert DEVEL_COPY not in dup_paths(report)
    assert CORE_COPY not in dup_paths(report)
    top_stats = report["image"]["layers"][-1]
    assert (top_stats["whiteouts"], top_stats["opaque_dirs"]) == (1, 1)
    assert "IMG006" in rules(report)
    # A link climbing above the root is accepted, as the engine and umoci accept it: in the
    # container its '..' stops at the root (the merged view re-aims it there; test_image_archive).
    assert not [f for f in report["findings"] if f["rule"] == "IMG002"]
    # umoci's own unpack agrees on the merged view.
    bundle = tmp_path / "bundle"
    run_checked([umoci, "unpack", "--rootless", "--image", f"{layout}:patched", str(bundle)], timeout=600)
    rootfs = bundle / "rootfs" / sp
    assert not (rootfs / "_rocm_sdk_devel/lib/llvm/lib/libclang-cpp.so.15").exists()
    assert sorted(p.name for p in (rootfs / "_rocm_sdk_devel/include").iterdir()) == ["new.h"]
    assert os.readlink(rootfs / "_rocm_sdk_devel/evil") == "../../../../../../../../.."
    json.dumps(report)


# --layers from a daemon stays in the default suite through test_daemon_layers_show_the_copies_in_two_layers.
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.long) for name in ("split_plain", "layered")])
def test_daemon_layers_stream_the_save_with_the_findings_of_the_saved_file(
    run_cli, docker, docker_env, images, saved, name, tmp_path, caplog
):
    # `docker save` streamed into the audit gives what the saved archive gives; layers the export
    # names by digest in order are applied as they arrive (Docker 25+), the rest spooled.
    ref = getattr(images, name)
    with caplog.at_level("INFO", logger="rocm_audit.image.daemon"):
        streamed = run_cli("image", ref, "--layers", "--format", "json").report
    from_file = run_cli("image", "--archive", str(saved[name]), "--format", "json").report

    def comparable(report: dict, label: str) -> set[tuple[str, str, str]]:
        return {(f["rule"], f["path"].removeprefix(label), f["message"]) for f in report["findings"]}

    assert comparable(streamed, ref) == comparable(from_file, str(saved[name]))
    assert streamed["image"]["waste"] == from_file["image"]["waste"]
    assert streamed["image"]["source"]["kind"] == "daemon"
    said = [r.getMessage() for r in caplog.records if "applied as they streamed" in r.getMessage()]
    assert said, "the daemon path did not say how many layers streamed"
    if streamed["image"]["source"]["format"] == "docker-save+oci":
        applied, total = (int(word) for word in said[0].split(": ", 1)[1].split()[0:3:2])
        assert applied == total == len(streamed["image"]["layers"])
