"""Server-Sent Events read from an upstream's (or llama-server's) byte stream.

Our own parser rather than ``httpx-sse``: it reads two things that project does not, and
that upstreams send: llama.cpp's ``error: {...}`` lines, and a last event cut off by the
end of the stream (dispatched, so that truncated output surfaces as a decoding error
instead of vanishing). It is fed the body's bytes as they arrive.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import AsyncIterator

_SSE_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class SSEParser:
    """Incremental Server-Sent Events parser: text in, ``(event, data)`` pairs out.

    Follows the SSE grammar: lines end in CRLF, LF or CR only (unlike ``str.splitlines``,
    which would also split inside JSON carrying U+2028 or U+0085); ``:`` lines are comments
    (keep-alives); several ``data:`` lines join with ``\\n``; a blank line dispatches. Two
    departures: an ``error: {...}`` line (llama.cpp's server) dispatches as event ``error``,
    and data still pending when the stream ends is dispatched rather than dropped, so a
    truncated last line surfaces as a decoding error instead of vanishing.
    """

    def __init__(self) -> None:
        self._decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
        self._partial: list[str] = []
        self._held_cr = False
        self._event = ""
        self._data: list[str] = []

    def feed(self, text: str, *, final: bool = False) -> list[tuple[str, str]]:
        if (text.endswith("\n\n") and not self._held_cr and not self._data and not self._event
                and not self._partial and "\r" not in text):
            # What nearly every upstream sends: whole events, each one ``data:`` line and a
            # blank one, nothing pending before them. Each event is read from its block at
            # once; a block of any other shape goes through the lines as below.
            events = []
            for block in text[:-2].split("\n\n"):
                if block.startswith("data:") and "\n" not in block:
                    events.append(("message", block[6:] if block.startswith(" ", 5) else block[5:]))
                else:
                    events += [event for line in (*block.split("\n"), "") if (event := self._line(line)) is not None]
            return events
        if self._held_cr:
            text, self._held_cr = "\r" + text, False
        if text.endswith("\r") and not final:
            text, self._held_cr = text[:-1], True  # may be the first half of a CRLF
        # most streams end their lines in LF alone: a plain split
        lines = _SSE_LINE_BREAK.split(text) if "\r" in text else text.split("\n")
        if len(lines) > 1:
            lines[0] = "".join(self._partial) + lines[0]
            self._partial = []
        tail = lines.pop()
        if tail:  # the start of a line to come (none after a line break: nothing pending)
            self._partial.append(tail)
        if final:
            lines.append("".join(self._partial))
            self._partial = []
        events = [event for line in lines if (event := self._line(line)) is not None]
        if final and self._data:
            events.append(self._dispatch())
        return events

    def _line(self, line: str) -> tuple[str, str] | None:
        if line.startswith("data:"):  # nearly every line
            self._data.append(line[6:] if line.startswith(" ", 5) else line[5:])
            return None
        if not line:
            if self._data:
                return self._dispatch()
            self._event = ""
            return None
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "error":
            return "error", value
        return None

    def _dispatch(self) -> tuple[str, str]:
        event = (self._event or "message", "\n".join(self._data))
        self._event, self._data = "", []
        return event

    def feed_bytes(self, chunk: bytes) -> list[tuple[str, str]]:
        """:meth:`feed` for bytes of the stream, decoded as UTF-8 as SSE requires (a
        character cut between two chunks is decoded once both are in)."""
        return self.feed(self._decode(chunk))

    def end(self) -> list[tuple[str, str]]:
        """The events the end of the stream completes (after the last :meth:`feed_bytes`)."""
        return self.feed(self._decode(b"", True), final=True)


async def sse_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[tuple[str, str]]:
    """``(event, data)`` pairs from an SSE byte stream (see :meth:`SSEParser.feed_bytes`)."""
    parser = SSEParser()
    async for chunk in chunks:
        for event in parser.feed_bytes(chunk):
            yield event
    for event in parser.end():
        yield event
