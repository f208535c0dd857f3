"""A fast Chat Completions upstream: a raw ASGI app (no framework) that answers at once.

``POST /v1/chat/completions`` answers ``Hello, world.`` either as one JSON completion or,
with ``stream: true``, as Server-Sent Events: a role chunk, four content chunks, a finish
chunk, a usage chunk (when ``stream_options.include_usage`` asks for it, as ors does),
then ``data: [DONE]``. ``GET /v1/models`` lists :data:`MODEL`.

A model named ``stub-hold-<seconds>`` (e.g. ``stub-hold-10``) streams its first content
chunk at once, then keeps the stream open that many seconds before the rest: many
streams can be held open at the same time. Without streaming it answers at once.

Every answer is prepared once per model, so the stub costs as little as it can; what a
benchmark measures through ors is then ors. Run it on its own with
``python -m bench.stub --port PORT``, or with :class:`StubProcess`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Self

import httpx

MODEL = "stub"
HOLD_PREFIX = "stub-hold-"
TEXT = ("Hello", ",", " world", ".")
USAGE = {"prompt_tokens": 5, "completion_tokens": len(TEXT), "total_tokens": 5 + len(TEXT)}

Scope = dict[str, Any]


def hold_model(seconds: float) -> str:
    """The model id whose streams stay open ``seconds`` after their first text."""
    return f"{HOLD_PREFIX}{seconds:g}"


def _hold_seconds(model: str) -> float:
    if model.startswith(HOLD_PREFIX):
        with contextlib.suppress(ValueError):
            return max(0.0, float(model.removeprefix(HOLD_PREFIX)))
    return 0.0


def _chunk(model: str, delta: dict[str, Any], finish: str | None = None, *, usage: bool = False) -> bytes:
    body: dict[str, Any] = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 0, "model": model,
                            "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage:
        body["usage"] = USAGE
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


@lru_cache(maxsize=64)
def _stream_parts(model: str, include_usage: bool) -> tuple[bytes, bytes]:
    """The stream of ``model`` in two parts: what is sent at once (the role chunk and the
    first text), and the rest (sent after the hold, if any)."""
    first = _chunk(model, {"role": "assistant", "content": ""}) + _chunk(model, {"content": TEXT[0]})
    rest = b"".join(_chunk(model, {"content": text}) for text in TEXT[1:])
    rest += _chunk(model, {}, "stop")
    if include_usage:
        rest += _chunk(model, {}, usage=True)
    return first, rest + b"data: [DONE]\n\n"


@lru_cache(maxsize=64)
def _completion(model: str) -> bytes:
    return json.dumps({
        "id": "chatcmpl-stub", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(TEXT)}, "finish_reason": "stop"}],
        "usage": USAGE,
    }, separators=(",", ":")).encode()


MODELS_BODY = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0,
                                                       "owned_by": "stub"}]}).encode()
JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


async def app(scope: Scope, receive: Any, send: Any) -> None:
    """The ASGI application."""
    if scope["type"] == "lifespan":
        while True:
            kind = (await receive())["type"]
            await send({"type": f"{kind}.complete"})  # lifespan.startup / lifespan.shutdown
            if kind == "lifespan.shutdown":
                return
    if scope["type"] != "http":
        return
    path, method = scope["path"], scope["method"]
    if method == "GET" and path in ("/v1/models", "/models"):
        await _send(send, 200, JSON_HEADERS, MODELS_BODY)
    elif method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
        await _complete(await _body(receive), send)
    else:
        await _send(send, 404, JSON_HEADERS, b'{"error":{"message":"not found","type":"not_found"}}')


async def _body(receive: Any) -> bytes:
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)


async def _complete(raw: bytes, send: Any) -> None:
    try:
        request = json.loads(raw)
        model = str(request.get("model") or MODEL)
    except (ValueError, AttributeError):
        await _send(send, 400, JSON_HEADERS, b'{"error":{"message":"invalid JSON","type":"invalid_request_error"}}')
        return
    if not request.get("stream"):
        await _send(send, 200, JSON_HEADERS, _completion(model))
        return
    include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
    first, rest = _stream_parts(model, include_usage)
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    await send({"type": "http.response.body", "body": first, "more_body": True})
    hold = _hold_seconds(model)
    if hold:
        await asyncio.sleep(hold)
    await send({"type": "http.response.body", "body": rest})


async def _send(send: Any, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class StubProcess:
    """The stub served by uvicorn (httptools) in its own process on 127.0.0.1."""

    def __init__(self, port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """The Chat Completions base URL (what ``ORS_UPSTREAM_URL`` takes)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        """What runs the server (another of the benchmark's servers overrides it)."""
        return [sys.executable, "-m", "bench.stub", "--port", str(self.port)]

    def start(self, timeout: float = 30) -> Self:
        """Start the process, and return once it answers ``GET /v1/models``."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.command()[2]} exited early:\n{self.log_path.read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/models", timeout=1).status_code == 200:
                    return self
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"{self.command()[2]} did not start:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m bench.stub", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8090)
    arguments = parser.parse_args(argv)
    uvicorn.run(app, host="127.0.0.1", port=arguments.port, http="httptools", loop="auto", lifespan="on",
                log_level="warning", access_log=False, backlog=4096, timeout_keep_alive=60)


if __name__ == "__main__":
    main()
