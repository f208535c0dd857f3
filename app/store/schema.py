"""The store's tables, defined once for SQLite and PostgreSQL.

* ``responses``: one row per response, never removed (a deleted response stays as a
  hidden tombstone, so ``previous_response_id`` always points at a row). ``owner`` is
  the instance that runs it; ``finished_at`` is set when its status becomes terminal;
  ``deleted_at`` hides it from every read, and its content goes with the delete: its
  ``resource`` becomes ``{"id","object","deleted"}``, its ``instructions`` NULL, and its
  ``tools`` ``[]`` once no visible response's chain needs them.
* ``items``: a response's own items, ``role`` ``input`` then ``output``, each numbered
  from 0 by ``position``. Written once (inputs by ``begin``, outputs by ``finish``),
  removed when no visible response needs them any more.
* ``conversations`` and ``conversation_items``: a tenant's conversations (OpenAI's
  Conversations API) and their items, numbered by ``position`` in the order they were
  added (``next_position`` is the next number; an item removed leaves a gap), each
  ``item_id`` once per conversation. A deleted conversation goes whole, items included.
  ``busy_response`` is the response running on it (``busy_since``, when it began), which
  holds it so that a second one is refused rather than interleaved.
* ``events``: the serialized events of a finished response, one row written once: their
  JSON texts one per line, zlib-compressed (:mod:`app.store.codec`; rows written as a
  JSON array of strings, as before, still read).

JSON is stored as text, byte for byte what :func:`dumps_json` wrote, so a document comes
back exactly as it went in (key order and number spelling included) on both engines.
Times are Unix epoch milliseconds, except ``created_at`` which is the response's own
(seconds).

The migrations create exactly these tables; a test compares the migrated database with
this module, so a change here needs a new migration. Indexes: each one is a page more
for every write to touch, so there are only those some query needs (the primary keys,
``previous_response_id`` for the responses that continue one, which a delete walks, and
the unfinished responses of an owner, for recovery).
"""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from app.jsontext import dumps
from app.protocol.states import ResponseStatus

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)


def dumps_json(value: Any) -> str:
    """Compact JSON text (:func:`app.jsontext.dumps`). Non-ASCII characters are kept as
    they are unless the text could not be encoded as UTF-8 (a lone surrogate): then
    everything is escaped."""
    return dumps(value)


class Serialized(str):
    """A JSON object already serialized (compact, UTF-8 text) by whoever made it, with
    its ``status``, the one field the store reads of it. Stored as it is: the final
    response is serialized once, for the store and for the client alike."""

    status: str

    def __new__(cls, text: str, status: str) -> Serialized:
        document = super().__new__(cls, text)
        document.status = status
        return document

    def __reduce__(self) -> tuple[type[Serialized], tuple[str, str]]:
        return Serialized, (str(self), self.status)


class JsonText(TypeDecorator[Any]):
    """A JSON document stored as text (a :class:`Serialized` one as it is)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        if value is None:
            return None
        return str(value) if isinstance(value, Serialized) else dumps_json(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else json.loads(value)


responses = Table(
    "responses",
    metadata,
    Column("id", Text, primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("model", Text, nullable=False),
    Column("previous_response_id", Text, ForeignKey("responses.id"), nullable=True),
    Column("instructions", Text, nullable=True),
    Column("tools", JsonText, nullable=False),
    Column("resource", JsonText, nullable=False),
    Column("background", Boolean, nullable=False),
    Column("owner", Text, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    Column("finished_at", BigInteger, nullable=True),
    Column("deleted_at", BigInteger, nullable=True),
    Index("ix_responses_previous_response_id", "previous_response_id"),
    Index(
        "ix_responses_unfinished_owner",
        "owner",
        sqlite_where=text("finished_at IS NULL"),
        postgresql_where=text("finished_at IS NULL"),
    ),
)

items = Table(
    "items",
    metadata,
    Column("response_id", Text, ForeignKey("responses.id", ondelete="CASCADE"), nullable=False),
    Column("role", Text, nullable=False),
    Column("position", Integer, nullable=False),
    Column("item_id", Text, nullable=True),
    Column("item", JsonText, nullable=False),
    PrimaryKeyConstraint("response_id", "role", "position"),
    CheckConstraint("role IN ('input', 'output')", name="role"),
)

events = Table(
    "events",
    metadata,
    Column("response_id", Text, ForeignKey("responses.id", ondelete="CASCADE"), primary_key=True),
    Column("body", LargeBinary, nullable=False),
)

conversations = Table(
    "conversations",
    metadata,
    Column("id", Text, primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("metadata", JsonText, nullable=False),
    Column("next_position", Integer, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    Column("busy_response", Text, nullable=True),
    Column("busy_since", BigInteger, nullable=True),
)

conversation_items = Table(
    "conversation_items",
    metadata,
    Column("conversation_id", Text, ForeignKey("conversations.id", ondelete="CASCADE"), nullable=False),
    Column("position", Integer, nullable=False),
    Column("item_id", Text, nullable=False),
    Column("item", JsonText, nullable=False),
    PrimaryKeyConstraint("conversation_id", "position"),
    Index("ix_conversation_items_conversation_id_item_id", "conversation_id", "item_id", unique=True),
)

NON_TERMINAL = frozenset(status for status in ResponseStatus if not status.final)
TERMINAL = frozenset(status for status in ResponseStatus if status.final)
"""A response's ``status`` column holds the protocol's statuses
(:class:`app.protocol.states.ResponseStatus`), as plain text: a member is its wire
string, so it binds and compares as one."""


def now_ms() -> int:
    """Now, in the store's times (Unix epoch milliseconds)."""
    return time.time_ns() // 1_000_000
