"""Upstream failures translated into the server's error taxonomy: the one boundary.

:func:`upstream_errors` for transport failures (connect, timeout, cut connection),
:func:`error_for_status` for HTTP answers, :func:`error_in_stream` for error objects that
arrive inside a stream. An upstream's own message reaches the client only where it
describes the client's request (400/404/413/422); otherwise it is logged, since it can
reveal keys, account ids or tracebacks. The upstream's address never appears in what
the client sees.
"""

from __future__ import annotations

import json
import logging
import re
from types import TracebackType
from typing import Any

import httpx

from app import jsontext
from app.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    ModelError,
    ModelNotFound,
    ORSError,
    TooManyRequests,
)

logger = logging.getLogger("ors.upstream")

ERROR_BODY_LIMIT = 64 * 1024
ERROR_MESSAGE_LIMIT = 500
_CONTEXT_OVERFLOW = re.compile(r"context (length|window)|maximum context|context size|too many tokens", re.I)
_MODEL_MISSING = re.compile(r"model", re.I)
_LOGPROBS = re.compile(r"logprob", re.I)


class upstream_errors:  # noqa: N801 - used as a function: ``with upstream_errors(url):``
    """Translate httpx's transport failures into the taxonomy; log the upstream's address.

    ========================================  ==========================================
    no connection (refused, DNS, TLS, proxy)  ``ModelError`` ``upstream_unavailable``
    every pooled connection stayed in use     ``TooManyRequests`` ``server_busy``
    a read or write timeout, ``TimeoutError``  ``ModelError`` ``upstream_timeout``
    the connection ended or broke             ``ModelError`` ``upstream_disconnected``
    a head that is not an HTTP answer's        ``ModelError`` ``upstream_error``
    ========================================  ==========================================

    Once the caller has set :attr:`answered` (the answer's head arrived), a body httpx
    cannot read is a broken connection too. (A class, not a generator: entered on every
    upstream request.)"""

    __slots__ = ("url", "answered")

    def __init__(self, url: str) -> None:
        self.url = url
        self.answered = False

    def __enter__(self) -> upstream_errors:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: TracebackType | None) -> None:
        if exc is None or not isinstance(exc, (httpx.HTTPError, TimeoutError, OSError)):
            return
        url = self.url
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.ProxyError, httpx.UnsupportedProtocol)):
            logger.warning("cannot reach the upstream at %s: %r", url, exc)
            raise ModelError("The upstream model server is unreachable.", code="upstream_unavailable") from exc
        if isinstance(exc, httpx.PoolTimeout):
            logger.warning("every connection to the upstream at %s stayed in use: %r", url, exc)
            raise TooManyRequests("Every connection to the upstream model server is in use; retry shortly.",
                                  code="server_busy") from exc
        if isinstance(exc, (TimeoutError, httpx.TimeoutException)):
            logger.warning("the upstream at %s timed out: %r", url, exc)
            raise ModelError("The upstream model server did not answer in time.", code="upstream_timeout") from exc
        if _broken(exc) or (self.answered and isinstance(exc, httpx.RemoteProtocolError)):
            logger.warning("the connection to the upstream at %s broke: %r", url, exc)
            raise ModelError(
                "The connection to the upstream model server broke before the model finished.",
                code="upstream_disconnected",
            ) from exc
        logger.warning("request to the upstream at %s failed: %r", url, exc)
        raise ModelError("The request to the upstream model server failed.", code="upstream_error") from exc


def _broken(exc: BaseException) -> bool:
    """Whether the connection ended or broke (as opposed to an upstream that sent
    something that is not an HTTP answer: httpx says "disconnected" or "closed" when the
    connection ended, and names what it could not parse otherwise)."""
    if isinstance(exc, httpx.RemoteProtocolError):
        message = str(exc).lower()
        return "disconnected" in message or "closed" in message
    return isinstance(exc, (httpx.ReadError, httpx.WriteError, httpx.CloseError, httpx.DecodingError, OSError))


def error_for_status(status: int, body: bytes, *, model: str, url: str, logprobs: bool = False) -> ORSError:
    """The taxonomy error for an upstream HTTP answer that is not a success.

    ``logprobs``: the request asked the upstream for logprobs. A 4xx refusal that names
    them is the client's ``include`` (or ``top_logprobs``) the upstream cannot serve: a
    400 with ``param: "include"``.

    The upstream's own message reaches the client only where it describes the client's
    request (4xx other than 401/403/429). Otherwise it is logged, not forwarded: auth and
    rate-limit messages can name this server's key or account, and 5xx bodies can carry the
    upstream's tracebacks (llama-cpp-python's server even answers invalid requests with 500).
    """
    message, code = _error_detail(json_or_text(body.decode("utf-8", errors="replace")))
    detail = message or f"HTTP {status}"
    logger.warning("the upstream at %s answered HTTP %s: %s", url, status, detail)
    if status in (401, 403):
        return ModelError(
            f"The upstream model server refused this server's credentials (HTTP {status}).", code="upstream_auth"
        )
    if status == 429:
        return TooManyRequests("The upstream model server is rate limiting requests.", code="upstream_rate_limited")
    if code == "model_not_found" or (status == 404 and _MODEL_MISSING.search(detail)):
        return ModelNotFound(f"The model {model!r} does not exist upstream: {detail}", param="model")
    if status in (400, 413, 422) and (code == "context_length_exceeded" or _CONTEXT_OVERFLOW.search(detail)):
        return ContextLengthExceeded(f"The upstream model server rejected the input: {detail}")
    if status in (408, 504):
        return ModelError(f"The upstream model server timed out (HTTP {status}).", code="upstream_timeout")
    if status == 503:
        return ModelError("The upstream model server is unavailable (HTTP 503).", code="upstream_unavailable")
    if 400 <= status < 500 and status != 404:
        if logprobs and _LOGPROBS.search(detail):
            return InvalidRequest(
                f"The upstream model server cannot return logprobs for this request: {detail}. Remove "
                "'message.output_text.logprobs' from include and set top_logprobs to 0.",
                code="upstream_rejected",
                param="include",
            )
        return InvalidRequest(f"The upstream model server rejected the request: {detail}", code="upstream_rejected")
    return ModelError(f"The upstream model server failed (HTTP {status}).", code="upstream_error")


def error_in_stream(error: Any) -> ModelError:
    """The taxonomy error for an error object the upstream sent instead of (more) chunks."""
    message, _ = _error_detail({"error": error})
    return ModelError(f"The upstream model server failed: {message or 'unknown error'}", code="upstream_error")


def _error_detail(body: Any) -> tuple[str, str | None]:
    """``(message, code)`` from the error shapes servers use: OpenAI's ``{"error": {...}}``,
    ``{"error": "text"}``, FastAPI's ``{"detail": ...}``, ``{"message": ...}`` or plain text."""
    if isinstance(body, dict) and "error" in body:
        body = body["error"]
    code = None
    if isinstance(body, dict):
        code = body.get("code") if isinstance(body.get("code"), str) else None
        body = body.get("message") or body.get("detail") or body.get("msg") or json.dumps(body)
    if isinstance(body, list):
        body = "; ".join(str(item.get("msg", item)) if isinstance(item, dict) else str(item) for item in body)
    text = str(body).strip() if body is not None else ""
    if len(text) > ERROR_MESSAGE_LIMIT:
        text = text[:ERROR_MESSAGE_LIMIT] + "…"
    return text, code


def json_or_text(text: str) -> Any:
    try:
        return jsontext.loads(text)
    except ValueError:
        return text


def json_object(raw: str | bytes) -> dict[str, Any]:
    try:
        value = jsontext.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        snippet = raw[:200] if isinstance(raw, str) else raw[:200].decode("utf-8", errors="replace")
        raise ModelError(f"The upstream model server sent a malformed chunk: {snippet!r}", code="upstream_error")
    return value

