"""The server's log handler writes in bulk: info lines wait (for more, or half a second
on the event loop), a warning takes everything before it out at once, in order."""

from __future__ import annotations

import asyncio
import io
import logging

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
