"""The HTTP client of one llama-server process: what this server asks of it, and how its
answers and failures read.

One :class:`LlamaClient` per process (a restarted process gets a new one), over
:func:`app.backends.http_client.loopback_client`: 127.0.0.1, never a proxy, the
process's own key on every request. The supervisor
(:class:`app.backends.llama_server.LlamaServer`) decides when to ask; this module knows
the wire:

* ``GET /health``: 200 once the model is loaded (:meth:`LlamaClient.healthy`);
* ``GET /metrics``: answered by the main loop between two steps of its batch, so an
  answer proves the loop turns (:meth:`LlamaClient.responsive`);
* ``POST /slots/<i>?action=save|restore`` (:meth:`LlamaClient.slot_action`);
* ``POST /completion`` streamed (:meth:`LlamaClient.completion`): Server-Sent Events, one
  JSON chunk per token, the last with ``stop: true``.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from app import jsontext
from app.backends.http_client import loopback_client
from app.backends.sse_parser import sse_events
from app.errors import InvalidRequest, ModelError

log = logging.getLogger("ors.llama_server")

SLOT_ACTION_SECONDS = 120.0
"""How long saving or restoring one slot may take (a large KV state to or from disk)."""


class Unanswered(Exception):
    """The connection broke before llama-server sent a single chunk of a completion:
    nothing was generated, so the request may be sent again."""


class LlamaClient:
    """Requests to one llama-server at ``base_url`` that carry ``key``."""

    def __init__(self, base_url: str, key: str) -> None:
        self.http = loopback_client(base_url, headers={"Authorization": f"Bearer {key}"})

    async def aclose(self) -> None:
        await self.http.aclose()

    async def healthy(self, timeout: float) -> bool:
        """Whether ``/health`` answers 200 within ``timeout`` seconds (a loading model
        answers 503; a process not yet listening refuses the connection)."""
        try:
            reply = await self.http.get("/health", timeout=timeout)
        except httpx.HTTPError:
            return False
        return reply.status_code == 200

    async def responsive(self, timeout: float) -> bool | None:
        """Whether ``/metrics`` answered within ``timeout`` seconds: ``False`` if it did
        not (the main loop is stuck), ``None`` if the connection failed (the process is
        gone or going: that is for the supervisor's exit watch to see)."""
        try:
            await self.http.get("/metrics", timeout=timeout)
        except httpx.TimeoutException:
            return False
        except httpx.HTTPError:
            return None
        return True

    async def slot_action(self, slot: int, action: str, name: str) -> dict[str, Any] | None:
        """``POST /slots/<slot>?action=...`` with the file ``name``: llama-server's
        answer, or ``None`` (logged) if it could not."""
        try:
            reply = await self.http.post(f"/slots/{slot}", params={"action": action}, json={"filename": name},
                                         timeout=SLOT_ACTION_SECONDS)
        except httpx.HTTPError as exc:
            log.warning("llama-server could not %s slot %d: %r", action, slot, exc)
            return None
        if reply.status_code != 200:
            log.warning("llama-server could not %s slot %d: %s", action, slot, reply.text[:300])
            return None
        try:
            answer = reply.json()
        except ValueError:
            return {}
        return answer if isinstance(answer, dict) else {}

    async def completion(self, body: Mapping[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Stream ``POST /completion``: its chunks (parsed JSON objects), up to and with
        the one with ``stop: true``.

        Closing this iterator closes the response and its connection, which llama-server
        notices: it cancels the generation and frees the slot. Raises :class:`Unanswered`
        when the connection broke before the first chunk, ``InvalidRequest`` for a 400
        (a grammar llama.cpp refuses, say), ``ModelError`` for anything else that went
        wrong, including a stream that ended without its last chunk."""
        received = False
        try:
            async with self.http.stream("POST", "/completion", json={**body, "stream": True}) as reply:
                if reply.status_code != 200:
                    raise _error(reply.status_code, (await reply.aread()).decode(errors="replace"))
                async with contextlib.aclosing(sse_events(reply.aiter_bytes())) as events:
                    async for event, data in events:
                        received = True
                        if event == "error":
                            raise _error(500, data)
                        chunk = jsontext.loads(data)
                        if isinstance(chunk, dict) and "error" in chunk:
                            raise _error(500, json.dumps(chunk["error"]))
                        yield chunk
                        if chunk.get("stop"):
                            return
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.ConnectError) as exc:
            if not received:
                raise Unanswered(repr(exc)) from exc
            raise ModelError(f"The embedded model's server failed: {exc!r}", code="model_unavailable") from exc
        except httpx.HTTPError as exc:
            raise ModelError(f"The embedded model's server failed: {exc!r}", code="model_unavailable") from exc
        raise ModelError("The embedded model's server ended the stream early.", code="model_stream_ended")


def _error(status: int, text: str) -> Exception:
    try:
        message = json.loads(text).get("error", {}).get("message", text)
    except (ValueError, AttributeError):
        message = text
    if status == 400:
        return InvalidRequest(f"The embedded model refused the request: {message}")
    return ModelError(f"The embedded model's server answered {status}: {message}", code="model_error")
