"""Logging: plain lines or one JSON object per line (``ORS_LOG_FORMAT``), each with the id
of the request it belongs to, all through the standard :mod:`logging` machinery.

The request id lives in a context variable that the transport's middleware sets for the
duration of a request (a WebSocket connection is one request); tasks started inside it
inherit it, so a background response's lines carry the id of the request that started
it. A filter on the handler copies it onto every record as ``request_id`` (``-`` outside
a request). Log lines name ids, sizes, codes and reasons; user text and keys are never
logged.

Access lines (one per HTTP request, :func:`log_access`) are records of the ``ors.access``
logger, formatted like every other line.

**The server's writes leave the event loop** (``configure(..., queued=True)``, what
``ors serve`` does): the root logger's handler is a :class:`~logging.handlers.QueueHandler`
that filters and formats each record where it is logged (so the request id is the one of
the task that logged it) and puts the finished line on a queue; a
:class:`~logging.handlers.QueueListener` thread writes the lines to stderr, in order. A
slow or blocked stderr (a full pipe) then never holds up requests. :func:`flush` waits
until every line logged before it is written; it runs at exit, and once the server has
finished before the signal that stopped it ends the process (``app.serve``).
"""

from __future__ import annotations

import atexit
import json
import logging
import queue
import threading
import time
from contextvars import ContextVar
from logging.handlers import QueueHandler, QueueListener
from typing import IO, Any, Literal

LogFormat = Literal["text", "json"]

request_id: ContextVar[str | None] = ContextVar("request_id", default=None)
"""The id of the request being served, or ``None`` outside one."""

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"
"""The format of a plain line: ``2025-01-31 12:00:00,123 INFO ors.access [req_…] …``."""


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` to every record: the current request's id, or ``-``. Put on a
    handler that runs where the record is logged (not on a queue listener's handler,
    whose thread is in no request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get() or "-"
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (RFC 3339, UTC, milliseconds), ``level``,
    ``logger``, ``message``, ``request_id`` (when in a request) and ``exception`` (the
    traceback, when there is one)."""

    converter = time.gmtime

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": f"{self.formatTime(record, '%Y-%m-%dT%H:%M:%S')}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = getattr(record, "request_id", "-")
        if rid != "-":
            entry["request_id"] = rid
        if record.exc_info and not record.exc_text:  # cached on the record, as logging.Formatter does
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exception"] = record.exc_text
        return json.dumps(entry, ensure_ascii=False)


def formatter(fmt: LogFormat) -> logging.Formatter:
    """The formatter of ``ORS_LOG_FORMAT``."""
    return JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)


class _Writer:
    """The queue and the listener thread that writes what the server logs (see the module
    docstring); :meth:`flush` and :meth:`stop` write every line queued before them."""

    def __init__(self, handler: logging.Handler) -> None:
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.listener = QueueListener(self.queue, handler)
        self.handler = handler
        self._lock = threading.Lock()
        self._running = False

    def start(self) -> None:
        with self._lock:
            if not self._running:
                self.listener.start()
                self._running = True

    def stop(self) -> None:
        """Write what is queued and end the thread (lines logged later wait in the queue
        until :meth:`start`)."""
        with self._lock:
            if self._running:
                self.listener.stop()  # the listener writes every record queued before its sentinel
                self._running = False
            self.handler.flush()

    def flush(self) -> None:
        self.stop()
        self.start()


_writer: _Writer | None = None
"""The queue's writer while :func:`configure` has routed logging through one."""


def flush() -> None:
    """Write every line logged so far (at exit, once the server has finished, or for a
    test that reads the log)."""
    if _writer is not None:
        _writer.flush()
    for handler in logging.getLogger().handlers:
        handler.flush()


@atexit.register
def _stop_at_exit() -> None:
    # registered after logging's own (logging.shutdown): runs before it
    if _writer is not None:
        _writer.stop()


def configure(level: str, fmt: LogFormat, *, queued: bool = False, stream: IO[str] | None = None) -> None:
    """Route every logger (uvicorn's included) through one handler on ``stream``
    (stderr by default); ``level`` applies to ours and uvicorn's, other libraries log
    warnings and errors only. ``queued``: the server's setup, whose writes leave the
    event loop through a queue (see the module docstring)."""
    global _writer
    previous, _writer = _writer, None
    if previous is not None:
        previous.stop()
    writing = logging.StreamHandler(stream)
    handler: logging.Handler = writing
    if queued:
        _writer = _Writer(writing)
        handler = QueueHandler(_writer.queue)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(formatter(fmt))  # a QueueHandler formats before it queues
    wanted = logging.getLevelName(level.upper())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    # Other libraries' debug output carries SQL parameters and HTTP bodies (user text):
    # they log warnings and errors only, whatever the level asked for.
    root.setLevel(max(wanted, logging.WARNING))
    logging.getLogger("ors").setLevel(wanted)
    for name in ("uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        for old in logger.handlers[:]:
            logger.removeHandler(old)
        logger.propagate = True
        logger.setLevel(wanted)
    # uvicorn writes its access line when a response starts, before its body leaves;
    # ours (:func:`log_access`) is written once the response is over, with its duration.
    silent = logging.getLogger("uvicorn.access")
    for old in silent.handlers[:]:
        silent.removeHandler(old)
    silent.propagate = False
    if _writer is not None:
        _writer.start()


access = logging.getLogger("ors.access")
"""One line per HTTP request, once its response is over (a stream once it ended)."""


def log_access(scope: dict[str, Any], status: int, seconds: float) -> None:
    """``127.0.0.1:50412 - "POST /v1/responses HTTP/1.1" 200 1.3ms``: uvicorn's access
    line, with the time from the request's arrival to the end of its response."""
    if not access.isEnabledFor(logging.INFO):
        return
    client = scope.get("client")
    query = scope.get("query_string", b"")
    target = scope["path"] + "?" + query.decode("latin-1") if query else scope["path"]
    access.info('%s - "%s %s HTTP/%s" %d %.1fms', f"{client[0]}:{client[1]}" if client else "-",
                scope["method"], target, scope.get("http_version", "1.1"), status, seconds * 1000)
