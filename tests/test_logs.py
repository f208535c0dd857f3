"""The server's log handler writes in bulk: info lines wait (for more, or half a second
on the event loop), a warning takes everything before it out at once, in order."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Iterator

import pytest

from app import logs

anyio = pytest.mark.anyio


class CountingStream(io.StringIO):
    """A stream that counts its writes (each one a system call on a real stream)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


@pytest.fixture
def logged() -> tuple[logging.Logger, CountingStream, logs.BufferedStreamHandler]:
    stream = CountingStream()
    handler = logs.BufferedStreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.Logger("buffered-test")
    logger.addHandler(handler)
    return logger, stream, handler


def test_outside_an_event_loop_every_line_is_written_at_once(logged) -> None:  # type: ignore[no-untyped-def]
    logger, stream, _ = logged
    logger.info("one")
    assert stream.getvalue() == "INFO one\n"


@anyio
async def test_info_lines_wait_and_a_warning_takes_them_out_in_order(logged) -> None:  # type: ignore[no-untyped-def]
    logger, stream, _ = logged
    for number in range(5):
        logger.info("line %d", number)
    assert stream.getvalue() == ""
    logger.warning("trouble")
    assert stream.getvalue().splitlines() == [*(f"INFO line {n}" for n in range(5)), "WARNING trouble"]
    assert stream.writes == 1


@anyio
async def test_info_lines_are_written_within_the_delay(logged, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(logs, "FLUSH_SECONDS", 0.05)
    logger, stream, _ = logged
    logger.info("a")
    logger.info("b")
    assert stream.getvalue() == ""
    await asyncio.sleep(0.2)
    assert stream.getvalue() == "INFO a\nINFO b\n" and stream.writes == 1
    logger.info("c")  # a new timer for the next line
    await asyncio.sleep(0.2)
    assert stream.getvalue().endswith("INFO c\n")


@anyio
async def test_a_full_buffer_and_a_flush_write_at_once(logged, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(logs, "FLUSH_BYTES", 100)
    logger, stream, handler = logged
    for _ in range(20):
        logger.info("x" * 10)
    assert 0 < stream.writes < 20 and len(stream.getvalue()) >= 100
    logger.info("last")
    handler.flush()
    assert stream.getvalue().endswith("INFO last\n")


def test_a_loop_that_stopped_leaves_no_line_behind(logged, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """A line whose timer was set by a loop that stopped before it fired goes out with
    the next loop's timer."""
    monkeypatch.setattr(logs, "FLUSH_SECONDS", 0.05)
    logger, stream, _ = logged

    async def log_and_leave() -> None:
        logger.info("from the first loop")

    async def log_and_wait() -> None:
        logger.info("from the second")
        await asyncio.sleep(0.3)

    asyncio.run(log_and_leave())
    assert stream.getvalue() == ""
    asyncio.run(log_and_wait())
    assert stream.getvalue() == "INFO from the first loop\nINFO from the second\n"


def test_every_logger_of_the_server_is_under_ors() -> None:
    """``ORS_LOG_LEVEL`` applies to ``ors.*`` (other libraries are capped at warnings): a
    logger of ours named otherwise would lose its info lines, whatever the level asked."""
    import importlib
    import pkgutil

    import app

    for module in pkgutil.walk_packages(app.__path__, "app."):
        if ".migrations." not in module.name:
            importlib.import_module(module.name)
    ours = [name for name in logging.Logger.manager.loggerDict if name == "app" or name.startswith("app.")]
    assert ours == []


def test_the_time_of_a_line_is_what_the_standard_formatter_writes() -> None:
    """The date and time made once a second are those the standard formatter makes for
    each line (text), and the UTC time the JSON line had, for times across many seconds
    and milliseconds, in any order."""
    import json
    import random
    import time

    text, standard = logs.TextFormatter(logs._TEXT), logging.Formatter(logs._TEXT)
    random.seed(11)
    moments = [1_800_000_000 + random.uniform(0, 5) for _ in range(300)] + [1_700_000_000.0, 1_700_000_000.999]
    for created in moments:
        record = logging.LogRecord("ors.access", logging.INFO, "x", 0, "line %d", (1,), None)
        record.created, record.msecs = created, int((created - int(created)) * 1000) + 0.0
        record.request_id = "-"
        assert text.format(record) == standard.format(record)
        assert text.formatTime(record, "%H:%M") == standard.formatTime(record, "%H:%M")
        utc = json.loads(logs.JsonFormatter().format(record))["time"]
        assert utc == time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(record.msecs):03d}Z"


@pytest.fixture
def server_logging() -> Iterator[None]:
    """Logging as :func:`logs.configure` sets it up for a server, undone afterwards."""
    names = ["", "ors", "uvicorn", "uvicorn.error", "uvicorn.access"]
    saved = {name: (logging.getLogger(name).handlers[:], logging.getLogger(name).level,
                    logging.getLogger(name).propagate) for name in names}
    flags = (logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing)  # type: ignore[attr-defined]
    direct = logs._direct
    yield
    for name, (handlers, level, propagate) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:], logger.propagate = handlers, propagate
        logger.setLevel(level)
    logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing = flags  # type: ignore[attr-defined]
    logs._direct = direct


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_an_access_line_written_directly_is_the_line_logging_writes(
    server_logging: None, monkeypatch: pytest.MonkeyPatch, fmt: logs.LogFormat
) -> None:
    """The server's access line skips logging's dispatch while logging is as configured,
    and is the line logging writes once anything else is configured (here a filter on
    the access logger, which then sees the record)."""
    import time

    logs.configure("info", fmt, buffered=True)
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logs.BufferedStreamHandler)
    handler.stream = io.StringIO()
    monkeypatch.setattr(time, "time", lambda: 1_800_000_123.456789)
    scope = {"client": ("127.0.0.1", 50412), "path": "/v1/responses", "query_string": b"a=1", "method": "POST",
             "http_version": "1.1"}
    seen: list[logging.LogRecord] = []
    watcher = logging.Filter()
    watcher.filter = lambda record: seen.append(record) or True  # type: ignore[method-assign]
    token = logs.request_id.set("req-1")
    try:
        logs.log_access(scope, 200, 0.0013)
        assert logs._direct is not None and logs._direct.intact() and seen == []
        logs.access.addFilter(watcher)
        try:
            assert not logs._direct.intact()
            logs.log_access(scope, 200, 0.0013)
        finally:
            logs.access.removeFilter(watcher)
    finally:
        logs.request_id.reset(token)
    handler.flush()
    direct, standard = handler.stream.getvalue().splitlines()
    assert len(seen) == 1
    assert direct == standard
    assert '127.0.0.1:50412 - \\"POST /v1/responses?a=1 HTTP/1.1\\" 200 1.3ms' in direct if fmt == "json" else \
        '[req-1] 127.0.0.1:50412 - "POST /v1/responses?a=1 HTTP/1.1" 200 1.3ms' in direct


@anyio
async def test_access_lines_are_formatted_when_written_in_their_place_among_the_others(
    server_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An access line waits as its fields and is formatted as the buffer is written,
    between the lines logged before and after it; the time it shows is its response's
    end, not the moment it is written."""
    import time

    logs.configure("info", "text", buffered=True)
    handler = logging.getLogger().handlers[0]
    stream = CountingStream()
    handler.stream = stream
    scope = {"client": ("127.0.0.1", 50412), "path": "/v1/responses", "query_string": b"", "method": "POST",
             "http_version": "1.1"}
    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.25)
    logging.getLogger("ors.test").info("first")
    logs.log_access(scope, 200, 0.0013)
    monkeypatch.setattr(time, "time", lambda: 1_800_000_001.5)
    logs.log_access(scope, 503, 0.5)
    assert stream.writes == 0 and any(isinstance(line, logs.AccessLine) for line in handler._lines)
    logging.getLogger("ors.test").warning("second")
    lines = stream.getvalue().splitlines()
    assert stream.writes == 1 and len(lines) == 4
    assert lines[0].endswith("INFO ors.test [-] first") and lines[3].endswith("WARNING ors.test [-] second")
    assert lines[1].endswith('127.0.0.1:50412 - "POST /v1/responses HTTP/1.1" 200 1.3ms') and ",250 INFO" in lines[1]
    assert lines[2].endswith('127.0.0.1:50412 - "POST /v1/responses HTTP/1.1" 503 500.0ms') and ",500 INFO" in lines[2]
