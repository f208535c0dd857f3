"""A response in a conversation: ``conversation`` on ``POST /v1/responses`` (an id, or
``{"id": ...}``), OpenAI's superset.

Contract:

* **Context.** The conversation's items, oldest first, are the response's history, as a
  ``previous_response_id`` chain's would be (so the replay gate checks an answer against
  the calls the conversation holds), from its last ``compaction`` item on
  (:func:`window`); the two fields together are a 400 on ``conversation``. A
  conversation that is absent or another tenant's is 404 ``conversation_not_found``.
* **Stored with it.** The response is stored (``store: false`` is a 400 on ``store``): its
  input items and then its output items are appended to the conversation in the
  transaction that writes its end (:class:`app.store.conversations.ConversationTurn`),
  before its terminal event is sent, so the next turn sees them.
* **One at a time.** Preparing the response holds the conversation (the last step of
  :meth:`app.engine.engine.Engine.prepare`, after every check); a second response on it
  while one runs, here or on another replica, is 409 ``conversation_busy``. The end's
  transaction lets go; a run that ends without writing one (it failed to start, it was
  cancelled or deleted, the store was out of reach) lets go when it ends
  (:func:`releasing`); a server that died holding one is taken over after
  :data:`app.store.conversations.STALE_HOLD_MS`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from app.engine.history import History
from app.engine.items import from_stored
from app.errors import Conflict, InvalidRequest, NotFound
from app.protocol.items import MAX_ID_LENGTH
from app.store.base import ResponseStore

log = logging.getLogger("ors.conversations")


def conversation_of(data: dict[str, Any]) -> str | None:
    """The conversation a request names, checked: a non-empty id, or ``{"id": id}``."""
    value = data.get("conversation")
    if value is None:
        return None
    if isinstance(value, dict) and set(value) == {"id"}:
        value = value["id"]
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_ID_LENGTH:
        raise InvalidRequest("conversation must be a conversation id, or an object {\"id\": id}.",
                             code="invalid_value", param="conversation")
    if data.get("previous_response_id") is not None:
        raise InvalidRequest("conversation and previous_response_id cannot be used together: a response "
                             "continues either a conversation or a previous response.",
                             code="invalid_value", param="conversation")
    return value


def _store(store: ResponseStore | None) -> ResponseStore:
    if store is None:
        raise InvalidRequest("This server stores nothing, so it keeps no conversations.", code="invalid_value",
                             param="conversation")
    return store


async def conversation_history(store: ResponseStore | None, tenant: str, conversation_id: str) -> History:
    """The conversation's items as a response's history (:func:`window`)."""
    items = await _store(store).conversations.history(tenant, conversation_id)
    if items is None:
        raise not_found(conversation_id)
    items = window(items)
    return History(items=[from_stored(item) for item in items], stored_items=items)


def window(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the model is given of a conversation: after a compaction turn (its
    ``compaction`` item summarises everything before it but the system and developer
    messages), those messages, then the last compaction item and what follows it. The
    conversation itself keeps every item."""
    last = max((index for index, item in enumerate(items) if item.get("type") == "compaction"), default=None)
    if last is None:
        return items
    kept = [item for item in items[:last]
            if item.get("type") == "message" and item.get("role") in ("system", "developer")]
    return [*kept, *items[last:]]


async def hold(store: ResponseStore | None, tenant: str, conversation_id: str, response_id: str) -> None:
    """Hold the conversation for the response about to run (see the module)."""
    held = await _store(store).conversations.hold(tenant, conversation_id, response_id)
    if held is None:
        raise not_found(conversation_id)
    if not held:
        raise Conflict(f"Another response is running on conversation '{conversation_id}'; send this one once "
                       "it has ended.", code="conversation_busy", param="conversation")


def releasing(store: ResponseStore, tenant: str, conversation_id: str, response_id: str,
              then: Callable[[], Awaitable[None]] | None) -> Callable[[], Awaitable[None]]:
    """A run's end hook that lets go of the conversation (if its end's write did not
    already), then calls ``then``."""

    async def on_end() -> None:
        try:
            await store.conversations.release(tenant, conversation_id, response_id)
        except Exception:  # the store out of reach: the hold goes stale instead
            log.warning("could not let go of conversation %s after response %s", conversation_id, response_id,
                        exc_info=True)
        finally:
            if then is not None:
                await then()

    return on_end


def not_found(conversation_id: str) -> NotFound:
    return NotFound(f"Conversation with id '{conversation_id}' not found.", code="conversation_not_found",
                    param="conversation")
