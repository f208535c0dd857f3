"""A strict parser for an Open Responses ``text/event-stream`` body.

The accepted framing is the one every Open Responses client can read, the official
harness included:

- lines end with ``\\n`` alone: a ``\\r`` anywhere is a violation. The harness splits
  on ``\\n`` and ends an event only at a line that is exactly empty, so with CRLF
  framing it would see no event at all;
- an event is one block: one ``event: <type>`` line, then one ``data: <json>`` line,
  then an empty line. The JSON is an object whose ``type`` equals the ``event`` name.
  ``id:``, ``retry:``, other fields, a second ``data:`` line (the harness keeps only
  the last one) and an ``event:`` without ``data:`` are violations;
- lines starting with ``:`` are comments (keep-alives) and are ignored, as are extra
  empty lines between blocks;
- the stream ends with the block ``data: [DONE]`` (no ``event:`` line) and nothing
  follows it.

``SSEParser`` parses a body incrementally, chunk by chunk as it arrives from the
network; ``parse_sse`` parses a complete body.
"""

from __future__ import annotations

import json
from typing import Any

from compliance.errors import ConformanceError

DONE_SENTINEL = "[DONE]"


class SSEParser:
    """Incremental strict parser: ``feed`` chunks of bytes, then ``close``.

    ``feed`` returns the events (decoded JSON objects) completed by the chunk. ``close``
    declares the end of the body; it raises if a block is unterminated, and, when
    ``require_done`` is true, if ``data: [DONE]`` was not received. When
    ``block_aligned_chunks`` is true, a chunk that ends in the middle of a block is a
    violation as well: the official harness resets its parser state on every network
    read, so a server must write each block in a single flush.
    """

    def __init__(self, *, require_done: bool = True, block_aligned_chunks: bool = False) -> None:
        self.require_done = require_done
        self.block_aligned_chunks = block_aligned_chunks
        self.done = False
        self.events: list[dict[str, Any]] = []
        self._buffer = b""
        self._block: list[tuple[int, str]] = []
        self._line_number = 0
        self._closed = False

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        """Parse ``chunk`` and return the events it completed, in order."""
        if self._closed:
            raise RuntimeError("feed() after close()")
        if self.done and chunk:
            raise ConformanceError(f"data after 'data: [DONE]': {chunk[:60]!r}")
        self._buffer += chunk
        completed: list[dict[str, Any]] = []
        while not self.done:
            end = self._buffer.find(b"\n")
            if end < 0:
                break
            raw_line, self._buffer = self._buffer[:end], self._buffer[end + 1 :]
            self._line_number += 1
            event = self._take_line(raw_line)
            if event is not None:
                completed.append(event)
        if self.done and self._buffer:
            raise ConformanceError(f"data after 'data: [DONE]': {self._buffer[:60]!r}")
        if self.block_aligned_chunks and (self._buffer or self._block):
            raise ConformanceError(
                f"a network chunk ended inside an SSE block (line {self._line_number + 1}); "
                "each event must be written in a single flush"
            )
        self.events.extend(completed)
        return completed

    def close(self) -> list[dict[str, Any]]:
        """Declare the end of the body and return all events parsed."""
        self._closed = True
        if self._buffer:
            raise ConformanceError(
                f"the stream ends with an unterminated line (line {self._line_number + 1}): {self._buffer[:60]!r}"
            )
        if self._block:
            raise ConformanceError(f"the stream ends inside a block that starts at line {self._block[0][0]}")
        if self.require_done and not self.done:
            raise ConformanceError("the stream does not end with 'data: [DONE]'")
        return self.events

    def _take_line(self, raw_line: bytes) -> dict[str, Any] | None:
        if b"\r" in raw_line:
            raise ConformanceError(
                f"line {self._line_number} contains a carriage return; lines must end with '\\n' alone"
            )
        try:
            line = raw_line.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ConformanceError(f"line {self._line_number} is not valid UTF-8: {error}") from None
        if line.startswith(":"):
            return None
        if line:
            self._block.append((self._line_number, line))
            return None
        if not self._block:
            return None
        block, self._block = self._block, []
        return self._dispatch(block)

    def _dispatch(self, block: list[tuple[int, str]]) -> dict[str, Any] | None:
        fields = [(number, *_split_field(number, line)) for number, line in block]
        names = [name for _, name, _ in fields]
        first_line = fields[0][0]
        for number, name, _ in fields:
            if name == "id":
                raise ConformanceError(f"line {number}: servers must not send an SSE 'id:' field")
            if name not in ("event", "data"):
                raise ConformanceError(f"line {number}: unexpected SSE field {name!r}")
        if names == ["data"] and fields[0][2] == DONE_SENTINEL:
            self.done = True
            return None
        if names.count("data") > 1:
            raise ConformanceError(f"the block at line {first_line} has more than one 'data:' line")
        if names != ["event", "data"]:
            raise ConformanceError(
                f"the block at line {first_line} has fields {names}; expected one 'event:' line then one 'data:' line"
            )
        (_, _, event_name), (data_line, _, data) = fields
        if data == DONE_SENTINEL:
            raise ConformanceError(f"line {data_line}: 'data: [DONE]' must be a block of its own, without 'event:'")
        try:
            event = json.loads(data)
        except ValueError as error:
            raise ConformanceError(f"line {data_line}: 'data:' is not valid JSON ({error})") from None
        if not isinstance(event, dict):
            raise ConformanceError(f"line {data_line}: 'data:' must be a JSON object")
        if event.get("type") != event_name:
            raise ConformanceError(
                f"line {first_line}: the SSE event name {event_name!r} differs from the JSON type {event.get('type')!r}"
            )
        return event


def _split_field(number: int, line: str) -> tuple[str, str]:
    name, colon, value = line.partition(":")
    if not colon:
        raise ConformanceError(f"line {number}: {line[:60]!r} is not an SSE field line")
    return name, value[1:] if value.startswith(" ") else value


def parse_sse(body: bytes, *, require_done: bool = True) -> list[dict[str, Any]]:
    """Parse a complete ``text/event-stream`` body and return its events."""
    parser = SSEParser(require_done=require_done)
    parser.feed(body)
    return parser.close()
