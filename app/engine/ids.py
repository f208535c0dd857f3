"""Identifiers. Opaque, unique, and prefixed by kind as the spec's examples are.

Ordered by time, as UUIDv7 is: 12 hex characters of the milliseconds since the Unix
epoch, then 24 random ones (96 bits). The store's indexes on ids (a response's id, its
items' and events' ``response_id``) then take each new row at their end, as they do a
row number, instead of at a random place: a batch of stored responses writes the same
few index pages instead of one page per index per response. What the order tells is the
millisecond an id was made, which the response says anyway (``created_at``).

Their randomness is the operating system's (``os.urandom``, as :mod:`secrets` uses),
drawn 256 ids at a time, since every response takes three or four ids (request,
response, items) and a system call for each would be on every request's path. The drawn
ids wait in a deque, whose ``popleft`` is atomic, so threads may take ids too; a forked
child empties it, so no id is handed out in two processes.
"""

from __future__ import annotations

import collections
import os
import time

_HEX_PER_ID = 24
_IDS_PER_DRAW = 256
_drawn: collections.deque[str] = collections.deque()
os.register_at_fork(after_in_child=_drawn.clear)


def random_hex() -> str:
    """24 random hex characters (96 bits)."""
    while True:
        try:
            return _drawn.popleft()
        except IndexError:
            block = os.urandom(_HEX_PER_ID // 2 * _IDS_PER_DRAW).hex()
            _drawn.extend([block[start:start + _HEX_PER_ID] for start in range(0, len(block), _HEX_PER_ID)])


def new_id(prefix: str) -> str:
    """``prefix`` + ``_`` + the time in milliseconds (12 hex characters) + 24 random hex
    characters (96 bits), e.g. ``msg_019ae1c2b3f43f2a…``."""
    return f"{prefix}_{time.time_ns() // 1_000_000:012x}{random_hex()}"


def response_id() -> str:
    return new_id("resp")


def message_id() -> str:
    return new_id("msg")


def function_call_id() -> str:
    return new_id("fc")


def call_id() -> str:
    return new_id("call")


def reasoning_id() -> str:
    return new_id("rs")


def function_call_output_id() -> str:
    return new_id("fco")


def custom_tool_call_id() -> str:
    return new_id("ctc")


def custom_tool_call_output_id() -> str:
    return new_id("ctco")


def compaction_id() -> str:
    return new_id("cmp")


def tool_search_call_id() -> str:
    return new_id("tsc")


def tool_search_output_id() -> str:
    return new_id("tso")
