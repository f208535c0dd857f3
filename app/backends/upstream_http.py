"""What every HTTP upstream adapter shares: its address and key, one kept-alive client,
and its model list.

:class:`HttpUpstream` is the base of the wire adapters (:mod:`app.backends.chat_completions`,
:mod:`app.backends.responses_upstream`); it knows nothing of either wire format. One
instance is one upstream: it owns one ``httpx.AsyncClient`` (opened by :meth:`start` or on
first use, closed by :meth:`aclose`), so requests to that upstream reuse its pooled
keep-alive connections. Those connections belong to the event loop that opened them, so
one backend serves one loop. An injected ``client`` is used as is and never closed here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from app.backends.base import Backend, ModelInfo
from app.backends.chat_errors import error_for_status, upstream_errors
from app.errors import ORSError

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=600.0, write=30.0, pool=30.0)
"""Connect fast or fail; a stream may stay silent for minutes while a model thinks."""
DEFAULT_LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=128, keepalive_expiry=4.0)
"""Every response in flight has its own connection (a stream holds one for its whole
life: a cap here made the 101st of 1,000 concurrent streams wait, then time out); up to
128 idle ones are kept alive, and dropped before the 5 s keep-alive timeout of uvicorn-
and Node-based servers. How many responses run at once is bounded where it should be:
by the rate limits and the clients."""
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
        client: httpx.AsyncClient | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        limits: httpx.Limits = DEFAULT_LIMITS,
        headers: Mapping[str, str] | None = None,
        owned_by: str = "upstream",
    ) -> None:
        url = httpx.URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"the upstream base URL must be an http(s) URL, got {base_url!r}")
        self.base_url = str(url).rstrip("/")
        self.allowed_models = tuple(models) if models is not None else None
        self.owned_by = owned_by
        self._headers = dict(headers or {})
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = timeout
        self._limits = limits
        self._client = client
        self._owns_client = client is None
        self._model_list: list[ModelInfo] | None = None
        self._model_list_at = 0.0

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self._http()

    async def aclose(self) -> None:
        if self._owns_client and self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self._timeout, limits=self._limits, follow_redirects=False)
        return self._client

    def _stream_headers(self) -> dict[str, str]:
        return {**self._headers, "Accept": "text/event-stream"}

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
                response = await self._http().get(url, headers=self._headers, timeout=10.0)
                if response.status_code != 200:
                    raise error_for_status(response.status_code, response.content, model="", url=url)
            listed = model_infos(response.json(), self.owned_by)
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
