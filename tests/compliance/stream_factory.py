"""Hand-built, spec-conformant responses and event streams for the oracle's own tests."""

from __future__ import annotations

import copy
import json
from typing import Any

CREATED_AT = 1764967971


def make_response(**overrides: Any) -> dict[str, Any]:
    """A schema-valid ``ResponseResource`` with all 31 required fields, status ``in_progress``."""
    response = {
        "id": "resp_test",
        "object": "response",
        "created_at": CREATED_AT,
        "completed_at": None,
        "status": "in_progress",
        "incomplete_details": None,
        "model": "test-model",
        "previous_response_id": None,
        "instructions": None,
        "output": [],
        "error": None,
        "tools": [],
        "tool_choice": "auto",
        "truncation": "disabled",
        "parallel_tool_calls": True,
        "text": {"format": {"type": "text"}},
        "top_p": 1,
        "presence_penalty": 0,
        "frequency_penalty": 0,
        "top_logprobs": 0,
        "temperature": 1,
        "reasoning": None,
        "usage": None,
        "max_output_tokens": None,
        "max_tool_calls": None,
        "store": True,
        "background": False,
        "service_tier": "default",
        "metadata": {},
        "safety_identifier": None,
        "prompt_cache_key": None,
    }
    response.update(overrides)
    return response


def make_usage(input_tokens: int = 5, output_tokens: int = 7) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }


class StreamBuilder:
    """Emits a conformant event sequence; each helper appends events and returns the final item."""

    def __init__(self, *, start: int = 0, created_status: str = "in_progress") -> None:
        self.events: list[dict[str, Any]] = []
        self.items: list[dict[str, Any]] = []
        self._next_sequence_number = start
        self.emit("response.created", response=make_response(status=created_status))
        if created_status == "queued":
            self.emit("response.queued", response=make_response(status="queued"))
        self.emit("response.in_progress", response=make_response())

    def emit(self, event_type: str, **fields: Any) -> dict[str, Any]:
        event = {"type": event_type, "sequence_number": self._next_sequence_number, **copy.deepcopy(fields)}
        self._next_sequence_number += 1
        self.events.append(event)
        return event

    def message(self, chunks: list[str], *, item_id: str = "msg_1", status: str = "completed",
                kind: str = "output_text") -> dict[str, Any]:
        index = len(self.items)
        key = "refusal" if kind == "refusal" else "text"
        delta_event = "response.refusal.delta" if kind == "refusal" else "response.output_text.delta"
        done_event = "response.refusal.done" if kind == "refusal" else "response.output_text.done"
        item = {"id": item_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}
        self.emit("response.output_item.added", output_index=index, item=item)
        part = {"type": kind, key: ""}
        if kind == "output_text":
            part["annotations"] = []
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        self.emit("response.content_part.added", **where, part=part)
        for chunk in chunks:
            self.emit(delta_event, **where, delta=chunk)
        full = "".join(chunks)
        self.emit(done_event, **where, **{key: full})
        part = {**part, key: full}
        self.emit("response.content_part.done", **where, part=part)
        return self._finish_item(index, {**item, "status": status, "content": [part]})

    def function_call(self, chunks: list[str], *, item_id: str = "fc_1", call_id: str = "call_1",
                      name: str = "get_weather") -> dict[str, Any]:
        index = len(self.items)
        item = {"id": item_id, "type": "function_call", "status": "in_progress", "call_id": call_id,
                "name": name, "arguments": ""}
        self.emit("response.output_item.added", output_index=index, item=item)
        for chunk in chunks:
            self.emit("response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=chunk)
        arguments = "".join(chunks)
        self.emit("response.function_call_arguments.done", item_id=item_id, output_index=index, arguments=arguments)
        return self._finish_item(index, {**item, "status": "completed", "arguments": arguments})

    def reasoning(self, summary_chunks: list[str], content_chunks: list[str], *,
                  item_id: str = "rs_1") -> dict[str, Any]:
        index = len(self.items)
        item = {"id": item_id, "type": "reasoning", "status": "in_progress", "summary": []}
        self.emit("response.output_item.added", output_index=index, item=item)
        where = {"item_id": item_id, "output_index": index}
        summary_part = {"type": "summary_text", "text": ""}
        self.emit("response.reasoning_summary_part.added", **where, summary_index=0, part=summary_part)
        for chunk in summary_chunks:
            self.emit("response.reasoning_summary_text.delta", **where, summary_index=0, delta=chunk)
        summary_part = {**summary_part, "text": "".join(summary_chunks)}
        self.emit("response.reasoning_summary_text.done", **where, summary_index=0, text=summary_part["text"])
        self.emit("response.reasoning_summary_part.done", **where, summary_index=0, part=summary_part)
        content_part = {"type": "reasoning_text", "text": ""}
        self.emit("response.content_part.added", **where, content_index=0, part=content_part)
        for chunk in content_chunks:
            self.emit("response.reasoning.delta", **where, content_index=0, delta=chunk)
        content_part = {**content_part, "text": "".join(content_chunks)}
        self.emit("response.reasoning.done", **where, content_index=0, text=content_part["text"])
        self.emit("response.content_part.done", **where, content_index=0, part=content_part)
        return self._finish_item(index, {**item, "status": "completed", "summary": [summary_part],
                                         "content": [content_part]})

    def compaction(self, encrypted_content: str = "ors1.sealed", *, item_id: str = "cmp_1") -> dict[str, Any]:
        index = len(self.items)
        item = {"id": item_id, "type": "compaction", "status": "in_progress", "encrypted_content": ""}
        self.emit("response.output_item.added", output_index=index, item=item)
        return self._finish_item(index, {**item, "status": "completed", "encrypted_content": encrypted_content})

    def tool_search(self, arguments: dict[str, Any], tools: list[dict[str, Any]] | None = None, *,
                    call_id: str | None = "call_s1") -> list[dict[str, Any]]:
        """A ``tool_search_call`` and, unless ``tools`` is ``None``, its ``tool_search_output``."""
        index = len(self.items)
        call = {"id": f"tsc_{index}", "type": "tool_search_call", "status": "in_progress", "call_id": call_id,
                "arguments": {}, "execution": "server"}
        self.emit("response.output_item.added", output_index=index, item=call)
        made = [self._finish_item(index, {**call, "status": "completed", "arguments": arguments})]
        if tools is not None:
            output = {"id": f"tso_{index + 1}", "type": "tool_search_output", "status": "in_progress",
                      "call_id": call_id, "execution": "server", "tools": []}
            self.emit("response.output_item.added", output_index=index + 1, item=output)
            made.append(self._finish_item(index + 1, {**output, "status": "completed", "tools": tools}))
        return made

    def completed(self) -> dict[str, Any]:
        return self.emit("response.completed", response=make_response(
            status="completed", completed_at=CREATED_AT + 1, output=self.items, usage=make_usage()))

    def incomplete(self, reason: str = "max_output_tokens") -> dict[str, Any]:
        return self.emit("response.incomplete", response=make_response(
            status="incomplete", incomplete_details={"reason": reason}, output=self.items, usage=make_usage()))

    def failed(self, code: str = "server_error", message: str = "the model failed") -> dict[str, Any]:
        return self.emit("response.failed", response=make_response(
            status="failed", error={"code": code, "message": message}, output=self.items))

    def error(self, code: str | None = "server_error", message: str = "the model failed") -> dict[str, Any]:
        return self.emit("error", error={"type": "server_error", "code": code, "message": message, "param": None})

    def _finish_item(self, index: int, item: dict[str, Any]) -> dict[str, Any]:
        self.emit("response.output_item.done", output_index=index, item=item)
        self.items.append(copy.deepcopy(item))
        return item


def to_sse(events: list[dict[str, Any]], *, done: bool = True, newline: str = "\n") -> bytes:
    """Frame events as a ``text/event-stream`` body: one ``event:`` and one ``data:`` line each."""
    blocks = [f"event: {event['type']}{newline}data: {json.dumps(event)}{newline}{newline}" for event in events]
    if done:
        blocks.append(f"data: [DONE]{newline}{newline}")
    return "".join(blocks).encode("utf-8")
