"""Logging: plain lines or one JSON object per line (``ORS_LOG_FORMAT``), each with the id
of the request it belongs to.

The request id lives in a context variable that the transport's middleware sets for the
duration of a request (a WebSocket connection is one request); tasks started inside it
inherit it, so a background response's lines carry the id of the request that started
it. Log lines name ids, sizes, codes and reasons; user text and keys are never logged.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from contextvars import ContextVar
from typing import Any, Literal, NamedTuple

LogFormat = Literal["text", "json"]

request_id: ContextVar[str | None] = ContextVar("request_id", default=None)
"""The id of the request being served, or ``None`` outside one."""

_TEXT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"


class _RequestId(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get() or "-"
        return True


@functools.lru_cache(maxsize=2)
def _local_second(second: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))


@functools.lru_cache(maxsize=2)
def _utc_second(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


class TextFormatter(logging.Formatter):
    """:class:`logging.Formatter`, with the date and time of a second written once for
    all its lines: a ``localtime`` and a ``strftime`` per line were a third of the cost
    of formatting an access line (2.9 of 6.6 µs)."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        return self.default_msec_format % (_local_second(int(record.created)), record.msecs)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (RFC 3339, UTC), ``level``, ``logger``,
    ``message``, ``request_id`` (when in a request) and ``exception`` (when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        return json_line(record.created, record.msecs, record.levelname, record.name, record.getMessage(),
                         getattr(record, "request_id", "-"),
                         self.formatException(record.exc_info) if record.exc_info else None)


def json_line(created: float, msecs: float, level: str, logger: str, message: str, rid: str,
              exception: str | None = None) -> str:
    """A line of :class:`JsonFormatter` (without its line break)."""
    entry: dict[str, object] = {
        "time": f"{_utc_second(int(created))}.{int(msecs):03d}Z",
        "level": level.lower(),
        "logger": logger,
        "message": message,
    }
    if rid != "-":
        entry["request_id"] = rid
    if exception is not None:
        entry["exception"] = exception
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
    last half second of info lines, as with nginx's ``buffer=`` and ``flush=``.

    An access line is held as its fields (:class:`AccessLine`) and formatted when the
    buffer is written, with the lines around it in order: formatting each as its
    response ended cost about 6% of a ``store: false`` JSON answer's throughput in front
    of a fast upstream (an A/B of two servers, alternating), formatting them together
    a fraction of that."""

    def __init__(self, stream: Any = None) -> None:
        super().__init__(stream)
        self._lines: list[str | AccessLine] = []
        self._size = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    def emit(self, record: logging.LogRecord) -> None:  # called holding the handler's lock
        try:
            line = self.format(record) + self.terminator
        except Exception:  # noqa: BLE001 - logging's own rule: report, never raise
            self.handleError(record)
            return
        self._add(line, record.levelno)

    def add_info_line(self, line: str | AccessLine) -> None:
        """An info line already formatted (with its line break), as :meth:`emit` adds
        one it formats, or an access line to format when it is written."""
        self.acquire()
        try:
            self._add(line, logging.INFO)
        finally:
            self.release()

    def _add(self, line: str | AccessLine, level: int) -> None:
        self._lines.append(line)
        self._size += len(line) if type(line) is str else _ACCESS_LINE_BYTES
        if level >= logging.WARNING or self._size >= FLUSH_BYTES:
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
        text = "".join([line if type(line) is str else line.text() for line in self._lines])
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
    global _direct
    handler = BufferedStreamHandler() if buffered else logging.StreamHandler()
    handler.addFilter(_RequestId())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter(_TEXT))
    _direct = _DirectAccess(handler, handler.formatter) if isinstance(handler, BufferedStreamHandler) else None
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
_ors = logging.getLogger("ors")


class AccessLine(NamedTuple):
    """An access line's fields, taken as its response ends; :meth:`text` is the line
    (with its line break) as the handler's formatter would have written it."""

    created: float
    request_id: str
    client: tuple[str, int] | None
    method: str
    path: str
    query: bytes
    http_version: str
    status: int
    seconds: float
    json: bool

    def text(self) -> str:
        created = self.created
        msecs = int((created - int(created)) * 1000)
        message = access_message(self.client, self.method, self.path, self.query, self.http_version,
                                 self.status, self.seconds)
        if self.json:
            return json_line(created, msecs, "INFO", access.name, message, self.request_id) + "\n"
        return (f"{_local_second(int(created))},{msecs:03d} INFO {access.name} [{self.request_id}] "
                f"{message}\n")


_ACCESS_LINE_BYTES = 640
"""What an :class:`AccessLine` counts for in a buffer's size, before it is formatted:
four times a line's length, so that a buffer full of them is about a hundred lines,
whose formatting holds the loop about a tenth of a millisecond (at a line's length, 400
lines held it half a millisecond: a spike every 400 requests one at a time)."""


def access_message(client: tuple[str, int] | None, method: str, path: str, query: bytes, http_version: str,
                   status: int, seconds: float) -> str:
    """``127.0.0.1:50412 - "POST /v1/responses HTTP/1.1" 200 1.3ms``."""
    target = path + "?" + query.decode("latin-1") if query else path
    return (f'{f"{client[0]}:{client[1]}" if client else "-"} - "{method} {target} '
            f'HTTP/{http_version}" {status} {seconds * 1000:.1f}ms')


class _DirectAccess:
    """The access line handed straight to the server's own handler (an
    :class:`AccessLine`, formatted as it would have formatted it), while logging is as
    :func:`configure` left it (the line would go to that handler alone, through no
    filter but the request id's). The standard path (a ``LogRecord``, the logger's and
    the handler's dispatch, the formatter) was about 65,000 instructions a request:
    3.8% of a ``store: false`` JSON answer in front of a fast upstream. Once anything
    else is configured, lines take the standard path."""

    def __init__(self, handler: BufferedStreamHandler, formatter: logging.Formatter | None) -> None:
        self.handler = handler
        self.formatter = formatter
        self.json = isinstance(formatter, JsonFormatter)

    def intact(self) -> bool:
        root, handler = logging.getLogger(), self.handler
        return (len(root.handlers) == 1 and root.handlers[0] is handler and not root.filters
                and not access.handlers and not access.filters and access.propagate
                and not _ors.handlers and not _ors.filters and _ors.propagate
                and len(handler.filters) == 1 and handler.formatter is self.formatter)


_direct: _DirectAccess | None = None
"""Set by :func:`configure` for a server's buffered handler."""


def log_access(scope: dict[str, Any], status: int, seconds: float) -> None:
    """``127.0.0.1:50412 - "POST /v1/responses HTTP/1.1" 200 1.3ms``: uvicorn's access
    line, with the time from the request's arrival to the end of its response."""
    if not access.isEnabledFor(logging.INFO):
        return
    direct = _direct
    if direct is not None and direct.intact():
        direct.handler.add_info_line(AccessLine(
            time.time(), request_id.get() or "-", scope.get("client"), scope["method"], scope["path"],
            scope.get("query_string", b""), scope.get("http_version", "1.1"), status, seconds, direct.json))
    else:
        access.info("%s", access_message(scope.get("client"), scope["method"], scope["path"],
                                         scope.get("query_string", b""), scope.get("http_version", "1.1"),
                                         status, seconds))
