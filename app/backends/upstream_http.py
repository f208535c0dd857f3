"""What every HTTP upstream adapter shares: its address and key, one kept-alive client,
and its model list.

:class:`HttpUpstream` is the base of the wire adapters (:mod:`app.backends.chat_completions`,
:mod:`app.backends.responses_upstream`); it knows nothing of either wire format. One
instance is one upstream: it owns one :class:`app.backends.http1.Client` (made by
:meth:`start` or on first use, closed by :meth:`aclose`), so requests to that upstream
reuse its pooled keep-alive connections. Those connections belong to the event loop that
opened them, so one backend serves one loop.

The client is this project's own small HTTP/1.1 client (:mod:`app.backends.http1`): the
upstream call is the largest single part of what ors adds to a proxied request, and a
general client costs several times what one origin and one request shape need (httpx
about four times aiohttp's CPU per streamed request; aiohttp about seven times this
client's instructions). A request whose body is not read to its end (a client that left)
has its connection closed, not pooled, which is what tells the upstream to stop
generating.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager as AsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from app import jsontext
from app.backends.base import Backend, Delta, Finish, ModelInfo
from app.backends.chat_errors import ERROR_BODY_LIMIT, error_for_status, upstream_errors
from app.backends.chat_stream import SSEParser
from app.backends.http1 import Client, Connection
from app.backends.tool_names import restored
from app.errors import ModelError, ORSError

logger = logging.getLogger("ors.upstream")


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect: float = 5.0
    """Seconds to open a connection: connect fast or fail."""
    read: float = 600.0
    """Seconds a response may stay silent: a model may think for minutes."""


DEFAULT_TIMEOUT = Timeouts()
KEEPALIVE_SECONDS = 4.0
"""Idle connections are dropped before the 5 s keep-alive timeout of uvicorn- and
Node-based servers. Every response in flight has its own connection (a stream holds one
for its whole life: a cap made the 101st of 1,000 concurrent streams wait, then time
out), so the pool has no limit; how many responses run at once is bounded where it should
be: by the rate limits and the clients."""
MODEL_LIST_TTL = 30.0
"""Seconds a fetched upstream model list is reused."""
MODEL_LIST_SECONDS = 10.0
"""How long fetching an upstream's model list may take."""

_ACCEPT_JSON = b"Accept: application/json\r\n"
_JSON_BODY = b"Content-Type: application/json\r\n"
_STREAM_HEADERS = b"Accept: text/event-stream\r\n" + _JSON_BODY
_WHOLE_HEADERS = _ACCEPT_JSON + _JSON_BODY


class AnswerDecoder(Protocol):
    """What a wire adapter reads an upstream's answer with (``ChunkDecoder``,
    ``ResponsesEventDecoder``)."""

    received: bool
    """Whether anything of an answer was read (a retry is safe only before)."""

    def feed_whole(self, body: bytes) -> list[Delta]: ...

    def feed_events(self, events: Iterable[tuple[str, str]]) -> Iterable[Delta]: ...

    def finish(self) -> Finish: ...


class HttpUpstream(Backend):
    """One upstream server reached over HTTP.

    ``models``: an optional allow-list. Without it the backend serves every model id (the
    router sends it only the ids routed to it) and :meth:`fetch_models` reports what the
    upstream lists.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        models: Sequence[str] | None = None,
        timeout: Timeouts = DEFAULT_TIMEOUT,
        headers: Mapping[str, str] | None = None,
        owned_by: str = "upstream",
    ) -> None:
        url = urllib.parse.urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"the upstream base URL must be an http(s) URL, got {base_url!r}")
        if url.username is not None or url.query or url.fragment:
            raise ValueError(f"the upstream base URL must be scheme, host, port and path only (a key goes in "
                             f"its api_key), got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self._origin = f"{url.scheme}://{url.netloc}"
        self._base_path = url.path.rstrip("/")
        self.allowed_models = tuple(models) if models is not None else None
        self.owned_by = owned_by
        self._headers = dict(headers or {})
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = timeout
        self._client = self._new_client()  # a header that cannot be sent is refused here
        self._model_list: list[ModelInfo] | None = None
        self._model_list_at = 0.0

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self._http()

    async def aclose(self) -> None:
        await self._client.aclose()

    def _new_client(self) -> Client:
        return Client(self._origin, connect=self._timeout.connect, read=self._timeout.read,
                      keepalive=KEEPALIVE_SECONDS, headers=self._headers)

    def _http(self) -> Client:
        if self._client.closed:  # started again after it was closed
            self._client = self._new_client()
        return self._client

    def post_stream(self, path: str, payload: dict[str, Any] | bytes, *,
                    stream: bool = True) -> AsyncContextManager[Connection]:
        """``POST`` ``payload`` as JSON (or JSON already encoded) to ``path`` (below the
        base URL), asking for an event stream (or, without ``stream``, one JSON body);
        ``async with`` gives the answer once its head has arrived, whose body the caller
        reads (``answer.chunks()``). Leaving the block before the end of the body closes
        the connection."""
        body = payload if isinstance(payload, bytes) else jsontext.dumps_bytes(payload)
        return self._http().request("POST", self._base_path + path, body,
                                    _STREAM_HEADERS if stream else _WHOLE_HEADERS)

    async def deltas(
        self, path: str, body: bytes, *, stream: bool, decoder: Callable[[], AnswerDecoder],
        refused: Callable[[int, bytes, str], ORSError], back: Mapping[str, str],
        finished: Callable[[AnswerDecoder, str], None] | None = None,
    ) -> AsyncIterator[Delta]:
        """A request's deltas, ending with exactly one ``Finish`` (the decoder's): the one
        generator from the upstream's answer to the consumer. The request, its answer
        and its parsing run in this loop, so each delta crosses no layer of its own.

        ``body`` goes to ``path`` (``stream``: asking for an event stream); a status
        other than 2xx is ``refused(status, body, url)``; a JSON answer (asked whole, or
        an upstream that ignored ``stream: true``) is read whole, an event stream as it
        comes, and read on to its end after the terminal event (only an answer read to
        its end gives its connection back to the pool). Calls come back under their
        wire names, turned back by ``back``; ``finished`` sees the decoder before its
        ``Finish`` is made.

        The upstream's answer lives inside this generator: closing it (``aclose``) or
        cancelling its consumer closes the answer's connection, and servers stop
        generating for a client that went away. One retry, invisible to the consumer:
        when the connection breaks before the upstream sent a single event. That is how
        a pooled keep-alive connection that the server has just closed fails; no output
        has been seen, so nothing is repeated or lost."""
        url = self.base_url + path
        for attempt in (1, 2):
            current = decoder()
            try:
                with upstream_errors(url):
                    async with self.post_stream(path, body, stream=stream) as answer:
                        if not 200 <= answer.status < 300:
                            raise refused(answer.status, await answer.read(ERROR_BODY_LIMIT), url)
                        if answer.headers.get("content-type", "").startswith("application/json"):
                            for delta in current.feed_whole(await answer.read()):
                                yield restored(delta, back) if back else delta
                        else:
                            parser = SSEParser()
                            async for chunk in answer.chunks():
                                for delta in current.feed_events(parser.feed_bytes(chunk)):
                                    yield restored(delta, back) if back else delta
                            for delta in current.feed_events(parser.end()):
                                yield restored(delta, back) if back else delta
            except ModelError as exc:
                if attempt == 1 and exc.code == "upstream_disconnected" and not current.received:
                    logger.info("retrying a request whose connection to %s broke before any event", url)
                    continue
                raise
            break
        if finished is not None:
            finished(current, url)
        yield current.finish()

    # -- models ------------------------------------------------------------------------------

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=name, owned_by=self.owned_by) for name in self.allowed_models or ()]

    def serves(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models

    async def available_models(self) -> list[ModelInfo]:
        return await self.fetch_models()

    async def fetch_models(self) -> list[ModelInfo]:
        """The upstream's ``GET /models``, filtered by the allow-list; best effort.

        A fresh answer is reused for :data:`MODEL_LIST_TTL` seconds. If the upstream cannot
        answer, the last good list (or :meth:`models`) is returned and nothing is raised.
        """
        now = time.monotonic()
        if self._model_list is not None and now - self._model_list_at < MODEL_LIST_TTL:
            return list(self._model_list)
        url = f"{self.base_url}/models"
        try:
            with upstream_errors(url):
                async with asyncio.timeout(MODEL_LIST_SECONDS):
                    async with self._http().request("GET", f"{self._base_path}/models",
                                                    headers=_ACCEPT_JSON) as answer:
                        status, body = answer.status, await answer.read()
                if status != 200:
                    raise error_for_status(status, body, model="", url=url)
            listed = model_infos(json.loads(body), self.owned_by)
        except (ORSError, ValueError) as exc:
            logger.warning("could not list the models of the upstream at %s: %s", url, exc)
            return list(self._model_list) if self._model_list is not None else self.models()
        if self.allowed_models is not None:
            listed = [info for info in listed if info.id in self.allowed_models]
        self._model_list, self._model_list_at = listed, now
        return list(listed)


def model_infos(listing: Any, owned_by: str) -> list[ModelInfo]:
    """The entries of an OpenAI-style model list (``{"data": [{"id": ...}, ...]}``)."""
    entries = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(entries, list):
        raise ValueError("the upstream model list has no 'data' array")
    infos = []
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            window = entry.get("max_model_len")
            infos.append(
                ModelInfo(
                    id=entry["id"],
                    owned_by=entry.get("owned_by") if isinstance(entry.get("owned_by"), str) else owned_by,
                    context_window=window if isinstance(window, int) else None,
                )
            )
    return infos
