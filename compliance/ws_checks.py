"""The WebSocket checks of the acceptance suite.

They replay the seven WebSocket tests of the official Open Responses compliance harness
against ``ws(s)://<base URL>/responses`` and keep its turn mechanics: every client
message is ``{"type": "response.create", ...}``; a turn ends at the first terminal event
(``response.completed`` | ``response.failed`` | ``response.incomplete``) or at the first
``type: "error"`` message, and must end within 30 s of its request; a turn's error code
is the error envelope's ``error.code`` or, failing that, the final response's
``error.code``. The verdicts are stricter than the harness's: every event passes the
stream checker (WebSocket rules, schemas on), an error envelope must be a valid
``WebSocketErrorEvent`` sent before any event of its turn, ``[DONE]`` and binary frames
are violations, and nothing may arrive after a socket's last turn ended.

A server that answers the upgrade with 404 or 405 does not offer the (optional)
transport: the checks are skipped. Any other refusal fails them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import connect

from compliance.errors import ConformanceError
from compliance.http_checks import clip, json_body, post, require_status, skip_if_not_offered, user
from compliance.resource import check_compact
from compliance.schemas import Spec, load_spec
from compliance.stream import TERMINAL_EVENT_TYPES, StreamChecker
from compliance.suite import Session, Skip, SuiteConfig, register

TURN_TIMEOUT = 30.0
"""The harness's limit for one turn, from sending its request to its last message."""
OPEN_TIMEOUT = 10.0
"""The harness's limit for the opening handshake."""
QUIET_SECONDS = 0.25
"""How long a socket must stay silent after its last turn before the check closes it."""
NOT_FOUND = "previous_response_not_found"
MISSING_CALL_ID = "call_openresponses_missing"
DONE_SENTINEL = "[DONE]"


class Connection(Protocol):
    """The client side of one WebSocket connection (what ``websockets.sync.client.connect`` returns)."""

    def send(self, message: str) -> None: ...

    def recv(self, timeout: float | None = None) -> str | bytes:
        """The next message; ``TimeoutError`` when none arrives in time, ``ConnectionClosed`` at the end."""
        ...

    def close(self) -> None: ...


class Connector(Protocol):
    def open(self) -> Connection:
        """A new connection; raises ``Skip`` or ``ConformanceError`` when the upgrade is refused."""
        ...


def websocket_url(base_url: str) -> str:
    """The WebSocket URL of ``/responses`` under ``base_url``: http becomes ws, https wss.

    A ``ws``/``wss`` base URL is used as it is; any other scheme is a ``ValueError``.
    """
    parts = urllib.parse.urlsplit(base_url)
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme.lower())
    if scheme is None:
        raise ValueError(f"cannot derive a WebSocket URL from the base URL {base_url!r}")
    return urllib.parse.urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + "/responses", parts.query, ""))


def turn_timeout(config: SuiteConfig) -> float:
    """The per-turn limit: the harness's 30 s, unless the run was given another ``--timeout``."""
    default = next(f.default for f in dataclasses.fields(SuiteConfig) if f.name == "timeout")
    return TURN_TIMEOUT if config.timeout == default else config.timeout


@dataclass(frozen=True)
class WebSocketConnector:
    """Opens connections to the server under test, authenticated in the upgrade request."""

    config: SuiteConfig

    @property
    def url(self) -> str:
        return websocket_url(self.config.base_url)

    def open(self) -> Connection:
        url = self.url
        try:
            return connect(url, additional_headers=self.config.headers(), open_timeout=OPEN_TIMEOUT, max_size=None)
        except InvalidStatus as refused:
            status = refused.response.status_code
            if status in (404, 405):
                raise Skip(f"the server does not offer the WebSocket transport at {url} (HTTP {status})") from None
            body = refused.response.body.decode("utf-8", errors="replace") if refused.response.body else ""
            raise ConformanceError(f"the server refused the WebSocket upgrade at {url}: HTTP {status}"
                                   + (f": {clip(body)}" if body else "")) from None
        except InvalidHandshake as error:
            raise ConformanceError(f"the WebSocket upgrade at {url} failed: {error}") from None
        except TimeoutError:
            raise ConformanceError(
                f"the WebSocket upgrade at {url} did not complete within {OPEN_TIMEOUT:g} s") from None
        except OSError as error:
            raise ConformanceError(f"could not connect to {url}: {error}") from None


def connector(session: Session) -> Connector:
    """The session's connector (``"websocket"``); one may be put in place before the run."""
    return session.resource("websocket", lambda: WebSocketConnector(session.config))


def error_code(message: Any) -> str | None:
    """``error.code`` of an error envelope or of a response object, or None when it has none."""
    error = message.get("error") if isinstance(message, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def ends_turn(message: dict[str, Any]) -> bool:
    """Whether ``message`` ends its turn: a terminal event or any ``type: "error"`` message."""
    return message.get("type") in TERMINAL_EVENT_TYPES or message.get("type") == "error"


def parse_message(frame: str | bytes) -> dict[str, Any]:
    """The JSON object of one server frame; ``ConformanceError`` for ``[DONE]``, binary or non-object frames."""
    if isinstance(frame, bytes):
        raise ConformanceError("a binary frame; every server message is a JSON text frame")
    if frame.strip() == DONE_SENTINEL:
        raise ConformanceError("[DONE] on WebSocket; the sentinel belongs to SSE, and a WebSocket client "
                               "counts it against the next turn")
    try:
        message = json.loads(frame)
    except ValueError as error:
        raise ConformanceError(f"a frame that is not JSON ({error}): {clip(frame)!r}") from None
    if not isinstance(message, dict):
        raise ConformanceError(f"a message that is not a JSON object: {clip(frame)!r}")
    return message


@dataclass(frozen=True)
class Turn:
    """What one turn produced: its events and final response, or an error envelope (and no events)."""

    events: list[dict[str, Any]] = field(default_factory=list)
    response: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    label: str = "turn"

    @property
    def error_code(self) -> str | None:
        """The envelope's ``error.code``, else the final response's ``error.code``."""
        return error_code(self.error) or error_code(self.response)

    @property
    def failed(self) -> bool:
        """Whether the turn failed: an error envelope, an error code, or a failed response."""
        return (self.error is not None or self.error_code is not None
                or (self.response is not None and self.response.get("status") == "failed"))

    def describe(self) -> str:
        if self.error is not None:
            return (f"an error envelope (status {self.error.get('status')!r}, code {self.error_code!r}: "
                    f"{clip(str(self.error['error'].get('message')), 120)})")
        if self.response is None:
            return "no result"
        code = f", code {self.error_code!r}" if self.error_code else ""
        return f"a {self.response['status']} response{code}"


class TurnReader:
    """The messages of one turn, judged as they arrive.

    ``feed`` takes one frame and returns True when it ended the turn; ``turn`` then
    holds the result. A ``type: "error"`` message before any event is the turn's error
    envelope and must be a valid ``WebSocketErrorEvent`` with an HTTP error status;
    every other message goes to a ``StreamChecker`` (WebSocket rules, schemas on), so an
    ``error`` event after the response started is a violation. Any violation raises
    ``ConformanceError``.
    """

    def __init__(self, *, spec: Spec | None = None) -> None:
        self.spec = spec or load_spec()
        self.checker = StreamChecker(transport="websocket", spec=self.spec)
        self.turn: Turn | None = None

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.checker.events

    def feed(self, frame: str | bytes) -> bool:
        if self.turn is not None:
            raise ConformanceError("a message after the end of the turn")
        message = parse_message(frame)
        if message.get("type") == "error" and not self.checker.events:
            self.spec.validate_ws_error(message)
            status = message["status"]
            if not 400 <= status <= 599:
                raise ConformanceError(f"the error envelope has status {status}; expected an HTTP error status "
                                       "(400-599)", json_path="$.status")
            self.turn = Turn(error=message)
            return True
        self.checker.feed(message)
        if ends_turn(message):
            self.turn = Turn(events=list(self.checker.events), response=self.checker.finish())
            return True
        return False


class Socket:
    """One connection of a check, driven one turn at a time (``name`` labels it when a check opens several)."""

    def __init__(self, connection: Connection, *, model: str, timeout: float, name: str = "",
                 spec: Spec | None = None) -> None:
        self.connection = connection
        self.model = model
        self.timeout = timeout
        self.name = name
        self.spec = spec or load_spec()
        self.turns = 0

    def label(self) -> str:
        return f"{self.name}, turn {self.turns}" if self.name else f"turn {self.turns}"

    def turn(self, body: dict[str, Any]) -> Turn:
        """Send ``response.create`` with the run's model and ``body``; return the checked turn.

        Raises ``ConformanceError`` (prefixed with the turn's label) on a violation, when
        the server closes the connection, or when the turn does not end within the limit.
        """
        self.turns += 1
        label = self.label()
        reader = TurnReader(spec=self.spec)
        try:
            self.connection.send(json.dumps({"type": "response.create", "model": self.model, **body}))
            deadline = time.monotonic() + self.timeout
            while not reader.feed(self.connection.recv(timeout=max(deadline - time.monotonic(), 0.0))):
                pass
        except TimeoutError:
            raise ConformanceError(f"{label}: no terminal event within {self.timeout:g} s "
                                   f"({len(reader.events)} events received)") from None
        except ConnectionClosed as closed:
            raise ConformanceError(f"{label}: the server closed the connection before the turn ended "
                                   f"({closed})") from None
        except ConformanceError as error:
            raise ConformanceError(f"{label}: {error}", json_path=error.json_path) from None
        assert reader.turn is not None
        return dataclasses.replace(reader.turn, label=label)

    def expect_silence(self) -> None:
        """Nothing may follow the last turn's final message (``[DONE]`` least of all)."""
        try:
            frame = self.connection.recv(timeout=QUIET_SECONDS)
        except (TimeoutError, ConnectionClosed):
            return
        shown = DONE_SENTINEL if frame == DONE_SENTINEL else clip(repr(frame), 120)
        raise ConformanceError(f"{self.label()}: {shown} arrived after the turn ended; "
                               "a turn sends nothing after its final message")


@contextlib.contextmanager
def open_socket(session: Session, name: str = "") -> Iterator[Socket]:
    """A new connection for the duration of the block; on a normal exit the socket must
    have stayed silent after its last turn, then it is closed."""
    chosen = connector(session)
    connection = session.recorder.websocket(chosen.open(), getattr(chosen, "url", "websocket"))
    try:
        socket = Socket(connection, model=session.config.model, timeout=turn_timeout(session.config), name=name)
        yield socket
        socket.expect_silence()
    finally:
        with contextlib.suppress(Exception):
            connection.close()


def require_completed(turn: Turn) -> dict[str, Any]:
    """The turn's final response, which must be completed."""
    if turn.response is None or turn.response["status"] != "completed":
        raise ConformanceError(f"{turn.label}: expected a completed response, got {turn.describe()}")
    return turn.response


def require_error_code(turn: Turn, code: str) -> None:
    if turn.error_code != code:
        raise ConformanceError(f"{turn.label}: expected the error code {code!r}, got {turn.describe()}")


def require_failed(turn: Turn) -> None:
    if not turn.failed:
        raise ConformanceError(f"{turn.label}: expected the turn to fail, got {turn.describe()}")


@register("websocket-response", transport="websocket")
def websocket_response(session: Session) -> None:
    """One WebSocket turn streams valid events and completes."""
    with open_socket(session) as socket:
        require_completed(socket.turn({"input": [user("Count from 1 to 3.")]}))


@register("websocket-sequential-responses", transport="websocket")
def websocket_sequential_responses(session: Session) -> None:
    """Two store:false turns on one socket each complete, as two distinct responses."""
    with open_socket(session) as socket:
        first = require_completed(socket.turn({"store": False, "input": "Reply with exactly: first"}))
        second = require_completed(socket.turn({"store": False, "input": "Reply with exactly: second"}))
    if first["id"] == second["id"]:
        raise ConformanceError(f"both turns returned the response id {first['id']!r}")


@register("websocket-continuation", transport="websocket")
def websocket_continuation(session: Session) -> None:
    """A store:false response continues on the same socket with previous_response_id and new input only."""
    with open_socket(session) as socket:
        first = require_completed(socket.turn({"store": False,
                                               "input": "Remember the code word: cobalt. Reply with OK."}))
        second_turn = socket.turn({"store": False, "previous_response_id": first["id"],
                                   "input": "What is the code word? Reply with only the code word."})
        second = require_completed(second_turn)
    if second["previous_response_id"] != first["id"]:
        raise ConformanceError(f"{second_turn.label}: previous_response_id is {second['previous_response_id']!r}, "
                               f"expected {first['id']!r}", json_path="$.previous_response_id")


@register("websocket-reconnect-store-false-recovery", transport="websocket")
def websocket_reconnect_store_false_recovery(session: Session) -> None:
    """A store:false id is not found from a new socket; a full-input turn on that socket then completes."""
    with open_socket(session, "socket A") as socket:
        first = require_completed(socket.turn({"store": False,
                                               "input": "Remember the code word: copper. Reply with OK."}))
    with open_socket(session, "socket B") as socket:
        require_error_code(socket.turn({
            "store": False, "previous_response_id": first["id"],
            "input": "Try to continue after reconnect. Reply with exactly: reconnected",
        }), NOT_FOUND)
        require_completed(socket.turn({"store": False, "input": [user(
            "The previous store:false chain could not continue after reconnect. "
            "Start a new response and reply with exactly: recovered")]}))


@register("websocket-previous-response-not-found", transport="websocket")
def websocket_previous_response_not_found(session: Session) -> None:
    """A store:false turn continuing an unknown id fails with previous_response_not_found."""
    with open_socket(session) as socket:
        require_error_code(socket.turn({
            "store": False, "previous_response_id": f"resp_openresponses_missing_{time.time_ns() // 1_000_000}",
            "input": "This should fail because the previous response is missing.",
        }), NOT_FOUND)


@register("websocket-failed-continuation-evicts-cache", transport="websocket")
def websocket_failed_continuation_evicts_cache(session: Session) -> None:
    """A failed continuation evicts the id it referenced: continuing from it again is not found."""
    with open_socket(session) as socket:
        first = require_completed(socket.turn({"store": False,
                                               "input": "Remember the code word: ember. Reply with OK."}))
        require_failed(socket.turn({"store": False, "previous_response_id": first["id"], "input": [{
            "type": "function_call_output", "call_id": MISSING_CALL_ID,
            "output": "No matching tool call exists in the previous response.",
        }]}))
        require_error_code(socket.turn({
            "store": False, "previous_response_id": first["id"],
            "input": "Try to continue after the failed turn. Reply with exactly: stale",
        }), NOT_FOUND)


@register("websocket-compact-new-chain", transport="websocket")
def websocket_compact_new_chain(session: Session) -> None:
    """A compacted window plus a new message starts a new WebSocket chain that completes."""
    response = post(session, "/responses/compact", {"model": session.config.model, "input": [
        user([{"type": "input_text", "text": "Remember the compaction code word: slate."}]),
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "OK."}]},
        user([{"type": "input_text", "text": "Compress this conversation for later continuation."}]),
    ]})
    skip_if_not_offered(response, "/responses/compact")
    require_status(response, (200,))
    window = check_compact(json_body(response))["output"]
    with open_socket(session) as socket:
        require_completed(socket.turn({"store": False, "tools": [], "input": [
            *window, user("Continue from here. Reply with exactly: compacted")]}))
