"""`rocm-audit image registry://...`: images read straight from a registry (issue 39).

A real registry (Debian's docker-registry, the distribution project's server) runs on loopback
with its storage in a temporary directory and is stopped by PID; images are pushed into it with
skopeo from docker-save archives the test writes; a second one asks for Basic credentials (an
htpasswd file). The token flow runs against a small registry of
the test's own (http.server on loopback): docker-registry's token auth needs a signing certificate
and a token server, while the client's part of the flow (401 with a Bearer challenge, a token from
the realm with the Docker config's credentials, the token on every request, no credentials sent
to the storage a blob redirect points at) is the same.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.image.layer_writers import docker_save, layer, oci_layout
from support.sdk_tree import build_library

SP = "usr/lib/python3/site-packages"
CORE = f"/{SP}/_rocm_sdk_core/lib/libamd_comgr.so.3"
DEVEL = f"/{SP}/_rocm_sdk_devel/lib/libamd_comgr.so.3"


def _tools_or_skip() -> None:
    missing = [tool for tool in ("docker-registry", "skopeo") if shutil.which(tool) is None]
    if missing:
        reason = f"{' and '.join(missing)} not installed (tests/apt-packages.txt)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(reason)
        pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _docker_registry(base: Path, auth: str = "") -> Iterator[str]:
    """docker-registry on 127.0.0.1:<free port>, storage under ``base``, ``auth`` (config lines)
    added; yields HOST:PORT once /v2/ answers (200, or 401 when it asks for credentials); stopped
    by PID."""
    port = _free_port()
    config = base / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: error\n"
        f"storage:\n  filesystem:\n    rootdirectory: {base / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n" + auth
    )
    process = subprocess.Popen(
        ["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1).close()
                break
            except urllib.error.HTTPError as answer:
                if answer.code == 401:  # up, and asking for credentials
                    break
                time.sleep(0.1)
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("docker-registry did not answer on /v2/ within 10 s")
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """docker-registry, anonymous; yields its HOST:PORT and storage directory."""
    _tools_or_skip()
    base = tmp_path_factory.mktemp("registry")
    with _docker_registry(base) as host:
        yield {"host": host, "storage": base / "data"}


def push(archive: Path, host: str, name: str, creds: str | None = None) -> None:
    subprocess.run(
        [
            "skopeo",
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
            *([f"--dest-creds={creds}"] if creds else []),
            f"docker-archive:{archive}",
            f"docker://{host}/{name}",
        ],
        check=True,
        capture_output=True,
    )


def _bcrypt(password: str) -> str:
    """A bcrypt hash for docker-registry's htpasswd file, from the system's libcrypt (libxcrypt:
    ``$2b$``), the library behind crypt(3); Python's own crypt module is going away."""
    import ctypes

    libcrypt = ctypes.CDLL("libcrypt.so.1")
    libcrypt.crypt.restype = ctypes.c_char_p
    alphabet = b"./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    salt = bytes(alphabet[b % 64] for b in os.urandom(22))
    hashed = libcrypt.crypt(password.encode(), b"$2b$05$" + salt)
    assert hashed and hashed.startswith(b"$2b$05$"), hashed
    return hashed.decode()


@pytest.fixture(scope="module")
def basic_registry(tmp_path_factory):
    """docker-registry that asks for Basic credentials (an htpasswd file: robot / the password)."""
    _tools_or_skip()
    base = tmp_path_factory.mktemp("basic-registry")
    password = base64.b32encode(os.urandom(10)).decode()
    (base / "htpasswd").write_text(f"robot:{_bcrypt(password)}\n")
    auth = f"auth:\n  htpasswd:\n    realm: rocm-audit-test\n    path: {base / 'htpasswd'}\n"
    with _docker_registry(base, auth) as host:
        yield {"host": host, "password": password}


def _docker_config(directory: Path, host: str, user: str, password: str) -> Path:
    directory.mkdir()
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    (directory / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))
    return directory


def test_a_real_registry_with_basic_auth_and_what_a_refusal_tells(run_cli, basic_registry, libs, tmp_path, monkeypatch):
    """Docker's own Basic flow against the real server: the credentials of the Docker config file
    read the image; none, or wrong ones, give one finding that says what to do."""
    host, password = basic_registry["host"], basic_registry["password"]
    archive = docker_save(tmp_path / "save.tar", sdk_layers(libs, b"basic"), tag="team/app:1")
    push(archive, host, "team/app:1", creds=f"robot:{password}")
    ref = f"registry://{host}/team/app:1"
    arguments = ("image", ref, "--insecure-registry", host, "--format", "json")

    # Refused: nothing of the image can be read, an error (exit 2) whatever --fail-on says.
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "none"))
    refused = run_cli("image", ref, "--insecure-registry", host, "--fail-on", "never", expect=2).stderr
    assert f"no credentials for {host} in the Docker config file; `docker login {host}`" in refused
    assert "offset" not in refused

    monkeypatch.setenv("DOCKER_CONFIG", str(_docker_config(tmp_path / "wrong", host, "robot", password + "x")))
    wrong = run_cli("image", ref, "--insecure-registry", host, expect=2).stderr
    assert "HTTP 401" in wrong and "refused the credentials" in wrong

    monkeypatch.setenv("DOCKER_CONFIG", str(_docker_config(tmp_path / "right", host, "robot", password)))
    report = run_cli(*arguments, expect=1).report
    from_archive = run_cli("image", "--archive", str(archive), "--format", "json", expect=1).report
    assert findings_of(report) == findings_of(from_archive)
    assert not [f for f in report["findings"] if f["rule"] in ("IMG001", "IMG005")]
    assert len(report["image"]["layers"]) == 3


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("libs")
    one = build_library(out, "comgr", "libamd_comgr.so.3", payload=os.urandom(120_000))
    two = build_library(out, "other", "libother.so.1", value=2)
    return {"comgr": one.read_bytes(), "other": two.read_bytes()}


def sdk_layers(libs: dict[str, bytes], marker: bytes = b"") -> list[bytes]:
    """Three layers: core, the devel copy of the same library, then a whiteout of another file."""
    return [
        layer(
            (f"{SP}/", None),
            (f"{SP}/_rocm_sdk_core/lib/libamd_comgr.so.3", libs["comgr"]),
            (f"{SP}/_rocm_sdk_core/lib/libother.so.1", libs["other"]),
            (f"{SP}/marker.txt", marker or b"m"),
        ),
        layer((f"{SP}/_rocm_sdk_devel/lib/libamd_comgr.so.3", libs["comgr"])),
        layer((f"{SP}/_rocm_sdk_core/lib/.wh.libother.so.1", b"")),
    ]


def findings_of(report: dict) -> set[tuple[str, str, str]]:
    """Every finding but the source's own (IMG001-IMG007 name the archive member or the URL)."""
    return {
        (f["rule"], f["path"], f["message"])
        for f in report["findings"]
        if f["rule"] not in {f"IMG00{i}" for i in range(1, 8)}
    }


def test_registry_image_gives_the_findings_of_its_archive(run_cli, registry, libs, tmp_path):
    archive = docker_save(tmp_path / "save.tar", sdk_layers(libs), tag="test/sdk:1")
    push(archive, registry["host"], "test/sdk:1")
    ref = f"registry://{registry['host']}/test/sdk:1"
    from_registry = run_cli("image", ref, "--insecure-registry", registry["host"], "--format", "json", expect=1).report
    from_archive = run_cli("image", "--archive", str(archive), "--format", "json", expect=1).report
    assert findings_of(from_registry) == findings_of(from_archive)
    assert ("IMG008", CORE) in {(f["rule"], f["path"]) for f in from_registry["findings"]}
    assert {found[0] for found in findings_of(from_archive)}, "the archive audit found nothing to compare"
    source = from_registry["image"]["source"]
    assert source["kind"] == "registry" and source["platform"] == "linux/amd64"
    assert source["manifest_digest"].startswith("sha256:")
    assert len(from_registry["image"]["layers"]) == 3
    group = next(g for g in from_registry["image"]["waste"]["groups"] if {c["path"] for c in g["copies"]} >= {CORE})
    assert {c["path"] for c in group["copies"]} == {CORE, DEVEL}
    assert group["scope"] == "cross-layer"
    assert not [f for f in from_registry["findings"] if f["rule"] in ("IMG001", "IMG005")]
    # Pinned by digest: the same image.
    pinned = run_cli(
        "image",
        f"registry://{registry['host']}/test/sdk@{source['manifest_digest']}",
        "--insecure-registry",
        registry["host"],
        "--format",
        "json",
        expect=1,
    ).report
    assert findings_of(pinned) == findings_of(from_registry)


def test_platform_is_for_registries_and_an_image_of_another_platform_is_refused(run_cli, registry, libs, tmp_path):
    # A single manifest (no index): its config says linux/amd64; asked for arm64, the audit of an
    # amd64 image is not what was asked for. Without --platform, the config's platform is reported.
    archive = docker_save(tmp_path / "save.tar", sdk_layers(libs, b"platform"), tag="test/platform:1")
    push(archive, registry["host"], "test/platform:1")
    ref = f"registry://{registry['host']}/test/platform:1"
    arguments = ("image", ref, "--insecure-registry", registry["host"])
    other = run_cli(*arguments, "--platform", "linux/arm64", "--fail-on", "never", expect=2).stderr.splitlines()
    assert other == [
        f"rocm-audit: error: {ref} is a linux/amd64 image, not linux/arm64 (--platform)",
        "hint: the registry has no linux/arm64 image of it; leave out --platform to audit this one",
    ]
    same = run_cli(*arguments, "--platform", "linux/amd64", "--format", "json", expect=1).report
    assert same["image"]["source"]["platform"] == "linux/amd64"
    for elsewhere in (["--archive", str(archive)], ["test/platform:1"]):
        result = run_cli("image", *elsewhere, "--platform", "linux/amd64", expect=2)
        assert result.stderr.startswith("rocm-audit: error: --platform is for registry://")
        result = run_cli("image", *elsewhere, "--insecure-registry", registry["host"], expect=2)
        assert result.stderr.startswith("rocm-audit: error: --insecure-registry is for registry://")


def test_without_insecure_registry_tls_is_required(run_cli, registry, libs, tmp_path):
    archive = docker_save(tmp_path / "save.tar", sdk_layers(libs, b"tls"), tag="test/tls:1")
    push(archive, registry["host"], "test/tls:1")
    host = registry["host"]  # plain HTTP
    result = run_cli("image", f"registry://{host}/test/tls:1", "--fail-on", "never", expect=2)
    assert result.stderr == (
        f"rocm-audit: error: {host} does not speak TLS (plain HTTP?): add --insecure-registry {host}\n"
    )
    # The value may be spelled as a URL: its scheme and a trailing slash are dropped.
    for spelled in (f"http://{host}/", f"https://{host}", f"{host}/"):
        run_cli("image", f"registry://{host}/test/tls:1", "--insecure-registry", spelled, expect=1)
    with_path = run_cli("image", f"registry://{host}/test/tls:1", "--insecure-registry", f"http://{host}/v2", expect=2)
    assert f"--insecure-registry takes HOST[:PORT] (127.0.0.1:5000, registry.local), not 'http://{host}/v2'" in (
        with_path.stderr
    )
    # Not found, nothing listening: plain words, exit 2.
    missing = run_cli("image", f"registry://{host}/test/tls:2", "--insecure-registry", host, expect=2)
    assert (
        missing.stderr == f"rocm-audit: error: registry {host} has no image test/tls:2 (HTTP 404: manifest unknown)\n"
    )
    closed = f"127.0.0.1:{_free_port()}"
    refused = run_cli("image", f"registry://{closed}/test/tls:1", expect=2)
    assert (
        refused.stderr
        == f"rocm-audit: error: cannot reach registry {closed}: nothing listens there (connection refused)\n"
    )


def _manifest_digest(host: str, name: str, tag: str) -> tuple[str, int]:
    request = urllib.request.Request(
        f"http://{host}/v2/{name}/manifests/{tag}",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        body = answer.read()
    return "sha256:" + hashlib.sha256(body).hexdigest(), len(body)


def test_platform_is_picked_from_a_manifest_list(run_cli, registry, libs, tmp_path):
    host = registry["host"]
    entries = []
    for arch, marker in (("amd64", b"amd64 image"), ("arm64", b"arm64 image")):
        layers = sdk_layers(libs, marker)
        archive = docker_save(tmp_path / f"{arch}.tar", layers, tag=f"test/multi:{arch}")
        if arch == "arm64":  # the config says arm64 (skopeo keeps the config as it is)
            _rewrite_arch(archive, "arm64", tmp_path)
        push(archive, host, f"test/multi:{arch}")
        digest, size = _manifest_digest(host, "test/multi", arch)
        entries.append(
            {
                "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "digest": digest,
                "size": size,
                "platform": {"os": "linux", "architecture": arch},
            }
        )
    index = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.list.v2+json",
            "manifests": entries,
        }
    ).encode()
    put = urllib.request.Request(
        f"http://{host}/v2/test/multi/manifests/both",
        data=index,
        method="PUT",
        headers={"Content-Type": "application/vnd.docker.distribution.manifest.list.v2+json"},
    )
    urllib.request.urlopen(put, timeout=10).close()
    ref = f"registry://{host}/test/multi:both"
    default = run_cli("image", ref, "--insecure-registry", host, "--format", "json", expect=1).report
    arm = run_cli(
        "image", ref, "--platform", "linux/arm64", "--insecure-registry", host, "--format", "json", expect=1
    ).report
    assert default["image"]["source"]["manifest_digest"] == entries[0]["digest"]
    assert arm["image"]["source"]["manifest_digest"] == entries[1]["digest"]
    assert arm["image"]["source"]["platform"] == "linux/arm64"
    missing = run_cli("image", ref, "--platform", "linux/s390x", "--insecure-registry", host)
    assert missing.exit_code == 2
    assert "linux/amd64" in missing.output and "linux/arm64" in missing.output


def _rewrite_arch(archive: Path, arch: str, tmp_path: Path) -> None:
    import tarfile

    work = tmp_path / f"rewrite-{arch}"
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    manifest = json.loads((work / "manifest.json").read_text())
    config_path = work / manifest[0]["Config"]
    config = json.loads(config_path.read_text())
    config["architecture"] = arch
    config_path.write_text(json.dumps(config))
    with tarfile.open(archive, "w") as tar:
        for child in sorted(work.rglob("*")):
            tar.add(child, arcname=str(child.relative_to(work)), recursive=False)


def test_a_tampered_blob_is_reported_and_the_other_layers_still_read(run_cli, registry, libs, tmp_path):
    host = registry["host"]
    layers = sdk_layers(libs, b"tampered image")
    layers[1] = layer((f"{SP}/_rocm_sdk_devel/lib/libamd_comgr.so.3", libs["comgr"]), (f"{SP}/t.txt", b"tamper me"))
    archive = docker_save(tmp_path / "save.tar", layers, tag="test/tampered:1")
    push(archive, host, "test/tampered:1")
    request = urllib.request.Request(
        f"http://{host}/v2/test/tampered/manifests/1",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        manifest = json.loads(answer.read())
    digest = manifest["layers"][1]["digest"]
    hexdigest = digest.split(":")[1]
    stored = registry["storage"] / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"
    import gzip

    stored.write_bytes(gzip.compress(layers[1] + bytes(2048), mtime=0))  # valid gzip, other bytes
    report = run_cli(
        "image", f"registry://{host}/test/tampered:1", "--insecure-registry", host, "--format", "json"
    ).report
    bad = [f for f in report["findings"] if f["rule"] == "IMG005"]
    assert len(bad) == 1 and bad[0]["data"]["layer"] == 1 and bad[0]["data"]["expected"] == digest
    assert len(report["image"]["layers"]) == 3


class _FakeRegistry(http.server.BaseHTTPRequestHandler):
    """A registry that wants a Bearer token (or Basic credentials) and redirects blobs to storage."""

    documents: dict[str, tuple[bytes, str]] = {}
    blobs: dict[str, bytes] = {}
    mode = "bearer"
    token = "tok-" + os.urandom(8).hex()
    credentials = ("robot", "s3cret")
    storage_port = 0
    seen: list[tuple[str, str, str]] = []  # (server, path, authorization)
    # How many requests a Bearer token serves before it expires (None: never); each expiry makes
    # the token service hand out a new one, as registries' short-lived tokens do.
    token_uses: int | None = None
    served = 0
    tokens_issued = 0
    lock = threading.Lock()

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        authorization = self.headers.get("Authorization", "")
        self.seen.append(("registry", self.path, authorization))
        basic = "Basic " + base64.b64encode(":".join(self.credentials).encode()).decode()
        port = self.server.server_address[1]
        if self.path.startswith("/token"):
            if authorization != basic or "scope=repository%3Atest%2Fsecret%3Apull" not in self.path:
                self._send(401)
                return
            with self.lock:
                type(self).tokens_issued += 1
                token = self.token
            self._send(200, json.dumps({"token": token}).encode())
            return
        with self.lock:
            wanted = f"Bearer {self.token}" if self.mode == "bearer" else basic
            if authorization == wanted and self.mode == "bearer" and self.token_uses is not None:
                type(self).served += 1
                if self.served > self.token_uses:  # expired: refused, and a new one is issued
                    type(self).token, type(self).served = "tok-" + os.urandom(8).hex(), 0
                    wanted = ""
        if authorization != wanted:
            challenge = (
                f'Bearer realm="http://127.0.0.1:{port}/token",service="fake",scope="repository:test/secret:pull"'
                if self.mode == "bearer"
                else 'Basic realm="fake"'
            )
            self._send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', {"WWW-Authenticate": challenge})
            return
        if self.path in self.documents:
            body, media_type = self.documents[self.path]
            self._send(200, body, {"Content-Type": media_type})
            return
        name = self.path.rsplit("/", 1)[-1]
        if "/blobs/" in self.path and name in self.blobs:
            location = f"http://127.0.0.1:{self.storage_port}/storage/{name}"
            self._send(307, b"", {"Location": location})
            return
        self._send(404)


class _Storage(http.server.BaseHTTPRequestHandler):
    """Where blobs are served. ``cuts``: blob name -> how many more of its answers stop halfway
    through (the connection closes with the announced length not sent); ``ranges``: whether a
    Range request gets its part (206) or, as some servers answer, the whole blob (200)."""

    cuts: dict[str, int] = {}
    ranges = True

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        _FakeRegistry.seen.append(("storage", self.path, self.headers.get("Authorization", "")))
        name = self.path.rsplit("/", 1)[-1]
        body = _FakeRegistry.blobs.get(name)
        asked = self.headers.get("Range", "")
        start = int(asked.removeprefix("bytes=").rstrip("-")) if asked and self.ranges and body is not None else 0
        part = (body or b"")[start:]
        self.send_response(404 if body is None else 206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        if self.cuts.get(name, 0) > 0:
            self.cuts[name] -= 1
            part = part[: len(part) // 2]  # and the connection closes (HTTP/1.0: one answer each)
        self.wfile.write(part)


@pytest.fixture
def fake_registry(libs, tmp_path, monkeypatch):
    layout = oci_layout(tmp_path / "oci", sdk_layers(libs, b"fake"))
    index = json.loads((layout / "index.json").read_text())
    manifest_digest = index["manifests"][0]["digest"]
    blobs = {p.name: p.read_bytes() for p in (layout / "blobs" / "sha256").iterdir()}
    _FakeRegistry.blobs = {f"sha256:{name}": data for name, data in blobs.items()}
    manifest = blobs[manifest_digest.split(":")[1]]
    _FakeRegistry.documents = {
        "/v2/test/secret/manifests/1": (manifest, "application/vnd.oci.image.manifest.v1+json"),
    }
    _FakeRegistry.seen = []
    _FakeRegistry.token_uses, _FakeRegistry.served, _FakeRegistry.tokens_issued = None, 0, 0
    _Storage.cuts, _Storage.ranges = {}, True
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) for handler in (_FakeRegistry, _Storage)]
    _FakeRegistry.storage_port = servers[1].server_address[1]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    host = f"127.0.0.1:{servers[0].server_address[1]}"
    config_dir = tmp_path / "docker-config"
    config_dir.mkdir()
    auth = base64.b64encode(":".join(_FakeRegistry.credentials).encode()).decode()
    (config_dir / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config_dir))
    try:
        yield host, manifest_digest
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


@pytest.mark.parametrize("mode", ["bearer", "basic"])
def test_token_and_basic_auth_with_the_docker_config(run_cli, fake_registry, mode, monkeypatch):
    host, manifest_digest = fake_registry
    monkeypatch.setattr(_FakeRegistry, "mode", mode)
    report = run_cli(
        "image", f"registry://{host}/test/secret:1", "--insecure-registry", host, "--format", "json", expect=1
    ).report
    assert report["image"]["source"]["manifest_digest"] == manifest_digest
    assert CORE in {c["path"] for g in report["image"]["waste"]["groups"] for c in g["copies"]}
    storage = [seen for seen in _FakeRegistry.seen if seen[0] == "storage"]
    assert len(storage) >= 4  # config and three layers, fetched from where the redirects point
    assert all(authorization == "" for _, _, authorization in storage)  # no credentials leave the host
    if mode == "bearer":
        assert any(path.startswith("/token") for _, path, _ in _FakeRegistry.seen)


@pytest.mark.parametrize("ranges", [True, False], ids=["range-requests", "server-ignores-range"])
def test_a_layer_download_cut_short_reads_on_where_it_stopped(run_cli, fake_registry, ranges, monkeypatch):
    """Every layer blob's first two answers stop halfway: each is asked again from the byte it
    stopped at (or read past it when the server answers a Range request with the whole blob), and
    the audit equals an undisturbed one, every digest checked."""
    host, _ = fake_registry
    arguments = ("image", f"registry://{host}/test/secret:1", "--insecure-registry", host, "--format", "json")
    undisturbed = run_cli(*arguments, expect=1).report
    manifest = json.loads(_FakeRegistry.documents["/v2/test/secret/manifests/1"][0])
    layers = [descriptor["digest"] for descriptor in manifest["layers"]]
    _FakeRegistry.seen = []
    monkeypatch.setattr(_Storage, "cuts", dict.fromkeys(layers, 2))
    monkeypatch.setattr(_Storage, "ranges", ranges)
    resumed = run_cli(*arguments, expect=1).report
    assert findings_of(resumed) == findings_of(undisturbed)
    assert not [f for f in resumed["findings"] if f["rule"] in ("IMG001", "IMG005")]
    assert resumed["image"]["waste"] == undisturbed["image"]["waste"]
    for digest in layers:
        asked = [path for server, path, _ in _FakeRegistry.seen if server == "registry" and path.endswith(digest)]
        assert len(asked) == 3, asked  # the first answer and two resumes, each through the registry


def test_a_layer_download_that_keeps_breaking_is_unreadable_not_retried_forever(run_cli, fake_registry, monkeypatch):
    host, _ = fake_registry
    manifest = json.loads(_FakeRegistry.documents["/v2/test/secret/manifests/1"][0])
    broken = manifest["layers"][1]["digest"]
    monkeypatch.setattr(_Storage, "cuts", {broken: 100})
    arguments = ("image", f"registry://{host}/test/secret:1", "--insecure-registry", host, "--format", "json")
    report = run_cli(*arguments, expect=1).report
    unreadable = [f for f in report["findings"] if f["rule"] == "IMG001"]
    assert len(unreadable) == 1 and "layer 1 is unreadable" in unreadable[0]["message"]
    assert "closed" in unreadable[0]["message"] and "resumed 3 times" in unreadable[0]["message"]
    assert _Storage.cuts[broken] == 100 - 4  # the first answer and three resumes
    assert len(report["image"]["layers"]) == 3  # the other layers are still read


def test_an_expired_bearer_token_is_asked_for_again(run_cli, fake_registry, monkeypatch):
    """Each token serves two requests (a registry's tokens expire within minutes; a large image's
    later layers are asked for after that): every refusal gets a new token, and the audit equals
    one whose token never expires."""
    host, _ = fake_registry
    arguments = ("image", f"registry://{host}/test/secret:1", "--insecure-registry", host, "--format", "json")
    lasting = run_cli(*arguments, expect=1).report
    assert _FakeRegistry.tokens_issued == 1
    monkeypatch.setattr(_FakeRegistry, "token_uses", 2)
    _FakeRegistry.tokens_issued = 0
    expiring = run_cli(*arguments, expect=1).report
    assert findings_of(expiring) == findings_of(lasting)
    assert not [f for f in expiring["findings"] if f["rule"] in ("IMG001", "IMG005")]
    assert _FakeRegistry.tokens_issued >= 3  # manifest and config, then the three layers (2 each)


def test_wrong_credentials_are_reported_not_retried_forever(run_cli, fake_registry, monkeypatch, tmp_path):
    host, _ = fake_registry
    config_dir = tmp_path / "wrong"
    config_dir.mkdir()
    auth = base64.b64encode(b"robot:wrong").decode()
    (config_dir / "config.json").write_text(json.dumps({"auths": {f"https://{host}": {"auth": auth}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config_dir))
    result = run_cli("image", f"registry://{host}/test/secret:1", "--insecure-registry", host, expect=2)
    assert "401" in result.stderr
    assert len(_FakeRegistry.seen) <= 6


@pytest.mark.parametrize(
    "ref",
    ["registry://", "registry://host", "registry://host/Upper/case", "registry://host/repo:bad tag"],
)
def test_bad_registry_references_are_usage_errors(run_cli, ref):
    result = run_cli("image", ref)
    assert result.exit_code == 2
    assert "registry://HOST" in result.output


def test_a_refused_connection_without_a_port_names_the_port_it_tried():
    from rocm_audit.image.registry import network_words

    bare = network_words("127.0.0.1", ConnectionRefusedError(111, "Connection refused"))
    assert bare.startswith("cannot reach registry 127.0.0.1 on port 443 (registry://127.0.0.1:PORT/... names")
    ported = network_words("127.0.0.1:5000", ConnectionRefusedError(111, "Connection refused"))
    assert ported == "cannot reach registry 127.0.0.1:5000: nothing listens there (connection refused)"
