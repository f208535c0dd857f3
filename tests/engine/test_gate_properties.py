"""The replay gate over random items, tools and schemas (hypothesis): whatever a client
sends, the gate answers with findings or one ``InvalidRequest``, never another exception,
and within its budget; and what it lets through never answers a call it cannot find.

The strategies build what clients send and what they get wrong: calls and outputs whose
``call_id`` matches or not, arguments that are JSON or not, statuses, messages, Chat
Completions shapes, other vendors' items, and tools whose ``parameters`` are random JSON
(valid schemas, invalid ones, huge patterns and nesting). Each example must be checked
well inside hypothesis's deadline (generous: seconds, where the gate takes milliseconds),
so a schema that makes it slow shows up as a failure with its example. 400 examples here,
``ORS_FUZZ_EXAMPLES`` (``make fuzz``: 5,000) otherwise."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.engine.gate import check_items, gate
from app.errors import InvalidRequest

NAMES = st.sampled_from(["get_weather", "lookup", "run", "x", "ns__tool"])
CALL_IDS = st.sampled_from(["call_1", "call_2", "call_3", "", "call_1 "])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)

SCHEMA_KEYWORDS = st.fixed_dictionaries({}, optional={
    "type": st.sampled_from(["object", "string", "integer", "array", "number", "boolean", "null", "nonsense", 3]),
    "properties": st.dictionaries(st.sampled_from(["city", "a", "b"]), st.deferred(lambda: SCHEMAS), max_size=3),
    "required": st.lists(st.sampled_from(["city", "a", "b", 7]), max_size=3),
    "additionalProperties": st.booleans() | st.deferred(lambda: SCHEMAS),
    "pattern": st.sampled_from(["^a+$", "(a+)+$", "[", "\\d{1,3}", "(?=x)"]),
    "maxLength": st.integers(min_value=-1, max_value=10**9),
    "enum": st.lists(JSON_VALUES, max_size=3),
    "$ref": st.sampled_from(["#/properties/a", "#/$defs/x", "http://elsewhere.example/s.json", "#"]),
    "items": st.deferred(lambda: SCHEMAS),
    "anyOf": st.lists(st.deferred(lambda: SCHEMAS), max_size=2),
})
SCHEMAS: st.SearchStrategy[Any] = st.one_of(SCHEMA_KEYWORDS, st.booleans(), JSON_VALUES)

TOOLS = st.lists(st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "function", "custom", "mcp", 4]), "name": NAMES | JSON_VALUES},
    optional={"parameters": SCHEMAS, "strict": st.booleans()},
), max_size=4)

ARGUMENTS = st.one_of(st.builds(json.dumps, st.dictionaries(st.sampled_from(["city", "a"]), JSON_VALUES, max_size=3)),
                      st.text(max_size=20), JSON_VALUES)
CALL = st.fixed_dictionaries(
    {"type": st.just("function_call"), "call_id": CALL_IDS, "name": NAMES, "arguments": ARGUMENTS},
    optional={"status": st.sampled_from(["completed", "in_progress", "incomplete", 5]), "id": st.text(max_size=6)})
OUTPUT = st.fixed_dictionaries(
    {"type": st.sampled_from(["function_call_output", "custom_tool_call_output", "tool_search_output"]),
     "call_id": CALL_IDS | JSON_VALUES},
    optional={"output": JSON_VALUES})
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "function", "system"]), "content": JSON_VALUES},
    optional={"type": st.just("message"), "tool_calls": JSON_VALUES})
OTHER = st.one_of(JSON_VALUES, st.fixed_dictionaries({"type": st.sampled_from(["acme:thing", "reasoning", "item_reference"])}))
ITEMS = st.lists(st.one_of(CALL, OUTPUT, MESSAGE, OTHER), max_size=8)


def _found(items: list[Any], history: list[Any], call_id: Any) -> bool:
    return any(isinstance(item, dict) and item.get("type") in ("function_call", "custom_tool_call", "tool_search_call")
               and item.get("call_id") == call_id for item in [*history, *items])


@settings(max_examples=int(os.environ.get("ORS_FUZZ_EXAMPLES", "400")), deadline=timedelta(seconds=5), database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(items=ITEMS | st.text(max_size=5) | st.none(), history=st.lists(st.one_of(CALL, OUTPUT, MESSAGE), max_size=4),
       tools=TOOLS, history_tools=TOOLS, unknown=st.sampled_from(["accept", "reject"]))
def test_the_gate_never_fails_and_never_lets_an_orphan_output_through(
        items: Any, history: list[Any], tools: list[Any], history_tools: list[Any], unknown: str) -> None:
    findings = check_items(items, history=history, tools=tools, history_tools=history_tools,
                           unknown_tool=unknown)  # type: ignore[arg-type]
    assert all(finding.param for finding in findings if not finding.ok)
    try:
        gate(items, history=history, tools=tools, history_tools=history_tools, unknown_tool=unknown)  # type: ignore[arg-type]
    except InvalidRequest as refused:
        assert refused.code and refused.param and refused.message
        return
    if isinstance(items, list):
        for index, item in enumerate(items):
            if isinstance(item, dict) and item.get("type") == "function_call_output":
                assert _found(items[:index], history, item.get("call_id")), (index, item)
