"""The streaming-event checker: order, lifecycle and consistency of one response stream.

``StreamChecker`` consumes the JSON events of one response, in order, and raises
``ConformanceError`` at the first event that breaks a rule; ``finish`` then returns the
final ``ResponseResource``. The rules:

- every event is schema-valid against the streaming union (optional, on by default);
- ``sequence_number`` starts anywhere and grows by exactly 1 per event;
- ``response.created`` comes first, then ``response.in_progress``; ``response.queued``
  may sit between them when the created snapshot is ``queued``. These snapshots have
  ``output: []``, ``usage: null`` and ``completed_at: null``;
- items are streamed one at a time, ``output_index`` 0, 1, 2...: ``output_item.added``
  (status ``in_progress``, zero values) opens an item and ``output_item.done`` (status
  ``completed`` or ``incomplete``) closes it before the next one opens; no event refers
  to an item after its ``done``; ``item_id`` always names the item; an added item carries
  zero values (a message no content, a function call no arguments, a reasoning item no
  summary, a compaction item ``encrypted_content: ""``; of OpenAI's superset items, a
  ``tool_search_call`` ``arguments: {}``, a ``tool_search_output`` ``tools: []``);
- content parts (and reasoning summary parts) open and close one at a time with
  indexes 0, 1, 2...: ``*.added`` with a zero-value part, deltas of the part's own kind,
  one ``*.done`` whose text equals the concatenated deltas, then ``*.part.done`` whose
  part equals the accumulated part; function-call arguments likewise;
- the ``output_item.done`` item equals the accumulated item: id, type, role, call_id,
  name, arguments, content and summary;
- an ``incomplete`` item is the last item, and the response then ends with
  ``response.incomplete`` (with ``incomplete_details.reason``);
- an ``error`` event is immediately followed by ``response.failed`` (over WebSocket an
  ``error`` event is not allowed at all: a failing turn ends with ``response.failed``
  alone, because clients end a turn at the first ``error`` message);
- exactly one terminal event (``response.completed`` | ``response.failed`` |
  ``response.incomplete``) ends the stream; its ``response.status`` matches its type,
  it passes ``check_response``, and its ``output`` equals the streamed items exactly;
- every snapshot carries the same ``id`` and the same request echo fields.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from compliance.errors import ConformanceError
from compliance.resource import check_response
from compliance.schemas import Spec, load_spec
from compliance.sse import DONE_SENTINEL, SSEParser

TERMINAL_EVENT_TYPES = {
    "response.completed": "completed",
    "response.failed": "failed",
    "response.incomplete": "incomplete",
}
SUPERSET_TERMINAL_STATUSES = {"response.incomplete": ("cancelled",)}
"""OpenAI's superset status ``cancelled`` (a background response stopped by the client)
ends its stream like any early stop, with ``response.incomplete``."""
SNAPSHOT_EVENT_TYPES = {"response.created", "response.queued", "response.in_progress", *TERMINAL_EVENT_TYPES}
STABLE_RESPONSE_FIELDS = (
    "id", "object", "created_at", "model", "previous_response_id", "instructions", "tools", "tool_choice",
    "truncation", "parallel_tool_calls", "text", "top_p", "presence_penalty", "frequency_penalty",
    "top_logprobs", "temperature", "reasoning", "max_output_tokens", "max_tool_calls", "store", "background",
    "metadata", "safety_identifier", "prompt_cache_key",
)
"""Snapshot fields that echo the request and therefore never change within one stream."""

_PART_KINDS = {"message": {"output_text", "refusal"}, "reasoning": {"reasoning_text"}}
_TEXT_KEY = {"output_text": "text", "refusal": "refusal", "reasoning_text": "text", "summary_text": "text"}
_DELTA_EVENTS = {
    "response.output_text.delta": ("content", "output_text"),
    "response.refusal.delta": ("content", "refusal"),
    "response.reasoning.delta": ("content", "reasoning_text"),
    "response.reasoning_summary_text.delta": ("summary", "summary_text"),
}
_TEXT_DONE_EVENTS = {
    "response.output_text.done": ("content", "output_text"),
    "response.refusal.done": ("content", "refusal"),
    "response.reasoning.done": ("content", "reasoning_text"),
    "response.reasoning_summary_text.done": ("summary", "summary_text"),
}
_PART_EVENTS = {
    "response.content_part.added": "content",
    "response.content_part.done": "content",
    "response.reasoning_summary_part.added": "summary",
    "response.reasoning_summary_part.done": "summary",
}
_INDEX_KEY = {"content": "content_index", "summary": "summary_index"}


@dataclass
class _Part:
    kind: str
    value: dict[str, Any]
    delta_logprobs: list[Any] = field(default_factory=list)
    text_done: bool = False
    closed: bool = False


@dataclass
class _Item:
    added: dict[str, Any]
    parts: dict[str, list[_Part]] = field(default_factory=lambda: {"content": [], "summary": []})
    argument_deltas: list[str] = field(default_factory=list)
    arguments_done: str | None = None
    done: dict[str, Any] | None = None

    @property
    def id(self) -> str:
        return self.added["id"]

    @property
    def type(self) -> str:
        return self.added["type"]

    def open_part(self) -> _Part | None:
        return next((p for group in self.parts.values() for p in group if not p.closed), None)


class StreamChecker:
    """Check the events of one response stream, one ``feed`` at a time.

    ``transport`` is ``"sse"`` or ``"websocket"``; the only difference is that a
    WebSocket stream may not carry ``error`` events. With ``validate_schemas=False``
    schema validation is skipped for speed and a malformed event is reported less
    precisely.
    """

    def __init__(
        self,
        *,
        validate_schemas: bool = True,
        transport: Literal["sse", "websocket"] = "sse",
        spec: Spec | None = None,
    ) -> None:
        self.validate_schemas = validate_schemas
        self.transport = transport
        self.spec = spec or load_spec()
        self.events: list[dict[str, Any]] = []
        self.items: list[_Item] = []
        self.final_response: dict[str, Any] | None = None
        self._state = "start"
        self._first_snapshot: dict[str, Any] | None = None
        self._created_status: str | None = None
        self._last_sequence_number: int | None = None

    def feed(self, event: dict[str, Any]) -> None:
        """Check the next event; raise ``ConformanceError`` if it breaks a rule."""
        position = len(self.events)
        self.events.append(event)
        label = f"event #{position}"
        try:
            if isinstance(event, dict):
                label += f" ({event.get('type')!r}, sequence_number {event.get('sequence_number')!r})"
            self._check(event)
        except ConformanceError as error:
            raise ConformanceError(f"{label}: {error}", json_path=error.json_path) from None
        except (KeyError, TypeError, AttributeError, IndexError) as error:
            raise ConformanceError(f"{label}: malformed event ({type(error).__name__}: {error})") from None

    def finish(self) -> dict[str, Any]:
        """Declare the end of the stream and return the final ``ResponseResource``."""
        if not self.events:
            raise ConformanceError("the stream carried no events")
        if self._state == "error":
            raise ConformanceError("the stream ended after an 'error' event without 'response.failed'")
        if self.final_response is None:
            raise ConformanceError(
                f"the stream ended without a terminal event (one of {', '.join(TERMINAL_EVENT_TYPES)})"
            )
        return self.final_response

    def _check(self, event: Any) -> None:
        if self.validate_schemas:
            self.spec.validate_event(event)
        elif not isinstance(event, dict):
            raise ConformanceError("a streaming event must be a JSON object")
        self._check_sequence(event["sequence_number"])
        event_type = event["type"]
        if self._state == "terminal":
            kind = "a second terminal event" if event_type in TERMINAL_EVENT_TYPES else "an event"
            raise ConformanceError(f"{kind} after the terminal event")
        if self._state == "error" and event_type != "response.failed":
            raise ConformanceError("an 'error' event must be followed immediately by 'response.failed'")
        if event_type in SNAPSHOT_EVENT_TYPES:
            self._on_snapshot(event_type, event["response"])
        elif self._state not in ("in_progress", "error"):
            raise ConformanceError(f"{event_type!r} before 'response.in_progress'")
        elif event_type == "error":
            if self.transport == "websocket":
                raise ConformanceError(
                    "a WebSocket stream must not carry an 'error' event; a failing turn ends with "
                    "'response.failed' alone"
                )
            self._state = "error"
        elif event_type == "response.output_item.added":
            self._on_item_added(event)
        elif event_type == "response.output_item.done":
            self._on_item_done(event)
        elif event_type in _PART_EVENTS:
            self._on_part_event(event, _PART_EVENTS[event_type], opening=event_type.endswith(".added"))
        elif event_type in _DELTA_EVENTS:
            self._on_text_delta(event, *_DELTA_EVENTS[event_type])
        elif event_type in _TEXT_DONE_EVENTS:
            self._on_text_done(event, *_TEXT_DONE_EVENTS[event_type])
        elif event_type == "response.output_text.annotation.added":
            self._on_annotation(event)
        elif event_type.startswith("response.function_call_arguments."):
            self._on_arguments(event, done=event_type.endswith(".done"))
        elif event_type.startswith("response.mcp_call_arguments."):
            self._on_arguments(event, done=event_type.endswith(".done"), kind="mcp_call")
        elif event_type in _MCP_PROGRESS_EVENTS:
            item = self._item(event)
            _require(item.type == _MCP_PROGRESS_EVENTS[event_type], "$.type", f"{event_type!r} for a {item.type} item")
        else:
            raise ConformanceError(f"unknown event type {event_type!r}")

    def _check_sequence(self, number: int) -> None:
        previous = self._last_sequence_number
        self._last_sequence_number = number
        if previous is None or number == previous + 1:
            return
        if number <= previous:
            raise ConformanceError(f"sequence_number {number} does not increase (previous {previous})")
        raise ConformanceError(f"sequence_number jumps from {previous} to {number}; it must grow by 1")

    def _on_snapshot(self, event_type: str, response: dict[str, Any]) -> None:
        self._check_snapshot_stability(response)
        if event_type in TERMINAL_EVENT_TYPES:
            self._on_terminal(event_type, response)
            return
        expected_state = {"response.created": ("start",), "response.queued": ("created",),
                          "response.in_progress": ("created", "queued")}[event_type]
        if self._state not in expected_state:
            if self._state == "start":
                raise ConformanceError(f"the first event must be 'response.created', not {event_type!r}")
            raise ConformanceError(f"{event_type!r} out of order (after {self._state!r})")
        status = response["status"]
        if event_type == "response.created":
            _require(status in ("queued", "in_progress"), "$.response.status",
                     f"the created snapshot has status {status!r}; expected 'queued' or 'in_progress'")
            self._created_status = status
        elif event_type == "response.queued":
            _require(self._created_status == "queued", "$.response.status",
                     "'response.queued' is allowed only when the created snapshot is queued")
            _require(status == "queued", "$.response.status", f"status {status!r} in 'response.queued'")
        else:
            _require(status == "in_progress", "$.response.status", f"status {status!r} in 'response.in_progress'")
        _require(response["output"] == [], "$.response.output", f"{event_type!r} must carry output: []")
        _require(response["usage"] is None, "$.response.usage", f"{event_type!r} must carry usage: null")
        check_response(response, spec=self.spec, validate=False)
        self._state = event_type.removeprefix("response.")

    def _check_snapshot_stability(self, response: dict[str, Any]) -> None:
        first = self._first_snapshot
        if first is None:
            self._first_snapshot = response
            return
        for name in STABLE_RESPONSE_FIELDS:
            if name in first and response.get(name) != first[name]:
                raise ConformanceError(
                    f"response.{name} changed within the stream: {first[name]!r} then {response.get(name)!r}",
                    json_path=f"$.response.{name}",
                )

    def _on_terminal(self, event_type: str, response: dict[str, Any]) -> None:
        if self._state not in ("in_progress", "error"):
            raise ConformanceError(f"{event_type!r} before 'response.in_progress'")
        status = response["status"]
        allowed = {TERMINAL_EVENT_TYPES[event_type], *SUPERSET_TERMINAL_STATUSES.get(event_type, ())}
        _require(status in allowed, "$.response.status",
                 f"{event_type!r} carries a response with status {status!r}")
        open_items = [item for item in self.items if item.done is None]
        if open_items and event_type != "response.failed":
            raise ConformanceError(f"{event_type!r} while item {len(self.items) - 1} is still open")
        if any(item.done and item.done["status"] == "incomplete" for item in self.items):
            _require(event_type == "response.incomplete", "$.type",
                     "a stream with an incomplete item must end with 'response.incomplete'")
        self._check_final_output(response["output"], allow_dropped_open_items=event_type == "response.failed")
        check_response(response, spec=self.spec, validate=False)
        self.final_response = response
        self._state = "terminal"

    def _check_final_output(self, output: list[dict[str, Any]], *, allow_dropped_open_items: bool) -> None:
        """The final output equals the streamed items; a failed response may leave out an unfinished item."""
        finished = sum(1 for item in self.items if item.done is not None)
        accepted = {len(self.items), finished} if allow_dropped_open_items else {len(self.items)}
        if len(output) not in accepted:
            raise ConformanceError(
                f"the final response has {len(output)} output items but {len(self.items)} were streamed",
                json_path="$.response.output",
            )
        for index, (final_item, streamed) in enumerate(zip(output, self.items, strict=False)):
            path = f"$.response.output[{index}]"
            if streamed.done is None:
                _require((final_item.get("id"), final_item.get("type")) == (streamed.id, streamed.type), path,
                         f"the final item {index} is not the streamed item {streamed.id!r}")
            elif final_item != streamed.done:
                difference = _difference(streamed.done, final_item)
                raise ConformanceError(f"the final output item {index} differs from the streamed item: {difference}",
                                       json_path=path)

    def _on_item_added(self, event: dict[str, Any]) -> None:
        item, index = event["item"], event["output_index"]
        _require(item is not None, "$.item", "output_item.added must carry the item")
        _require(index == len(self.items), "$.output_index",
                 f"output_index {index}; the next item must have output_index {len(self.items)}")
        if self.items:
            previous = self.items[-1]
            _require(previous.done is not None, "$.output_index",
                     f"item {index} is added while item {index - 1} is still open")
            _require(previous.done["status"] != "incomplete", "$.output_index",
                     f"item {index} follows an incomplete item; an incomplete item must be the last")
        _check_identity(item, "$.item")
        _require(item["status"] == "in_progress", "$.item.status",
                 f"an added item must have status 'in_progress', not {item['status']!r}")
        _require(all(other.id != item["id"] for other in self.items), "$.item.id",
                 f"item id {item['id']!r} was already used")
        zero_values = {"message": {"content": []}, "function_call": {"arguments": ""}, "reasoning": {"summary": []},
                       "compaction": {"encrypted_content": ""}, "tool_search_call": {"arguments": {}},
                       "tool_search_output": {"tools": []}}
        for name, zero in zero_values.get(item["type"], {}).items():
            _require(item[name] == zero, f"$.item.{name}", f"an added {item['type']} must carry {name}: {zero!r}")
        if item["type"] == "reasoning":
            _require(item.get("content", []) == [], "$.item.content", "an added reasoning item must carry no content")
        self.items.append(_Item(added=item))

    def _on_item_done(self, event: dict[str, Any]) -> None:
        item, done = self._item(event, allow_done=True), event["item"]
        _require(item.done is None, "$.output_index", f"output_item.done for item {item.id!r} was already sent")
        _require(done is not None, "$.item", "output_item.done must carry the item")
        _check_identity(done, "$.item")
        ends = _MCP_CALL_ENDS if done["type"] == "mcp_call" else ("completed", "incomplete")
        _require(done["status"] in ends, "$.item.status",
                 f"a done item must have status {' or '.join(map(repr, ends))}, not {done['status']!r}")
        _require(item.open_part() is None, "$.item", "output_item.done while a part of the item is still open")
        for name in ("id", "type", "role", "call_id", "name"):
            if name in item.added:
                _require(done.get(name) == item.added[name], f"$.item.{name}",
                         f"{name} {done.get(name)!r} differs from {item.added[name]!r} in output_item.added")
        if item.type == "function_call":
            streamed = item.arguments_done if item.arguments_done is not None else "".join(item.argument_deltas)
            _require(not item.argument_deltas or item.arguments_done is not None, "$.item.arguments",
                     "function_call_arguments.delta without function_call_arguments.done")
            _require(done["arguments"] == streamed, "$.item.arguments",
                     f"arguments {done['arguments']!r} differ from the streamed arguments {streamed!r}")
        for group in ("content", "summary"):
            streamed_parts = [part.value for part in item.parts[group]]
            if group in done or streamed_parts:
                _require(done.get(group) == streamed_parts, f"$.item.{group}",
                         f"{group} differs from the streamed parts: {_difference(streamed_parts, done.get(group))}")
        item.done = done

    def _on_part_event(self, event: dict[str, Any], group: str, *, opening: bool) -> None:
        item, part_value = self._item(event), event["part"]
        index_key = _INDEX_KEY[group]
        index, parts = event[index_key], item.parts[group]
        if opening:
            allowed = {"summary_text"} if group == "summary" else _PART_KINDS.get(item.type, set())
            _require(item.type == "reasoning" or group == "content", "$.type",
                     "summary parts belong to reasoning items")
            _require(part_value["type"] in allowed, "$.part.type",
                     f"a {item.type} item cannot stream a {part_value['type']!r} part")
            _require(index == len(parts), f"$.{index_key}", f"{index_key} {index}; the next part is {len(parts)}")
            _require(item.open_part() is None, f"$.{index_key}", "a part is opened while another is still open")
            zero = {"type": part_value["type"], _TEXT_KEY[part_value["type"]]: ""}
            if part_value["type"] == "output_text":
                zero["annotations"] = []
            _require(_without_logprobs(part_value) == zero and not part_value.get("logprobs"), "$.part",
                     f"an added part must carry zero values {zero!r}")
            parts.append(_Part(kind=part_value["type"], value=dict(part_value)))
            return
        part = self._part(item, group, index)
        _require(part.text_done, "$.type", f"the part is closed before its {part.kind} text is done")
        _require(_without_logprobs(part_value) == _without_logprobs(part.value), "$.part",
                 f"the done part differs from the streamed part: {_difference(part.value, part_value)}")
        if part_value.get("logprobs"):
            _require(part_value["logprobs"] == part.delta_logprobs, "$.part.logprobs",
                     "the done part's logprobs differ from the streamed logprobs")
        part.value = part_value
        part.closed = True

    def _on_text_delta(self, event: dict[str, Any], group: str, kind: str) -> None:
        part = self._part(self._item(event), group, event[_INDEX_KEY[group]], kind=kind)
        _require(not part.text_done, "$.type", f"a delta after the {kind} text is done")
        part.value[_TEXT_KEY[kind]] += event["delta"]
        part.delta_logprobs.extend(event.get("logprobs") or [])

    def _on_text_done(self, event: dict[str, Any], group: str, kind: str) -> None:
        part = self._part(self._item(event), group, event[_INDEX_KEY[group]], kind=kind)
        _require(not part.text_done, "$.type", f"the {kind} text is done twice")
        key = _TEXT_KEY[kind]
        streamed = part.value[key]
        _require(event[key] == streamed, f"$.{key}",
                 f"the done {key} {_clip(event[key])!r} differs from the concatenated deltas {_clip(streamed)!r}")
        part.text_done = True

    def _on_annotation(self, event: dict[str, Any]) -> None:
        part = self._part(self._item(event), "content", event["content_index"], kind="output_text")
        annotations = part.value["annotations"]
        _require(event["annotation"] is not None, "$.annotation", "annotation.added must carry the annotation")
        _require(event["annotation_index"] == len(annotations), "$.annotation_index",
                 f"annotation_index {event['annotation_index']}; the next annotation is {len(annotations)}")
        annotations.append(event["annotation"])

    def _on_arguments(self, event: dict[str, Any], *, done: bool, kind: str = "function_call") -> None:
        item = self._item(event)
        _require(item.type == kind, "$.type", f"{kind.replace('_', '-')} arguments for a {item.type} item")
        _require(item.arguments_done is None, "$.type", "function-call arguments after their done event")
        if not done:
            item.argument_deltas.append(event["delta"])
            return
        streamed = "".join(item.argument_deltas)
        _require(event["arguments"] == streamed, "$.arguments",
                 f"arguments {_clip(event['arguments'])!r} differ from the concatenated deltas {_clip(streamed)!r}")
        item.arguments_done = event["arguments"]

    def _item(self, event: dict[str, Any], *, allow_done: bool = False) -> _Item:
        index = event["output_index"]
        _require(isinstance(index, int) and 0 <= index < len(self.items), "$.output_index",
                 f"no item was added at output_index {index}")
        item = self.items[index]
        if not allow_done:
            _require(item.done is None, "$.output_index", f"an event for item {item.id!r} after its output_item.done")
        if "item_id" in event:
            _require(event["item_id"] == item.id, "$.item_id",
                     f"item_id {event['item_id']!r} is not the id {item.id!r} of item {index}")
        return item

    def _part(self, item: _Item, group: str, index: int, *, kind: str | None = None) -> _Part:
        parts = item.parts[group]
        index_key = _INDEX_KEY[group]
        _require(0 <= index < len(parts), f"$.{index_key}", f"no {group} part was added at {index_key} {index}")
        part = parts[index]
        _require(not part.closed, f"$.{index_key}", f"an event for the {group} part {index} after it was closed")
        if kind is not None:
            _require(part.kind == kind, "$.type", f"a {kind} event inside a {part.kind!r} part")
        return part


def check_stream(
    events: Iterable[dict[str, Any] | str],
    *,
    expect_done: bool = True,
    transport: Literal["sse", "websocket"] = "sse",
    validate_schemas: bool = True,
    spec: Spec | None = None,
) -> dict[str, Any]:
    """Check a complete list of events and return the final ``ResponseResource``.

    ``events`` holds event objects and, with ``expect_done``, ends with the ``"[DONE]"``
    sentinel string; without it (a WebSocket turn) the sentinel must not appear. ``spec``:
    what the events are judged by (the vendored spec by default).
    """
    items = list(events)
    if expect_done:
        if not items or items[-1] != DONE_SENTINEL:
            raise ConformanceError("the stream does not end with [DONE]")
        items.pop()
    if DONE_SENTINEL in items:
        where = "before the end of the stream" if expect_done else "on this transport"
        raise ConformanceError(f"[DONE] appears {where}")
    checker = StreamChecker(transport=transport, validate_schemas=validate_schemas, spec=spec)
    for event in items:
        checker.feed(event)
    return checker.finish()


def check_sse_chunks(chunks: Iterable[bytes], *, validate_schemas: bool = True,
                     block_aligned_chunks: bool = False) -> dict[str, Any]:
    """Check a ``text/event-stream`` body as it arrives, failing at the first violation.

    Framing (see ``compliance.sse``, ``[DONE]`` required) and event rules are checked
    together; the final ``ResponseResource`` is returned.
    """
    parser = SSEParser(require_done=True, block_aligned_chunks=block_aligned_chunks)
    checker = StreamChecker(transport="sse", validate_schemas=validate_schemas)
    for chunk in chunks:
        for event in parser.feed(chunk):
            checker.feed(event)
    parser.close()
    return checker.finish()


def check_sse_body(raw: bytes, *, validate_schemas: bool = True) -> dict[str, Any]:
    """Check a complete ``text/event-stream`` body and return the final ``ResponseResource``."""
    return check_sse_chunks([raw], validate_schemas=validate_schemas)


_MCP_PROGRESS_EVENTS = {f"response.{kind}.{step}": kind for kind in ("mcp_call", "mcp_list_tools")
                        for step in ("in_progress", "completed", "failed")}
"""OpenAI's progress events of its MCP items (a superset): each names an open item of its kind."""

_MCP_CALL_ENDS = ("completed", "incomplete", "failed")
"""OpenAI's ``mcp_call`` (a superset item) ends ``failed`` when the tool failed."""


def _check_identity(item: dict[str, Any], path: str) -> None:
    for name in ("id", "type", "status"):
        value = item.get(name)
        _require(isinstance(value, str) and value != "", f"{path}.{name}", f"every item must have a non-empty {name!r}")


def _without_logprobs(part: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in part.items() if key != "logprobs"}


def _difference(expected: Any, actual: Any, path: str = "") -> str:
    """A short description of the first place where ``actual`` departs from ``expected``."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(expected.keys() | actual.keys()):
            if expected.get(key, _MISSING) != actual.get(key, _MISSING):
                return _difference(expected.get(key, _MISSING), actual.get(key, _MISSING), f"{path}.{key}")
    if isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        for index, (left, right) in enumerate(zip(expected, actual, strict=False)):
            if left != right:
                return _difference(left, right, f"{path}[{index}]")
    return f"{path or 'value'} is {_clip(repr(actual))}, streamed {_clip(repr(expected))}"


class _Missing:
    def __repr__(self) -> str:
        return "<absent>"


_MISSING = _Missing()


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _require(condition: bool, path: str, message: str) -> None:
    if not condition:
        raise ConformanceError(f"{message} (at {path})", json_path=path)
