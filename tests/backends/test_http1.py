"""The upstream client (``app.backends.http1``) against real servers on loopback: a raw
asyncio server for the wire's variants and faults (each test scripts what it writes),
and a TLS one with a certificate made for the test."""

from __future__ import annotations

import asyncio
import datetime
import gzip
import ipaddress
import ssl
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from app.backends import http1
from app.backends.http1 import Client, ConnectFailed, Disconnected, Malformed, ReadTimeout

pytestmark = pytest.mark.anyio

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """A TCP server on 127.0.0.1 whose connections ``handler`` serves; counts connections
    and records each request's head."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.heads: list[bytes] = []
        self.closed_by_client = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def origin(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        """One request's head and body (by its Content-Length); ``b""`` once the client closed."""
        head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
        if not head:
            return b""
        self.heads.append(head)
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        return head + await reader.readexactly(length)


def client(origin: str, *, read: float = 5.0, keepalive: float = 4.0, **kwargs: object) -> Client:
    return Client(origin, connect=2.0, read=read, keepalive=keepalive, **kwargs)  # type: ignore[arg-type]


def sized(body: bytes, *, status: str = "200 OK", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        status.encode(), len(body), extra, body)


def chunked(*pieces: bytes) -> bytes:
    out = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    for piece in pieces:
        out += b"%x\r\n%s\r\n" % (len(piece), piece)
    return out + b"0\r\n\r\n"


def answering(*answers: bytes, then_close: bool = False) -> Callable[[RawServer], Handler]:
    """A handler that answers the n-th request of a connection with ``answers[n]``."""
    def make(server: RawServer) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for answer in answers:
                if not await server.read_request(reader):
                    return
                writer.write(answer)
                await writer.drain()
            if then_close:
                return
            await reader.read()  # until the client closes
            server.closed_by_client.set()
        return handle
    return make


_serving: list[RawServer] = []


@pytest.fixture(autouse=True)
async def _close_servers() -> AsyncIterator[None]:
    yield
    while _serving:
        await _serving.pop().__aexit__()


async def serving(make: Callable[[RawServer], Handler]) -> RawServer:
    """A server whose handler ``make`` makes; closed when the test ends."""
    server = RawServer(lambda reader, writer: asyncio.sleep(0))
    server.handler = make(server)
    _serving.append(server)
    return await server.__aenter__()


async def body_of(answer: http1.Connection) -> bytes:
    return b"".join([piece async for piece in answer.chunks()])


# -- answers ---------------------------------------------------------------------------------


async def test_a_sized_answer_and_its_head() -> None:
    server = await serving(answering(sized(b'{"ok":true}', extra=b"X-Thing: A b\r\n")))
    upstream = client(server.origin, headers={"Authorization": "Bearer k"})
    async with upstream.request("POST", "/v1/x?y=1", b'{"a":1}', b"Accept: application/json\r\n") as answer:
        assert answer.status == 200
        assert answer.headers["x-thing"] == "A b" and answer.headers["content-type"] == "application/json"
        assert await answer.read() == b'{"ok":true}'
    head = server.heads[0]
    assert head.startswith(b"POST /v1/x?y=1 HTTP/1.1\r\n")
    port = server.origin.rsplit(":", 1)[1].encode()
    for line in (b"Host: 127.0.0.1:" + port, b"Authorization: Bearer k", b"Accept: application/json",
                 b"Content-Length: 7", b"User-Agent: ors"):
        assert line in head.split(b"\r\n")
    await upstream.aclose()


async def test_a_chunked_stream_arrives_in_pieces_as_it_is_written() -> None:
    release = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nfirst\n\r\n")
        await writer.drain()
        await release.wait()
        writer.write(b"7\r\nsecond\n\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with RawServer(handle) as server:
        upstream = client(server.origin)
        async with upstream.request("POST", "/", b"{}") as answer:
            pieces = answer.chunks()
            assert await pieces.__anext__() == b"first\n"  # before the rest was written
            release.set()
            assert await body_of(answer) == b"second\n"
        assert upstream.idle == 1
        await upstream.aclose()


async def test_a_body_without_a_length_ends_with_its_connection_which_is_not_reused() -> None:
    async with RawServer(lambda r, w: asyncio.sleep(0)) as server:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it, then the end")
            await writer.drain()
        server.handler = handle
        upstream = client(server.origin)
        async with upstream.request("GET", "/") as answer:
            assert await answer.read() == b"all of it, then the end"
        assert upstream.idle == 0


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
async def test_a_compressed_answer_is_decoded(coding: str) -> None:
    text = b'{"text": "' + b"compressible " * 500 + b'"}'
    packed = gzip.compress(text) if coding == "gzip" else zlib.compress(text)
    server = await serving(answering(sized(packed, extra=b"Content-Encoding: %s\r\n" % coding.encode())))
    upstream = client(server.origin)
    async with upstream.request("GET", "/") as answer:
        assert await answer.read() == text
    assert upstream.idle == 1
    await upstream.aclose()


async def test_an_unknown_content_coding_is_malformed() -> None:
    server = await serving(answering(sized(b"xx", extra=b"Content-Encoding: br\r\n")))
    upstream = client(server.origin)
    with pytest.raises(Malformed, match="br"):
        async with upstream.request("GET", "/"):
            pass


async def test_an_interim_answer_is_skipped() -> None:
    server = await serving(answering(b"HTTP/1.1 100 Continue\r\n\r\n" + sized(b"done")))
    upstream = client(server.origin)
    async with upstream.request("POST", "/", b"{}") as answer:
        assert answer.status == 200 and await answer.read() == b"done"


async def test_an_error_status_is_an_answer_like_any_other() -> None:
    server = await serving(answering(sized(b'{"error":"no"}', status="429 Too Many Requests")))
    upstream = client(server.origin)
    async with upstream.request("POST", "/", b"{}") as answer:
        assert answer.status == 429 and await answer.read() == b'{"error":"no"}'


async def test_read_with_a_limit_stops_early_and_drops_the_connection() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 20)
        await writer.drain()
        await reader.read()  # the rest never comes; the client closes
        server.closed_by_client.set()

    async with RawServer(handle) as server:
        upstream = client(server.origin)
        async with upstream.request("GET", "/") as answer:
            assert await answer.read(10) == b"x" * 20
        assert upstream.idle == 0
        await asyncio.wait_for(server.closed_by_client.wait(), 5)


# -- the pool --------------------------------------------------------------------------------


async def test_connections_are_kept_alive_and_reused() -> None:
    server = await serving(answering(*(sized(b"%d" % n) for n in range(3))))
    upstream = client(server.origin)
    for n in range(3):
        async with upstream.request("POST", "/", b"{}") as answer:
            assert await answer.read() == b"%d" % n
    assert server.connections == 1 and upstream.idle == 1
    await upstream.aclose()
    await asyncio.wait_for(server.closed_by_client.wait(), 5)


async def test_concurrent_requests_each_get_a_connection_of_their_own() -> None:
    gate = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await server.read_request(reader):
            await gate.wait()
            writer.write(sized(b"ok"))
            await writer.drain()

    async with RawServer(handle) as server:
        upstream = client(server.origin)

        async def one() -> bytes:
            async with upstream.request("POST", "/", b"{}") as answer:
                return await answer.read()

        calls = [asyncio.ensure_future(one()) for _ in range(5)]
        await asyncio.sleep(0.1)
        gate.set()
        assert await asyncio.gather(*calls) == [b"ok"] * 5
        assert server.connections == 5 and upstream.idle == 5
        await upstream.aclose()


async def test_an_answer_that_says_close_is_not_pooled() -> None:
    server = await serving(answering(sized(b"bye", extra=b"Connection: close\r\n"), then_close=True))
    upstream = client(server.origin)
    async with upstream.request("GET", "/") as answer:
        assert await answer.read() == b"bye"
    assert upstream.idle == 0


async def test_an_answer_not_read_to_its_end_closes_its_connection() -> None:
    server = await serving(answering(chunked(b"one", b"two")))
    upstream = client(server.origin)
    async with upstream.request("POST", "/", b"{}") as answer:
        assert answer.status == 200
    assert upstream.idle == 0
    await asyncio.wait_for(server.closed_by_client.wait(), 5)


async def test_a_connection_idle_too_long_is_not_reused() -> None:
    server = await serving(answering(sized(b"1")))
    upstream = client(server.origin, keepalive=0.05)
    async with upstream.request("GET", "/") as answer:
        await answer.read()
    await asyncio.sleep(0.1)
    async with upstream.request("GET", "/") as answer:
        await answer.read()
    assert server.connections == 2  # the first was too old: closed, and a new one opened
    await upstream.aclose()


async def test_a_pooled_connection_the_server_closed_is_not_used() -> None:
    server = await serving(answering(sized(b"1"), then_close=True))
    upstream = client(server.origin)
    async with upstream.request("GET", "/") as answer:
        assert await answer.read() == b"1"
    assert upstream.idle == 1
    await asyncio.sleep(0.1)  # the server has closed its end meanwhile
    async with upstream.request("GET", "/") as answer:
        assert await answer.read() == b"1"
    assert server.connections == 2


async def test_a_pooled_connection_closed_as_the_request_leaves_is_disconnected() -> None:
    """The race the adapters retry once: the server closes a kept-alive connection just as
    the next request is written on it; it fails before any byte of an answer."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(sized(b"1"))
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")  # the second request: closed without an answer

    async with RawServer(handle) as server:
        upstream = client(server.origin)
        async with upstream.request("GET", "/") as answer:
            await answer.read()
        with pytest.raises(Disconnected):
            async with upstream.request("GET", "/"):
                pass
        assert upstream.idle == 0


# -- failures ----------------------------------------------------------------------------------


async def test_nothing_listening_is_a_failure_to_connect() -> None:
    with pytest.raises(ConnectFailed, match="cannot connect"):
        async with client("http://127.0.0.1:1").request("GET", "/"):
            pass


async def test_garbage_instead_of_an_answer_is_malformed() -> None:
    server = await serving(answering(b"SMTP ready\r\n\r\n"))
    with pytest.raises(Malformed):
        async with client(server.origin).request("GET", "/"):
            pass


async def test_a_broken_chunk_is_a_broken_body() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"zz\r\nnope\r\n")
        await writer.drain()
        await reader.read()

    async with RawServer(handle) as server:
        upstream = client(server.origin)
        async with upstream.request("GET", "/") as answer:
            with pytest.raises(Disconnected, match="cannot be read"):
                await answer.read()
        assert upstream.idle == 0
        # its head and the break in one read: the request itself fails
        server.handler = answering(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")(server)
        with pytest.raises(Disconnected, match="cannot be read"):
            async with upstream.request("GET", "/"):
                pass


async def test_a_connection_cut_mid_body_is_disconnected_after_what_came() -> None:
    server = await serving(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this", then_close=True))
    upstream = client(server.origin)
    async with upstream.request("GET", "/") as answer:
        pieces = answer.chunks()
        assert await pieces.__anext__() == b"only this"
        with pytest.raises(Disconnected, match="closed the connection"):
            await pieces.__anext__()


async def test_a_silent_upstream_times_out_and_its_connection_is_dropped() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await reader.read()
        server.closed_by_client.set()

    async with RawServer(handle) as server:
        upstream = client(server.origin, read=0.3)
        started = asyncio.get_running_loop().time()
        async with upstream.request("GET", "/") as answer:
            with pytest.raises(ReadTimeout):
                await answer.read()
        assert asyncio.get_running_loop().time() - started >= 0.3
        await asyncio.wait_for(server.closed_by_client.wait(), 5)


async def test_a_reader_that_falls_behind_pauses_the_socket_and_loses_nothing() -> None:
    piece = bytes(range(256)) * 256  # 64 KiB
    pieces = 40  # 2.5 MiB, far above HIGH_WATER

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (len(piece) * pieces))
        for _ in range(pieces):
            writer.write(piece)
            await writer.drain()
        await reader.read()

    async with RawServer(handle) as server:
        upstream = client(server.origin, read=0.5)
        async with upstream.request("GET", "/") as answer:
            await asyncio.sleep(1.0)  # longer than the read timeout: the pause is ours, not the server's
            assert answer._paused and answer._waiting <= http1.HIGH_WATER + len(piece) * 2
            assert await answer.read() == piece * pieces
        assert upstream.idle == 1
        await upstream.aclose()


async def test_a_cancelled_request_closes_its_connection() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        await reader.read()  # never answers; sees the client close
        server.closed_by_client.set()

    async with RawServer(handle) as server:
        upstream = client(server.origin)

        async def ask() -> None:
            async with upstream.request("POST", "/", b"{}"):
                pass

        call = asyncio.ensure_future(ask())
        await asyncio.sleep(0.1)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.wait_for(server.closed_by_client.wait(), 5)
        assert upstream.idle == 0


@pytest.mark.parametrize("headers", [{"X-A": "1\r\nX-B: 2"}, {"X:A": "1"}, {"": "1"}, {"X-A": "1\n"}])
async def test_a_header_that_would_split_the_request_is_refused(headers: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="header"):
        client("http://127.0.0.1:1", headers=headers)


# -- TLS -------------------------------------------------------------------------------------


def _certificate(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    cert, key = _certificate(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (await reader.readuntil(b"\r\n\r\n")):
                writer.write(sized(b'{"over":"tls"}'))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
    yield f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}", cert
    server.close()


async def test_https_with_a_trusted_certificate(tls_server: tuple[str, Path]) -> None:
    origin, cert = tls_server
    upstream = client(origin, tls=ssl.create_default_context(cafile=str(cert)))
    for _ in range(2):
        async with upstream.request("GET", "/") as answer:
            assert await answer.read() == b'{"over":"tls"}'
    assert upstream.idle == 1
    await upstream.aclose()


async def test_https_with_an_untrusted_certificate_fails_to_connect(tls_server: tuple[str, Path]) -> None:
    origin, _ = tls_server
    with pytest.raises(ConnectFailed, match="CERTIFICATE_VERIFY_FAILED"):
        async with client(origin).request("GET", "/"):
            pass
