"""Following a response that another process runs (``GET /v1/responses/{id}?stream=true``).

A response's events live in the process that runs it until it ends; only then are they
stored. A client may ask any replica or worker to follow it meanwhile. The contract:

* **Asked, then sent.** The follower sends a *follow* notice (``pg_notify`` on
  :data:`FOLLOW_CHANNEL`: tenant, response id, the last sequence number it has, and a
  token of its own). Every process hears it; the one that runs the response (and only
  it: it looks the turn up among its live ones) starts one relay per token, which sends
  the turn's events after that number, then each new one as it is emitted, until the
  terminal event. Nothing is sent for a response nobody follows: the hot path pays
  nothing for this.
* **Events on the wire.** Each event goes out on :data:`EVENTS_CHANNEL` in pieces that
  fit a notice (payloads are limited to 8,000 bytes), each headed by the response id,
  the sequence number, the piece's number and count, and the event type. All pieces of
  a process go out on its one relay connection, in order (PostgreSQL delivers one
  session's notices in the order they were sent). Every process listens and hands the
  pieces of the responses it follows to their followers, which put events back together
  and drop any sequence number they have already yielded (two relays for one follower
  cannot duplicate an event).
* **Nothing is lost for good.** A follower that hears nothing for
  :data:`QUIET_SECONDS` asks again (the same token: a running relay is not doubled), and
  looks at the stored row: once the response has ended, the stored events after the
  last one it yielded finish the stream. So a lost notice, a relay that died with its
  process, or a response that ended between two looks all end in the stored record.
* **Never a gap.** Sequence numbers are consecutive, and a follower yields only the
  next one. An event further on means notices were lost (this process's connection was
  down while the relay went on): the follower asks again with a new token, once per
  gap, and the new relay sends from the last event it yielded.

Each process uses **one dedicated connection** for this (:class:`~app.store.listener.Listener`,
outside the store's pool, as for cancels: a pooled connection is reset when it goes
back, which drops ``LISTEN``). When it is lost it comes back: a relay whose notice
could not be sent stops (the follower's next ask starts another), a follow request that
could not be sent is asked again later, and once listening again every follower of this
process asks again with a new token. SQLite has one process, where every running
response is live locally: no relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from app.errors import StoreUnavailable
from app.store.engines import unreachable
from app.store.listener import Listener

log = logging.getLogger("ors.store")

FOLLOW_CHANNEL = "ors_follow"
EVENTS_CHANNEL = "ors_events"
PIECE_CHARS = 1_900
"""Characters of event JSON per notice: at most 4 bytes each, within the 8,000-byte limit."""
QUIET_SECONDS = 2.0
"""How long a follower waits for an event before it asks again and looks at the store."""


@dataclass(frozen=True, slots=True)
class RelayedEvent:
    sequence_number: int
    type: str
    data: str


Source = Callable[[str, str, int], AsyncIterator[tuple[int, str, str]] | None]
"""``(tenant, response_id, after)`` → the live events ``(sequence, type, data)`` after
``after`` of a response this process runs, or ``None`` when it does not run it."""
Ended = Callable[[str, str], Awaitable[list[str] | None]]
"""``(tenant, response_id)`` → the stored events once the response has ended, else ``None``."""


@dataclass(slots=True)
class _Follower:
    tenant: str
    last: int
    """The sequence number of the last event yielded (-1: none)."""
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    asked_after_gap: int | None = None
    """The ``last`` at which a gap was last asked about (once per gap)."""
    queue: asyncio.Queue[RelayedEvent] = field(default_factory=asyncio.Queue)
    pieces: dict[int, list[str | None]] = field(default_factory=dict)

    def renew(self) -> None:
        """A new token: the owner starts a new relay from :attr:`last`."""
        self.token = uuid.uuid4().hex


def _pieces(response_id: str, sequence: int, kind: str, data: str) -> list[str]:
    parts = [data[i : i + PIECE_CHARS] for i in range(0, len(data), PIECE_CHARS)] or [""]
    return [f"{response_id} {sequence} {number} {len(parts)} {kind}\n{part}" for number, part in enumerate(parts)]


class PostgresEventRelay:
    """Both sides of following across processes on PostgreSQL (see the module docstring)."""

    def __init__(self, dsn: str) -> None:
        self._listener = Listener(dsn, {FOLLOW_CHANNEL: self._on_follow, EVENTS_CHANNEL: self._on_piece},
                                  name="event relay", on_back=self._ask_again)
        self._send_lock = asyncio.Lock()
        self._source: Source | None = None
        self._relays: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._followers: dict[str, list[_Follower]] = {}

    async def start(self, source: Source) -> None:
        """Listen for follow requests (answered from ``source``) and for relayed events."""
        self._source = source
        await self._listener.start()

    async def heartbeat(self) -> None:
        await self._listener.heartbeat()

    async def close(self) -> None:
        for task in list(self._relays.values()):
            task.cancel()
        for task in list(self._relays.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._listener.close()

    async def _ask_again(self, _since_ms: int) -> None:
        """Listening again: what was relayed meanwhile did not reach this process, so
        each of its followers asks for a new relay from the last event it yielded."""
        for response_id, followers in list(self._followers.items()):
            for follower in list(followers):
                follower.renew()
                await self._ask(follower, response_id)

    # ------------------------------------------------------------ the follower's side

    async def follow(self, tenant: str, response_id: str, after: int | None,
                     ended: Ended) -> AsyncIterator[RelayedEvent]:
        """The events of a response another process runs, after ``after``, until its
        terminal event (or, if the relay falls silent, until the stored record ends it)."""
        follower = _Follower(tenant, -1 if after is None else after)
        self._followers.setdefault(response_id, []).append(follower)
        try:
            await self._ask(follower, response_id)
            while True:
                try:
                    event = await asyncio.wait_for(follower.queue.get(), QUIET_SECONDS)
                except TimeoutError:
                    try:
                        stored = await ended(tenant, response_id)
                    except StoreUnavailable:
                        stored = None  # the store is out of reach: the relay may still come
                    if stored is not None:
                        for data in stored:
                            sequence = json.loads(data)["sequence_number"]
                            if sequence > follower.last:
                                yield RelayedEvent(sequence, json.loads(data)["type"], data)
                        return
                    await self._ask(follower, response_id)
                    continue
                if event.sequence_number <= follower.last:
                    continue
                if event.sequence_number > follower.last + 1:  # notices were lost: a gap
                    if follower.asked_after_gap != follower.last:
                        follower.asked_after_gap = follower.last
                        follower.renew()
                        await self._ask(follower, response_id)
                    continue
                follower.last = event.sequence_number
                yield event
                if event.type in _TERMINAL:
                    return
        finally:
            followers = self._followers.get(response_id, [])
            with contextlib.suppress(ValueError):
                followers.remove(follower)
            if not followers:
                self._followers.pop(response_id, None)

    async def _ask(self, follower: _Follower, response_id: str) -> None:
        """A follow request for ``follower`` (not sent while the connection is lost: the
        follower asks again after :data:`QUIET_SECONDS`, or when it is back)."""
        payload = json.dumps({"tenant": follower.tenant, "id": response_id, "after": follower.last,
                              "token": follower.token})
        await self._send([payload], FOLLOW_CHANNEL)

    def _on_piece(self, _connection: Any, _pid: int, _channel: str, payload: str) -> None:
        head, _, part = payload.partition("\n")
        try:
            response_id, sequence, number, count, kind = head.split(" ")
            seq, index, total = int(sequence), int(number), int(count)
        except ValueError:
            log.warning("ignoring a malformed relayed event piece")
            return
        for follower in self._followers.get(response_id, ()):
            pieces = follower.pieces.setdefault(seq, [None] * total)
            if index < len(pieces):
                pieces[index] = part
            if all(piece is not None for piece in pieces):
                del follower.pieces[seq]
                follower.queue.put_nowait(RelayedEvent(seq, kind, "".join(pieces)))  # type: ignore[arg-type]

    # ------------------------------------------------------------ the owner's side

    def _on_follow(self, _connection: Any, _pid: int, _channel: str, payload: str) -> None:
        try:
            request = json.loads(payload)
            tenant, response_id = request["tenant"], request["id"]
            after, token = int(request["after"]), request["token"]
        except (ValueError, TypeError, KeyError):
            log.warning("ignoring a malformed follow request")
            return
        if (response_id, token) in self._relays or self._source is None:
            return
        events = self._source(tenant, response_id, after)
        if events is None:
            return  # another process runs it
        task = asyncio.create_task(self._relay(response_id, events), name=f"ors-relay-{response_id}")
        self._relays[(response_id, token)] = task
        task.add_done_callback(lambda _: self._relays.pop((response_id, token), None))

    async def _relay(self, response_id: str, events: AsyncIterator[tuple[int, str, str]]) -> None:
        async for sequence, kind, data in events:
            if not await self._send(_pieces(response_id, sequence, kind, data), EVENTS_CHANNEL):
                # the follower's next ask (same token, now free) starts a relay from its last event
                log.warning("stopped relaying the events of %s: the relay connection is lost", response_id)
                return

    async def _send(self, payloads: list[str], channel: str) -> bool:
        """Whether the notices were sent (in order, on the one relay connection)."""
        connection = self._listener.connection
        if connection is None:
            return False
        try:
            async with self._send_lock:  # one session, so the pieces go out in order
                await connection.execute("SELECT pg_notify($1, p) FROM unnest($2::text[]) WITH ORDINALITY AS u(p, n) "
                                         "ORDER BY n", channel, payloads)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
            if not unreachable(error):
                log.warning("could not send %d notice(s) on %s: %r", len(payloads), channel, error)
            elif connection is self._listener.connection:
                self._listener.lost(error)
            return False
        return True


_TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete"})
