"""The builder's MCP items and events (``app.engine.mcp_items``), judged by the stream
checker with the MCP superset items and events (``tests.superset.mcp_spec``)."""

from __future__ import annotations

from app.backends.base import (
    Finish,
    McpApprovalRequestDelta,
    McpCallDelta,
    McpListToolsDelta,
    McpTool,
    TextDelta,
    Usage,
)
from app.errors import ModelError
from compliance import check_stream
from tests.engine.test_builder import _builder, _run, _wire
from tests.superset import mcp_spec

ADD = McpTool("add", "Add two integers.", {"type": "object"}, {"readOnlyHint": True})


def test_a_listing_a_call_and_an_answer() -> None:
    events = _run(_builder(), McpListToolsDelta("calc", (ADD,)),
                  McpCallDelta("calc", "add", '{"a":1}', running=True), McpCallDelta("calc", "add", '{"a":1}', "1"),
                  TextDelta("It is 1."), Finish("stop", Usage(9, 4)))
    assert [event["type"] for event in events][2:12] == [
        "response.output_item.added", "response.mcp_list_tools.in_progress", "response.mcp_list_tools.completed",
        "response.output_item.done", "response.output_item.added", "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done", "response.mcp_call.in_progress", "response.mcp_call.completed",
        "response.output_item.done"]
    assert events[2]["item"]["tools"] == [] and events[6]["item"]["arguments"] == ""
    final = check_stream([*events, "[DONE]"], spec=mcp_spec())
    listing, call, message = final["output"]
    assert listing["tools"] == [{"name": "add", "description": "Add two integers.", "input_schema": {"type": "object"},
                                 "annotations": {"readOnlyHint": True}}]
    assert (call["arguments"], call["output"], call["error"], call["status"]) == ('{"a":1}', "1", None, "completed")
    assert message["type"] == "message" and final["status"] == "completed"


def test_failures_and_an_approval_request() -> None:
    events = _run(_builder(), McpListToolsDelta("down", (), "the MCP server could not be reached"),
                  McpCallDelta("calc", "add", "{}", running=True), McpCallDelta("calc", "add", "{}", None, "boom"),
                  McpApprovalRequestDelta("mcpr_1", "calc", "add", "{}"), Finish("stop"))
    types = [event["type"] for event in events]
    assert "response.mcp_list_tools.failed" in types and "response.mcp_call.failed" in types
    final = check_stream([*events, "[DONE]"], spec=mcp_spec())
    listing, call, request = final["output"]
    assert listing["error"] == "the MCP server could not be reached" and call["status"] == "failed"
    assert request == {"type": "mcp_approval_request", "id": "mcpr_1", "server_label": "calc", "name": "add",
                       "arguments": "{}", "status": "completed"}


def test_a_call_open_when_the_response_is_cancelled_or_fails_ends_incomplete() -> None:
    builder = _builder()
    events = _run(builder, McpCallDelta("calc", "add", "{}", running=True)) + _wire(builder.cancel())
    final = check_stream([*events, "[DONE]"], spec=mcp_spec())
    assert final["output"][0]["status"] == "incomplete"
    builder = _builder()
    events = _run(builder, McpCallDelta("calc", "add", "{}", running=True))
    events += _wire(builder.fail(ModelError("gone")))
    final = check_stream([*events, "[DONE]"], spec=mcp_spec())
    assert final["status"] == "failed"
