"""``POST /v1/responses/compact``: the request (``CompactResponseMethodPublicBody``) and
the compacted window it returns (``CompactResource``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.protocol.base import WireModel
from app.protocol.items import ItemParam
from app.protocol.responses import Usage

MAX_INPUT_CHARS = 10_485_760


class CompactBody(BaseModel):
    """``CompactResponseMethodPublicBody``. ``model`` is required (unlike on
    ``/v1/responses``); unknown top-level fields are ignored, items are strict."""

    model_config = ConfigDict(extra="ignore")

    model: str
    input: str | list[ItemParam] | None = None
    previous_response_id: str | None = None
    instructions: str | None = None
    prompt_cache_key: str | None = Field(default=None, max_length=64)

    @field_validator("input", mode="before")
    @classmethod
    def _input_length(cls, value: Any) -> Any:
        if isinstance(value, str) and len(value) > MAX_INPUT_CHARS:
            raise ValueError(f"String should have at most {MAX_INPUT_CHARS} characters")
        return value


class CompactResource(WireModel):
    """``CompactResource``: the compacted window, to be sent back as ``input`` of a new
    chain. Its ``id`` names this compaction only: it is not a response id and cannot be
    continued with ``previous_response_id``.

    ``output`` holds items in the spec's ``ItemField`` wire form (``id``, ``type`` and
    ``status`` on each): the kept items exactly as they are stored and listed, so
    nothing a client sent is lost (an inline file keeps its ``file_data``), and one
    :class:`app.protocol.items.Compaction` item."""

    id: str
    object: Literal["response.compaction"] = "response.compaction"
    output: list[dict[str, Any]]
    created_at: int
    usage: Usage
