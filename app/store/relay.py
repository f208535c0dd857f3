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

Each process uses **one dedicated asyncpg connection** for this, outside the store's pool
(as for cancels: a pooled connection is reset when it goes back, which drops ``LISTEN``).
SQLite has one process, where every running response is live locally: no relay.
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

log = logging.getLogger(__name__)

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
    queue: asyncio.Queue[RelayedEvent] = field(default_factory=asyncio.Queue)
    pieces: dict[int, list[str | None]] = field(default_factory=dict)


def _pieces(response_id: str, sequence: int, kind: str, data: str) -> list[str]:
    parts = [data[i : i + PIECE_CHARS] for i in range(0, len(data), PIECE_CHARS)] or [""]
    return [f"{response_id} {sequence} {number} {len(parts)} {kind}\n{part}" for number, part in enumerate(parts)]


class PostgresEventRelay:
    """Both sides of following across processes on PostgreSQL (see the module docstring)."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._connection: asyncpg.Connection | None = None
        self._send_lock = asyncio.Lock()
        self._source: Source | None = None
        self._relays: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._followers: dict[str, list[_Follower]] = {}

    async def start(self, source: Source) -> None:
        """Listen for follow requests (answered from ``source``) and for relayed events."""
        self._source = source
        connection = await asyncpg.connect(self._dsn)
        try:
            await connection.add_listener(FOLLOW_CHANNEL, self._on_follow)
            await connection.add_listener(EVENTS_CHANNEL, self._on_piece)
        except BaseException:
            await connection.close()
            raise
        self._connection = connection

    async def close(self) -> None:
        for task in list(self._relays.values()):
            task.cancel()
        for task in list(self._relays.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close(timeout=5)

    # ------------------------------------------------------------ the follower's side

    async def follow(self, tenant: str, response_id: str, after: int | None, ended: Ended) -> AsyncIterator[RelayedEvent]:
        """The events of a response another process runs, after ``after``, until its
        terminal event (or, if the relay falls silent, until the stored record ends it)."""
        follower = _Follower()
        self._followers.setdefault(response_id, []).append(follower)
        token = uuid.uuid4().hex
        last = -1 if after is None else after
        try:
            await self._ask(tenant, response_id, last, token)
            while True:
                try:
                    event = await asyncio.wait_for(follower.queue.get(), QUIET_SECONDS)
                except TimeoutError:
                    stored = await ended(tenant, response_id)
                    if stored is not None:
                        for data in stored:
                            sequence = json.loads(data)["sequence_number"]
                            if sequence > last:
                                yield RelayedEvent(sequence, json.loads(data)["type"], data)
                        return
                    await self._ask(tenant, response_id, last, token)
                    continue
                if event.sequence_number <= last:
                    continue
                last = event.sequence_number
                yield event
                if event.type in _TERMINAL:
                    return
        finally:
            followers = self._followers.get(response_id, [])
            with contextlib.suppress(ValueError):
                followers.remove(follower)
            if not followers:
                self._followers.pop(response_id, None)

    async def _ask(self, tenant: str, response_id: str, after: int, token: str) -> None:
        payload = json.dumps({"tenant": tenant, "id": response_id, "after": after, "token": token})
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
            tenant, response_id, after, token = request["tenant"], request["id"], int(request["after"]), request["token"]
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
        try:
            async for sequence, kind, data in events:
                await self._send(_pieces(response_id, sequence, kind, data), EVENTS_CHANNEL)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
            log.warning("stopped relaying the events of %s: %r", response_id, error)

    async def _send(self, payloads: list[str], channel: str) -> None:
        connection = self._connection
        if connection is None:
            return
        async with self._send_lock:  # one session, so the pieces go out in order
            await connection.execute("SELECT pg_notify($1, p) FROM unnest($2::text[]) WITH ORDINALITY AS u(p, n) "
                                     "ORDER BY n", channel, payloads)


_TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete"})
