"""The contract of the response store.

What is stored, once each:

* a **response row**: id, tenant, status, the ``previous_response_id`` it continues, the
  settings that define its context (``instructions``, ``tools``), and the latest
  ``ResponseResource`` snapshot (JSON);
* its **own items**, in order: the new input items of that request (``role="input"``),
  then its output items (``role="output"``). A continuation never copies its ancestors'
  items: the context of turn N is rebuilt by walking the chain;
* its **events**, written once when the response ends, for stream replay.

Write discipline (what makes a crash harmless):

* :meth:`ResponseStore.begin` writes the row (status ``queued`` or ``in_progress``) and the
  input items in one transaction, before the first event is sent;
* :meth:`ResponseStore.finish` writes the output items, the final snapshot and the events
  in one transaction, when the terminal event is produced. Nothing is written per delta;
* a process that dies in between leaves a row ``in_progress`` with no output items;
  :meth:`ResponseStore.recover` marks such rows ``failed`` (see its contract for how a
  dead owner is told from a live replica);
* :meth:`ResponseStore.cancel` (a client's cancel, received by any replica) moves a row
  that has not finished to ``cancelled`` in one transaction, and every process watching
  (:meth:`ResponseStore.watch_cancels`) is told, so the one running it stops it; the
  run's own ``finish`` then writes nothing (see :mod:`app.store.cancels`).

Deleting hides a response from every read: it can no longer be fetched, listed or
continued. Its items are kept while later responses of its chain still need them for
their context, and removed with the last of them.

Every read and write is scoped by ``tenant``: a response of another tenant is never
returned, counted or changed; to the caller it looks absent.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from app.errors import ServerError
from app.store.relay import RelayedEvent, Source
from app.store.schema import Serialized

if TYPE_CHECKING:
    from app.store.conversations import SqlConversations

JSON = dict[str, Any]
Document = JSON | Serialized
"""A response snapshot as a dict, or already serialized."""
Order = Literal["asc", "desc"]


class StoreConflict(ServerError):
    """A write that the response's stored state forbids: beginning an id twice, finishing
    a response twice, or moving or finishing one that was never begun. A bug in the
    caller (or a race it must handle, such as a cancel that lost to the finish), reported
    as a server error if it escapes."""


@dataclass(frozen=True, slots=True)
class NewResponse:
    """What :meth:`ResponseStore.begin` records."""

    id: str
    tenant: str
    status: str
    created_at: int
    model: str
    previous_response_id: str | None
    instructions: str | None
    tools: list[JSON]
    resource: Document
    """The initial ``ResponseResource`` snapshot."""
    input_items: list[JSON]
    """The request's own input items, each with an ``id``."""
    background: bool = False


@dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    tenant: str
    status: str
    created_at: int
    model: str
    previous_response_id: str | None
    instructions: str | None
    tools: list[JSON]
    resource: JSON
    """The latest ``ResponseResource`` snapshot (the final one once finished)."""
    background: bool = False


@dataclass(frozen=True, slots=True)
class ChainLink:
    """One response of a chain, oldest first, with its own items."""

    response_id: str
    tools: list[JSON]
    input_items: list[JSON] = field(default_factory=list)
    output_items: list[JSON] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ItemPage:
    data: list[JSON]
    has_more: bool


@dataclass(frozen=True, slots=True)
class ConversationTurn:
    """What a response adds to its conversation when its end is written, in the same
    transaction (:func:`app.store.conversations.append_turn`): its input items, then its
    output items."""

    tenant: str
    conversation_id: str
    response_id: str
    items: list[JSON]


class ResponseStore(abc.ABC):
    """Durable storage of responses. Implementations must be safe for concurrent use by
    many tasks of one process, and by several processes sharing one database."""

    @abc.abstractmethod
    async def open(self) -> None:
        """Connect and bring the schema up to date (migrations)."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def begin(self, response: NewResponse) -> None:
        """Record a response that starts now (row + input items, one transaction). If
        ``previous_response_id`` is not visible to ``tenant`` when this commits (absent,
        deleted meanwhile, another tenant's), nothing is written and
        :class:`~app.errors.PreviousResponseNotFound` is raised."""

    @abc.abstractmethod
    async def set_status(self, tenant: str, response_id: str, status: str, resource: Document) -> None:
        """Move a response that has not finished (``queued`` → ``in_progress``, or to
        ``cancelled``). A response that was cancelled or deleted meanwhile is left as it
        is; one that already finished otherwise raises :class:`StoreConflict`."""

    @abc.abstractmethod
    async def finish(
        self, tenant: str, response_id: str, resource: Document, output_items: list[JSON], events: list[str] | None,
        turn: ConversationTurn | None = None,
    ) -> bool:
        """Record the end of a response (output items, final snapshot whose ``status`` is
        terminal, serialized events, or none kept: ``None``) in one transaction; ``True``
        when written. A ``turn`` (a response in a conversation) is appended to its
        conversation in the same transaction, and its hold released. Finishing
        twice raises :class:`StoreConflict`; finishing a response that was cancelled or
        deleted meanwhile leaves it as it is, writes nothing and returns ``False``."""

    async def record(
        self, response: NewResponse, resource: Document, output_items: list[JSON], events: list[str] | None,
        turn: ConversationTurn | None = None,
    ) -> bool:
        """:meth:`begin` and :meth:`finish` of a response in one transaction: for a
        response nobody could see before it ended (a plain JSON answer: its id is first
        given out with the response itself), half the writes and one commit instead of
        two. The same checks as the two apply."""
        await self.begin(response)
        return await self.finish(response.tenant, response.id, resource, output_items, events, turn)

    @abc.abstractmethod
    async def finish_later(
        self, tenant: str, response_id: str, resource: Document, output_items: list[JSON], events: list[str] | None
    ) -> None:
        """:meth:`finish`, kept in memory and written once the store can be reached
        again: for the end of a response whose own :meth:`finish` could not reach it
        (the client was told the response failed; the store should say so too, not keep
        it ``in_progress``). Retried until it is written or the store closes."""

    @abc.abstractmethod
    async def cancel(self, tenant: str, response_id: str) -> StoredResponse | None:
        """Record the client's cancel of a response that has not finished, wherever it
        runs: its row becomes ``cancelled`` (the latest snapshot with ``status:
        "cancelled"``), a later :meth:`finish` of its run writes nothing, and every
        watcher (:meth:`watch_cancels`, in every process sharing the store) is told.
        A response that already finished is returned unchanged; ``None`` if absent,
        deleted, or another tenant's."""

    @abc.abstractmethod
    async def watch_cancels(self, callback: Callable[[str, str], object]) -> None:
        """Call ``callback(tenant, response_id)`` on this event loop for every cancel
        recorded from now on by any process sharing the store (this one included),
        until :meth:`close`. Notices lost while the store could not listen are replayed
        for the responses this instance owns. Ids the caller does not run are its to
        ignore."""

    async def serve_follows(self, source: Source) -> None:
        """Answer other processes' requests to follow a response this one runs, from
        ``source`` (see :mod:`app.store.relay`). Nothing to do with one process."""

    def follow_elsewhere(self, tenant: str, response_id: str, after: int | None) -> AsyncIterator[RelayedEvent] | None:
        """The events of a response another process runs, after ``after``, until its end;
        ``None`` when no other process can run one (one process)."""
        return None

    @abc.abstractmethod
    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        """The response, or ``None`` if absent, deleted or another tenant's."""

    @abc.abstractmethod
    async def chain(self, tenant: str, response_id: str) -> list[ChainLink] | None:
        """The chain ending at ``response_id``, oldest first, each link with its own
        items, in a bounded number of queries whatever the chain's length. ``None`` if
        ``response_id`` is absent, deleted, or another tenant's."""

    @abc.abstractmethod
    async def input_items(
        self, tenant: str, response_id: str, *, limit: int, order: Order, after: str | None
    ) -> ItemPage | None:
        """A page of the response's input items (cursor ``after`` = an item id; an id
        that is not among them gives an empty page). ``None`` if the response is absent."""

    @property
    @abc.abstractmethod
    def conversations(self) -> SqlConversations:
        """The tenants' conversations, kept in the same database (:mod:`app.store.conversations`)."""

    @abc.abstractmethod
    async def responses(self, tenant: str, *, limit: int, order: Order, after: str | None) -> ItemPage:
        """A page of the tenant's visible responses (their resources), ``desc`` newest
        first (cursor ``after`` = a response id; one that is not among them gives an
        empty page)."""

    @abc.abstractmethod
    async def events(self, tenant: str, response_id: str) -> list[str] | None:
        """The serialized events of a finished response, in order; ``None`` if absent or
        if no events were recorded (not finished yet, cancelled, recovered, or a plain
        JSON answer, which keeps none)."""

    @abc.abstractmethod
    async def delete(self, tenant: str, response_id: str) -> bool:
        """Delete; ``False`` if there was nothing (visible) to delete."""

    @abc.abstractmethod
    async def expire(self, created_before: int, limit: int) -> tuple[int, int]:
        """Delete, as :meth:`delete` does, up to ``limit`` finished responses created
        before ``created_before`` (Unix seconds), oldest first, whatever their tenant:
        ``(found, deleted)`` (one deleted meanwhile is found, not deleted). See
        :mod:`app.store.retention`."""

    async def ping(self) -> None:
        """Return once the store answers a query now; raise
        :class:`~app.errors.StoreUnavailable` if it cannot be reached (readiness)."""

    @abc.abstractmethod
    async def recover(self) -> int:
        """Mark responses left ``queued``/``in_progress`` by a dead process ``failed``;
        return how many. Called at start."""
