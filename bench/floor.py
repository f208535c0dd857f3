"""The floor of the stack: the least a Responses proxy on ors's own stack does, as a
reference measured beside ors in the proxy benchmark.

A raw ASGI app (no framework) on the same uvicorn (httptools, uvloop), in front of the
same upstream with the same HTTP client (httpx, made as ors makes it:
:func:`app.backends.http_client.upstream_client`, one kept-alive pool). ``POST
/v1/responses`` reads the body, decodes its JSON, sends the upstream one Chat Completions
request made of its ``model`` and text ``input`` (``stream`` as asked), and passes the
upstream's answer back as it comes: the completion as it is, or its SSE chunks one by
one. Nothing is validated, translated, counted, logged or stored, so it is not a
Responses server; what it adds over the upstream is what the stack itself costs on the
machine (two HTTP exchanges in Python instead of one), and what ors adds over it is
ors's own work. ``GET /v1/models`` answers at once (readiness).

Run it on its own with ``python -m bench.floor --port PORT --upstream URL``, or with
:class:`FloorProcess`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from app.backends.http_client import upstream_client
from bench.stub import JSON_HEADERS, MODELS_BODY, SSE_HEADERS, StubProcess, _body, _send


class Floor:
    """The ASGI application, forwarding to ``upstream`` (a Chat Completions base URL)."""

    def __init__(self, upstream: str) -> None:
        self.client = upstream_client(upstream.rstrip("/"))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"]
                if kind == "lifespan.shutdown":
                    await self.client.aclose()
                await send({"type": f"{kind}.complete"})
                if kind == "lifespan.shutdown":
                    return
        if scope["type"] != "http":
            return
        if scope["method"] == "GET" and scope["path"] == "/v1/models":
            await _send(send, 200, JSON_HEADERS, MODELS_BODY)
        elif scope["method"] == "POST" and scope["path"] == "/v1/responses":
            await self._forward(json.loads(await _body(receive)), send)
        else:
            await _send(send, 404, JSON_HEADERS, b'{"error":{"message":"not found"}}')

    async def _forward(self, request: dict[str, Any], send: Any) -> None:
        stream = bool(request.get("stream"))
        chat: dict[str, Any] = {"model": request["model"], "stream": stream,
                                "messages": [{"role": "user", "content": request["input"]}]}
        if stream:
            chat["stream_options"] = {"include_usage": True}
        body = json.dumps(chat).encode()
        async with self.client.stream("POST", "chat/completions", content=body,
                                      headers={"Content-Type": "application/json"}) as answer:
            if not stream:
                await _send(send, answer.status_code, JSON_HEADERS, await answer.aread())
                return
            await send({"type": "http.response.start", "status": answer.status_code, "headers": SSE_HEADERS})
            async for chunk in answer.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})


class FloorProcess(StubProcess):
    """The floor served by uvicorn in its own process on 127.0.0.1, in front of ``upstream``."""

    def __init__(self, port: int, upstream: str, log_path: Path) -> None:
        super().__init__(port, log_path)
        self.upstream = upstream

    def command(self) -> list[str]:
        return [sys.executable, "-m", "bench.floor", "--port", str(self.port), "--upstream", self.upstream]


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8091)
    parser.add_argument("--upstream", required=True, help="the upstream's Chat Completions base URL")
    arguments = parser.parse_args(argv)
    uvicorn.run(Floor(arguments.upstream), host="127.0.0.1", port=arguments.port, http="httptools", loop="auto",
                lifespan="on", log_level="warning", access_log=False, backlog=4096, timeout_keep_alive=60)


if __name__ == "__main__":
    main()
