"""A response's head leaves with the start of its body, in one write.

uvicorn writes a response's status line and headers the moment the app sends
``http.response.start``, and each body part when it is sent: on a loopback or LAN
connection every write is a system call that also runs the receiving side of TCP and wakes
the client. A JSON answer is one head and one body, sent one after the other without a
pause, and a stream's head is followed at once by its first events; two writes where one
would do.

:class:`HeadWithBody` stands between uvicorn's request cycle and the connection's
transport for one response. The first write (the head) is held; the next write, if it
comes before the loop turns, leaves with it (``writelines``: one ``writev``), and from then
on the cycle writes to the transport itself. If nothing follows within the current step
of the loop (a stream whose first event is not made yet), the head leaves alone on the
loop's next turn, so a client never waits for its head longer than it would have waited
for the loop. Closing the connection sends what is held first. A ``100 Continue`` is a
cycle's first write too, when the client asked for one: it is held the same way (a turn
of the loop at most), and the head that follows it is written on its own.
"""

from __future__ import annotations

import asyncio
from typing import Any


class HeadWithBody:
    """The transport of one request cycle (``cycle.transport``) until its head is out."""

    __slots__ = ("_cycle", "_transport", "_held", "_flush")

    def __init__(self, cycle: Any, transport: asyncio.Transport) -> None:
        self._cycle = cycle
        self._transport = transport
        self._held: bytes | None = None
        self._flush: asyncio.Handle | None = None

    def write(self, data: bytes) -> None:
        if self._held is None:
            self._held = data
            self._flush = asyncio.get_running_loop().call_soon(self._send_held)
            return
        held, self._held = self._held, None
        self._flush.cancel()  # type: ignore[union-attr]
        self._cycle.transport = self._transport
        if not self._transport.is_closing():
            self._transport.writelines((held, data))

    def _send_held(self) -> None:
        held, self._held = self._held, None
        self._cycle.transport = self._transport
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
        self._send_held()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
