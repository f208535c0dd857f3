"""What an HTTP upstream's answer does to a request, through the Chat Completions adapter,
against raw servers on loopback (each test scripts the bytes the upstream writes, for
the wire's variants and faults no real server makes on demand): bodies sized, chunked,
compressed or ended by the connection; kept-alive connections reused, and closed when an
answer is left before its end; the one retry; failures in the error taxonomy; the bounded
pool. TLS and proxies are tested end to end (``tests/e2e/test_upstream_tls_proxy.py``)."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from app.backends.base import ChatMessage, Delta, Finish, GenerationRequest, TextDelta
from app.backends.chat_completions import ChatCompletionsBackend
from app.backends.http_client import Pool, Timeouts
from app.errors import InvalidRequest, ModelError, TooManyRequests

pytestmark = pytest.mark.anyio

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

COMPLETION = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello."},
                                      "finish_reason": "stop"}]}).encode()


def event(content: str | None = None, finish: str | None = None) -> bytes:
    delta = {"content": content} if content is not None else {}
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode() + b"\n\n"


STREAM = [event("Hel"), event("lo."), event(finish="stop"), b"data: [DONE]\n\n"]


class RawServer:
    """A TCP server on 127.0.0.1 whose connections ``handler`` serves; records each
    request (head and body) and its connection's number, and sees clients close."""

    def __init__(self) -> None:
        self.handler: Handler | None = None
        self.connections = 0
        self.requests: list[tuple[int, bytes, bytes]] = []
        self.closed_by_client = asyncio.Event()
        self.server: asyncio.Server | None = None

    @property
    def base_url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.transport.set_write_buffer_limits(0)  # type: ignore[attr-defined]
        try:
            assert self.handler is not None
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes | None:
        """One request's head and body; ``None`` once the client closed."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        body = await reader.readexactly(length)
        self.requests.append((self.connections, head, body))
        return head

    async def until_closed(self, reader: asyncio.StreamReader) -> None:
        """Wait for the client to close the connection."""
        while await reader.read(65536):
            pass
        self.closed_by_client.set()


@pytest.fixture
async def raw() -> AsyncIterator[RawServer]:
    server = RawServer()
    server.server = await asyncio.start_server(server._serve, "127.0.0.1", 0)
    yield server
    server.server.close()


def serve(server: RawServer, *answers: bytes | list[bytes], then: str = "keep") -> None:
    """Answer the n-th request of each connection with ``answers[n]`` (a list: pieces
    written one by one, 20 ms apart); ``then``: ``keep`` the connection open until the
    client closes it, or ``close`` it."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in answers:
            if await server.read_request(reader) is None:
                return
            for piece in answer if isinstance(answer, list) else [answer]:
                writer.write(piece)
                await writer.drain()
                if isinstance(answer, list):
                    await asyncio.sleep(0.02)
        if then == "keep":
            await server.until_closed(reader)
    server.handler = handle


def sized(body: bytes, *, status: str = "200 OK", content_type: str = "application/json", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n%s" % (
        status.encode(), content_type.encode(), len(body), extra, body)


def chunked(*pieces: bytes) -> list[bytes]:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    return [head, *(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces), b"0\r\n\r\n"]


def ask(stream: bool = True) -> GenerationRequest:
    return GenerationRequest(model="m", messages=(ChatMessage("user", "Hi"),), incremental=stream)


async def collect(backend: ChatCompletionsBackend, request: GenerationRequest) -> list[Delta]:
    return [delta async for delta in backend.stream(request)]


@pytest.fixture
async def chat(raw: RawServer) -> AsyncIterator[ChatCompletionsBackend]:
    backend = ChatCompletionsBackend(raw.base_url, api_key="k", timeout=Timeouts(connect=2.0, read=5.0))
    yield backend
    await backend.aclose()


HELLO = [TextDelta("Hel"), TextDelta("lo."), Finish("stop")]


# -- answers ---------------------------------------------------------------------------------


async def test_a_sized_json_answer_and_what_the_request_carries(raw: RawServer, chat: ChatCompletionsBackend) -> None:
    serve(raw, sized(COMPLETION))
    assert await collect(chat, ask(stream=False)) == [TextDelta("Hello."), Finish("stop")]
    (_, head, body) = raw.requests[0]
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/chat/completions HTTP/1.1"
    headers = {name.lower(): value for name, _, value in (line.partition(": ") for line in lines[1:] if line)}
    assert headers["host"].startswith("127.0.0.1:") and headers["user-agent"] == "ors"
    assert headers["authorization"] == "Bearer k" and headers["content-type"] == "application/json"
    assert headers["accept"] == "application/json" and headers["accept-encoding"] == "identity"
    assert json.loads(body)["stream"] is False


async def test_a_chunked_stream_arrives_as_it_is_written(raw: RawServer, chat: ChatCompletionsBackend) -> None:
    released = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.read_request(reader)
        head, first, *rest = chunked(*STREAM)
        writer.write(head + first)
        await released.wait()  # the rest only once the first delta came out
        writer.write(b"".join(rest))
        await raw.until_closed(reader)

    raw.handler = handle
    stream = chat.stream(ask())
    assert await anext(stream) == TextDelta("Hel")
    released.set()
    assert [delta async for delta in stream] == HELLO[1:]


async def test_a_body_ended_by_its_connection_is_read_and_the_connection_not_reused(
        raw: RawServer, chat: ChatCompletionsBackend) -> None:
    serve(raw, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + b"".join(STREAM), then="close")
    assert await collect(chat, ask()) == HELLO
    assert await collect(chat, ask()) == HELLO
    assert raw.connections == 2


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
async def test_a_compressed_answer_is_decoded(raw: RawServer, chat: ChatCompletionsBackend, coding: str) -> None:
    body = gzip.compress(b"".join(STREAM)) if coding == "gzip" else zlib.compress(b"".join(STREAM))
    serve(raw, sized(body, content_type="text/event-stream", extra=b"Content-Encoding: %s\r\n" % coding.encode()))
    assert await collect(chat, ask()) == HELLO


async def test_an_interim_answer_is_skipped(raw: RawServer, chat: ChatCompletionsBackend) -> None:
    serve(raw, b"HTTP/1.1 100 Continue\r\n\r\n" + sized(COMPLETION))
    assert await collect(chat, ask(stream=False)) == [TextDelta("Hello."), Finish("stop")]


async def test_a_large_error_body_is_read_in_part_and_its_connection_dropped(
        raw: RawServer, chat: ChatCompletionsBackend) -> None:
    """Only the start of an error's body is read (64 KiB); the rest is not waited for."""
    huge = json.dumps({"error": {"message": "bad temperature " + "x" * 10_000_000}}).encode()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.read_request(reader)
        writer.write(sized(huge, status="400 Bad Request"))
        try:
            await writer.drain()  # until the client took it all, or closed
            await raw.until_closed(reader)
        except ConnectionError:
            raw.closed_by_client.set()

    raw.handler = handle
    with pytest.raises(InvalidRequest) as failure:
        await collect(chat, ask())
    assert failure.value.code == "upstream_rejected"
    assert "bad temperature" in str(failure.value)
    await asyncio.wait_for(raw.closed_by_client.wait(), 10)


# -- connections -----------------------------------------------------------------------------


async def test_connections_are_kept_alive_and_reused(raw: RawServer, chat: ChatCompletionsBackend) -> None:
    serve(raw, *[b"".join(chunked(*STREAM))] * 3)
    for _ in range(3):
        assert await collect(chat, ask()) == HELLO
    assert raw.connections == 1 and len(raw.requests) == 3


async def test_concurrent_streams_each_hold_a_connection(raw: RawServer, chat: ChatCompletionsBackend) -> None:
    both = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.read_request(reader)
        if len(raw.requests) == 2:
            both.set()
        await asyncio.wait_for(both.wait(), 10)  # neither answers before both were asked
        writer.write(b"".join(chunked(*STREAM)))
        await raw.until_closed(reader)

    raw.handler = handle
    assert await asyncio.gather(collect(chat, ask()), collect(chat, ask())) == [HELLO, HELLO]
    assert raw.connections == 2


async def test_an_answer_that_says_close_is_not_reused(raw: RawServer, chat: ChatCompletionsBackend) -> None:
    serve(raw, sized(COMPLETION, extra=b"Connection: close\r\n"), then="close")
    for _ in range(2):
        await collect(chat, ask(stream=False))
    assert raw.connections == 2


async def test_a_pooled_connection_the_upstream_closed_is_not_used(raw: RawServer,
                                                                   chat: ChatCompletionsBackend) -> None:
    """The upstream closes a kept-alive connection while it is idle: the next request goes
    out on a new one, once (no retry needed)."""
    serve(raw, sized(COMPLETION), then="close")
    await collect(chat, ask(stream=False))
    await asyncio.sleep(0.2)  # the close has reached this side
    await collect(chat, ask(stream=False))
    assert raw.connections == 2 and len(raw.requests) == 2


async def test_a_connection_closed_under_a_request_is_retried_once(raw: RawServer,
                                                                   chat: ChatCompletionsBackend) -> None:
    """The upstream reads a request on a kept-alive connection and closes it without a
    byte of answer (a server closing an idle connection just as a request arrives): it is
    sent again, invisibly, on a new connection."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = raw.connections
        await raw.read_request(reader)
        if number == 1:
            writer.write(sized(COMPLETION))
            await writer.drain()
            await raw.read_request(reader)
            return  # closed without an answer
        writer.write(sized(COMPLETION))
        await raw.until_closed(reader)

    raw.handler = handle
    await collect(chat, ask(stream=False))
    assert await collect(chat, ask(stream=False)) == [TextDelta("Hello."), Finish("stop")]
    assert raw.connections == 2 and len(raw.requests) == 3


async def test_a_cancelled_request_closes_its_connection(raw: RawServer, chat: ChatCompletionsBackend) -> None:
    """A request whose consumer goes away before the upstream answered (a client that
    left): its connection is closed, which is what tells the upstream to stop."""
    asked = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.read_request(reader)
        asked.set()
        await raw.until_closed(reader)  # never answers

    raw.handler = handle
    call = asyncio.ensure_future(collect(chat, ask()))
    await asyncio.wait_for(asked.wait(), 10)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.wait_for(raw.closed_by_client.wait(), 10)


# -- failures --------------------------------------------------------------------------------


async def test_garbage_instead_of_an_answer_is_an_upstream_error_not_retried(
        raw: RawServer, chat: ChatCompletionsBackend) -> None:
    serve(raw, b"SSH-2.0-OpenSSH_9.6\r\n\r\n", then="close")
    with pytest.raises(ModelError) as failure:
        await collect(chat, ask())
    assert failure.value.code == "upstream_error"
    assert len(raw.requests) == 1


async def test_a_broken_chunk_is_a_broken_connection(raw: RawServer, chat: ChatCompletionsBackend) -> None:
    head, first, *_ = chunked(*STREAM)
    serve(raw, [head, first, b"zz\r\nnot a chunk\r\n"], then="close")
    received: list[Delta] = []
    with pytest.raises(ModelError) as failure:
        async for delta in chat.stream(ask()):
            received.append(delta)
    assert received == [TextDelta("Hel")] and failure.value.code == "upstream_disconnected"


async def test_a_connection_cut_before_any_event_is_retried_once(raw: RawServer,
                                                                 chat: ChatCompletionsBackend) -> None:
    head, *_ = chunked(*STREAM)
    serve(raw, [head], then="close")  # a head, then nothing: cut
    with pytest.raises(ModelError) as failure:
        await collect(chat, ask())
    assert failure.value.code == "upstream_disconnected"
    assert len(raw.requests) == 2


async def test_a_silent_upstream_times_out(raw: RawServer) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await raw.read_request(reader)
        head, first, *_ = chunked(*STREAM)
        writer.write(head + first)
        await raw.until_closed(reader)  # and then nothing

    raw.handler = handle
    chat = ChatCompletionsBackend(raw.base_url, timeout=Timeouts(connect=2.0, read=0.3))
    try:
        with pytest.raises(ModelError) as failure:
            await collect(chat, ask())
    finally:
        await chat.aclose()
    assert failure.value.code == "upstream_timeout"
    await asyncio.wait_for(raw.closed_by_client.wait(), 10)


# -- the bounded pool ------------------------------------------------------------------------


def _held(raw: RawServer, release: asyncio.Event) -> None:
    """Every request is answered with a stream that waits for ``release`` before its end."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await raw.read_request(reader) is not None:
            head, first, *rest = chunked(*STREAM)
            writer.write(head + first)
            await release.wait()
            writer.write(b"".join(rest))
    raw.handler = handle


async def test_a_request_past_the_bound_waits_for_a_connection(raw: RawServer) -> None:
    release = asyncio.Event()
    _held(raw, release)
    chat = ChatCompletionsBackend(raw.base_url, pool=Pool(max_connections=1, max_keepalive=1, wait=30.0))
    try:
        first = chat.stream(ask())
        assert await anext(first) == TextDelta("Hel")  # holds the only connection
        second = asyncio.ensure_future(collect(chat, ask()))
        await asyncio.sleep(0.3)
        assert not second.done() and len(raw.requests) == 1  # waiting, not sent
        release.set()
        assert [delta async for delta in first] == HELLO[1:]
        assert await second == HELLO
    finally:
        await chat.aclose()
    assert raw.connections == 1 and len(raw.requests) == 2


async def test_a_request_that_waited_too_long_is_server_busy(raw: RawServer) -> None:
    release = asyncio.Event()
    _held(raw, release)
    chat = ChatCompletionsBackend(raw.base_url, pool=Pool(max_connections=1, max_keepalive=1, wait=0.2))
    try:
        first = chat.stream(ask())
        assert await anext(first) == TextDelta("Hel")
        with pytest.raises(TooManyRequests) as failure:
            await collect(chat, ask())
        assert failure.value.code == "server_busy" and failure.value.status == 429
        release.set()
        assert [delta async for delta in first] == HELLO[1:]
    finally:
        await chat.aclose()
    assert len(raw.requests) == 1  # the refused one never reached the upstream
