"""The replay gate: one test per reason, precedence, params, history, and the schema engine."""

from __future__ import annotations

import http.server
import json
import threading
from typing import Any

import pytest

from app.engine.gate import Reason, check_items, gate, is_namespaced
from app.errors import InvalidRequest

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city"],
        "additionalProperties": False,
    },
}
TOOLS = [WEATHER]


def user(text: str = "What's the weather in Paris?") -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def call(call_id: str = "call_1", *, name: str = "get_weather", arguments: Any = '{"city": "Paris"}',
         **fields: Any) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments, **fields}


def output(call_id: str = "call_1", text: str = "18C, sunny") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def rejection(items: list[Any], **context: Any) -> InvalidRequest:
    context.setdefault("tools", TOOLS)
    with pytest.raises(InvalidRequest) as caught:
        gate(items, **context)
    return caught.value


# ---------------------------------------------------------------- passes


def test_a_completed_call_with_matching_arguments_passes() -> None:
    items = [user(), call(status="completed"), output()]
    gate(items, tools=TOOLS)
    findings = check_items(items, tools=TOOLS)
    assert [(f.param, f.kind, f.reason) for f in findings] == [
        ("input[1]", "function_call", "ok"),
        ("input[2]", "function_call_output", "ok"),
    ]
    assert all(f.ok and f.message == "" for f in findings)


def test_a_call_without_status_is_accepted() -> None:
    gate([call(), output()], tools=TOOLS)


def test_nothing_to_check() -> None:
    gate("just a string", tools=TOOLS)
    gate(None)
    gate([user(), {"type": "reasoning", "summary": []}])
    assert check_items([user()]) == []


# ---------------------------------------------------------------- one test per reason


def test_call_id_that_matches_nothing() -> None:
    error = rejection([user(), call("call_1"), output("call_nope")])
    assert (error.code, error.param, error.status) == ("call_id", "input[2]", 400)
    assert "call_nope" in error.message and "previous_response_id" in error.message


def test_call_id_missing_or_not_a_string() -> None:
    missing = rejection([{"type": "function_call_output", "output": "x"}])
    assert (missing.code, missing.param) == ("call_id", "input[0]")
    assert "Set call_id" in missing.message
    assert rejection([{"type": "function_call_output", "call_id": 7, "output": "x"}]).code == "call_id"


def test_an_output_before_its_call_says_so() -> None:
    error = rejection([output(), call()])
    assert (error.code, error.param) == ("call_id", "input[0]")
    assert "input[1]" in error.message and "after" in error.message


def test_namespaced_call() -> None:
    vendor_call = {"type": "acme:tool_call", "call_id": "call_1", "name": "search", "arguments": "{}"}
    error = rejection([vendor_call, output()])
    assert (error.code, error.param) == ("namespaced", "input[1]")
    assert "acme:tool_call" in error.message and "vendor" in error.message


def test_a_type_that_is_not_a_string_is_namespaced() -> None:
    odd = {"type": ["function_call"], "call_id": "call_1"}
    assert rejection([odd, output()]).code == "namespaced"


def test_not_function_call() -> None:
    message = {"type": "message", "role": "assistant", "content": "hi", "call_id": "call_1"}
    error = rejection([message, output()])
    assert (error.code, error.param) == ("not_function_call", "input[1]")
    assert "'message'" in error.message and "call_id" in error.message


def test_incomplete_call() -> None:
    error = rejection([call(status="incomplete"), output()])
    assert (error.code, error.param) == ("status", "input[1]")
    assert "'incomplete'" in error.message and "must never be answered" in error.message


def test_in_progress_call() -> None:
    assert rejection([call(status="in_progress"), output()]).code == "status"


def test_arguments_object_instead_of_string() -> None:
    error = rejection([call(arguments={"city": "Paris"}), output()])
    assert (error.code, error.param) == ("arguments_type", "input[1]")
    assert "an object, not a string" in error.message and "string of JSON" in error.message


def test_arguments_missing() -> None:
    bare = {"type": "function_call", "call_id": "call_1", "name": "get_weather"}
    assert rejection([bare, output()]).code == "arguments_type"


@pytest.mark.parametrize("arguments", ['{"city": "Paris"', "{'city': 'Paris'}", '{"x": NaN}', ""])
def test_arguments_not_json(arguments: str) -> None:
    error = rejection([call(arguments=arguments), output()])
    assert (error.code, error.param) == ("arguments_parse", "input[1]")
    assert "not valid JSON" in error.message


def test_arguments_outside_an_enum() -> None:
    error = rejection([call(arguments='{"city": "Paris", "unit": "kelvin"}'), output()])
    assert (error.code, error.param) == ("arguments_schema", "input[1]")
    assert "$.unit: 'kelvin' is not one of ['celsius', 'fahrenheit']" in error.message
    assert "get_weather" in error.message and "Fix the arguments" in error.message


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ("{}", "'city' is a required property"),
        ('{"city": 3}', "$.city: 3 is not of type 'string'"),
        ('{"city": "Paris", "when": "now"}', "Additional properties are not allowed"),
        ('["Paris"]', "an array"),
        ('"Paris"', "a string"),
    ],
)
def test_arguments_schema(arguments: str, expected: str) -> None:
    error = rejection([call(arguments=arguments), output()])
    assert error.code == "arguments_schema"
    assert expected in error.message


def test_arguments_must_be_an_object_even_without_parameters() -> None:
    free = {"type": "function", "name": "ping", "parameters": None}
    gate([call(name="ping", arguments='{"anything": [1, 2]}'), output()], tools=[free])
    error = rejection([call(name="ping", arguments="[1]"), output()], tools=[free])
    assert error.code == "arguments_schema" and "JSON object" in error.message


def test_unknown_tool() -> None:
    error = rejection([call(name="get_time"), output()], unknown_tool="reject")
    assert (error.code, error.param) == ("unknown_tool", "input[1]")
    assert "'get_time'" in error.message and "Add the function's definition to tools" in error.message


def test_unknown_tool_with_no_tools_at_all() -> None:
    assert rejection([call(), output()], tools=[], unknown_tool="reject").code == "unknown_tool"


def test_only_function_tools_define_functions() -> None:
    hosted = {"type": "acme:search", "name": "get_weather"}
    assert rejection([call(), output()], tools=[hosted], unknown_tool="reject").code == "unknown_tool"


def test_an_answer_to_an_undefined_tool_is_accepted_and_logged_by_default(caplog: pytest.LogCaptureFixture) -> None:
    items = [user(), call(status="completed"), output()]
    with caplog.at_level("INFO", logger="ors.gate"):
        gate(items, tools=[])
    assert "input[2]" in caplog.text and "unknown_tool" in caplog.text and "'get_weather'" in caplog.text
    findings = check_items(items, tools=[])
    assert [(f.param, f.reason, f.blocking, f.undefined_tool) for f in findings] == [
        ("input[1]", "unknown_tool", False, True),
        ("input[2]", "unknown_tool", False, True),
    ]
    assert [f.blocking for f in check_items(items, tools=[], unknown_tool="reject")] == [False, True]


def test_an_undefined_tool_still_gets_every_structural_check() -> None:
    assert rejection([call(name="nope", status="incomplete"), output()], tools=[]).code == "status"
    assert rejection([call(name="nope", arguments={"a": 1}), output()], tools=[]).code == "arguments_type"
    assert rejection([call(name="nope", arguments="{"), output()], tools=[]).code == "arguments_parse"
    assert rejection([call(name="nope", arguments="[]"), output()], tools=[]).code == "arguments_schema"
    assert rejection([call(name=""), output()], tools=[]).code == "unknown_tool"
    assert rejection([output("ghost")], tools=[]).code == "call_id"
    assert rejection([call(), output(), output()], tools=[]).code == "duplicate_output"
    assert rejection([{"type": "acme:call", "call_id": "call_1"}, output()], tools=[]).code == "namespaced"
    assert rejection([user(), {**user(), "call_id": "call_1"}, output()], tools=[]).code == "not_function_call"


def test_invalid_tool_schema_is_reported_on_the_tool() -> None:
    broken = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": 5}}
    error = rejection([user()], tools=[broken])
    assert (error.code, error.param) == ("invalid_tool_schema", "tools[0].parameters")
    assert "$.properties" in error.message and "get_weather" in error.message


def test_a_tool_name_given_twice_is_refused_on_the_second() -> None:
    again = {**WEATHER, "description": "another"}
    error = rejection([user()], tools=[WEATHER, again])
    assert (error.code, error.param) == ("duplicate_tool_name", "tools[1].name")
    assert "tools[0]" in error.message and WEATHER["name"] in error.message
    # a custom tool counts by its name too
    custom = {"type": "custom", "name": WEATHER["name"]}
    assert (rejection([user()], tools=[WEATHER, custom]).param) == "tools[1].name"
    # distinct names pass
    assert all(f.ok for f in check_items([user()], tools=[WEATHER, {**WEATHER, "name": "other"}]))


def test_a_namespaced_function_clashes_only_by_its_flat_name() -> None:
    group = {"type": "namespace", "name": "crm", "tools": [{**WEATHER}, {**WEATHER}]}
    error = rejection([user()], tools=[group])
    assert (error.code, error.param) == ("duplicate_tool_name", "tools[0].tools[1].name")
    # the same function name in a namespace and at the top is not the same tool
    assert all(f.ok for f in check_items([user()], tools=[WEATHER, {**group, "tools": [WEATHER]}]))


def test_invalid_regex_in_a_tool_schema() -> None:
    broken = {"type": "function", "name": "f", "parameters": {"properties": {"a": {"pattern": "[unclosed"}}}}
    error = rejection([], tools=[WEATHER, broken])
    assert (error.code, error.param) == ("invalid_tool_schema", "tools[1].parameters")


def test_remote_ref_is_refused_on_the_tool_and_never_fetched() -> None:
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"type": "string"}')

        def log_message(self, *args: object) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/city.json"
        remote = {
            "type": "function",
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"$ref": url}}},
        }
        error = rejection([call(), output()], tools=[remote])
        server.shutdown()
    assert (error.code, error.param) == ("invalid_tool_schema", "tools[0].parameters")
    assert url in error.message and "nothing is fetched" in error.message
    assert hits == []


def test_local_refs_resolve() -> None:
    local = {
        "type": "function",
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"$ref": "#/$defs/unit"}},
            "$defs": {"unit": {"enum": ["celsius", "fahrenheit"]}},
        },
    }
    gate([call(arguments='{"unit": "celsius"}'), output()], tools=[local])
    assert rejection([call(arguments='{"unit": "kelvin"}'), output()], tools=[local]).code == "arguments_schema"


def test_duplicate_output_in_input() -> None:
    error = rejection([call(), output(), output(text="again")])
    assert (error.code, error.param) == ("duplicate_output", "input[2]")
    assert "input[1]" in error.message and "Remove" in error.message


def test_duplicate_output_already_answered_in_the_chain() -> None:
    history = [user(), call(status="completed"), output()]
    error = rejection([output(text="again")], history=history)
    assert (error.code, error.param) == ("duplicate_output", "input[0]")
    assert "previous_response_id" in error.message


def test_a_non_object_entry() -> None:
    error = rejection([user(), "hello"])
    assert (error.code, error.param) == ("not_an_item", "input[1]")
    assert "a string" in error.message


@pytest.mark.parametrize(
    ("item", "equivalent"),
    [
        ({"role": "assistant", "content": None,
          "tool_calls": [{"id": "call_1", "type": "function",
                          "function": {"name": "get_weather", "arguments": "{}"}}]}, '"type": "function_call"'),
        ({"role": "tool", "tool_call_id": "call_1", "content": "18C"}, '"type": "function_call_output"'),
        ({"type": "message", "role": "function", "name": "get_weather", "content": "18C"},
         '"type": "function_call_output"'),
        ({"type": "function", "id": "call_1", "function": {"name": "get_weather", "arguments": "{}"}},
         '"type": "function_call"'),
    ],
)
def test_chat_completions_envelope(item: dict[str, Any], equivalent: str) -> None:
    error = rejection([user(), item])
    assert (error.code, error.param) == ("chat_completions_envelope", "input[1]")
    assert "Chat Completions" in error.message and equivalent in error.message
    assert "call_id" in error.message


# ---------------------------------------------------------------- precedence


def test_namespaced_wins_over_status_and_arguments_type() -> None:
    vendor = {"type": "acme:tool_call", "call_id": "call_1", "status": "incomplete", "arguments": {"a": 1}}
    assert rejection([vendor, output()]).code == "namespaced"


def test_status_wins_over_bad_json() -> None:
    assert rejection([call(status="incomplete", arguments='{"city": '), output()]).code == "status"


def test_arguments_type_wins_over_unknown_tool() -> None:
    error = rejection([call(name="nope", arguments={"city": "Paris"}), output()], unknown_tool="reject")
    assert error.code == "arguments_type"


def test_arguments_parse_wins_over_unknown_tool() -> None:
    assert rejection([call(name="nope", arguments="{"), output()], unknown_tool="reject").code == "arguments_parse"


def test_arguments_that_are_no_object_win_over_unknown_tool() -> None:
    assert rejection([call(name="nope", arguments="[]"), output()], unknown_tool="reject").code == "arguments_schema"


def test_unknown_tool_wins_over_a_schema_mismatch() -> None:
    items = [call(name="nope", arguments='{"unit": "kelvin"}'), output()]
    assert rejection(items, unknown_tool="reject").code == "unknown_tool"


def test_call_id_wins_over_duplicate() -> None:
    assert rejection([output("ghost"), output("ghost")]).code == "call_id"


def test_duplicate_wins_over_the_calls_problems() -> None:
    findings = check_items([call(status="incomplete"), output(), output()], tools=TOOLS)
    assert [f.reason for f in findings] == ["status", "status", "duplicate_output"]


def test_the_first_failing_item_in_document_order_is_reported() -> None:
    items = [
        call("call_a", status="incomplete"),
        call("call_b", arguments='{"city": "Paris", "unit": "kelvin"}'),
        output("call_b"),
        output("call_a"),
    ]
    error = rejection(items)
    assert (error.code, error.param) == ("arguments_schema", "input[2]")
    findings = check_items(items, tools=TOOLS)
    assert [(f.param, f.reason) for f in findings if f.blocking] == [
        ("input[2]", "arguments_schema"),
        ("input[3]", "status"),
    ]


def test_tool_findings_come_first() -> None:
    broken = {"type": "function", "name": "f", "parameters": {"type": 1}}
    findings = check_items([call(), output("ghost")], tools=[WEATHER, broken])
    assert [f.param for f in findings] == ["tools[1].parameters", "input[0]", "input[1]"]
    assert rejection([call(), output("ghost")], tools=[WEATHER, broken]).param == "tools[1].parameters"


# ---------------------------------------------------------------- replayed calls and history


def test_an_unanswered_bad_call_is_reported_but_does_not_block() -> None:
    items = [user(), call(status="incomplete", name="gone"), user("never mind")]
    gate(items, tools=TOOLS)
    (finding,) = check_items(items, tools=TOOLS)
    assert (finding.param, finding.reason, finding.blocking, finding.ok) == ("input[1]", "status", False, False)
    assert finding.message.startswith("This function_call has status 'incomplete'")


def test_the_call_is_found_in_history() -> None:
    history = [user(), call("call_h", status="completed")]
    gate([output("call_h")], history=history, tools=TOOLS)
    error = rejection([output("call_h")], history=[user(), call("call_h", status="incomplete")])
    assert (error.code, error.param) == ("status", "input[0]")
    assert "previous_response_id chain" in error.message


def test_the_nearest_call_is_the_one_answered() -> None:
    history = [call("call_1", status="incomplete"), call("call_1", status="completed")]
    gate([output()], history=history, tools=TOOLS)
    assert rejection([output()], history=list(reversed(history))).code == "status"
    assert rejection([call("call_1", arguments="{"), output()], history=history).code == "arguments_parse"
    assert rejection([call("call_1"), call("call_1", arguments="{"), output()]).code == "arguments_parse"
    gate([call("call_1", arguments="{"), call("call_1"), output()], tools=TOOLS)
    gate([call("call_1", arguments="{"), call("call_2"), call("call_1"), output()], tools=TOOLS)


def test_a_reused_call_id_may_be_answered_again() -> None:
    history = [call(status="completed"), output()]
    gate([call(), output()], history=history, tools=TOOLS)
    gate([call(), output(), call(), output()], tools=TOOLS)
    assert rejection([call(), output(), call(), output(), output()]).param == "input[4]"
    assert rejection([output()], history=[*history, call(status="incomplete")]).code == "status"


def test_history_tools_define_calls_in_history_and_in_input() -> None:
    history = [user(), call("call_h", status="completed")]
    gate([output("call_h")], history=history, history_tools=TOOLS)
    gate([call(), output()], history_tools=TOOLS)


def test_the_requests_tool_wins_over_the_chains() -> None:
    strict_city = {**WEATHER, "parameters": {"type": "object", "properties": {"city": {"enum": ["Rome"]}}}}
    history = [call(status="completed")]
    gate([output()], history=history, tools=TOOLS, history_tools=[strict_city])
    assert rejection([output()], history=history, tools=[strict_city], history_tools=TOOLS).code == (
        "arguments_schema"
    )


def test_the_chains_latest_tool_definition_wins() -> None:
    old = {**WEATHER, "parameters": {"type": "object", "properties": {"city": {"enum": ["Rome"]}}}}
    history = [call(status="completed")]
    gate([output()], history=history, tools=[], history_tools=[old, WEATHER])
    assert rejection([output()], history=history, tools=[], history_tools=[WEATHER, old]).code == (
        "arguments_schema"
    )


# ---------------------------------------------------------------- helpers and scale


def test_is_namespaced() -> None:
    assert is_namespaced({"type": "ors:note"})
    assert is_namespaced({"type": "openai:web_search_call"})
    assert not is_namespaced({"type": "function_call"})
    assert not is_namespaced({"role": "user", "content": "x"})
    assert not is_namespaced("ors:note")
    assert not is_namespaced({"type": 3})


def test_reasons_are_the_documented_codes() -> None:
    assert {str(reason) for reason in Reason} == {
        "ok", "not_an_item", "chat_completions_envelope", "invalid_tool_schema", "duplicate_tool_name", "call_id",
        "duplicate_output", "namespaced", "not_function_call", "status", "arguments_type",
        "arguments_parse", "unknown_tool", "arguments_schema",
    }
    error = rejection([output("ghost")])
    assert type(error.code) is str and json.dumps(error.body())


@pytest.mark.parametrize("count", [500, 5000])
def test_linear_in_the_number_of_items(count: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Counted, not timed: the walk looks at each item a bounded number of times.
    import app.engine.gate as gate_module

    looked = 0
    real = gate_module._call_id

    def counting(item: Any) -> Any:
        nonlocal looked
        looked += 1
        return real(item)

    monkeypatch.setattr(gate_module, "_call_id", counting)
    items: list[Any] = []
    for number in range(count):
        items += [call(f"call_{number}", arguments=json.dumps({"city": f"c{number}"})), output(f"call_{number}")]
    history = [call(f"old_{number}", status="completed") for number in range(count)]
    gate(items, history=history, tools=TOOLS)
    assert looked <= 4 * (len(items) + len(history))


def test_catastrophic_pattern_runs_in_linear_time() -> None:
    # Python's backtracking `re` needs ~2^n steps for this pattern on n `a`s and a `!`;
    # with 5,000 of them it would never finish (pytest-timeout fails the test).
    evil = {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "pattern": "^(a+)+$"}}},
    }
    arguments = json.dumps({"city": "a" * 5000 + "!"})
    error = rejection([call(arguments=arguments), output()], tools=[evil])
    assert (error.code, error.param) == ("arguments_schema", "input[1]")
    assert "does not match" in error.message


def test_lookaround_pattern_is_refused_on_the_tool() -> None:
    tool = {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "pattern": "^(?!x).*$"}}},
    }
    error = rejection([user()], tools=[tool])
    assert (error.code, error.param) == ("invalid_tool_schema", "tools[0].parameters")
    assert "linear time" in error.message
