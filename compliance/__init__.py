"""An independent conformance oracle for Open Responses servers (release 2026-04-24).

It judges what a server sends, against the vendored OpenAPI document and the rules of the
specification's prose, without sharing any code with the server:

- ``compliance.schemas``: JSON Schema validation of responses, events and error bodies;
- ``compliance.resource``: rules about a whole response object;
- ``compliance.sse``: strict ``text/event-stream`` framing;
- ``compliance.stream``: event order, item lifecycle and stream/final-response agreement;
- ``python -m compliance``: the acceptance suite, run against any server over HTTP and WebSocket.

Every check raises ``ConformanceError`` (an ``AssertionError``) naming the violation.
"""

from __future__ import annotations

from compliance.errors import ConformanceError
from compliance.resource import check_compact, check_response
from compliance.schemas import (
    ERRATA,
    ERROR_BODY_SCHEMA,
    EVENT_TYPES,
    SPEC_PATH,
    Erratum,
    Spec,
    load_spec,
    validate_compact,
    validate_error_body,
    validate_event,
    validate_response,
    validate_schema,
    validate_ws_error,
)
from compliance.sse import SSEParser, parse_sse
from compliance.stream import (
    TERMINAL_EVENT_TYPES,
    StreamChecker,
    check_sse_body,
    check_sse_chunks,
    check_stream,
)

__all__ = [
    "ERRATA",
    "ERROR_BODY_SCHEMA",
    "EVENT_TYPES",
    "SPEC_PATH",
    "TERMINAL_EVENT_TYPES",
    "ConformanceError",
    "Erratum",
    "SSEParser",
    "Spec",
    "StreamChecker",
    "check_compact",
    "check_response",
    "check_sse_body",
    "check_sse_chunks",
    "check_stream",
    "load_spec",
    "parse_sse",
    "validate_compact",
    "validate_error_body",
    "validate_event",
    "validate_response",
    "validate_schema",
    "validate_ws_error",
]
