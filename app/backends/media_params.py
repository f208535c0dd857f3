"""An upstream's error about an image or a file, pointed back at where the client sent it.

An upstream that refuses a part (an image it cannot read, a file it does not take), in a
400 or in an ``error`` event of its stream, names it by its own request's path:
``messages[2].content[1].image_url`` (Chat Completions; OpenAI also writes
``messages.[2].content.[1]``), ``input[1].content[0].image_url`` (a Responses upstream).
Those paths are of the whole conversation this server sent, not of the client's request.
Each adapter sends one wire message per conversation message (Chat Completions), or a
known run of items (Responses), and one content part per message part
(:mod:`app.backends.parts`), so the upstream's path finds the part, and the part knows
where the client sent it (``input[3].content[1]``, a field below it kept where the
client's part has it too). A part that came from an earlier response of the chain is
named by ``previous_response_id``. Any other path names nothing the client sent: ``None``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from app.backends.base import ChatMessage, FilePart, ImagePart

_CHAT = re.compile(r"^messages\.?\[(\d+)\]\.content\.?\[(\d+)\](.*)$")
_RESPONSES = re.compile(r"^input\.?\[(\d+)\]\.(?:content|output)\.?\[(\d+)\](.*)$")
_CHAT_FIELDS = {
    ".image_url": ".image_url", ".image_url.url": ".image_url", ".image_url.detail": ".detail",
    ".file.file_data": ".file_data", ".file.file_id": ".file_id", ".file.filename": ".filename",
}
"""A Chat Completions part's fields, by the names of the client's part."""
_RESPONSES_FIELDS = frozenset({".image_url", ".detail", ".file_id", ".file_data", ".file_url", ".filename"})
CHAINED = "previous_response_id"
"""The ``param`` of a part that came from an earlier response of the chain."""


def upstream_param(body: Any) -> str | None:
    """The ``param`` of an upstream's error body (``{"error": {"param": ...}}``), if any."""
    inner = body.get("error") if isinstance(body, dict) else None
    param = inner.get("param") if isinstance(inner, dict) else None
    return param if isinstance(param, str) else None


def chat_param(param: str | None, messages: Sequence[ChatMessage]) -> str | None:
    """The client's path of the part a Chat Completions upstream's ``param`` names."""
    found = _CHAT.match(param or "")
    if found is None:
        return None
    index, part, rest = int(found.group(1)), int(found.group(2)), found.group(3)
    message = messages[index] if index < len(messages) else None
    return _client_path(message, part, _CHAT_FIELDS.get(rest, ""))


def responses_param(param: str | None, owners: Sequence[ChatMessage | None]) -> str | None:
    """The client's path of the part a Responses upstream's ``param`` names; ``owners``:
    the message each input item sent was made from (``None`` for an item no part is in)."""
    found = _RESPONSES.match(param or "")
    if found is None:
        return None
    index, part, rest = int(found.group(1)), int(found.group(2)), found.group(3)
    message = owners[index] if index < len(owners) else None
    return _client_path(message, part, rest if rest in _RESPONSES_FIELDS else "")


def _client_path(message: ChatMessage | None, index: int, field: str) -> str | None:
    if message is None or index >= len(message.parts):
        return None
    part = message.parts[index]
    if not isinstance(part, ImagePart | FilePart):
        return None
    if part.param is None:
        return CHAINED
    if field and not hasattr(part, field[1:]):
        field = ""
    return part.param + field
