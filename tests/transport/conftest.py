"""Fixtures of the transport's tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from bench.stub import MODEL, StubProcess
from tests.live import ServerProcess, free_port


class Kept(logging.Handler):
    """Keeps the records of warnings and errors."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def problems() -> Iterator[list[logging.LogRecord]]:
    """Warnings and errors that the server (uvicorn's loggers and ours) logs meanwhile."""
    kept = Kept()
    loggers = [logging.getLogger(name) for name in ("uvicorn.error", "ors")]
    for logger in loggers:
        logger.addHandler(kept)
    try:
        yield kept.records
    finally:
        for logger in loggers:
            logger.removeHandler(kept)


@pytest.fixture(scope="module")
def fronted_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``ors serve`` as its own process (a client in the same process would wait for the
    GIL, and read late) in front of the benchmark's stub upstream, which answers at once;
    its model is the default one. For tests that read raw sockets."""
    work = tmp_path_factory.mktemp("fronted")
    stub = StubProcess(free_port(), work / "stub.log").start()
    ors = ServerProcess({"ORS_UPSTREAM_URL": stub.base_url, "ORS_DEFAULT_MODEL": MODEL}, work / "ors").start()
    try:
        yield ors
    finally:
        ors.terminate()
        stub.stop()
