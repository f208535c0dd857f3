"""Building the documents a store test records: full, valid responses and items."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import Engine, event, func, select

from app.protocol.responses import ResponseResource
from app.store.base import NewResponse
from app.store.schema import metadata
from app.store.sql import SqlResponseStore

JSON = dict[str, Any]


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def resource(response_id: str, *, status: str = "in_progress", previous: str | None = None,
             output: list[JSON] | None = None, tools: list[JSON] | None = None, **fields: Any) -> JSON:
    """A ``ResponseResource`` with all 31 fields, validated by the protocol model."""
    document: JSON = {
        "id": response_id,
        "object": "response",
        "created_at": 1_760_000_000,
        "completed_at": 1_760_000_009 if status == "completed" else None,
        "status": status,
        "incomplete_details": None,
        "model": "test-model",
        "previous_response_id": previous,
        "instructions": None,
        "output": output or [],
        "error": None,
        "tools": tools or [],
        "tool_choice": "auto",
        "truncation": "disabled",
        "parallel_tool_calls": True,
        "text": {"format": {"type": "text"}},
        "top_p": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "top_logprobs": 0,
        "temperature": 1.0,
        "reasoning": {"effort": None, "summary": None},
        "usage": None,
        "max_output_tokens": None,
        "max_tool_calls": None,
        "store": True,
        "background": False,
        "service_tier": "default",
        "metadata": {},
        "safety_identifier": None,
        "prompt_cache_key": None,
        **fields,
    }
    ResponseResource.model_validate(document)
    return document


def user_message(text: str, item_id: str | None = None) -> JSON:
    return {"type": "message", "id": item_id or new_id("msg"), "role": "user", "status": "completed",
            "content": [{"type": "input_text", "text": text}]}


def assistant_message(text: str, item_id: str | None = None) -> JSON:
    return {"type": "message", "id": item_id or new_id("msg"), "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def function_tool(name: str) -> JSON:
    return {"type": "function", "name": name, "description": None,
            "parameters": {"type": "object", "properties": {}}, "strict": None}


def new_response(tenant: str, *, response_id: str | None = None, previous: str | None = None,
                 inputs: list[JSON] | None = None, tools: list[JSON] | None = None,
                 status: str = "in_progress", background: bool = False) -> NewResponse:
    response_id = response_id or new_id("resp")
    tools = tools if tools is not None else []
    return NewResponse(
        id=response_id,
        tenant=tenant,
        status=status,
        created_at=1_760_000_000,
        model="test-model",
        previous_response_id=previous,
        instructions=None,
        tools=tools,
        resource=resource(response_id, status=status, previous=previous, tools=tools, background=background),
        input_items=inputs if inputs is not None else [user_message("hello")],
        background=background,
    )


def final(begun: NewResponse, output: list[JSON], *, status: str = "completed") -> JSON:
    """The final snapshot of ``begun`` with ``output``."""
    return resource(begun.id, status=status, previous=begun.previous_response_id, output=output,
                    tools=begun.tools, background=begun.background)


def events_of(response_id: str, count: int = 3) -> list[str]:
    return [f'{{"type":"response.output_text.delta","sequence_number":{n},"delta":"w{n}",'
            f'"response_id":"{response_id}"}}' for n in range(count)]


async def row_count(store: SqlResponseStore, table: str, response_id: str | None = None, *,
                    role: str | None = None) -> int:
    """Rows of ``table`` (all, or those of one response; items of one ``role``), read past
    the store's API."""
    rows = metadata.tables[table]
    query = select(func.count()).select_from(rows)
    if response_id is not None:
        key = rows.c.response_id if "response_id" in rows.c else rows.c.id
        query = query.where(key == response_id)
    if role is not None:
        query = query.where(rows.c.role == role)
    async with store.engine.connect() as connection:
        return int(await connection.scalar(query) or 0)


@contextlib.contextmanager
def on_every_engine(identifier: str, listener: Callable[..., Any]) -> Iterator[None]:
    """``listener`` for SQLAlchemy's ``identifier`` event (``before_cursor_execute``,
    ``after_cursor_execute``) of every engine, a store's pools included, while inside."""
    event.listen(Engine, identifier, listener)
    try:
        yield
    finally:
        event.remove(Engine, identifier, listener)
