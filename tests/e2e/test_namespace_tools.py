"""Namespace tools (OpenAI's ``{"type": "namespace", "tools": [...]}``, which Codex sends
for its sub-agent tools) end to end over HTTP: the model sees each function under its
flat name ``namespace__name``; a call comes back as a ``function_call`` with the
function's own ``name`` and the ``namespace``, the shape Codex reads; the tool loop and
the replay gate hold such calls to the namespace's schemas. The scripted model (named as
such) shows what the model was offered; SmolLM2 makes a real call under a grammar."""

from __future__ import annotations

import json
from typing import Any

from tests.client import Client
from tests.conftest import SMOL

SPAWN = {
    "type": "function",
    "name": "spawn_agent",
    "description": "Start a sub-agent on a task.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {"message": {"type": "string"}},
        "required": ["message"],
        "additionalProperties": False,
    },
}
WAIT = {
    "type": "function",
    "name": "wait_agent",
    "description": "Wait for a sub-agent to finish.",
    "strict": False,
    "parameters": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
}
AGENTS = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for spawning and managing sub-agents.",
    "tools": [SPAWN, WAIT],
}
SHELL = {
    "type": "function",
    "name": "shell",
    "description": "Run a command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}


def _calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in response["output"] if item["type"] == "function_call"]


def test_the_model_sees_flat_names_and_the_call_comes_back_namespaced(client: Client, scripted) -> None:  # type: ignore[no-untyped-def]
    response = client.create(model="scripted-namespaced-tool", input="Delegate: list the files.",
                             tools=[SHELL, AGENTS, {"type": "web_search"}])

    offered = scripted.requests[-1].tools
    assert [tool.name for tool in offered] == ["shell", "multi_agent_v1__spawn_agent", "multi_agent_v1__wait_agent"]
    assert offered[1].description.startswith("Tools for spawning and managing sub-agents.")
    assert offered[1].description.endswith("Start a sub-agent on a task.")
    [call] = _calls(response)
    assert (call["name"], call["namespace"], call["status"]) == ("spawn_agent", "multi_agent_v1", "completed")
    assert json.loads(call["arguments"]) == {"message": "list files"}
    echoed = [(tool["name"], tool.get("namespace")) for tool in response["tools"]]
    assert echoed == [("shell", None), ("spawn_agent", "multi_agent_v1"), ("wait_agent", "multi_agent_v1")]
    assert "namespace" not in response["tools"][0]  # plain functions stay as the spec has them


def test_a_streamed_namespaced_call_carries_its_namespace_in_every_item_event(client: Client) -> None:
    result = client.stream(model="scripted-namespaced-tool", input="Delegate.", tools=[AGENTS])
    items = [event["item"] for event in result.events if event["type"].startswith("response.output_item.")]
    assert [(item["status"], item["name"], item["namespace"]) for item in items] == [
        ("in_progress", "spawn_agent", "multi_agent_v1"),
        ("completed", "spawn_agent", "multi_agent_v1"),
    ]
    assert _calls(result.final)[0]["namespace"] == "multi_agent_v1"


def test_the_tool_loop_answers_a_namespaced_call(client: Client, scripted) -> None:  # type: ignore[no-untyped-def]
    first = client.create(model="scripted-namespaced-tool", input="Delegate.", tools=[AGENTS])
    call = _calls(first)[0]
    answer = {"type": "function_call_output", "call_id": call["call_id"], "output": '{"id": "agent-1"}'}

    by_chain = client.create(model="scripted-text", previous_response_id=first["id"], input=[answer],
                             tools=[AGENTS])
    assert by_chain["status"] == "completed"
    replayed = scripted.requests[-1].messages[-2].tool_calls[0]
    assert (replayed.name, replayed.call_id) == ("multi_agent_v1__spawn_agent", call["call_id"])

    # Codex's way: the whole history resent, the call as it came back (namespace included).
    resent = client.create(model="scripted-text", store=False, tools=[AGENTS],
                           input=[{"role": "user", "content": "Delegate."}, call, answer])
    assert resent["status"] == "completed"
    assert scripted.requests[-1].messages[-2].tool_calls[0].name == "multi_agent_v1__spawn_agent"
    listed = client.http.get(f"/v1/responses/{first['id']}/input_items").json()
    assert listed["data"][0]["type"] == "message"


def test_the_gate_holds_a_namespaced_call_to_its_namespace_schema(client: Client, scripted) -> None:  # type: ignore[no-untyped-def]
    before = len(scripted.requests)
    call = {"type": "function_call", "call_id": "call_ns1", "name": "spawn_agent", "namespace": "multi_agent_v1",
            "arguments": json.dumps({"message": "go", "extra": 1}), "status": "completed"}
    error = client.error({"model": "scripted-text", "tools": [AGENTS], "input": [
        {"role": "user", "content": "Delegate."}, call,
        {"type": "function_call_output", "call_id": "call_ns1", "output": "{}"},
    ]}, 400)
    assert (error["code"], error["param"]) == ("arguments_schema", "input[2]")

    # The same function name outside the namespace is another tool, which nothing defines.
    plain = {**call, "arguments": json.dumps({"message": "go"})}
    del plain["namespace"]
    strict_answer = {"type": "function_call_output", "call_id": "call_ns1", "output": "{}"}
    accepted = client.create(model="scripted-text", tools=[AGENTS], store=False,
                             input=[{"role": "user", "content": "Delegate."}, plain, strict_answer])
    assert accepted["status"] == "completed"  # unknown tools are accepted and logged by default
    assert scripted.requests[-1].messages[-2].tool_calls[0].name == "spawn_agent"
    assert len(scripted.requests) == before + 1


def test_a_namespace_function_with_a_broken_schema_is_named_by_its_path(client: Client) -> None:
    broken = {**AGENTS, "tools": [SPAWN, {**WAIT, "parameters": {"type": "object", "pattern": "(?=x)"}}]}
    error = client.error({"model": "scripted-text", "input": "hi", "tools": [SHELL, broken]}, 400)
    assert error["param"] == "tools[1].tools[1].parameters"


def test_a_malformed_namespace_tool_is_a_precise_400(client: Client) -> None:
    empty = client.error({"model": "scripted-text", "input": "hi", "tools": [{**AGENTS, "tools": []}]}, 400)
    assert empty["param"].startswith("tools[0].tools")
    nameless = {key: value for key, value in AGENTS.items() if key != "name"}
    error = client.error({"model": "scripted-text", "input": "hi", "tools": [nameless]}, 400)
    assert error["param"].startswith("tools[0]")


def test_the_embedded_model_calls_a_namespaced_function(client: Client) -> None:
    """SmolLM2 under the grammar of ``tool_choice: required``: the flat name it writes
    comes back split into ``name`` and ``namespace``."""
    mode = {"type": "function", "name": "set_mode", "description": "Set how sub-agents run.",
            "parameters": {"type": "object", "properties": {"mode": {"type": "string", "enum": ["fast", "careful"]}},
                           "required": ["mode"], "additionalProperties": False}}
    agents = {**AGENTS, "tools": [SPAWN, mode]}
    response = client.create(model=SMOL, input="Make the helpers careful.", tools=[agents],
                             tool_choice={"type": "function", "name": "multi_agent_v1__set_mode"},
                             max_output_tokens=64, temperature=0)
    [call] = _calls(response)
    assert (call["name"], call["namespace"], call["status"]) == ("set_mode", "multi_agent_v1", "completed")
    assert json.loads(call["arguments"])["mode"] in ("fast", "careful")
