"""What a stored run writes, and when: the store's side of a :class:`~app.engine.run.Run`.

A run with ``store: true`` has one :class:`Recording`. The run decides when (its
contract, in :mod:`app.engine.run`, from its delivery); the recording knows what each
write holds:

* **The start** (:meth:`Recording.begin`): the response's row with its initial snapshot,
  its tools and its input items (stored form, ids given), before the first event is
  sent. A response recorded only whole (a JSON answer) defers it: the start is kept and
  goes in with the end, in one transaction.
* **A step between starts** (:meth:`Recording.status`): ``queued`` → ``in_progress``.
* **The end** (:meth:`Recording.end`): the final snapshot, the output items and the
  events (``None`` for a run whose events nobody reads), before the terminal event is
  sent. The final snapshot is serialized once (:attr:`Recording.answer`): the store
  writes it and a JSON answer sends it. Once written, the output is handed to
  ``on_recorded`` (the history kept for a continuation). The end is written once: a
  second call is a bug of the caller, and :attr:`Recording.end_written` says it began.
* **An end written later** (:meth:`Recording.end_later`): the end the client was told,
  when it could not be written then (the store out of reach), handed to the store to
  retry. A response recorded only whole has no row to end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.protocol.responses import ResponseResource, response_json
from app.store.base import ConversationTurn, NewResponse, ResponseStore
from app.store.schema import Serialized

JSON = dict[str, Any]


class Recording:
    """The writes of one stored run (see the module). ``input_items`` gives the request's
    input items in stored form (made when first asked for). It holds nothing of the run:
    a run that referred to itself through its recording would be freed only by the
    cyclic collector, which ``ors serve`` runs rarely (``settle_heap``)."""

    def __init__(
        self,
        store: ResponseStore,
        *,
        tenant: str,
        response_id: str,
        tools: list[JSON],
        input_items: Callable[[], list[JSON]],
        on_recorded: Callable[[list[JSON]], None] | None = None,
        conversation: str | None = None,
    ) -> None:
        self.store = store
        self.tenant = tenant
        self.response_id = response_id
        self.tools = tools
        self._input_items = input_items
        self.on_recorded = on_recorded
        """Called with the output items (stored form) once the end is written."""
        self.conversation = conversation
        """The conversation the end appends the response's items to, in its transaction."""
        self.deferred: NewResponse | None = None
        """The start, kept to be written with the end (a response recorded only whole)."""
        self.end_written = False
        """The end's write began (whatever came of it)."""
        self.answer: Serialized | None = None
        """The final response's JSON once the end's write began (made once: the store
        and a JSON answer share it)."""

    async def begin(self, resource: ResponseResource, *, whole: bool = False) -> None:
        """Record the start, ``resource`` the initial snapshot; ``whole``: keep it for the
        end instead (deferred: nothing is written now, and the end's snapshot replaces it)."""
        begun = NewResponse(
            id=self.response_id,
            tenant=self.tenant,
            status=resource.status,
            created_at=resource.created_at,
            model=resource.model,
            previous_response_id=resource.previous_response_id,
            instructions=resource.instructions,
            tools=self.tools,
            resource={} if whole else _serialized(resource),
            input_items=self._input_items(),
            background=resource.background,
        )
        if whole:
            self.deferred = begun
            return
        await self.store.begin(begun)

    async def status(self, resource: ResponseResource) -> None:
        """Record a step between starts (``resource`` in its new status)."""
        await self.store.set_status(self.tenant, self.response_id, resource.status, _serialized(resource))

    async def end(self, resource: ResponseResource, events: list[str] | None) -> None:
        """Write the end (the whole response, if its start was deferred); raises what
        the write raised."""
        self.end_written = True
        self.answer = final = _serialized(resource)
        output = [item.model_dump(mode="json") for item in resource.output]
        turn = None if self.conversation is None else ConversationTurn(
            self.tenant, self.conversation, self.response_id, [*self._input_items(), *output])
        if self.deferred is not None:
            written = await self.store.record(self.deferred, final, output, events, turn)
        else:
            written = await self.store.finish(self.tenant, self.response_id, final, output, events, turn)
        if written and self.on_recorded is not None:
            self.on_recorded(output)

    async def end_later(self, resource: ResponseResource, events: list[str] | None) -> None:
        """Hand the end the client was told to the store, to be written once it can
        (:meth:`ResponseStore.finish_later`): the stored response then says so too,
        instead of staying ``in_progress``. Nothing for a response recorded only whole,
        which has no row to end."""
        if self.deferred is not None:
            return
        await self.store.finish_later(self.tenant, self.response_id, _serialized(resource),
                                      [item.model_dump(mode="json") for item in resource.output], events)


def _serialized(resource: ResponseResource) -> Serialized:
    """The snapshot's JSON (made once per snapshot: the events that carry it share it)."""
    return Serialized(response_json(resource), str(resource.status))
