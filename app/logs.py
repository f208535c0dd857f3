"""Logging: plain lines or one JSON object per line (``ORS_LOG_FORMAT``), each with the id
of the request it belongs to.

The request id lives in a context variable that the transport's middleware sets for the
duration of a request (a WebSocket connection is one request); tasks started inside it
inherit it, so a background response's lines carry the id of the request that started
it. Log lines name ids, sizes, codes and reasons; user text and keys are never logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextvars import ContextVar
from typing import Any, Literal

LogFormat = Literal["text", "json"]

request_id: ContextVar[str | None] = ContextVar("request_id", default=None)
"""The id of the request being served, or ``None`` outside one."""

_TEXT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"


class _RequestId(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get() or "-"
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (RFC 3339, UTC), ``level``, ``logger``,
    ``message``, ``request_id`` (when in a request) and ``exception`` (when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = getattr(record, "request_id", "-")
        if rid != "-":
            entry["request_id"] = rid
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


FLUSH_SECONDS = 0.5
"""How long an info line may wait in a :class:`BufferedStreamHandler`'s buffer."""
FLUSH_BYTES = 64 * 1024
"""How much a :class:`BufferedStreamHandler` holds before it writes."""


class BufferedStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes its lines in bulk: a warning or an error at once,
    with every line before it; info lines (one access line per request) when
    :data:`FLUSH_BYTES` have gathered, or :data:`FLUSH_SECONDS` after the first of them
    (a timer on the event loop of the thread that logged it; a line logged outside a
    loop is written at once), and at exit (``logging.shutdown``).

    Why: each write to stderr is a system call that lets go of the GIL, and when SQLite's
    writer thread is waiting for it (any stored response under load), the event loop
    then waits to take it back, about 0.1 ms. One write per request's access line cost
    stored JSON answers 8% of their throughput at concurrency 16 (ten interleaved
    rounds, with the access log against without). What a ``kill -9`` can lose is the
    last half second of info lines, as with nginx's ``buffer=`` and ``flush=``."""

    def __init__(self, stream: Any = None) -> None:
        super().__init__(stream)
        self._lines: list[str] = []
        self._size = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    def emit(self, record: logging.LogRecord) -> None:  # called holding the handler's lock
        try:
            line = self.format(record) + self.terminator
        except Exception:  # noqa: BLE001 - logging's own rule: report, never raise
            self.handleError(record)
            return
        self._lines.append(line)
        self._size += len(line)
        if record.levelno >= logging.WARNING or self._size >= FLUSH_BYTES:
            self._write()
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._write()
            return
        timer = self._timer
        # a timer is set unless one is pending on this loop (one set by a loop that has
        # since stopped would never fire)
        if timer is None or self._timer_loop is not loop or loop.time() > timer.when() + FLUSH_SECONDS:
            self._timer = loop.call_later(FLUSH_SECONDS, self.flush)
            self._timer_loop = loop

    def flush(self) -> None:
        self.acquire()
        try:
            self._write()
        finally:
            self.release()

    def _write(self) -> None:
        # a pending timer is left to fire on an empty buffer: cancelling it from another
        # thread (a warning logged off the loop) would not be safe
        self._timer = None
        if not self._lines or self.stream is None:
            return
        text = "".join(self._lines)
        self._lines.clear()
        self._size = 0
        try:
            self.stream.write(text)
            self.stream.flush()
        except Exception:  # noqa: BLE001 - as StreamHandler: a log that cannot be written is dropped
            pass


def flush() -> None:
    """Write what the root logger's handlers hold (a test reading the log, a shutdown)."""
    for handler in logging.getLogger().handlers:
        handler.flush()


def configure(level: str, fmt: LogFormat, *, buffered: bool = False) -> None:
    """Route every logger (uvicorn's included) through one handler on stderr; ``level``
    applies to ours and uvicorn's, other libraries log warnings and errors only.
    ``buffered``: a server's handler, which writes info lines in bulk
    (:class:`BufferedStreamHandler`)."""
    # What no line of ours shows is not gathered for every record (the logging HOWTO's
    # "Optimization"): the caller's frame, thread, process and multiprocessing names.
    # Every request writes an access line; this is a fifth of its cost (7 -> 5.5 us).
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = BufferedStreamHandler() if buffered else logging.StreamHandler()
    handler.addFilter(_RequestId())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT))
    wanted = logging.getLevelName(level.upper())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # Other libraries' debug output carries SQL parameters and HTTP bodies (user text):
    # they log warnings and errors only, whatever the level asked for.
    root.setLevel(max(wanted, logging.WARNING))
    logging.getLogger("ors").setLevel(wanted)
    for name in ("uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
        logger.setLevel(wanted)
    # uvicorn writes its access line when a response starts, before its body leaves;
    # ours (:func:`log_access`) is written once the response is over, with its duration.
    # Without a handler anywhere above it, uvicorn does not even format its own.
    silent = logging.getLogger("uvicorn.access")
    silent.handlers[:] = []
    silent.propagate = False


access = logging.getLogger("ors.access")
"""One line per HTTP request, once its response is over (a stream once it ended)."""


def log_access(scope: dict[str, Any], status: int, seconds: float) -> None:
    """``127.0.0.1:50412 - "POST /v1/responses HTTP/1.1" 200 1.3ms``: uvicorn's access
    line, with the time from the request's arrival to the end of its response."""
    if not access.isEnabledFor(logging.INFO):
        return
    client = scope.get("client")
    query = scope.get("query_string")
    path = scope["path"] + "?" + query.decode("latin-1") if query else scope["path"]
    access.info('%s - "%s %s HTTP/%s" %d %.1fms', f"{client[0]}:{client[1]}" if client else "-",
                scope["method"], path, scope.get("http_version", "1.1"), status, seconds * 1000)
