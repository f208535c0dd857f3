"""Where a continuation's history comes from: the store, or a connection's memory.

The spec's order is kept: for every response of the chain, oldest first, its input items
then its output items; the new request's input comes after (added by the caller).
Instructions are not inherited.

A finished response's chain never changes (deleting an ancestor keeps the items its
visible descendants need), so the chain of a response this process has just recorded is
kept in a :class:`HistoryCache`: the parent's history plus the response's own items,
built from O(own items), and so is its conversation (the chat messages its items make,
:class:`~app.engine.context.Conversation`). Turn 1,000 of a conversation then costs what
turn 2 costs to load and to turn into messages, instead of reading and converting 2,000
items. Visibility is never cached: every
load still asks the store whether the response exists for the tenant (and has finished).
"""

from __future__ import annotations

import abc
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from app.engine.context import EMPTY, Conversation, SealedContent, extend_conversation
from app.engine.items import from_stored
from app.errors import InvalidRequest, PreviousResponseNotFound
from app.protocol.items import ToolSearchOutputParam
from app.protocol.states import ResponseStatus
from app.store.base import ResponseStore

JSON = dict[str, Any]
log = logging.getLogger("ors.history")


@dataclass(slots=True)
class _Memo:
    conversation: Conversation | None = None
    search_outputs: tuple[ToolSearchOutputParam, ...] | None = None


@dataclass(frozen=True, slots=True)
class History:
    """The items of a chain (as params, in order) and the tools its responses offered."""

    items: list[object] = field(default_factory=list)
    tools: list[JSON] = field(default_factory=list)
    stored_items: list[JSON] = field(default_factory=list)
    """The same items in stored (wire) form, for a connection cache to keep."""
    _memo: _Memo = field(default_factory=_Memo, compare=False, repr=False)

    def conversation(self, sealed: SealedContent | None = None) -> Conversation:
        """The chat messages of :attr:`items`, built once per history (a cached chain's
        is extended from its parent's by :meth:`HistoryCache.remember`)."""
        if self._memo.conversation is None:
            self._memo.conversation = extend_conversation(EMPTY, self.items, sealed=sealed)
        return self._memo.conversation

    def search_outputs(self) -> tuple[ToolSearchOutputParam, ...]:
        """The chain's ``tool_search_output`` items (the tools its searches loaded), found
        once per history (a cached chain's are its parent's and its own)."""
        if self._memo.search_outputs is None:
            self._memo.search_outputs = _search_outputs(self.items)
        return self._memo.search_outputs


def _search_outputs(items: list[object]) -> tuple[ToolSearchOutputParam, ...]:
    return tuple(item for item in items if isinstance(item, ToolSearchOutputParam))


def not_found(response_id: str) -> PreviousResponseNotFound:
    return PreviousResponseNotFound(
        f"Previous response with id '{response_id}' not found.", param="previous_response_id"
    )


def merge_tools(earlier: list[JSON], later: list[JSON]) -> list[JSON]:
    """The tools a chain's responses offered, each name once, its latest definition
    winning (what the replay gate holds a replayed call to): an agent that sends the same
    30 tools every turn has 30 of them at turn 1,000, not 30,000."""
    if not later:
        return earlier
    merged = {_tool_key(tool): tool for tool in earlier}
    for tool in later:
        key = _tool_key(tool)
        merged.pop(key, None)
        merged[key] = tool
    return list(merged.values())


def _tool_key(tool: JSON) -> str:
    name, namespace = tool.get("name"), tool.get("namespace")
    if isinstance(name, str):
        return f"{namespace}/{name}" if isinstance(namespace, str) else name
    return json.dumps(tool, sort_keys=True)


class HistorySource(abc.ABC):
    @abc.abstractmethod
    async def load(self, response_id: str) -> History:
        """The history up to and including ``response_id``, or ``PreviousResponseNotFound``."""


class NoHistory(HistorySource):
    """Nothing can be continued (no store)."""

    async def load(self, response_id: str) -> History:
        raise not_found(response_id)


class HistoryCache:
    """The histories of recently recorded responses, least recently used out."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[tuple[str, str], History | _Recorded] = OrderedDict()

    def get(self, tenant: str, response_id: str) -> History | None:
        entry = self._entries.get((tenant, response_id))
        if entry is None:
            return None
        if isinstance(entry, _Recorded):
            try:
                entry = self._entries[(tenant, response_id)] = entry.history()
            except Exception:  # never expected: the store has the chain as well
                log.exception("the cached history of %s could not be built; it is read from the store", response_id)
                del self._entries[(tenant, response_id)]
                return None
        self._entries.move_to_end((tenant, response_id))
        return entry

    def remember(
        self, tenant: str, response_id: str, past: History, tools: list[JSON], own: list[JSON],
        *, sealed: SealedContent | None = None,
    ) -> None:
        """The chain up to ``response_id``: ``past`` (its parent's), then its own items
        (stored form: inputs then outputs) and the tools it offered. Kept as given, and
        built into a :class:`History` by the first :meth:`get`: every stored response is
        remembered before its answer is sent, but only a continued one needs its items
        parsed (about a tenth of a millisecond saved on each of the others)."""
        if self.size <= 0:
            return
        self._entries[(tenant, response_id)] = _Recorded(past, tools, own, sealed)
        self._entries.move_to_end((tenant, response_id))
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)


@dataclass(frozen=True, slots=True)
class _Recorded:
    """A remembered response whose history is not built yet (see ``HistoryCache.remember``)."""

    past: History
    tools: list[JSON]
    own: list[JSON]
    sealed: SealedContent | None

    def history(self) -> History:
        """The parent's history extended by the own items; its conversation too, when the
        parent's was built."""
        parsed = [from_stored(item) for item in self.own]
        history = History(
            items=[*self.past.items, *parsed],
            tools=merge_tools(self.past.tools, self.tools),
            stored_items=[*self.past.stored_items, *self.own],
        )
        if self.past._memo.conversation is not None:
            history._memo.conversation = extend_conversation(self.past._memo.conversation, parsed,
                                                             sealed=self.sealed)
        if self.past._memo.search_outputs is not None:
            history._memo.search_outputs = (*self.past._memo.search_outputs, *_search_outputs(parsed))
        return history


class StoredHistory(HistorySource):
    """Chains persisted in the store, scoped to one tenant."""

    def __init__(self, store: ResponseStore, tenant: str, cache: HistoryCache | None = None) -> None:
        self.store = store
        self.tenant = tenant
        self.cache = cache

    async def load(self, response_id: str) -> History:
        previous = await self.store.get(self.tenant, response_id)
        if previous is None:
            raise not_found(response_id)
        if not ResponseStatus(previous.status).final:
            raise InvalidRequest(
                f"Previous response '{response_id}' is still {previous.status}; continue from it "
                "once it has finished.",
                code="previous_response_in_progress",
                param="previous_response_id",
            )
        if self.cache is not None and (cached := self.cache.get(self.tenant, response_id)) is not None:
            return cached
        links = await self.store.chain(self.tenant, response_id)
        if not links:
            raise not_found(response_id)
        stored: list[JSON] = []
        tools: list[JSON] = []
        for link in links:
            stored += link.input_items
            stored += link.output_items
            tools = merge_tools(tools, link.tools)
        return History(items=[from_stored(item) for item in stored], tools=tools, stored_items=stored)
