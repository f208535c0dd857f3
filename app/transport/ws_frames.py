"""The client's frames on the WebSocket, read: one text frame, one client event.

:func:`read_frame` decodes a frame (the same JSON limits as a request body) and tells
what it is (:class:`FrameKind`) and which stream it belongs to:

* ``response.create``: a turn. Its ``stream_id``, if any, must be a string of 1 to
  :data:`MAX_STREAM_ID` characters (``null`` is none). :func:`create_body` makes the
  request body of it: ``type``, ``stream_id`` and ``generate`` (a boolean; ``false`` is a
  warm-up) are taken out, and so are the HTTP transport's fields when they say what a
  WebSocket turn does anyway (``stream: true``, which Codex sends; ``background: false``;
  ``stream_options: null``). Any other value of those is a 400 naming the field: a
  WebSocket turn always streams, in the foreground.
* ``response.steer`` (OpenAI's beta steering): never supported here, answered at once
  with ``response.steer.failed`` (:func:`steer_failed`, code ``steering_not_supported``),
  which hands the input back, as OpenAI's WebSocket reference documents for a response
  that cannot be steered.
* ``response.processed`` (sent by Codex under a feature flag, once it has handled a
  response): a hint this server has no use for; ignored, answered with nothing.
* anything else (not text, not JSON, not an object, another ``type``, a bad
  ``stream_id``): an error, delivered in its turn (:attr:`FrameKind.INVALID`).

:func:`tagged` puts a stream's ``stream_id`` on an event's or envelope's JSON text.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from app.engine.body_decoding import decode_body
from app.engine.limits import RequestLimits
from app.errors import InvalidRequest, ORSError

MAX_STREAM_ID = 64
"""The longest ``stream_id``, in characters."""

STREAM_KEY = '"stream_id"'
"""How ``stream_id`` is spelled in a frame's text, unless its characters are escaped."""

TRANSPORT_FIELDS: dict[str, object] = {"stream": True, "background": False, "stream_options": None}
"""The HTTP transport's fields, each with the one value a WebSocket turn accepts."""


class FrameKind(enum.Enum):
    CREATE = "response.create"
    STEER = "response.steer"
    PROCESSED = "response.processed"
    INVALID = "invalid"


@dataclass(frozen=True, slots=True)
class Frame:
    """One client frame, read: its kind, its stream (``None``: frames without
    ``stream_id``), its decoded object or the error it is answered with, and its size
    (characters, counted among the bodies in flight until its turn is over)."""

    kind: FrameKind
    size: int
    stream: str | None = None
    data: dict[str, Any] | None = None
    error: ORSError | None = None


async def read_frame(text: str | None, size: int, limits: RequestLimits) -> Frame:
    """Decode and classify one frame (see the module docstring); never raises."""
    if text is None:
        return _invalid(size, InvalidRequest("Frames must be text holding one JSON object.", code="invalid_json"))
    try:
        data = await decode_body(text, limits, what="frame")
    except ORSError as error:
        return _invalid(size, error)
    if not isinstance(data, dict):
        return _invalid(size, InvalidRequest("A frame must be a JSON object.", code="invalid_type"))
    kind = data.get("type")
    if kind == FrameKind.CREATE.value:
        stream = data.get("stream_id")
        if stream is not None and not (isinstance(stream, str) and 0 < len(stream) <= MAX_STREAM_ID):
            return _invalid(size, InvalidRequest(
                f"'stream_id' must be a string of 1 to {MAX_STREAM_ID} characters.",
                code="invalid_value", param="stream_id"))
        return Frame(FrameKind.CREATE, size, stream=stream, data=data)
    if kind == FrameKind.STEER.value:
        return Frame(FrameKind.STEER, size, data=data)
    if kind == FrameKind.PROCESSED.value:
        return Frame(FrameKind.PROCESSED, size)
    return _invalid(size, InvalidRequest(
        f"Unknown client event type {kind!r}: send 'response.create'.", code="invalid_type", param="type"))


def _invalid(size: int, error: ORSError) -> Frame:
    return Frame(FrameKind.INVALID, size, error=error)


def create_body(data: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The request body of a ``response.create`` and whether it generates (``False``: a
    warm-up); raises a 400 for a transport field with another value, or a ``generate``
    that is not a boolean."""
    for name, accepted in TRANSPORT_FIELDS.items():
        if name in data and data[name] != accepted:
            raise InvalidRequest(
                f"'{name}' is not allowed on the WebSocket transport: every turn streams, in the foreground.",
                code="invalid_value", param=name)
    generate = data.get("generate", True)
    if not isinstance(generate, bool):
        raise InvalidRequest("'generate' must be a boolean.", code="invalid_type", param="generate")
    dropped = {"type", "stream_id", "generate", *TRANSPORT_FIELDS}
    return {key: value for key, value in data.items() if key not in dropped}, generate


def steer_failed(data: dict[str, Any], stream: str | None) -> dict[str, Any]:
    """The ``response.steer.failed`` answer to a ``response.steer``: its input handed
    back, untouched, with code ``steering_not_supported``."""
    previous = data.get("previous_response_id")
    message = {
        "type": "response.steer.failed",
        "sequence_number": 0,
        "steer": {"previous_response_id": previous if isinstance(previous, str) else "",
                  "input": data.get("input")},
        "error": {"type": "invalid_request_error", "code": "steering_not_supported",
                  "message": "This server does not steer responses: send the input with the next "
                             "response.create instead."},
    }
    if stream is not None:
        message["stream_id"] = stream
    return message


def tagged(text: str, stream: str | None) -> str:
    """``text`` (one JSON object) with ``stream_id`` added when there is a stream."""
    if stream is None:
        return text
    return f'{text[:-1]},"stream_id":{json.dumps(stream)}}}'
