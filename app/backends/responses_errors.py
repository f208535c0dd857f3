"""A Responses upstream's failures in the server's error taxonomy: the one boundary of
:mod:`app.backends.responses_upstream`.

Transport failures and HTTP statuses are mapped exactly as for a Chat Completions upstream
(:mod:`app.backends.chat_errors`: the same codes, the same care not to forward what the
client should not see). What a Responses upstream adds is the ``param`` of its error
object: a 400 that names a parameter the client sent under the same name (``temperature``,
``tools[0].parameters``, ``text.format.schema``…) keeps that ``param``. A ``param`` about
``input`` is of the whole conversation, not of the client's request: one that names an
image or a file is mapped back to where the client sent it (the adapter's ``media``,
:mod:`app.backends.media_params`), any other is dropped.

In a stream, an ``error`` event and a ``response.failed`` are raised as the errors they
describe (``invalid_request`` → ``InvalidRequest``, rate limits → ``TooManyRequests``,
anything else → ``ModelError`` ``upstream_error``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from app.backends.chat_errors import error_for_status, error_in_stream, json_or_text
from app.backends.media_params import upstream_param
from app.errors import InvalidRequest, ORSError, TooManyRequests

PASSED_PARAMS = frozenset({
    "model", "temperature", "top_p", "max_output_tokens", "presence_penalty", "frequency_penalty",
    "top_logprobs", "tools", "tool_choice", "parallel_tool_calls", "max_tool_calls", "text", "reasoning",
    "include", "prompt_cache_key",
})
"""Request fields the upstream receives as the client sent them."""
_ROOT = re.compile(r"^[A-Za-z_]+")


def client_param(param: Any) -> str | None:
    """The upstream's ``param`` if it names something the client sent under that name."""
    if not isinstance(param, str):
        return None
    root = _ROOT.match(param)
    return param if root is not None and root.group(0) in PASSED_PARAMS else None


def http_error(status: int, body: bytes, *, model: str, url: str, logprobs: bool = False,
               media: Callable[[str | None], str | None] | None = None) -> ORSError:
    """The taxonomy error for an upstream HTTP answer that is not a success; ``media``
    maps a ``param`` that names a part of the input to the client's path."""
    error = error_for_status(status, body, model=model, url=url, logprobs=logprobs)
    if type(error) is InvalidRequest and error.param is None:
        param = upstream_param(json_or_text(body.decode("utf-8", errors="replace")))
        error.param = client_param(param) or (media(param) if media is not None else None)
    return error


def stream_error(error: Any, media: Callable[[str | None], str | None] | None = None) -> ORSError:
    """An ``error`` event's object (``{type, code, message, param}``) as a taxonomy error
    (``media``: as for :func:`http_error`)."""
    if not isinstance(error, dict):
        return error_in_stream(error)
    kind = str(error.get("type") or "")
    message = error.get("message") if isinstance(error.get("message"), str) else "unknown error"
    if kind.startswith("invalid_request"):
        param = error.get("param") if isinstance(error.get("param"), str) else None
        return InvalidRequest(f"The upstream model server rejected the request: {message}", code="upstream_rejected",
                              param=client_param(param) or (media(param) if media is not None else None))
    if kind.startswith("too_many_requests") or error.get("code") == "rate_limit_exceeded":
        return TooManyRequests("The upstream model server is rate limiting requests.", code="upstream_rate_limited")
    return error_in_stream(error)


def failed_response_error(error: Any) -> ORSError:
    """A ``response.failed``'s ``response.error`` (``{code, message}``) as a taxonomy error."""
    return error_in_stream(error if error is not None else "the response failed")
