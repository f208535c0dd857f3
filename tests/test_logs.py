"""Logging as the server sets it up: standard records, handlers and formatters; the
request id on every line; the server's lines written off the event loop, none lost."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app import logs

anyio = pytest.mark.anyio

SCOPE = {"client": ("127.0.0.1", 50412), "path": "/v1/responses", "query_string": b"a=1", "method": "POST",
         "http_version": "1.1"}


@pytest.fixture
def server_logging() -> Iterator[None]:
    """Logging as :func:`logs.configure` sets it up for a server, undone afterwards."""
    names = ["", "ors", "uvicorn", "uvicorn.error", "uvicorn.access"]
    saved = {name: (logging.getLogger(name).handlers[:], logging.getLogger(name).level,
                    logging.getLogger(name).propagate) for name in names}
    yield
    logs.configure("warning", "text", stream=io.StringIO())  # stops a queue's writer
    for name, (handlers, level, propagate) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:], logger.propagate = handlers, propagate
        logger.setLevel(level)


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


def test_a_text_line_is_the_standard_formatters_with_the_request_id(server_logging: None) -> None:
    stream = io.StringIO()
    logs.configure("info", "text", stream=stream)
    logging.getLogger("ors.test").info("outside %s", "a request")
    token = logs.request_id.set("req-1")
    try:
        logging.getLogger("ors.test").warning("inside")
    finally:
        logs.request_id.reset(token)
    outside, inside = stream.getvalue().splitlines()
    assert outside.endswith(" INFO ors.test [-] outside a request")
    assert inside.endswith(" WARNING ors.test [req-1] inside")
    time.strptime(outside.split(",")[0], "%Y-%m-%d %H:%M:%S")


def test_a_json_line_has_the_fields_and_the_exception(server_logging: None) -> None:
    stream = io.StringIO()
    logs.configure("info", "json", stream=stream)
    token = logs.request_id.set("req-2")
    try:
        try:
            raise ValueError("broken")
        except ValueError:
            logging.getLogger("ors.test").exception("failed %d", 7)
    finally:
        logs.request_id.reset(token)
    logging.getLogger("ors.test").info("plain")
    failed, plain = (json.loads(line) for line in stream.getvalue().splitlines())
    assert {key: failed[key] for key in ("level", "logger", "message", "request_id")} == {
        "level": "error", "logger": "ors.test", "message": "failed 7", "request_id": "req-2"}
    assert failed["exception"].startswith("Traceback") and "ValueError: broken" in failed["exception"]
    assert set(plain) == {"time", "level", "logger", "message"}  # no request, no exception
    assert time.strptime(plain["time"], "%Y-%m-%dT%H:%M:%S.%fZ")


def test_the_json_time_is_utc_with_milliseconds() -> None:
    record = logging.LogRecord("ors.access", logging.INFO, "x", 0, "line %d", (1,), None)
    record.created, record.msecs = 1_800_000_000.25, 250.0
    assert json.loads(logs.JsonFormatter().format(record))["time"] == "2027-01-15T08:00:00.250Z"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_an_access_line_is_an_ordinary_record_of_ors_access(server_logging: None, fmt: logs.LogFormat) -> None:
    """A filter on the access logger sees it; the handler's formatter writes it."""
    stream = io.StringIO()
    logs.configure("info", fmt, stream=stream)
    seen: list[logging.LogRecord] = []
    watcher = logging.Filter()
    watcher.filter = lambda record: seen.append(record) or True  # type: ignore[method-assign]
    logs.access.addFilter(watcher)
    token = logs.request_id.set("req-1")
    try:
        logs.log_access(SCOPE, 200, 0.0013)
    finally:
        logs.request_id.reset(token)
        logs.access.removeFilter(watcher)
    message = '127.0.0.1:50412 - "POST /v1/responses?a=1 HTTP/1.1" 200 1.3ms'
    assert len(seen) == 1 and seen[0].name == "ors.access" and seen[0].getMessage() == message
    line = stream.getvalue().rstrip("\n")
    if fmt == "json":
        assert json.loads(line)["message"] == message and json.loads(line)["request_id"] == "req-1"
    else:
        assert line.endswith(f"INFO ors.access [req-1] {message}")


def test_no_access_line_below_info(server_logging: None) -> None:
    stream = io.StringIO()
    logs.configure("warning", "text", stream=stream)
    logs.log_access(SCOPE, 200, 0.0013)
    assert stream.getvalue() == ""


class BlockedStream(io.StringIO):
    """A stderr that cannot be written to (a full pipe) until :attr:`open` is set; notes
    the threads that wrote to it."""

    def __init__(self) -> None:
        super().__init__()
        self.open = threading.Event()
        self.writers: set[int] = set()

    def write(self, text: str) -> int:
        self.open.wait()
        self.writers.add(threading.get_ident())
        return super().write(text)


@anyio
async def test_a_blocked_stderr_does_not_hold_up_the_event_loop(server_logging: None) -> None:
    """Queued: each line is formatted where it is logged (with that task's request id)
    and written by another thread, in order; :func:`logs.flush` waits for them all."""
    stream = BlockedStream()
    logs.configure("info", "text", queued=True, stream=stream)

    async def request(number: int) -> None:
        logs.request_id.set(f"req-{number}")
        await asyncio.sleep(0)
        logging.getLogger("ors.test").info("line %d", number)

    await asyncio.wait_for(asyncio.gather(*(request(number) for number in range(200))), timeout=30)
    assert stream.getvalue() == ""  # all logged, none written yet
    stream.open.set()
    logs.flush()
    lines = stream.getvalue().splitlines()
    assert [line.split(" INFO ors.test ")[1] for line in lines] == [f"[req-{n}] line {n}" for n in range(200)]
    assert threading.get_ident() not in stream.writers
    logging.getLogger("ors.test").warning("after the flush")  # the writer goes on
    logs.flush()
    assert stream.getvalue().endswith("WARNING ors.test [-] after the flush\n")


def test_an_exception_crosses_the_queue_as_text(server_logging: None) -> None:
    stream = io.StringIO()
    logs.configure("info", "json", queued=True, stream=stream)
    try:
        raise KeyError("gone")
    except KeyError:
        logging.getLogger("ors.test").exception("failed")
    logs.flush()
    line = json.loads(stream.getvalue())
    assert line["message"] == "failed" and "KeyError: 'gone'" in line["exception"]


CHILD = textwrap.dedent("""
    import logging, os, signal, sys, time
    from app import logs

    class Slow:  # a stderr slower than the lines come: they wait in the queue
        def write(self, text):
            time.sleep(0.0005)
            return sys.stderr.write(text)

        def flush(self):
            sys.stderr.flush()

    logs.configure("info", "text", queued=True, stream=Slow())
    for number in range(2000):
        logging.getLogger("ors.test").info("line %d", number)
    if sys.argv[1] == "signal":
        logs.flush()  # what the server does once it has finished, before the signal ends it
        os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("ending", ["exit", "signal"])
def test_no_queued_line_is_lost_at_the_end(ending: str) -> None:
    """A process that exits writes every queued line (at exit); one ended by a signal,
    every line logged before :func:`logs.flush`."""
    root = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", CHILD, ending], capture_output=True, text=True, timeout=120,
                          cwd=root, env={**os.environ, "PYTHONPATH": root})
    lines = done.stderr.splitlines()
    assert [line.rsplit(" ", 1)[1] for line in lines] == [str(number) for number in range(2000)], done.stderr[-2000:]
