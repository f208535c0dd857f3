"""Remote MCP tools (``{"type": "mcp"}``) end to end: a real MCP server (the SDK's
``MCPServer``, ``tests.mcp_server``, over streamable HTTP and SSE) and the real ors
server. Scripted models (named as such) call the MCP tools deterministically; every
response and event is judged by the vendored spec with the MCP items added
(``tests.superset``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.backends.base import Delta, Finish, GenerationRequest, TextDelta, ToolCallDelta, Usage
from app.backends.local import LocalBackend
from app.backends.scripted import ScriptedBackend
from app.config import Settings
from app.main import create_app
from compliance import StreamChecker
from tests.client import Client, output_text
from tests.conftest import QWEN
from tests.e2e.test_websocket import Socket
from tests.live import LiveServer
from tests.mcp_server import McpServers
from tests.superset import mcp_spec

SECRET = "s3cr3t-token-of-the-test"


def caller(request: GenerationRequest) -> list[Delta]:
    """Answers a tool message with its text; else calls what the last user message
    names (``call NAME ARGS``, several joined by `` ; ``), or says it has nothing to do."""
    last = request.messages[-1]
    if last.role == "tool":
        return [TextDelta(f"The tool said: {last.content}"), Finish("stop", Usage(5, 3))]
    said = next(m.content for m in reversed(request.messages) if m.role == "user")
    assert isinstance(said, str)
    if not said.startswith("call "):
        return [TextDelta("Nothing to call."), Finish("stop", Usage(3, 2))]
    calls: list[Delta] = []
    for index, part in enumerate(said.split(" ; ")):
        _, name, arguments = part.split(" ", 2)
        calls.append(ToolCallDelta(index, name=name, arguments=arguments))
    return [*calls, Finish("tool_calls", Usage(7, 5))]


def looper(request: GenerationRequest) -> list[Delta]:
    """Calls ``calc__add`` again after every result."""
    return [ToolCallDelta(0, name="calc__add", arguments='{"a": 1, "b": 1}'), Finish("tool_calls")]


SCRIPTED = ScriptedBackend({"scripted-mcp-text": ["Hello."], "scripted-mcp-caller": caller,
                            "scripted-mcp-looper": looper})


@pytest.fixture(scope="module")
def mcp_servers() -> Iterator[McpServers]:
    servers = McpServers().start()
    yield servers
    servers.stop()


def _serve(data: Path, **settings: Any) -> LiveServer:
    return LiveServer(create_app(Settings(data_dir=data, default_model="scripted-mcp-text", **settings),
                                 backends=[SCRIPTED])).start()


@pytest.fixture(scope="module")
def closed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = _serve(tmp_path_factory.mktemp("mcp-off"))
    yield server
    server.stop()


def _tool(url: str, **more: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "calc", "server_url": url, **more}


# ---------------------------------------------------------------- no open relay


def test_mcp_is_off_by_default_and_the_error_names_the_setting(closed_server: LiveServer,
                                                               mcp_servers: McpServers) -> None:
    with Client(closed_server.url) as client:
        error = client.error({"input": "hi", "tools": [{"type": "function", "name": "f"},
                                                       _tool(mcp_servers.http_url)]}, 400)
    assert error["param"] == "tools[1]"
    assert "ORS_MCP_ALLOWED_URLS" in error["message"]


@pytest.mark.parametrize(("allowed", "url"), [
    ("https://mcp.example.com/tools", "https://mcp.example.com/toolsets/x"),  # a segment boundary
    ("https://mcp.example.com/tools", "http://mcp.example.com/tools"),  # the scheme
    ("https://mcp.example.com/tools", "https://mcp.example.com:8443/tools"),  # the port
    ("mcp.example.com:8000", "http://mcp.example.com:8001/mcp"),
    ("mcp.example.com", "http://127.0.0.1/mcp"),  # loopback only when listed
    ("mcp.example.com", "http://mcp.example.com.evil.test/mcp"),
])
def test_a_url_not_listed_is_refused_naming_its_param(tmp_path: Path, allowed: str, url: str) -> None:
    server = _serve(tmp_path, mcp_allowed_urls=allowed)
    try:
        with Client(server.url) as client:
            error = client.error({"input": "hi", "tools": [_tool(url)]}, 400)
    finally:
        server.stop()
    assert (error["param"], error["code"]) == ("tools[0].server_url", "mcp_url_not_allowed")


def test_a_url_with_credentials_is_refused(closed_server: LiveServer, tmp_path: Path) -> None:
    server = _serve(tmp_path, mcp_allowed_urls="mcp.example.com")
    try:
        with Client(server.url) as client:
            error = client.error({"input": "hi", "tools": [_tool("http://user:pw@mcp.example.com/mcp")]}, 400)
    finally:
        server.stop()
    assert error["param"] == "tools[0].server_url"


# ---------------------------------------------------------------- calls run here


@pytest.fixture(scope="module")
def mcp_server(tmp_path_factory: pytest.TempPathFactory, mcp_servers: McpServers) -> Iterator[LiveServer]:
    server = _serve(tmp_path_factory.mktemp("mcp-on"), mcp_allowed_urls="127.0.0.1", mcp_max_calls=3,
                    mcp_max_output_bytes=256)
    yield server
    server.stop()


@pytest.fixture()
def client(mcp_server: LiveServer) -> Iterator[Client]:
    with Client(mcp_server.url, spec=mcp_spec()) as client:
        yield client


def _of(response: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [item for item in response["output"] if item["type"] == kind]


@pytest.mark.parametrize("transport", ["http", "sse"])
def test_a_call_is_run_and_its_output_given_back_to_the_model(client: Client, mcp_servers: McpServers,
                                                              transport: str) -> None:
    url = mcp_servers.http_url if transport == "http" else mcp_servers.sse_url
    response = client.create(model="scripted-mcp-caller", input='call calc__add {"a": 2, "b": 3}',
                             tools=[_tool(url, require_approval="never")])
    listing, call, message = response["output"]
    assert listing["type"] == "mcp_list_tools" and listing["server_label"] == "calc"
    assert {tool["name"] for tool in listing["tools"]} == {"add", "lookup", "repeat", "slow", "broken"}
    add = next(tool for tool in listing["tools"] if tool["name"] == "add")
    assert add["input_schema"]["properties"].keys() == {"a", "b"}
    assert (call["type"], call["name"], call["arguments"], call["output"], call["error"], call["status"]) == (
        "mcp_call", "add", '{"a": 2, "b": 3}', "5", None, "completed")
    assert output_text(response) == "The tool said: 5"
    first, second = SCRIPTED.requests[-2:]
    assert "calc__add" in {tool.name for tool in first.tools}
    assert second.messages[-1].role == "tool" and second.messages[-1].content == "5"
    assert second.messages[-2].tool_calls[0].name == "calc__add"
    assert response["usage"]["output_tokens"] == 8  # both rounds


def test_the_stream_carries_the_items_in_order(client: Client, mcp_servers: McpServers) -> None:
    result = client.stream(model="scripted-mcp-caller", input='call calc__lookup {"word": "ors"}',
                           tools=[_tool(mcp_servers.http_url, require_approval="never")])
    added = [event["item"]["type"] for event in result.events if event["type"] == "response.output_item.added"]
    assert added == ["mcp_list_tools", "mcp_call", "message"]
    types = result.types()
    listing = types[types.index("response.output_item.added"):types.index("response.output_item.done") + 1]
    assert listing == ["response.output_item.added", "response.mcp_list_tools.in_progress",
                       "response.mcp_list_tools.completed", "response.output_item.done"]
    start = types.index("response.mcp_call_arguments.delta") - 1
    assert types[start:start + 7] == [
        "response.output_item.added", "response.mcp_call_arguments.delta", "response.mcp_call_arguments.done",
        "response.mcp_call.in_progress", "response.mcp_call.completed", "response.output_item.done",
        "response.output_item.added"]
    arguments = next(event for event in result.events if event["type"] == "response.mcp_call_arguments.done")
    assert arguments["arguments"] == '{"word": "ors"}'
    call = _of(result.final, "mcp_call")[0]
    assert call["output"] == "an Open Responses server"
    assert result.types()[-1] == "response.completed"


def test_the_items_and_their_events_over_websocket(mcp_server: LiveServer, mcp_servers: McpServers) -> None:
    socket = Socket(mcp_server.url.replace("http://", "ws://") + "/v1/responses")
    try:
        socket.send(model="scripted-mcp-caller", input='call calc__add {"a": 3, "b": 4}',
                    tools=[_tool(mcp_servers.sse_url, require_approval="never")])
        checker = StreamChecker(transport="websocket", spec=mcp_spec())
        types: list[str] = []
        while not checker.final_response:
            event = json.loads(socket.ws.recv(timeout=60))
            types.append(event["type"])
            checker.feed(event)
        final = checker.finish()
    finally:
        socket.close()
    assert [item["type"] for item in final["output"]] == ["mcp_list_tools", "mcp_call", "message"]
    assert "response.mcp_call.completed" in types and _of(final, "mcp_call")[0]["output"] == "7"


def test_a_failing_tool_is_a_failed_call_and_the_model_still_answers(client: Client,
                                                                      mcp_servers: McpServers) -> None:
    response = client.create(model="scripted-mcp-caller", input="call calc__broken {}",
                             tools=[_tool(mcp_servers.http_url, require_approval="never")])
    [call] = _of(response, "mcp_call")
    assert call["status"] == "failed" and call["output"] is None and "broken" in call["error"]
    assert output_text(response).startswith("The tool said: The MCP tool call failed")
    streamed = client.stream(model="scripted-mcp-caller", input="call calc__broken {}",
                             tools=[_tool(mcp_servers.sse_url, require_approval="never")])
    assert "response.mcp_call.failed" in streamed.types() and "response.mcp_call.completed" not in streamed.types()
    assert _of(streamed.final, "mcp_call")[0]["status"] == "failed"
    assert streamed.final["status"] == "completed"


def test_allowed_tools_filters_what_the_model_sees(client: Client, mcp_servers: McpServers) -> None:
    client.create(model="scripted-mcp-caller", input="hello",
                  tools=[_tool(mcp_servers.http_url, allowed_tools=["lookup"])])
    assert [tool.name for tool in SCRIPTED.requests[-1].tools] == ["calc__lookup"]
    client.create(model="scripted-mcp-caller", input="hello",
                  tools=[_tool(mcp_servers.http_url, allowed_tools={"tool_names": ["add"]})])
    assert [tool.name for tool in SCRIPTED.requests[-1].tools] == ["calc__add"]


def test_a_tool_choice_of_an_mcp_server_requires_its_tools_for_the_first_round(client: Client,
                                                                              mcp_servers: McpServers) -> None:
    tools = [{"type": "function", "name": "local", "parameters": {"type": "object"}},
             _tool(mcp_servers.http_url, require_approval="never")]
    response = client.create(model="scripted-mcp-caller", input='call calc__add {"a": 1, "b": 1}', tools=tools,
                             tool_choice={"type": "mcp", "server_label": "calc", "name": "add"})
    assert response["tool_choice"] == "required"  # the spec's echo has no MCP choice
    first, second = SCRIPTED.requests[-2:]
    assert (first.tool_policy.mode, first.tool_policy.allowed) == ("required", ("calc__add",))
    assert second.tool_policy.mode == "auto"
    client.create(model="scripted-mcp-caller", input='call calc__lookup {"word": "mcp"}', tools=tools,
                  tool_choice={"type": "mcp", "server_label": "calc"})
    assert set(SCRIPTED.requests[-2].tool_policy.allowed or ()) == {
        "calc__add", "calc__lookup", "calc__repeat", "calc__slow", "calc__broken"}
    error = client.error({"model": "scripted-mcp-caller", "input": "hi", "tools": tools,
                          "tool_choice": {"type": "mcp", "server_label": "other"}}, 400)
    assert error["param"] == "tool_choice.server_label"


def test_a_listing_is_reused_across_a_chain(client: Client, mcp_servers: McpServers) -> None:
    tools = [_tool(mcp_servers.http_url, require_approval="never")]
    first = client.create(model="scripted-mcp-caller", input="hello", tools=tools)
    assert len(_of(first, "mcp_list_tools")) == 1
    lists = mcp_servers.lists()
    second = client.create(model="scripted-mcp-caller", input="hello again", tools=tools,
                           previous_response_id=first["id"])
    assert _of(second, "mcp_list_tools") == [] and mcp_servers.lists() == lists  # the server was not asked
    assert "calc__add" in {tool.name for tool in SCRIPTED.requests[-1].tools}  # the tools were offered all the same
    third = client.create(model="scripted-mcp-caller", input='call calc__add {"a": 1, "b": 2}', tools=tools,
                          previous_response_id=second["id"])
    assert _of(third, "mcp_list_tools") == [] and _of(third, "mcp_call")[0]["output"] == "3"
    fourth = client.create(model="scripted-mcp-caller", input="hello", tools=tools, previous_response_id=third["id"])
    assert output_text(fourth) == "Nothing to call."
    replayed = [call for message in SCRIPTED.requests[-1].messages for call in message.tool_calls]
    assert [call.name for call in replayed] == ["calc__add"]  # the call is in the model's context


def test_approval_by_default_then_approved_then_run(client: Client, mcp_servers: McpServers) -> None:
    tools = [_tool(mcp_servers.http_url)]  # require_approval defaults to "always"
    calls = mcp_servers.http.methods["tools/call"]
    streamed = client.stream(model="scripted-mcp-caller", input='call calc__add {"a": 20, "b": 22}', tools=tools)
    first = streamed.final
    [request] = _of(first, "mcp_approval_request")
    assert first["status"] == "completed" and first["output"][-1]["type"] == "mcp_approval_request"
    assert (request["name"], request["arguments"]) == ("add", '{"a": 20, "b": 22}')
    assert _of(first, "mcp_call") == [] and mcp_servers.http.methods["tools/call"] == calls
    second = client.create(model="scripted-mcp-caller", tools=tools, previous_response_id=first["id"],
                           input=[{"type": "mcp_approval_response", "approval_request_id": request["id"],
                                   "approve": True}])
    [call] = _of(second, "mcp_call")
    assert (call["output"], call["approval_request_id"]) == ("42", request["id"])
    assert output_text(second) == "The tool said: 42"


def test_a_refusal_is_told_to_the_model(client: Client, mcp_servers: McpServers) -> None:
    tools = [_tool(mcp_servers.http_url, require_approval={"never": {"tool_names": ["lookup"]}})]
    first = client.create(model="scripted-mcp-caller", input='call calc__add {"a": 1, "b": 1}', tools=tools)
    [request] = _of(first, "mcp_approval_request")
    second = client.create(model="scripted-mcp-caller", tools=tools, previous_response_id=first["id"],
                           input=[{"type": "mcp_approval_response", "approval_request_id": request["id"],
                                   "approve": False, "reason": "not today"}])
    assert _of(second, "mcp_call") == []
    assert output_text(second) == "The tool said: The user refused this call: not today"


def test_an_unknown_approval_is_refused_with_its_param(client: Client, mcp_servers: McpServers) -> None:
    error = client.error({"model": "scripted-mcp-caller", "tools": [_tool(mcp_servers.http_url)],
                          "input": [{"role": "user", "content": "hi"},
                                    {"type": "mcp_approval_response", "approval_request_id": "mcpr_nope",
                                     "approve": True}]}, 400)
    assert error["param"] == "input[1].approval_request_id"


def test_calls_stop_at_the_budget(client: Client, mcp_servers: McpServers) -> None:
    response = client.create(model="scripted-mcp-looper", input="loop",
                             tools=[_tool(mcp_servers.http_url, require_approval="never")])
    assert len(_of(response, "mcp_call")) == 3  # mcp_max_calls
    assert response["status"] == "completed"


def test_a_long_output_is_cut_with_a_note(client: Client, mcp_servers: McpServers) -> None:
    response = client.create(model="scripted-mcp-caller", input='call calc__repeat {"word": "ab", "times": 500}',
                             tools=[_tool(mcp_servers.http_url, require_approval="never")])
    [call] = _of(response, "mcp_call")
    assert call["output"].startswith("ab" * 128) and "ab" * 129 not in call["output"]  # mcp_max_output_bytes
    assert "[output cut: 744 more bytes past the limit of 256]" in call["output"]
    assert SCRIPTED.requests[-1].messages[-1].content == call["output"]


def test_a_call_past_its_time_fails_and_the_model_still_answers(tmp_path: Path, mcp_servers: McpServers) -> None:
    server = _serve(tmp_path, mcp_allowed_urls="127.0.0.1", mcp_call_seconds=1)
    try:
        with Client(server.url, spec=mcp_spec()) as client:
            response = client.create(model="scripted-mcp-caller", input='call calc__slow {"seconds": 4}',
                                     tools=[_tool(mcp_servers.http_url, require_approval="never")])
    finally:
        server.stop()
    [call] = _of(response, "mcp_call")
    assert call["status"] == "failed" and call["error"] == "the MCP server did not answer within 1 s"
    assert output_text(response).startswith("The tool said: The MCP tool call failed")


def test_an_unreachable_server_is_a_failed_listing(client: Client) -> None:
    response = client.create(model="scripted-mcp-caller", input="hello",
                             tools=[_tool("http://127.0.0.1:9/mcp", require_approval="never")])
    [listing] = _of(response, "mcp_list_tools")
    assert listing["tools"] == [] and "could not be reached" in listing["error"]
    assert output_text(response) == "Nothing to call."
    streamed = client.stream(model="scripted-mcp-caller", input="hello",
                             tools=[_tool("http://127.0.0.1:9/mcp", require_approval="never")])
    assert "response.mcp_list_tools.failed" in streamed.types()


def test_secrets_go_to_the_server_only_never_stored_nor_logged(tmp_path: Path, mcp_servers: McpServers,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    server = _serve(tmp_path, mcp_allowed_urls=f"http://127.0.0.1:{mcp_servers.ports[0]}/mcp", log_level="debug")
    tool = _tool(mcp_servers.http_url, require_approval="never", authorization=SECRET,
                 headers={"X-Api-Key": f"key-{SECRET}"})
    try:
        with Client(server.url, spec=mcp_spec()) as client:
            first = client.stream(model="scripted-mcp-caller", input='call calc__add {"a": 2, "b": 2}', tools=[tool])
            assert _of(first.final, "mcp_call")[0]["output"] == "4"
            second = client.create(model="scripted-mcp-caller", input="hello", tools=[tool],
                                   previous_response_id=first.final["id"])
            kept = client.http.get(f"/v1/responses/{first.final['id']}").text
    finally:
        server.stop()
    assert SECRET not in first.raw.decode() and SECRET not in json.dumps(second) and SECRET not in kept
    sent = [headers for headers in mcp_servers.http.headers if headers.get("authorization") == f"Bearer {SECRET}"]
    assert sent and all(headers.get("x-api-key") == f"key-{SECRET}" for headers in sent)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path.name
    assert any(record.name.startswith("ors") for record in caplog.records)  # the server's log is seen
    assert SECRET not in caplog.text


# ---------------------------------------------------------------- a real model


def test_qwen_calls_the_real_servers_add_tool_through_ors(model_dir: Path, tmp_path: Path,
                                                         mcp_servers: McpServers) -> None:
    """Qwen, made to call the server's tool (``tool_choice`` of type ``mcp``, one call,
    temperature 0), with the MCP
    server's ``add`` the only tool it may see: ors lists it, Qwen calls it, ors runs the
    call on the real server and gives Qwen the sum, and Qwen answers in the same response."""
    settings = Settings(data_dir=tmp_path, default_model=QWEN, mcp_allowed_urls="127.0.0.1")
    server = LiveServer(create_app(settings, backends=[LocalBackend(model_dir, n_threads=2, models=[QWEN])])).start()
    calls = mcp_servers.http.methods["tools/call"]
    try:
        with Client(server.url, spec=mcp_spec()) as client:
            result = client.stream(model=QWEN, input="Use the add tool to add 17 and 25.", temperature=0,
                                   max_output_tokens=256, parallel_tool_calls=False,
                                   tool_choice={"type": "mcp", "server_label": "calc", "name": "add"},
                                   tools=[_tool(mcp_servers.http_url, allowed_tools=["add"],
                                                require_approval="never")])
    finally:
        server.stop()
    final = result.final
    [listing] = _of(final, "mcp_list_tools")
    assert {tool["name"] for tool in listing["tools"]} == {"add", "lookup", "repeat", "slow", "broken"}
    call = _of(final, "mcp_call")[0]
    assert (call["name"], call["status"], json.loads(call["arguments"])) == ("add", "completed", {"a": 17, "b": 25})
    assert call["output"] == "42" and mcp_servers.http.methods["tools/call"] > calls
    assert final["status"] == "completed" and final["output"][-1]["type"] == "message"


def test_items_sent_back_whole_work_as_a_chain_does(client: Client, mcp_servers: McpServers) -> None:
    tools = [_tool(mcp_servers.http_url)]
    asked = {"role": "user", "content": 'call calc__add {"a": 5, "b": 6}'}
    first = client.create(model="scripted-mcp-caller", input=[asked], tools=tools, store=False)
    [request] = _of(first, "mcp_approval_request")
    lists = mcp_servers.lists()
    answer = {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}
    second = client.create(model="scripted-mcp-caller", tools=tools, input=[asked, *first["output"], answer])
    assert _of(second, "mcp_list_tools") == []  # the listing sent back is reused
    assert mcp_servers.lists() - lists <= 1  # the SDK's own listing before a call, at most
    assert _of(second, "mcp_call")[0]["output"] == "11"
    listed = client.http.get(f"/v1/responses/{second['id']}/input_items", params={"order": "asc"}).json()["data"]
    assert [item["type"] for item in listed] == ["message", "mcp_list_tools", "mcp_approval_request",
                                                 "mcp_approval_response"]
    assert listed[-1]["id"].startswith("mcpa_") and listed[-1]["approve"] is True
