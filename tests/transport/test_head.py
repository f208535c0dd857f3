"""A response's head leaves with the start of its body (``app.transport.head``): through
the real server, the first read of a raw socket holds the status line and the body's
start; and the holder's contract on a real event loop, against a recording transport
(a test double, named as such: the kernel joins bytes, so a peer cannot tell one write
from two)."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest

from app.transport.head import HeadWithBody
from bench.stub import MODEL
from tests.live import ServerProcess


@pytest.fixture(scope="module")
def server(fronted_process: ServerProcess) -> ServerProcess:
    return fronted_process


def _first_read(server: ServerProcess, body: dict[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    request = (f"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n").encode() + payload
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request)
        return sock.recv(1 << 20)  # returns as soon as anything has arrived


@pytest.mark.parametrize("store", [True, False])
def test_a_json_answer_arrives_with_its_head_in_one_piece(server: ServerProcess, store: bool) -> None:
    for _ in range(5):  # every time, not by luck
        data = _first_read(server, {"model": MODEL, "input": "Hi", "store": store})
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        assert len(body) == length
        assert json.loads(body)["output"][0]["content"][0]["text"] == "Hello, world."


@pytest.mark.parametrize("store", [True, False])
def test_a_stream_s_head_arrives_with_its_first_events(server: ServerProcess, store: bool) -> None:
    for _ in range(5):
        data = _first_read(server, {"model": MODEL, "input": "Hi", "store": store, "stream": True})
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK")
        assert b"content-type: text/event-stream" in head.lower()
        assert b"event: response.created\ndata: {" in body


class RecordingTransport:
    """Test double: records what is written, as calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", data))

    def writelines(self, parts: Any) -> None:
        self.calls.append(("writelines", tuple(parts)))

    def close(self) -> None:
        self.closing = True
        self.calls.append(("close", None))

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


class Cycle:
    transport: Any


def _held() -> tuple[Cycle, RecordingTransport, HeadWithBody]:
    cycle, transport = Cycle(), RecordingTransport()
    cycle.transport = HeadWithBody(cycle, transport)  # type: ignore[arg-type]
    return cycle, transport, cycle.transport


@pytest.mark.anyio
async def test_the_head_and_the_next_write_leave_as_one_and_then_writes_go_straight() -> None:
    cycle, transport, holder = _held()
    holder.write(b"head")
    assert transport.calls == []
    holder.write(b"body")
    assert transport.calls == [("writelines", (b"head", b"body"))]
    assert cycle.transport is transport  # the cycle writes to the transport itself from now on
    await asyncio.sleep(0)
    assert transport.calls == [("writelines", (b"head", b"body"))]  # the held head is not sent again


@pytest.mark.anyio
async def test_a_head_with_nothing_after_it_leaves_alone_on_the_loop_s_next_turn() -> None:
    cycle, transport, holder = _held()
    holder.write(b"head")
    await asyncio.sleep(0)
    assert transport.calls == [("write", b"head")]
    assert cycle.transport is transport
    assert holder.get_extra_info("peername") == "info:peername"


@pytest.mark.anyio
async def test_closing_sends_the_held_head_first_and_a_closed_connection_gets_nothing() -> None:
    _, transport, holder = _held()
    holder.write(b"head")
    holder.close()
    assert transport.calls == [("write", b"head"), ("close", None)]
    await asyncio.sleep(0)
    assert len(transport.calls) == 2

    _, transport, holder = _held()
    holder.write(b"head")
    transport.closing = True  # the client left meanwhile
    await asyncio.sleep(0)
    assert transport.calls == []
