"""How events are packed for the store: compressed, read back exactly, and what was
stored with zlib's default window still reads."""

from __future__ import annotations

import json
import zlib

import pytest

from app.store.codec import INLINE_LIMIT, pack_events, pack_events_now, unpack_events, unpack_events_now
from app.store.schema import dumps_json

pytestmark = pytest.mark.anyio


def _events(count: int) -> list[str]:
    return [json.dumps({"type": "response.output_text.delta", "sequence_number": number,
                        "item_id": "msg_0123456789abcdef0123456789abcdef", "output_index": 0,
                        "content_index": 0, "delta": f"word {number} ", "logprobs": []})
            for number in range(count)]


def test_events_read_back_exactly_and_compress() -> None:
    events = [*_events(40), json.dumps({"type": "note", "text": "é \u2028 \U0001f600"})]
    packed = pack_events_now(events)
    assert unpack_events_now(packed) == events
    assert len(packed) * 5 < len(dumps_json(events).encode())


def test_events_stored_with_the_default_window_still_read() -> None:
    events = _events(10)
    assert unpack_events_now(zlib.compress(dumps_json(events).encode(), 6)) == events


async def test_large_payloads_take_the_same_format_off_the_event_loop() -> None:
    events = _events(2000)
    assert sum(map(len, events)) > INLINE_LIMIT
    packed = await pack_events(events)
    assert packed == pack_events_now(events)
    assert await unpack_events(packed) == events
