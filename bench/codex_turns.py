"""A recorded Codex session made into stateless turns, from the WebSocket frames a tap saw
(:class:`tests.asgi_tap.Connection`), for ``bench codex`` to replay over HTTP.

Codex runs one turn at a time on a connection and chains each to the one before with
``previous_response_id`` (``store: false``: the server remembers the chain on the
socket). A turn's stateless body is therefore the chain's earlier inputs and outputs
followed by its own input, with its own instructions, tools and options, and without the
WebSocket's own fields (``type``, ``stream_id``, ``generate``, and the HTTP transport's
fields a WebSocket turn may carry, dropped as the server drops them: :func:`create_body`)
nor ``previous_response_id``. A warm-up (``generate: false``) is no model turn, but its
input is part of the chain. A ``response.create`` is paired with the next answer on its
connection that ends a turn: a terminal event (its ``response``) or an error envelope
(a turn refused before it started, which no model saw). A turn left unanswered (the
session was stopped under it) is not kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.transport.ws_frames import create_body
from tests.asgi_tap import Connection

TERMINAL_TYPES = ("response.completed", "response.incomplete", "response.failed")
ERROR_TYPE = "error"


@dataclass(frozen=True)
class Turn:
    """One ``response.create`` of the session that reached the model: its stateless
    body and the final response it was answered with."""

    body: dict[str, Any]
    response: dict[str, Any]

    @property
    def output_tokens(self) -> int:
        return int((self.response.get("usage") or {}).get("output_tokens", 0))

    @property
    def status(self) -> str:
        return str(self.response.get("status"))


def input_items(value: object) -> list[dict[str, Any]]:
    """A request's ``input`` as a list of items (a string is one user message)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]}]
    if isinstance(value, list):
        return [dict(item) for item in value]
    raise ValueError(f"an input that is neither a string nor a list: {type(value).__name__}")


def answered(connection: Connection) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """Each ``response.create`` of the connection with its final response (``None`` for
    a turn refused with an error envelope), in order; unanswered ones are left out."""
    requests = [frame for frame in connection.received() if frame.get("type") == "response.create"]
    answers: list[dict[str, Any] | None] = []
    for event in connection.sent():
        if event.get("type") in TERMINAL_TYPES:
            answers.append(event["response"])
        elif event.get("type") == ERROR_TYPE:
            answers.append(None)
    return list(zip(requests, answers, strict=False))


def model_turns(connections: Sequence[Connection]) -> list[Turn]:
    """The session's generating turns answered by a response (any status, so each
    lines up with one request the model got), in order, each made stateless. Chains are
    followed across connections (an id of another connection is found too); a
    ``previous_response_id`` the session never answered raises ``ValueError``."""
    chains: dict[str, list[dict[str, Any]]] = {}
    turns: list[Turn] = []
    for connection in connections:
        for frame, response in answered(connection):
            body, generate = create_body(frame)
            previous = body.pop("previous_response_id", None)
            if previous is not None and previous not in chains:
                raise ValueError(f"a turn continues {previous!r}, which the session never answered")
            items = [*(chains[previous] if previous is not None else []), *input_items(body.get("input"))]
            if response is None:
                continue
            chains[str(response["id"])] = [*items, *(dict(item) for item in response.get("output") or [])]
            if generate:
                turns.append(Turn({**body, "input": items}, response))
    return turns


def output_budget(produced: int, floor: int = 16, ceiling: int = 256) -> int:
    """The ``max_output_tokens`` a replayed turn gets: what the recorded turn produced,
    within ``floor`` and ``ceiling``."""
    return max(floor, min(ceiling, produced))
