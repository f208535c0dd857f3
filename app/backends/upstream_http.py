"""What every HTTP upstream adapter shares: its address and key, one kept-alive client,
and its model list.

:class:`HttpUpstream` is the base of the wire adapters (:mod:`app.backends.chat_completions`,
:mod:`app.backends.responses_upstream`); it knows nothing of either wire format. One
instance is one upstream: it owns one ``aiohttp.ClientSession`` (opened by :meth:`start`
or on first use, closed by :meth:`aclose`), so requests to that upstream reuse its pooled
keep-alive connections. Those connections belong to the event loop that opened them, so
one backend serves one loop. An injected ``session`` is used as is and never closed here.

aiohttp rather than httpx: its C parser makes a streamed request cost about a quarter
of the CPU (0.31 against 1.26 ms per request, measured against the benchmark's stub on
2 cores), and the upstream call is most of what ors adds to a proxied request. A request
whose body is not read to its end (a client that left) has its connection closed, not
pooled, which is what tells the upstream to stop generating.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import urllib.parse
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from app import jsontext
from app.backends.base import Backend, ModelInfo
from app.backends.chat_errors import error_for_status, upstream_errors
from app.errors import ORSError

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
        session: aiohttp.ClientSession | None = None,
        timeout: Timeouts = DEFAULT_TIMEOUT,
        headers: Mapping[str, str] | None = None,
        owned_by: str = "upstream",
    ) -> None:
        url = urllib.parse.urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"the upstream base URL must be an http(s) URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.allowed_models = tuple(models) if models is not None else None
        self.owned_by = owned_by
        self._headers = dict(headers or {})
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout.connect, sock_read=timeout.read)
        self._session = session
        self._owns_session = session is None
        self._model_list: list[ModelInfo] | None = None
        self._model_list_at = 0.0

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self._http()

    async def aclose(self) -> None:
        if self._owns_session and self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_SECONDS)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout,
                                                  auto_decompress=True, raise_for_status=False)
        return self._session

    @contextlib.asynccontextmanager
    async def post_stream(self, url: str, payload: dict[str, Any] | bytes, *,
                          stream: bool = True) -> AsyncIterator[aiohttp.ClientResponse]:
        """``POST`` ``payload`` as JSON (or JSON already encoded) asking for an event
        stream (or, without ``stream``, one JSON body); the response, whose body the
        caller reads (``content.iter_any()``). Leaving the block before the end of the
        body closes the connection."""
        body = payload if isinstance(payload, bytes) else jsontext.dumps_bytes(payload)
        headers = {**self._headers, "Accept": "text/event-stream" if stream else "application/json",
                   "Content-Type": "application/json"}
        async with self._http().post(url, data=body, headers=headers, allow_redirects=False) as response:
            yield response

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
                async with self._http().get(url, headers=self._headers, allow_redirects=False,
                                            timeout=aiohttp.ClientTimeout(total=10.0)) as response:
                    status, body = response.status, await response.read()
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
