"""How events are packed for the store: one per line, compressed, read back exactly;
what was stored as a JSON array, or with zlib's default window, still reads."""

from __future__ import annotations

import json
import zlib

import pytest

from app.store.codec import INLINE_LIMIT, pack_events, pack_events_now, packer, unpack_events, unpack_events_now
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


def test_events_are_stored_as_they_were_sent_one_per_line() -> None:
    events = _events(3)
    assert zlib.decompress(pack_events_now(events)) == "\n".join(events).encode()
    assert unpack_events_now(pack_events_now([])) == []


def test_events_that_hold_a_line_break_or_a_lone_surrogate_read_back_exactly() -> None:
    odd = [json.dumps({"type": "note"}, indent=1), '{"type":"note","text":"\ud800"}', "{\"raw\":\"\ud800\"}"]
    assert unpack_events_now(pack_events_now(odd)) == odd
    assert unpack_events_now(pack_events_now(odd[1:])) == odd[1:]


def test_events_stored_as_a_json_array_still_read() -> None:
    events = _events(10)
    packer = zlib.compressobj(6, zlib.DEFLATED, 12, 5)
    assert unpack_events_now(packer.compress(dumps_json(events).encode()) + packer.flush()) == events


def test_events_stored_with_the_default_window_still_read() -> None:
    events = _events(10)
    assert unpack_events_now(zlib.compress(dumps_json(events).encode(), 6)) == events


async def test_large_payloads_take_the_same_format_off_the_event_loop() -> None:
    events = _events(2000)
    assert sum(map(len, events)) > INLINE_LIMIT
    packed = await pack_events(events)
    assert packed == pack_events_now(events)
    assert await unpack_events(packed) == events


async def test_a_write_beside_the_loop_packs_small_payloads_itself() -> None:
    """SQLite's writer thread packs a stored answer's events when it writes them; a write
    on the loop, or a large payload, gets them packed before. Each way the body is the
    same."""
    small, large = _events(40), _events(2000)
    lazily = await packer(small, beside_loop=True)
    assert lazily() == pack_events_now(small) and lazily() is not lazily()  # packed when called
    for events, beside_loop in ((small, False), (large, True), (large, False)):
        body = await packer(events, beside_loop=beside_loop)
        assert body() is body()  # packed once, before the write
        assert unpack_events_now(body()) == events
