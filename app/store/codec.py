"""How a response's events are stored: their JSON texts one per line, zlib-compressed.

An event's JSON (as the server serializes it) never holds a raw line break, so the
lines are the events as they were sent, with nothing escaped (a JSON array of strings
would escape every quote of every event again). What was stored as such an array still
reads: a body that starts with ``[`` is one (an event starts with ``{``), and events
that did hold a line break are stored that way too.

Streams repeat the same keys and ids in every delta event, so they compress well.
Large payloads are (de)compressed in a worker thread (zlib releases the GIL), so a long
response does not stall the event loop; small ones are compressed by SQLite's writer
thread as it writes them (:func:`packer`).
"""

from __future__ import annotations

import functools
import json
import zlib
from collections.abc import Callable

import anyio.to_thread

from app.store.schema import dumps_json

INLINE_LIMIT = 64 * 1024
"""Below this many bytes the work is cheaper than a thread hop."""

LEVEL = 6
WINDOW_BITS = 12
MEMORY_LEVEL = 5
"""A 4 KiB window and a small state: what repeats in a response's events repeats from
one event to the next, so zlib's larger defaults compress them no smaller and cost more
to set up. ``zlib.decompress`` reads the window from the header, so what was stored with
the defaults reads as before."""


def pack_events_now(events: list[str]) -> bytes:
    if any("\n" in event for event in events):
        text = dumps_json(events)  # never made by the server; kept exact all the same
    else:
        text = "\n".join(events)
    packer = zlib.compressobj(LEVEL, zlib.DEFLATED, WINDOW_BITS, MEMORY_LEVEL)
    # surrogatepass: an event is stored as the text it was, whatever it holds
    return packer.compress(text.encode("utf-8", "surrogatepass")) + packer.flush()


def unpack_events_now(body: bytes) -> list[str]:
    text = zlib.decompress(body).decode("utf-8", "surrogatepass")
    if not text.startswith("["):
        return text.split("\n") if text else []
    events = json.loads(text)
    if not isinstance(events, list):
        raise ValueError("stored events are not a JSON array")
    return events


async def pack_events(events: list[str]) -> bytes:
    if sum(len(event) for event in events) < INLINE_LIMIT:
        return pack_events_now(events)
    return await anyio.to_thread.run_sync(pack_events_now, events)


async def packer(events: list[str], *, beside_loop: bool) -> Callable[[], bytes]:
    """What a write calls, in its transaction, for the stored body of ``events``.

    ``beside_loop``: the write runs beside the event loop (SQLite's writer thread), so a
    small payload is packed there, in the write's transaction, instead of on the event
    loop. Otherwise (PostgreSQL's writes run on the loop), and for a large payload (which
    would hold every write queued behind it), the body is packed here, before the write,
    as :func:`pack_events` does: on the loop if small, in a worker thread if large."""
    if beside_loop and sum(len(event) for event in events) < INLINE_LIMIT:
        return functools.partial(pack_events_now, events)
    return functools.partial(_given, await pack_events(events))


def _given(body: bytes) -> bytes:
    return body


async def unpack_events(body: bytes) -> list[str]:
    if len(body) < INLINE_LIMIT // 8:
        return unpack_events_now(body)
    return await anyio.to_thread.run_sync(unpack_events_now, body)
