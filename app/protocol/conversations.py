"""Request bodies of OpenAI's Conversations API (``/v1/conversations``), a superset of
the spec: a conversation is created with up to 20 items and ``metadata``, its metadata
replaced, and items added 20 at a time. Items are the input items of ``POST
/v1/responses`` (:data:`app.protocol.items.ItemParam`), checked as strictly."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.protocol.items import ItemParam
from app.protocol.responses import metadata_limits

MAX_ITEMS_PER_CALL = 20
"""Items one call may create or add (OpenAI's limit)."""

Metadata = dict[str, Annotated[str, Field(max_length=512)]]


class CreateConversationBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    items: list[ItemParam] | None = Field(default=None, max_length=MAX_ITEMS_PER_CALL)
    metadata: Metadata | None = None

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return metadata_limits(value)


class UpdateConversationBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    metadata: Metadata

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return metadata_limits(value)


class AddItemsBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    items: list[ItemParam] = Field(min_length=1, max_length=MAX_ITEMS_PER_CALL)
