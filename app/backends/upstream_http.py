"""What every HTTP upstream adapter shares: its address and key, one httpx client, and
its model list.

:class:`HttpUpstream` is the base of the wire adapters (:mod:`app.backends.chat_completions`,
:mod:`app.backends.responses_upstream`); it knows nothing of either wire format. One
instance is one upstream: it owns one ``httpx.AsyncClient`` (made by
:func:`app.backends.http_client.upstream_client`: proxies from the environment, the
upstream's own TLS files, a bounded pool; made again by :meth:`start` after
:meth:`aclose`), so requests to that upstream reuse its pooled keep-alive connections.
Those connections belong to the event loop that opened them, so one backend serves one
loop.

A response whose body is not read to its end (a client that left, a task cancelled) is
closed, and httpx closes its connection rather than pool it: that is what tells the
upstream to stop generating.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import httpx

from app.backends.base import TEXT_AND_IMAGES, Backend, Delta, Finish, InputModality, ModelInfo
from app.backends.chat_errors import ERROR_BODY_LIMIT, error_for_status, upstream_errors
from app.backends.http_client import Pool, Timeouts, TlsFiles, check_headers, upstream_client
from app.backends.sse_parser import SSEParser
from app.backends.tool_names import restored
from app.errors import ModelError, ORSError

logger = logging.getLogger("ors.upstream")

DEFAULT_TIMEOUT = Timeouts()
MODEL_LIST_TTL = 30.0
"""Seconds a fetched upstream model list is reused."""
MODEL_LIST_SECONDS = 10.0
"""How long fetching an upstream's model list may take."""

_ACCEPT_JSON = {"Accept": "application/json"}
_STREAM_HEADERS = {"Accept": "text/event-stream", "Content-Type": "application/json"}
_WHOLE_HEADERS = {"Accept": "application/json", "Content-Type": "application/json"}


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
        pool: Pool = Pool(),
        tls: TlsFiles | None = None,
        input_modalities: Sequence[InputModality] = TEXT_AND_IMAGES,
        model_input_modalities: Mapping[str, Sequence[InputModality]] | None = None,
    ) -> None:
        """``pool``: the bounds of its connection pool; ``tls``: its own CA bundle and
        client certificate (the system's trust, or ``SSL_CERT_FILE``, without);
        ``input_modalities``: what its models take (:attr:`Backend.input_modalities`), and
        ``model_input_modalities`` what some take instead, by the id it is sent. Raises
        ``ValueError`` for a base URL that is not an upstream's, a header that cannot be
        sent, or TLS files that cannot be used."""
        url = urllib.parse.urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"the upstream base URL must be an http(s) URL, got {base_url!r}")
        if url.username is not None or url.query or url.fragment:
            raise ValueError(f"the upstream base URL must be scheme, host, port and path only (a key goes in "
                             f"its api_key), got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.input_modalities = tuple(input_modalities)
        self.model_input_modalities = {model: tuple(taken) for model, taken in (model_input_modalities or {}).items()}
        self.allowed_models = tuple(models) if models is not None else None
        self.owned_by = owned_by
        self._headers = dict(headers or {})
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        check_headers(self._headers)
        self._timeout = timeout
        self._pool = pool
        self._verify = tls.context() if tls is not None else True
        self._client: httpx.AsyncClient | None = None
        self._model_list: list[ModelInfo] | None = None
        self._model_list_at = 0.0

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self._http()

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def _http(self) -> httpx.AsyncClient:
        """The client, made on first use (and again after :meth:`aclose`)."""
        client = self._client
        if client is None:
            client = self._client = upstream_client(self.base_url, headers=self._headers, timeouts=self._timeout,
                                                    pool=self._pool, verify=self._verify)
        return client

    async def deltas(
        self, path: str, body: bytes, *, stream: bool, decoder: Callable[[], AnswerDecoder],
        refused: Callable[[int, bytes, str], ORSError], back: Mapping[str, str],
        finished: Callable[[AnswerDecoder, str], None] | None = None,
    ) -> AsyncIterator[Delta]:
        """A request's deltas, ending with exactly one ``Finish`` (the decoder's): the one
        generator from the upstream's answer to the consumer.

        ``body`` (JSON) is posted to ``path`` (below the base URL; ``stream``: asking for
        an event stream); a status other than 2xx is ``refused(status, body, url)`` (at
        most :data:`~app.backends.chat_errors.ERROR_BODY_LIMIT` bytes of its body read); a
        JSON answer (asked whole, or an upstream that ignored ``stream: true``) is read
        whole, an event stream as it comes, and read on to its end after the terminal
        event (only an answer read to its end gives its connection back to the pool).
        Calls come back under their wire names, turned back by ``back``; ``finished``
        sees the decoder before its ``Finish`` is made.

        The upstream's answer lives inside this generator: closing it (``aclose``) or
        cancelling its consumer closes the answer, and with it its connection, and
        servers stop generating for a client that went away. One retry, invisible to the
        consumer: when the connection breaks before the upstream sent a single event.
        That is how a pooled keep-alive connection that the server has just closed fails;
        no output has been seen, so nothing is repeated or lost."""
        url = self.base_url + path
        relative = path.lstrip("/")
        headers = _STREAM_HEADERS if stream else _WHOLE_HEADERS
        for attempt in (1, 2):
            current = decoder()
            try:
                with upstream_errors(url) as errors:
                    async with self._http().stream("POST", relative, content=body, headers=headers) as answer:
                        errors.answered = True
                        if not answer.is_success:
                            raise refused(answer.status_code, await _first_bytes(answer, ERROR_BODY_LIMIT), url)
                        if answer.headers.get("content-type", "").startswith("application/json"):
                            for delta in current.feed_whole(await answer.aread()):
                                yield restored(delta, back) if back else delta
                        else:
                            parser = SSEParser()
                            async for chunk in answer.aiter_bytes():
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
        return [ModelInfo(id=name, owned_by=self.owned_by, images=self.takes_images(name))
                for name in self.allowed_models or ()]

    def takes_images(self, model: str | None = None) -> bool:
        taken = self.model_input_modalities.get(model, self.input_modalities) if model else self.input_modalities
        return "image" in taken

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
                    answer = await self._http().get("models", headers=_ACCEPT_JSON)
                status, body = answer.status_code, answer.content
                if status != 200:
                    raise error_for_status(status, body, model="", url=url)
            listed = [dataclasses.replace(info, images=self.takes_images(info.id))
                      for info in model_infos(json.loads(body), self.owned_by)]
        except (ORSError, ValueError) as exc:
            logger.warning("could not list the models of the upstream at %s: %s", url, exc)
            return list(self._model_list) if self._model_list is not None else self.models()
        if self.allowed_models is not None:
            listed = [info for info in listed if info.id in self.allowed_models]
        self._model_list, self._model_list_at = listed, now
        return list(listed)


async def _first_bytes(answer: httpx.Response, limit: int) -> bytes:
    """The body of ``answer``, or its first ``limit`` bytes or more (the rest is left
    unread, and the connection is not reused)."""
    body = bytearray()
    async for piece in answer.aiter_bytes():
        body += piece
        if len(body) >= limit:
            break
    return bytes(body)


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
