"""`rocm-audit image` on inputs that are no image, or no image it can find: an error (exit 2) that
names the input once and says what it is, in plain words, whatever --fail-on says; damage inside an
image that could be opened stays a finding (IMG001), and a run that read no layer never exits 0.

Every input is real: tar, gzip, xz and zip files written by the standard tools of Python, a
directory, the layer writers' docker-save archives.
"""

from __future__ import annotations

import gzip
import lzma
import zipfile
from pathlib import Path

import pytest

from support.image.layer_writers import docker_save, layer, oci_layout

SP = "usr/lib/python3/dist-packages"


def one_image(tmp_path: Path, tag: str = "test/image:1") -> Path:
    return docker_save(tmp_path / "img.tar", [layer((f"{SP}/pkg/a.py", b"x = 1\n"))], tag=tag)


def _fs_tar(path: Path) -> Path:
    path.write_bytes(layer(("etc/os-release", b"ID=debian\n"), ("usr/bin/true", b"\0" * 100), ("var/log/x", b"")))
    return path


def _two_images(path: Path) -> Path:
    manifest = [
        {"Config": "c.json", "RepoTags": ["a:1"], "Layers": []},
        {"Config": "c.json", "RepoTags": ["b:2"], "Layers": []},
    ]
    return docker_save(path, [layer(("a", b"1"))], manifest=manifest)


def _wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("pkg/__init__.py", "x = 1\n")
    return path


def _truncated(path: Path, tmp_path: Path) -> Path:
    whole = one_image(tmp_path).read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    return path


def _text(path: Path) -> Path:
    path.write_text("# notes\n<family>], and more text that is no tar header\n" * 20)
    return path


def _directory(path: Path) -> Path:
    (path / "etc").mkdir(parents=True)
    (path / "usr").mkdir()
    return path


INPUTS = {
    # name: (make it, words the error must say)
    "text": (lambda p, t: _text(p / "notes.md"), ["is a text file, not an image archive"]),
    "wheel": (lambda p, t: _wheel(p / "x-1.0-py3-none-any.whl"), ["is a wheel (a zip archive)", "rocm-audit check"]),
    "xz": (
        lambda p, t: _bytes(p / "img.tar.xz", lzma.compress(one_image(t).read_bytes())),
        ["is xz-compressed: rocm-audit reads plain, gzip or zstd", "xz -d"],
    ),
    "gzip of text": (
        lambda p, t: _bytes(p / "notes.gz", gzip.compress(b"hello, world\n" * 50)),
        ["is gzip-compressed (read as such), but holds a text file"],
    ),
    "docker export": (lambda p, t: _fs_tar(p / "fs.tar"), ["`docker export` output", "docker save IMAGE"]),
    "root directory": (lambda p, t: _directory(p / "rootfs"), ["is a directory of files", "check -p DIR"]),
    "empty directory": (lambda p, t: _bytes_dir(p / "empty"), ["without manifest.json or index.json"]),
    "two images": (lambda p, t: _two_images(p / "two.tar"), ["holds 2 images: name one as REF", "a:1, b:2"]),
    "truncated": (lambda p, t: _truncated(p / "cut.tar", t), ["is cut short at ", "KiB, inside a member"]),
    "random bytes": (lambda p, t: _bytes(p / "junk.tar", bytes(range(256)) * 8), ["is not a tar archive"]),
}


def _bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _bytes_dir(path: Path) -> Path:
    path.mkdir()
    return path


@pytest.mark.parametrize("kind", list(INPUTS))
def test_an_input_that_is_no_image_is_an_error_that_says_what_it_is(tmp_path, run_cli, kind):
    make, words = INPUTS[kind]
    made = tmp_path / "made"
    made.mkdir()
    path = make(made, tmp_path)
    result = run_cli("image", "--archive", str(path), "gfx942", "--fail-on", "never", "-o", str(tmp_path / "r.json"))
    assert result.exit_code == 2, (kind, result.output)
    assert result.stdout == "" and not (tmp_path / "r.json").exists()  # no report: nothing was audited
    error = result.stderr.splitlines()[0]
    assert error.startswith("rocm-audit: error: ")
    for word in words:
        assert word in result.stderr, (kind, result.stderr)
    assert result.stderr.count(str(path)) == 1, result.stderr  # the path once
    assert "b'" not in result.stderr and "offset 0x" not in result.stderr and "IMG001" not in result.stderr


def test_a_ref_the_archive_does_not_hold_lists_its_tags_and_names_a_near_gpu_target(tmp_path, run_cli):
    archive = one_image(tmp_path)
    missing = run_cli("image", "--archive", str(archive), "other:2", "gfx942", "--fail-on", "never", expect=2)
    said = f"rocm-audit: error: no image tagged 'other:2' in {archive} (its tags: test/image:1)"
    assert missing.stderr.splitlines() == [said]
    target = run_cli("image", "--archive", str(archive), "MI300", expect=2)
    assert target.stderr.splitlines()[1] == (
        "hint: 'MI300' is nearly a GPU target's name: did you mean the target MI300A or MI300X?"
    )
    layout = oci_layout(tmp_path / "oci", [layer(("a", b"1"))], ref="1.0")
    oci = run_cli("image", "--archive", str(layout), "gfx9500x", "--fail-on", "never")
    assert oci.exit_code == 2  # gfx9500x looks like a target: reported as an unknown one


@pytest.mark.parametrize("manifest", [b"{not json", b"[]", b'[{"Layers": "x"}]', b"[" * 100_000])
def test_an_archive_whose_manifest_cannot_be_read_is_an_error(tmp_path, run_cli, manifest):
    archive = docker_save(tmp_path / "save.tar", [layer(("a", b"1"))], manifest=manifest)
    result = run_cli("image", "--archive", str(archive), "--fail-on", "never")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"rocm-audit: error: cannot read {archive} as an image: ")
    assert "Traceback" not in result.output and "(at offset" not in result.output


def test_damage_inside_an_image_stays_a_finding_and_a_run_that_read_nothing_fails(tmp_path, run_cli):
    good = layer((f"{SP}/pkg/a.py", b"x = 1\n" * 500))
    cut = good[:700]  # the first member's data is cut: the layer's rest is missing
    one_bad = docker_save(tmp_path / "one.tar", [good, cut])
    partial = run_cli("image", "--archive", str(one_bad), "--fail-on", "never", "--format", "json", expect=0)
    assert [f["data"]["layer"] for f in partial.report["findings"] if f["rule"] == "IMG001"] == [1]
    every = docker_save(tmp_path / "every.tar", [cut, cut[:600]])
    nothing = run_cli("image", "--archive", str(every), "--fail-on", "never", "--format", "json", expect=1)
    assert sorted(f["data"]["layer"] for f in nothing.report["findings"] if f["rule"] == "IMG001") == [0, 1]
    # A layer the manifest names but the archive lacks: not audited, and never a pass.
    missing = docker_save(tmp_path / "missing.tar", [good], manifest=[{"Layers": ["missing/layer.tar"]}])
    gone = run_cli("image", "--archive", str(missing), "--fail-on", "never", "--format", "json", expect=1)
    assert [f["rule"] for f in gone.report["findings"]] == ["IMG001"]
    assert gone.stderr.startswith("image: not audited: ")


@pytest.mark.parametrize("source", ["broken archive", "registry", "daemon"])
def test_a_target_named_on_the_command_line_is_checked_before_the_image_is_read(tmp_path, run_cli, monkeypatch, source):
    # Each source would fail on its own (a cut archive, a closed port, no daemon): the target is
    # what is said, so it was checked first.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no.sock")
    image = {
        "broken archive": ["--archive", str(_truncated(tmp_path / "cut.tar", tmp_path))],
        "registry": ["registry://127.0.0.1:9/qa/rocm:1"],
        "daemon": ["qa/rocm:1"],
    }[source]
    result = run_cli("image", *image, "-t", "gfx9422", expect=2)
    assert result.stderr.splitlines()[0] == "rocm-audit: error: unknown GPU target 'gfx9422'; did you mean gfx942?"


def test_no_daemon_says_where_it_looked_in_lines_of_100_columns(tmp_path, run_cli, monkeypatch):
    pytest.importorskip("docker")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no.sock")
    result = run_cli("image", "qa/rocm:1", expect=2)
    assert result.stderr.splitlines() == [
        f"rocm-audit: error: no Docker daemon at unix://{tmp_path}/no.sock (from DOCKER_HOST)",
        "hint: start one, set DOCKER_HOST, or use --archive FILE or registry://HOST/REPO:TAG",
    ]
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:9")  # the discard port: nothing listens
    closed = run_cli("image", "qa/rocm:1", expect=2).stderr.splitlines()
    assert closed[0] == "rocm-audit: error: no Docker daemon at tcp://127.0.0.1:9 (from DOCKER_HOST)"
    assert all(len(line) <= 100 for line in closed) and "Error while fetching" not in result.stderr


@pytest.mark.parametrize(
    ("ref", "instead"),
    [
        ("docker://qa-sdk:1", "write qa-sdk:1 for an image in the Docker daemon, or registry://HOST/REPO:TAG"),
        ("docker-archive:/tmp/x.tar", "write --archive /tmp/x.tar for a docker save file"),
        ("oci:/tmp/layout", "write --archive /tmp/layout for an OCI layout directory"),
    ],
)
def test_a_skopeo_transport_as_ref_says_what_to_write(run_cli, ref, instead):
    result = run_cli("image", ref, expect=2)
    assert (
        result.stderr.splitlines()[0]
        == f"rocm-audit: error: {ref!r} is a skopeo transport, not a reference rocm-audit reads"
    )
    assert result.stderr.splitlines()[1].startswith(f"hint: {instead}")
