"""schemathesis against the vendored spec: requests generated from ``openapi/openapi.json``
(``POST /v1/responses`` and ``/v1/responses/compact``, JSON and SSE as ``stream`` comes
out), sent over real HTTP to the real server. What must hold for every one: no 5xx, every
refusal the spec's error object, every answer valid against the spec (a JSON response,
or an SSE stream through the stream checker), and nothing at ERROR or with a traceback
in the server's log.

Bounded here (``ORS_FUZZ_EXAMPLES`` per operation, 150 by default, derandomized so a run
is repeatable); ``make fuzz`` runs the same with 5,000. Valid bodies need a model this
server has: a generated ``model`` is replaced by the scripted backend's (named as such),
so generation runs too, cheaply.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from app.config import Settings
from app.main import create_app
from compliance import SSEParser, StreamChecker, check_compact, check_response, validate_error_body
from tests.conftest import scripted_backend
from tests.live import LiveServer

SPEC = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"
EXAMPLES = int(os.environ.get("ORS_FUZZ_EXAMPLES", "150"))

schema = schemathesis.openapi.from_path(SPEC)


class Faults(logging.Handler):
    """Every record at ERROR or above, or carrying a traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            self.seen.append(record)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, Faults]]:
    faults = Faults()
    logging.getLogger().addHandler(faults)
    settings_ = Settings(data_dir=tmp_path_factory.mktemp("fuzz"), default_model="scripted-text")
    server = LiveServer(create_app(settings_, backends=[scripted_backend()])).start()
    yield server, faults
    server.stop()
    logging.getLogger().removeHandler(faults)


def _judge(method: str, path: str, status: int, content_type: str, body: bytes) -> None:
    assert status < 500, (status, body[:500])
    if status >= 400:
        validate_error_body(json.loads(body))
    elif method.upper() != "POST":  # schemathesis tries the other methods too: GET is the list (a superset)
        assert method.upper() == "GET" and path == "/responses", (method, path, status)
        assert json.loads(body)["object"] == "list"
    elif content_type.startswith("text/event-stream"):
        checker = StreamChecker(transport="sse")
        parser = SSEParser(require_done=True)
        for event in parser.feed(body):
            checker.feed(event)
        parser.close()
        checker.finish()
    elif path.endswith("/compact"):
        check_compact(json.loads(body))
    else:
        check_response(json.loads(body))


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_generated_requests_get_spec_answers_and_no_fault(case: Any, fuzzed: tuple[LiveServer, Faults]) -> None:
    server, faults = fuzzed
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        case.body["model"] = "scripted-text"
    reply = case.call(base_url=f"{server.url}/v1", timeout=60)
    kind = reply.headers.get("content-type") or ""
    _judge(case.method, case.path, reply.status_code, kind if isinstance(kind, str) else kind[0], reply.content)
    assert not faults.seen, [faults.format(record) for record in faults.seen]
