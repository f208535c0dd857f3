"""The server in front of upstreams reached over TLS and through a forward proxy, all real
and on loopback: a scripted upstream served by uvicorn over TLS with certificates made
for the test (``trustme``: a CA, the upstream's certificate, a client certificate), and
``proxy.py``'s forward proxy in a process of its own. The upstream's own TLS files come
from the ``ORS_CONFIG`` file; ``SSL_CERT_FILE``, ``HTTP_PROXY``, ``HTTPS_PROXY`` and
``NO_PROXY`` from the environment the server starts in. Also: the bounded pool, seen by
a client."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from app.config import Settings
from app.main import create_app
from tests.client import Client
from tests.live import LiveServer, free_port
from tests.upstream_server import DONE, Pause, ScriptedUpstream, chunk, running_scripted_upstream

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
                   "no_proxy")


@dataclass(frozen=True)
class Certificates:
    directory: Path
    ca: Path
    """The CA that issued the upstream's certificate and the client certificate."""
    other_ca: Path
    """A CA that issued neither."""
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    directory = tmp_path_factory.mktemp("certificates")
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("ors@example")
    paths = Certificates(directory, directory / "ca.pem", directory / "other-ca.pem", directory / "server.pem",
                         directory / "server.key", directory / "client.pem", directory / "client.key")
    ca.cert_pem.write_to_path(str(paths.ca))
    other.cert_pem.write_to_path(str(paths.other_ca))
    server.cert_chain_pems[0].write_to_path(str(paths.server_cert))
    server.private_key_pem.write_to_path(str(paths.server_key))
    client.cert_chain_pems[0].write_to_path(str(paths.client_cert))
    client.private_key_pem.write_to_path(str(paths.client_key))
    return paths


@pytest.fixture(scope="module")
def tls_upstream(certificates: Certificates) -> Iterator[ScriptedUpstream]:
    """An https upstream whose certificate ``certificates.ca`` issued."""
    with running_scripted_upstream(ssl_certfile=str(certificates.server_cert),
                                   ssl_keyfile=str(certificates.server_key)) as upstream:
        yield upstream


@pytest.fixture(scope="module")
def mtls_upstream(certificates: Certificates) -> Iterator[ScriptedUpstream]:
    """An https upstream that requires a client certificate issued by ``certificates.ca``."""
    with running_scripted_upstream(ssl_certfile=str(certificates.server_cert),
                                   ssl_keyfile=str(certificates.server_key), ssl_ca_certs=str(certificates.ca),
                                   ssl_cert_reqs=ssl.CERT_REQUIRED) as upstream:
        yield upstream


@pytest.fixture(scope="module")
def plain_upstream() -> Iterator[ScriptedUpstream]:
    with running_scripted_upstream() as upstream:
        yield upstream


class ForwardProxy:
    """``proxy.py`` on 127.0.0.1, in its own process; its access log says what it forwarded."""

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ForwardProxy:
        env = {key: value for key, value in os.environ.items() if key not in PROXY_VARIABLES}
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "proxy", "--hostname", "127.0.0.1", "--port", str(self.port),
                 "--num-workers", "1", "--num-acceptors", "1"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log()
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return self
            time.sleep(0.1)
        raise TimeoutError(f"the proxy did not start:\n{self.log()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def mark(self) -> int:
        """Where the log ends now (for :meth:`forwarded`)."""
        return len(self.log())

    def forwarded(self, target: str, since: int, timeout: float = 20) -> bool:
        """Whether the access log, from ``since`` on, shows a request to ``target``
        (``host:port``), waiting for the line to be written (it is, once the proxied
        connection ends)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(target in line for line in self.log()[since:].splitlines() if "access_log" in line):
                return True
            time.sleep(0.1)
        return False


@pytest.fixture(scope="module")
def forward_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForwardProxy]:
    proxy = ForwardProxy(tmp_path_factory.mktemp("proxy") / "proxy.log").start()
    yield proxy
    proxy.stop()


@contextlib.contextmanager
def serving(settings: Settings, monkeypatch: pytest.MonkeyPatch, **environ: str) -> Iterator[Client]:
    """The server started with ``environ`` set (and no other proxy variable): its upstream
    clients read the environment when they are made, at start. The test's own client is
    made after, without them."""
    settings = settings.model_copy(update={"default_model": "upstream-default"})  # no embedded model loads
    with monkeypatch.context() as patched:
        for name in PROXY_VARIABLES:
            patched.delenv(name, raising=False)
        for name, value in environ.items():
            patched.setenv(name, value)
        server = LiveServer(create_app(settings)).start()
    try:
        yield Client(server.url)
    finally:
        server.stop()


def config(tmp_path: Path, upstream: ScriptedUpstream, **tls: Path) -> Path:
    """An ``ORS_CONFIG`` file routing every id to ``upstream``, with its TLS files."""
    lines = "".join(f"{field} = '{path}'\n" for field, path in tls.items())
    path = tmp_path / "ors.toml"
    path.write_text(f"[upstreams.up]\nbase_url = '{upstream.base_url}'\nprefixes = ['']\n{lines}")
    return path


def answer(upstream: ScriptedUpstream, text: str = "over the wire") -> str:
    return upstream.stream(chunk(content=text), chunk(finish_reason="stop"), DONE)


def host_port(upstream: ScriptedUpstream) -> str:
    return upstream.base_url.split("://", 1)[1].split("/", 1)[0]


# -- TLS -------------------------------------------------------------------------------------


def test_an_upstream_verified_with_its_ca_bundle(tls_upstream: ScriptedUpstream, certificates: Certificates,
                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(config=config(tmp_path, tls_upstream, ca_bundle=certificates.ca), data_dir=tmp_path)
    with serving(settings, monkeypatch) as client:
        model = answer(tls_upstream)
        assert client.create(model=model, input="Hi")["output"][0]["content"][0]["text"] == "over the wire"
        result = client.stream(model=answer(tls_upstream, "streamed"), input="Hi")
        assert result.final["status"] == "completed" and result.text() == "streamed"


def test_a_ca_that_did_not_issue_the_certificate_fails_cleanly(
        tls_upstream: ScriptedUpstream, certificates: Certificates, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(config=config(tmp_path, tls_upstream, ca_bundle=certificates.other_ca), data_dir=tmp_path)
    with serving(settings, monkeypatch) as client:
        model = answer(tls_upstream)
        error = client.error({"model": model, "input": "Hi"}, 500)
        assert (error["type"], error["code"]) == ("model_error", "upstream_unavailable")
        assert "127.0.0.1" not in error["message"]  # the upstream's address is for the log only
        result = client.stream(model=model, input="Hi")
        assert result.types()[-2:] == ["error", "response.failed"]
        assert result.final["error"]["code"] == "upstream_unavailable"
    assert not tls_upstream.requests_for(model)


def test_an_upstream_that_requires_a_client_certificate(mtls_upstream: ScriptedUpstream, certificates: Certificates,
                                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = config(tmp_path, mtls_upstream, ca_bundle=certificates.ca, client_cert=certificates.client_cert,
                  client_key=certificates.client_key)
    with serving(Settings(config=path, data_dir=tmp_path / "with"), monkeypatch) as client:
        result = client.stream(model=answer(mtls_upstream, "mutual"), input="Hi")
        assert result.final["status"] == "completed" and result.text() == "mutual"
    # the same upstream refuses a server that presents no certificate: a clean error
    path = config(tmp_path, mtls_upstream, ca_bundle=certificates.ca)
    with serving(Settings(config=path, data_dir=tmp_path / "without"), monkeypatch) as client:
        model = answer(mtls_upstream)
        error = client.error({"model": model, "input": "Hi"}, 500)
        assert error["type"] == "model_error" and error["code"].startswith("upstream_")
    assert not mtls_upstream.requests_for(model)


def test_ssl_cert_file_is_the_trust_of_an_upstream_without_a_ca_bundle(
        tls_upstream: ScriptedUpstream, certificates: Certificates, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(upstream_url=tls_upstream.base_url, data_dir=tmp_path / "trusted")
    with serving(settings, monkeypatch, SSL_CERT_FILE=str(certificates.ca)) as client:
        assert client.create(model=answer(tls_upstream), input="Hi")["status"] == "completed"
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    settings = Settings(upstream_url=tls_upstream.base_url, data_dir=tmp_path / "untrusted")
    with serving(settings, monkeypatch, SSL_CERT_FILE=str(certificates.other_ca)) as client:
        error = client.error({"model": answer(tls_upstream), "input": "Hi"}, 500)
        assert error["code"] == "upstream_unavailable"


# -- a forward proxy -------------------------------------------------------------------------


def test_http_proxy_carries_requests_to_an_http_upstream(plain_upstream: ScriptedUpstream,
                                                         forward_proxy: ForwardProxy, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(upstream_url=plain_upstream.base_url, data_dir=tmp_path)
    since = forward_proxy.mark()
    with serving(settings, monkeypatch, HTTP_PROXY=forward_proxy.url) as client:
        result = client.stream(model=answer(plain_upstream, "proxied"), input="Hi")
        assert result.final["status"] == "completed" and result.text() == "proxied"
    assert forward_proxy.forwarded(f"POST {host_port(plain_upstream)}/v1/chat/completions", since), \
        forward_proxy.log()


def test_https_proxy_tunnels_to_an_https_upstream(tls_upstream: ScriptedUpstream, certificates: Certificates,
                                                  forward_proxy: ForwardProxy, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """TLS to the upstream runs inside the proxy's tunnel (``CONNECT``), verified against
    the upstream's own CA bundle."""
    settings = Settings(config=config(tmp_path, tls_upstream, ca_bundle=certificates.ca), data_dir=tmp_path)
    since = forward_proxy.mark()
    with serving(settings, monkeypatch, HTTPS_PROXY=forward_proxy.url) as client:
        result = client.stream(model=answer(tls_upstream, "tunnelled"), input="Hi")
        assert result.final["status"] == "completed" and result.text() == "tunnelled"
    assert forward_proxy.forwarded(f"CONNECT {host_port(tls_upstream)}", since), forward_proxy.log()


def test_no_proxy_bypasses_the_proxy(plain_upstream: ScriptedUpstream, forward_proxy: ForwardProxy,
                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(upstream_url=plain_upstream.base_url, data_dir=tmp_path)
    model = answer(plain_upstream, "direct")
    since = forward_proxy.mark()
    with serving(settings, monkeypatch, HTTP_PROXY=forward_proxy.url, NO_PROXY="example.com,127.0.0.1") as client:
        assert client.create(model=model, input="Hi")["output"][0]["content"][0]["text"] == "direct"
    assert plain_upstream.requests_for(model)
    assert not forward_proxy.forwarded(f"POST {host_port(plain_upstream)}", since, timeout=2), \
        forward_proxy.log()


def test_a_proxy_that_cannot_be_reached_is_upstream_unavailable(plain_upstream: ScriptedUpstream, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(upstream_url=plain_upstream.base_url, data_dir=tmp_path)
    model = answer(plain_upstream)
    with serving(settings, monkeypatch, HTTP_PROXY=f"http://127.0.0.1:{free_port()}") as client:
        error = client.error({"model": model, "input": "Hi"}, 500)
        assert error["code"] == "upstream_unavailable"
    assert not plain_upstream.requests_for(model)


# -- the bounded pool ------------------------------------------------------------------------


def test_a_request_past_the_pool_waits_then_is_server_busy(plain_upstream: ScriptedUpstream, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """One connection to the upstream: a second request waits for it while a stream holds
    it, and past ``upstream_pool_timeout`` is 429 ``server_busy``; the stream is not
    disturbed, and once it ends the connection serves the next request."""
    settings = Settings(upstream_url=plain_upstream.base_url, data_dir=tmp_path, upstream_max_connections=1,
                        upstream_pool_timeout=0.5)
    held = plain_upstream.stream(chunk(content="held"), Pause(3.0), chunk(finish_reason="stop"), DONE)
    with serving(settings, monkeypatch) as client:
        results: list[str] = []
        streaming = threading.Thread(target=lambda: results.append(client.stream(model=held, input="Hi").text()))
        streaming.start()
        deadline = time.monotonic() + 30
        while not plain_upstream.requests_for(held) and time.monotonic() < deadline:
            time.sleep(0.02)
        busy = Client(str(client.http.base_url).rstrip("/"))
        error = busy.error({"model": answer(plain_upstream), "input": "Hi"}, 429)
        assert error["code"] == "server_busy"
        streaming.join(timeout=60)
        assert results == ["held"]
        assert client.create(model=answer(plain_upstream, "next"), input="Hi")["status"] == "completed"
