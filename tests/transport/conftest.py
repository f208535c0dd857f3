"""Fixtures of the transport's tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


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
