"""Tool names a strict upstream would refuse, end to end, against a scripted Chat
Completions server on loopback (named as such: it records what it is sent and answers a
call by the name it was offered, which no real server does on demand). A namespace
tool's flat name past 64 characters goes on the wire as 64 allowed characters; the call comes back to the client under the tool's own name (and
namespace); the next turn replays it under the wire name again."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.backends.tool_names import wire_name
from app.config import Settings
from app.main import create_app
from tests.client import Client
from tests.live import LiveServer
from tests.upstream_server import DONE, ScriptedUpstream, chunk, running_scripted_upstream, tool_call

NAMESPACE = "mcp__an_issue_tracker_with_a_rather_long_server_name"
FUNCTION = "create_issue_comment_reply_with_attachments"
FLAT = f"{NAMESPACE}__{FUNCTION}"
TRACKER = {
    "type": "namespace",
    "name": NAMESPACE,
    "description": "The issue tracker.",
    "tools": [{"type": "function", "name": FUNCTION, "description": "Reply to a comment.",
               "parameters": {"type": "object", "properties": {"body": {"type": "string"}}, "required": ["body"]}}],
}
SHELL = {"type": "function", "name": "shell", "description": "Run a command.",
         "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}
STRICT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with running_scripted_upstream() as scripted:
        yield scripted


@pytest.fixture(scope="module")
def front(upstream: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    data: Path = tmp_path_factory.mktemp("tool-names")
    server = LiveServer(create_app(Settings(data_dir=data, upstream_url=upstream.base_url), backends=[])).start()
    client = Client(server.url)
    yield client
    client.close()
    server.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_a_long_namespaced_call_goes_out_short_and_comes_back_whole(
        front: Client, upstream: ScriptedUpstream, stream: bool) -> None:
    wire = wire_name(FLAT)
    model = upstream.stream(
        chunk(tool_calls=[tool_call(0, id="call_1", name=wire, arguments='{"body": "Thanks!"}')]),
        chunk(finish_reason="tool_calls"),
        DONE,
    )
    body = {"model": model, "input": "Thank them.", "tools": [TRACKER, SHELL],
            "tool_choice": {"type": "function", "name": FLAT}}
    first = front.stream(**body).final if stream else front.create(**body)

    sent = upstream.requests_for(model)[-1].body
    names = [tool["function"]["name"] for tool in sent["tools"]]
    assert names == [wire, "shell"]
    assert all(STRICT_NAME.fullmatch(name) for name in names)
    assert sent["tool_choice"] == {"type": "function", "function": {"name": wire}}
    [call] = [item for item in first["output"] if item["type"] == "function_call"]
    assert (call["name"], call["namespace"]) == (FUNCTION, NAMESPACE)
    assert json.loads(call["arguments"]) == {"body": "Thanks!"}

    # the next turn replays the call under its wire name, and the gate held it to its schema
    after = upstream.stream(chunk(content="Replied.", finish_reason="stop"), DONE)
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
    second = front.create(model=after, previous_response_id=first["id"], input=[output], tools=[TRACKER, SHELL])
    assert second["status"] == "completed"
    replayed = [message for message in upstream.requests_for(after)[-1].body["messages"]
                if message.get("tool_calls")]
    assert replayed[-1]["tool_calls"][0]["function"]["name"] == wire
