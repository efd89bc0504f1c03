"""Read an image straight from a registry over the OCI distribution API: no daemon, no full copy.

``registry://HOST[:PORT]/REPO[:TAG|@DIGEST]`` (the prefix docker scout uses). The manifest (Docker
v2 schema 2 or OCI; through an image index or a Docker manifest list, the platform picked by
``--platform``) and the config are fetched into memory (at most MAX_DOCUMENT_BYTES each, checked
against their digests); the layer blobs are streamed, one connection per layer, into the same
parallel pipeline as archive layers (image/layerpipe.py), which checks each blob's digest as it
streams past.

Client: plain ``http.client``, not a registry library: no new dependency, and full control of
what streams and of every loop (redirects, auth rounds, index depth are all bounded). Auth:
anonymous, then what the registry's 401 asks for: Basic, or a Bearer token from its token
endpoint (anonymous or with the Basic credentials), credentials from the Docker config file
(``$DOCKER_CONFIG/config.json`` or ``~/.docker/config.json``, its ``auths``; credential helpers
are not run). TLS is verified, except for hosts named with ``--insecure-registry``: for those
HTTPS is tried without verification and plain HTTP is used when the host does not speak TLS.
Authorization is never sent to another host than the one that asked for it (blob redirects to
storage).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import logging
import os
import re
import socket
import ssl
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from rocm_audit.errors import FormatError, UsageError
from rocm_audit.image import tarstream
from rocm_audit.image.archive import ImageLayout, LayerRef, Store

log = logging.getLogger(__name__)

PREFIX = "registry://"
MAX_DOCUMENT_BYTES = 4 << 20  # a manifest, an index, a config, a token answer
MAX_REDIRECTS = 5
MAX_AUTH_ROUNDS = 2
MAX_RESUMES = 3  # a layer blob opened again where its connection broke, at most this often
MAX_INDEX_DEPTH = 2
TIMEOUT = 60.0
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
_REF = re.compile(
    r"^(?P<host>[A-Za-z0-9.-]+(?::\d{1,5})?|\[[0-9A-Fa-f:]+\](?::\d{1,5})?)/"
    r"(?P<repo>[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True, slots=True)
class RegistryRef:
    host: str  # host[:port]
    repository: str
    reference: str  # tag or digest
    text: str

    @property
    def pinned(self) -> str | None:
        return self.reference if self.reference.startswith("sha256:") else None


def is_registry_ref(text: str) -> bool:
    return text.startswith(PREFIX)


def parse_ref(text: str) -> RegistryRef:
    """``registry://HOST[:PORT]/REPO[:TAG|@DIGEST]``; the tag defaults to ``latest``. UsageError."""
    match = _REF.match(text[len(PREFIX) :]) if is_registry_ref(text) else None
    if not match:
        raise UsageError(
            f"not a registry reference: {text!r}; write registry://HOST[:PORT]/REPO[:TAG|@DIGEST], "
            "for example registry://ghcr.io/org/image:1.0"
        )
    reference = match["digest"] or match["tag"] or "latest"
    return RegistryRef(match["host"], match["repo"], reference, text)


DEFAULT_PLATFORM = "linux/amd64"


def parse_platform(text: str) -> tuple[str, str, str | None]:
    """``os/arch[/variant]`` -> parts. UsageError."""
    parts = text.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise UsageError(f"--platform takes OS/ARCH[/VARIANT] (linux/amd64, linux/arm64/v8), not {text!r}")
    return parts[0], parts[1], parts[2] if len(parts) == 3 else None


HELPER_ONLY = ("", "")  # no credentials for the host, but the file names a credential helper


def docker_config_auth(host: str, environ: dict[str, str] | None = None) -> tuple[str, str] | None:
    """(user, password) for ``host`` from the Docker config file's ``auths``; None when it has
    none; HELPER_ONLY when it has none but names a credential helper (not run: out of scope)."""
    env = os.environ if environ is None else environ
    directory = env.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"), ".docker")
    path = os.path.join(directory, "config.json")
    try:
        with open(path, "rb") as handle:
            config = json.loads(handle.read(MAX_DOCUMENT_BYTES))
    except (OSError, ValueError, RecursionError):  # RecursionError: nested too deeply
        return None
    auths = config.get("auths") if isinstance(config, dict) else None
    if not isinstance(auths, dict):
        return None
    for key, entry in auths.items():
        name = urllib.parse.urlsplit(key).netloc if "://" in key else key.split("/", 1)[0]
        if name != host or not isinstance(entry, dict):
            continue
        if isinstance(entry.get("auth"), str):
            try:
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                continue
            return user, password
        if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
            return entry["username"], entry["password"]
    if config.get("credHelpers") or config.get("credsStore"):
        log.info("%s: the Docker config names a credential helper; helpers are not run", host)
        return HELPER_ONLY
    return None


@dataclass(slots=True)
class Client:
    """One registry host: connections, auth, bounded requests."""

    host: str
    insecure: bool = False
    credentials: tuple[str, str] | None = None
    scheme: str = ""  # "https" or "http", decided on the first request
    tokens: dict[str, str] = field(default_factory=dict)  # scope -> bearer token
    basic: bool = False  # the registry asked for Basic
    helper_named: bool = False  # the Docker config file names a credential helper (not run)

    def _connect(self, scheme: str, netloc: str) -> http.client.HTTPConnection:
        if scheme == "http":
            return http.client.HTTPConnection(netloc, timeout=TIMEOUT)
        context = ssl.create_default_context()
        if self.insecure and netloc == self.host:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return http.client.HTTPSConnection(netloc, timeout=TIMEOUT, context=context)

    def _scheme(self) -> str:
        if self.scheme:
            return self.scheme
        if not self.insecure:
            self.scheme = "https"
            return self.scheme
        connection = self._connect("https", self.host)
        try:
            connection.request("GET", "/v2/")
            connection.getresponse().close()
            self.scheme = "https"
        except (ssl.SSLError, http.client.HTTPException, ConnectionResetError):
            self.scheme = "http"  # an insecure registry that does not speak TLS
        except OSError as exc:
            raise UsageError(network_words(self.host, exc)) from None
        finally:
            connection.close()
        return self.scheme

    def get(self, path: str, accept: tuple[str, ...] = (), scope: str = "", start: int = 0) -> http.client.HTTPResponse:
        """GET ``path`` of the registry, following redirects and auth challenges (bounded); from
        byte ``start`` on when it is not 0 (a Range request). Returns a response with status 200,
        or 206 for a Range request; raises FormatError for any other answer."""
        url = f"{self._scheme()}://{self.host}{path}"
        auth_rounds = 0
        redirects = 0
        while True:
            parts = urllib.parse.urlsplit(url)
            headers = {"User-Agent": "rocm-audit", "Accept": ", ".join(accept) or "*/*"}
            if start:
                headers["Range"] = f"bytes={start}-"
            authorization = self._authorization(scope) if parts.netloc == self.host else ""
            if authorization:
                headers["Authorization"] = authorization
            connection = self._connect(parts.scheme, parts.netloc)
            try:
                connection.request(
                    "GET", urllib.parse.urlunsplit(("", "", parts.path, parts.query, "")), headers=headers
                )
                response = connection.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                if isinstance(exc, OSError) and parts.netloc == self.host:  # the registry itself
                    raise FormatError("registry", 0, network_words(self.host, exc)) from None
                raise FormatError("registry", 0, f"{self.host}: GET {path}: {exc}") from None
            if response.status == 200 or (start and response.status == 206):
                return response
            body = response.read(MAX_DOCUMENT_BYTES)
            connection.close()
            if response.status in (301, 302, 303, 307, 308) and redirects < MAX_REDIRECTS:
                location = response.getheader("Location") or ""
                target = urllib.parse.urljoin(url, location)
                if urllib.parse.urlsplit(target).scheme not in ("http", "https"):
                    raise FormatError("registry", 0, f"{self.host}: GET {path}: redirect to {location!r}")
                url, redirects = target, redirects + 1
                continue
            if response.status == 401 and auth_rounds < MAX_AUTH_ROUNDS and parts.netloc == self.host:
                auth_rounds += 1
                if self._answer(response.getheader("WWW-Authenticate") or "", scope, authorization):
                    continue
            status = _status(response.status, body)
            if response.status == 401:
                status += f": {self._login_hint()}"
            raise HttpError(response.status, f"{self.host}: GET {path}: {status}")

    def _login_hint(self) -> str:
        """What a refused request asks of the user: credentials, other credentials, or a helper's."""
        if self.credentials is not None:
            return f"the registry refused the credentials the Docker config file has for {self.host}"
        helper = " (it names a credential helper, which rocm-audit does not run)" if self.helper_named else ""
        where = f"{self.host} in the Docker config file{helper}"
        return f"no credentials for {where}; `docker login {self.host}` writes them"

    def _authorization(self, scope: str) -> str:
        token = self.tokens.get(scope)
        if token:
            return f"Bearer {token}"
        if self.basic and self.credentials:
            raw = f"{self.credentials[0]}:{self.credentials[1]}".encode()
            return "Basic " + base64.b64encode(raw).decode()
        return ""

    def _answer(self, challenge: str, scope: str, refused: str) -> bool:
        """Prepare credentials for the challenge to a request that sent ``refused`` (its
        Authorization header); False when there is nothing new to try. A refused Bearer token is
        asked for again: registries' tokens expire within minutes (Docker Hub: 5), and a large
        image's later layers are requested after that."""
        kind = challenge.split(" ", 1)[0].lower()
        if kind == "basic":
            if self.credentials is None or self.basic:
                return False
            self.basic = True
            return True
        if kind != "bearer":
            return False
        if scope in self.tokens and refused != f"Bearer {self.tokens[scope]}":
            return True  # another layer's request has got a new token meanwhile
        fields = dict(_CHALLENGE.findall(challenge))
        realm = fields.get("realm", "")
        parts = urllib.parse.urlsplit(realm)
        if parts.scheme not in ("http", "https") or (parts.scheme == "http" and not self.insecure):
            raise FormatError("registry", 0, f"{self.host}: token service {realm!r} is not an https URL")
        query = {k: v for k, v in (("service", fields.get("service")), ("scope", fields.get("scope") or scope)) if v}
        url = realm + ("&" if parts.query else "?") + urllib.parse.urlencode(query)
        self.tokens[scope] = self._token(url)
        return True

    def _token(self, url: str) -> str:
        parts = urllib.parse.urlsplit(url)
        headers = {"User-Agent": "rocm-audit"}
        if self.credentials:
            raw = f"{self.credentials[0]}:{self.credentials[1]}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()
        connection = self._connect(parts.scheme, parts.netloc)
        try:
            connection.request("GET", urllib.parse.urlunsplit(("", "", parts.path, parts.query, "")), headers=headers)
            response = connection.getresponse()
            body = response.read(MAX_DOCUMENT_BYTES + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise FormatError("registry", 0, f"{self.host}: token service: {exc}") from None
        finally:
            connection.close()
        if response.status != 200:
            raise FormatError("registry", 0, f"{self.host}: token service: {_status(response.status, body)}")
        try:
            answer = json.loads(body[:MAX_DOCUMENT_BYTES])
        except (ValueError, RecursionError):  # RecursionError: nested too deeply
            answer = None
        token = answer.get("token") or answer.get("access_token") if isinstance(answer, dict) else None
        if not isinstance(token, str) or not token:
            raise FormatError("registry", 0, f"{self.host}: token service answered without a token")
        return token

    def document(self, path: str, accept: tuple[str, ...], scope: str, digest: str | None) -> tuple[bytes, str]:
        """A small JSON document (manifest, index, config): its bytes and its sha256 digest,
        checked against ``digest`` when given."""
        response = self.get(path, accept, scope)
        try:
            body = response.read(MAX_DOCUMENT_BYTES + 1)
        finally:
            response.close()
        if len(body) > MAX_DOCUMENT_BYTES:
            raise FormatError("registry", 0, f"{self.host}: {path} is larger than {MAX_DOCUMENT_BYTES} bytes")
        actual = "sha256:" + hashlib.sha256(body).hexdigest()
        if digest is not None and actual != digest:
            raise FormatError("registry", 0, f"{self.host}: {path} does not match its digest {digest}")
        return body, response.getheader("Content-Type") or ""


class HttpError(FormatError):
    """A registry's answer other than the one asked for; ``status``: its HTTP status."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__("registry", 0, reason)
        self.status = status


def network_words(host: str, exc: OSError) -> str:
    """What a failed connection to ``host`` means, in words: the host name does not resolve,
    nothing listens, plain HTTP where TLS was expected, an untrusted certificate."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"the TLS certificate of {host} is not trusted ({exc.verify_message}): for a private registry "
            f"with its own certificate, add --insecure-registry {host}"
        )
    if isinstance(exc, ssl.SSLError) and exc.reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE"):
        return f"{host} does not speak TLS (plain HTTP?): add --insecure-registry {host}"
    if isinstance(exc, socket.gaierror):
        return f"cannot reach registry {host}: its name does not resolve ({exc.strerror})"
    if isinstance(exc, ConnectionRefusedError):
        # Without a port the connection went to HTTPS's 443: a local registry listens elsewhere.
        ported = ":" in host.rsplit("]", 1)[-1]
        where = host if ported else f"{host} on port 443 (registry://{host}:PORT/... names another)"
        return f"cannot reach registry {where}: nothing listens there (connection refused)"
    if isinstance(exc, TimeoutError):
        return f"cannot reach registry {host}: no answer within {TIMEOUT:.0f} s"
    return f"cannot reach registry {host}: {exc.strerror or exc}"


def insecure_host(text: str) -> str:
    """A --insecure-registry value as HOST[:PORT], lower case: an ``http://`` or ``https://`` in
    front and a ``/`` behind are dropped (the host is what is matched). Raises UsageError for a
    value with a path."""
    host = text.strip()
    for scheme in ("http://", "https://"):
        if host.lower().startswith(scheme):
            host = host[len(scheme) :]
    host = host.rstrip("/")
    if not host or "/" in host or "://" in host:
        raise UsageError(f"--insecure-registry takes HOST[:PORT] (127.0.0.1:5000, registry.local), not {text!r}")
    return host.lower()


def _status(status: int, body: bytes) -> str:
    detail = ""
    try:
        errors = json.loads(body).get("errors") or []
        detail = "; ".join(str(e.get("message") or e.get("code")) for e in errors if isinstance(e, dict))[:300]
    except (ValueError, AttributeError, TypeError, RecursionError):  # any body a server sends
        pass
    return f"HTTP {status}" + (f" ({detail})" if detail else "")


def _json(body: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormatError("json", 0, f"{what}: {exc}") from None
    except RecursionError:  # "[[[[..." from a hostile server: Python's parser recurses per level
        raise FormatError("json", 0, f"{what}: nested too deeply") from None
    if not isinstance(value, dict):
        raise FormatError("image", 0, f"{what} is not a JSON object")
    return value


def _digest(value: object, what: str) -> str:
    if not isinstance(value, str) or not _DIGEST.match(value):
        raise FormatError("image", 0, f"{what}: bad digest {value!r}")
    return value


class RegistryStore(Store):
    """Layer blobs of one repository, each streamed on its own connection when opened."""

    def __init__(self, client: Client, ref: RegistryRef) -> None:
        self.client = client
        self.ref = ref
        self.label = ref.text
        self.scope = f"repository:{ref.repository}:pull"

    def exists(self, name: str) -> bool:
        return bool(_DIGEST.match(name))

    def size(self, name: str) -> int:
        raise FormatError("image", 0, f"{self.label}: blob sizes are not read")

    def blob_path(self, name: str) -> str:
        return f"/v2/{self.ref.repository}/blobs/{name}"

    def open(self, name: str) -> _Body:  # type: ignore[override]
        return _Body(self, name, self.client.get(self.blob_path(name), (), self.scope))


class _Body:
    """A layer blob's response body. A connection that breaks, or ends before the length it
    announced, is opened again where it stopped (a Range request; MAX_RESUMES times at most): a
    layer of gigabytes survives a network hiccup. The layer's digest is taken over the bytes as
    they are read, so a resumed blob is checked like any other. Other failures become FormatError
    (the layer is unreadable)."""

    def __init__(self, store: RegistryStore, name: str, response: http.client.HTTPResponse) -> None:
        self.store = store
        self.name = name
        self.response = response
        self.position = 0  # bytes of the blob handed out
        self.resumes = 0

    def read(self, size: int = -1, /) -> bytes:
        size = tarstream.CHUNK if size < 0 else size
        while True:
            try:
                piece = self.response.read(size)
            except (OSError, http.client.HTTPException) as exc:
                self._resume(str(exc) or type(exc).__name__)
                continue
            if piece or not self.response.length:  # length: what the response announced and has not sent
                self.position += len(piece)
                return piece
            self._resume(f"the connection closed {self.response.length} bytes early")

    def _resume(self, reason: str) -> None:
        where = f"{self.store.label}: {self.name}"
        if self.resumes >= MAX_RESUMES:
            raise FormatError("registry", self.position, f"{where}: {reason} (resumed {MAX_RESUMES} times)")
        self.resumes += 1
        log.info("%s: %s at byte %d; reading on from there", where, reason, self.position)
        self.response.close()
        response = self.store.client.get(self.store.blob_path(self.name), (), self.store.scope, self.position)
        if response.status == 206:
            answered = (response.getheader("Content-Range") or "").removeprefix("bytes ").split("-", 1)[0]
            if answered != str(self.position):
                response.close()
                raise FormatError(
                    "registry", self.position, f"{where}: asked for byte {self.position} on, got {answered!r}"
                )
        else:  # 200: the server ignores Range; what was read already is read past
            skip = self.position
            while skip:
                piece = response.read(min(skip, tarstream.CHUNK))
                if not piece:
                    response.close()
                    raise FormatError("registry", self.position, f"{where}: {reason}, and shorter when read again")
                skip -= len(piece)
        self.response = response

    def close(self) -> None:
        self.response.close()


def read_image(
    ref: RegistryRef, platform: tuple[str, str, str | None] | None, insecure_hosts: frozenset[str]
) -> tuple[RegistryStore, ImageLayout]:
    """Resolve the reference to one image manifest (through indexes, the entry of ``platform``,
    default linux/amd64) and read its config. Raises UsageError when ``platform`` was asked for and
    the image's config names another."""
    credentials = docker_config_auth(ref.host)
    client = Client(ref.host, insecure=ref.host.lower() in insecure_hosts)
    if credentials is HELPER_ONLY:
        client.helper_named = True
    else:
        client.credentials = credentials
    store = RegistryStore(client, ref)
    accept = MANIFEST_TYPES + INDEX_TYPES
    path = f"/v2/{ref.repository}/manifests/{ref.reference}"
    try:
        body, content_type = client.document(path, accept, store.scope, ref.pinned)
    except HttpError as exc:
        if exc.status != 404:
            raise
        said = exc.reason.rsplit(": HTTP 404", 1)[-1].strip(" ()") or "not found"
        raise UsageError(
            f"registry {ref.host} has no image {ref.repository}{'@' if ref.pinned else ':'}{ref.reference} "
            f"(HTTP 404: {said})"
        ) from None
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    document = _json(body, f"{ref.text}: manifest")
    for _ in range(MAX_INDEX_DEPTH + 1):
        media_type = str(document.get("mediaType") or content_type.split(";")[0].strip())
        if media_type not in INDEX_TYPES and "manifests" not in document:
            break
        digest = _pick_platform(document, platform or parse_platform(DEFAULT_PLATFORM), ref.text)
        body, content_type = client.document(f"/v2/{ref.repository}/manifests/{digest}", accept, store.scope, digest)
        document = _json(body, f"{ref.text}: manifest {digest}")
    else:
        raise FormatError("image", 0, f"{ref.text}: image indexes nested too deep")
    if document.get("schemaVersion") != 2 or not isinstance(document.get("layers"), list):
        raise FormatError("image", 0, f"{ref.text}: manifest {digest} is not an image manifest (schema 2 or OCI)")
    layers = []
    for layer in document["layers"]:
        if not isinstance(layer, dict):
            raise FormatError("image", 0, f"{ref.text}: manifest {digest}: bad layer descriptor")
        blob = _digest(layer.get("digest"), f"{ref.text}: layer")
        layers.append(LayerRef(member=blob, digest=blob, media_type=str(layer.get("mediaType", ""))))
    config: dict[str, Any] = {}
    descriptor = document.get("config")
    if isinstance(descriptor, dict):
        config_digest = _digest(descriptor.get("digest"), f"{ref.text}: config")
        raw, _ = client.document(f"/v2/{ref.repository}/blobs/{config_digest}", (), store.scope, config_digest)
        config = _json(raw, f"{ref.text}: config")
    return store, ImageLayout(
        kind="registry",
        layers=layers,
        config=config,
        tags=[ref.text],
        manifest_digest=digest,
        platform=_config_platform(config, platform, ref.text),
    )


def _config_platform(config: dict[str, Any], asked: tuple[str, str, str | None] | None, label: str) -> str | None:
    """The image's OS/ARCH[/VARIANT] from its config (None when it says none). Raises UsageError
    when ``asked`` (--platform) names another: a single-platform image is what the registry has,
    and the audit of another platform's files is not what was asked for."""
    parts = [config.get(k) for k in ("os", "architecture", "variant")]
    found = "/".join(p for p in parts if isinstance(p, str) and p) or None
    if asked is None or found is None:
        return found
    wanted_os, wanted_arch, wanted_variant = asked
    if parts[0] != wanted_os or parts[1] != wanted_arch or (wanted_variant and parts[2] != wanted_variant):
        wanted = "/".join(p for p in asked if p)
        raise UsageError(
            f"{label} is a {found} image, not {wanted} (--platform)",
            hint=f"the registry has no {wanted} image of it; leave out --platform to audit this one",
        )
    return found


def _pick_platform(index: dict[str, Any], platform: tuple[str, str, str | None], label: str) -> str:
    entries = index.get("manifests")
    if not isinstance(entries, list) or not entries:
        raise FormatError("image", 0, f"{label}: index has no manifests")
    wanted_os, wanted_arch, wanted_variant = platform
    offered = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        raw_platform = entry.get("platform")
        found: dict[str, Any] = raw_platform if isinstance(raw_platform, dict) else {}
        offered.append("/".join(str(found.get(k)) for k in ("os", "architecture", "variant") if found.get(k)))
        if found.get("os") == wanted_os and found.get("architecture") == wanted_arch:
            if wanted_variant is None or found.get("variant") == wanted_variant:
                return _digest(entry.get("digest"), f"{label}: index entry")
    wanted = "/".join(p for p in platform if p)
    raise UsageError(
        f"{label} has no image for platform {wanted} (it has: {', '.join(sorted(set(offered))) or 'none'}); "
        "choose one with --platform"
    )
