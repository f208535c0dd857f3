"""``ors gate``: the replay gate over a logged item list, run as the console command runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city"],
    },
}
GOOD = [
    {"type": "message", "role": "user", "content": "Weather in Paris and Rome?"},
    {"type": "function_call", "call_id": "call_abc", "name": "get_weather",
     "arguments": '{"city": "Paris"}', "status": "completed"},
    {"type": "function_call_output", "call_id": "call_abc", "output": "18C"},
]


def ors_gate(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "gate", *args],
        input=stdin, capture_output=True, text=True, timeout=60, check=False,
    )


def write_jsonl(path: Path, items: list[Any]) -> str:
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return str(path)


def write_json(path: Path, value: Any) -> str:
    path.write_text(json.dumps(value, indent=2))
    return str(path)


def test_a_log_mixing_good_and_bad_items(tmp_path: Path) -> None:
    log = write_jsonl(tmp_path / "log.jsonl", [
        *GOOD,
        {"type": "function_call", "call_id": "call_def", "name": "get_weather",
         "arguments": '{"city": "Rome", "unit": "kelvin"}', "status": "completed"},
        {"type": "function_call_output", "call_id": "call_def", "output": "291K"},
        {"type": "function_call", "call_id": "call_cut", "name": "get_weather",
         "arguments": '{"city": "Ly', "status": "incomplete"},
        {"type": "function_call_output", "call_id": "call_zzz", "output": "?"},
        {"role": "tool", "tool_call_id": "call_abc", "content": "18C"},
    ])
    tools = write_json(tmp_path / "tools.json", [WEATHER])
    result = ors_gate(log, "--tools", tools)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:3] == [
        "input[1] function_call call_abc get_weather ok",
        "input[2] function_call_output call_abc ok",
        "input[3] function_call call_def get_weather arguments_schema: This function_call has arguments that "
        "do not match the parameters of 'get_weather': $.unit: 'kelvin' is not one of ['celsius', "
        "'fahrenheit']. Fix the arguments (or the tool's parameters, if the schema is wrong).",
    ]
    assert lines[3].startswith("input[4] function_call_output call_def arguments_schema: ")
    assert lines[4].startswith("input[5] function_call call_cut get_weather status: ")
    assert lines[5].startswith("input[6] function_call_output call_zzz call_id: ")
    assert lines[6].startswith("input[7] message chat_completions_envelope: ")
    assert '"type": "function_call_output"' in lines[6]
    assert len(lines) == 7
    assert "7 checked, 5 failed" in result.stderr


def test_a_clean_log_passes(tmp_path: Path) -> None:
    log = write_jsonl(tmp_path / "log.jsonl", GOOD)
    result = ors_gate(log, "--tools", write_json(tmp_path / "tools.json", {"tools": [WEATHER]}))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "input[1] function_call call_abc get_weather ok",
        "input[2] function_call_output call_abc ok",
    ]


def test_without_tools_every_call_is_reported_as_an_unknown_tool_and_accepted(tmp_path: Path) -> None:
    result = ors_gate(write_json(tmp_path / "log.json", GOOD))
    assert result.returncode == 0, result.stdout
    lines = result.stdout.splitlines()
    assert lines[0].startswith("input[1] function_call call_abc get_weather unknown_tool (accepted): ")
    assert lines[1].startswith("input[2] function_call_output call_abc unknown_tool (accepted): ")


def test_unknown_tool_reject_fails_the_log(tmp_path: Path) -> None:
    result = ors_gate(write_json(tmp_path / "log.json", GOOD), "--unknown-tool", "reject")
    assert result.returncode == 1
    assert result.stdout.splitlines()[0].startswith("input[1] function_call call_abc get_weather unknown_tool: ")


def test_a_request_body_brings_its_own_tools(tmp_path: Path) -> None:
    log = write_json(tmp_path / "request.json", {"model": "m", "input": GOOD, "tools": [WEATHER]})
    assert ors_gate(log).returncode == 0


def test_a_response_is_checked_by_its_output_paths(tmp_path: Path) -> None:
    response = {"object": "response", "output": [GOOD[1]], "tools": [WEATHER]}
    result = ors_gate(write_json(tmp_path / "response.json", response))
    assert (result.returncode, result.stdout) == (0, "output[0] function_call call_abc get_weather ok\n")


def test_an_invalid_tool_schema_is_a_failure(tmp_path: Path) -> None:
    broken = {**WEATHER, "parameters": {"type": "object", "required": "city"}}
    result = ors_gate(write_json(tmp_path / "log.json", GOOD), "--tools", write_json(tmp_path / "t.json", [broken]))
    assert result.returncode == 1
    assert result.stdout.splitlines()[0].startswith("tools[0].parameters tool get_weather invalid_tool_schema: ")


def test_stdin(tmp_path: Path) -> None:
    tools = write_json(tmp_path / "tools.json", [WEATHER])
    result = ors_gate("-", "--tools", tools, stdin=json.dumps(GOOD))
    assert result.returncode == 0, result.stderr


def test_a_log_with_nothing_to_check(tmp_path: Path) -> None:
    result = ors_gate(write_json(tmp_path / "log.json", [GOOD[0]]))
    assert (result.returncode, result.stdout) == (0, "")
    assert "no function calls" in result.stderr


def test_garbage_is_unreadable(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.log"
    garbage.write_text("this is not json\nnor is this {\n")
    result = ors_gate(str(garbage))
    assert result.returncode == 2
    assert result.stdout == ""
    assert "neither JSON" in result.stderr and "line 1" in result.stderr


def test_unreadable_inputs(tmp_path: Path) -> None:
    log = write_json(tmp_path / "log.json", GOOD)
    missing = ors_gate(str(tmp_path / "absent.jsonl"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    (tmp_path / "empty.jsonl").write_text("\n")
    assert ors_gate(str(tmp_path / "empty.jsonl")).returncode == 2
    (tmp_path / "binary.log").write_bytes(b"\xff\xfe\x00garbage")
    assert ors_gate(str(tmp_path / "binary.log")).returncode == 2
    assert ors_gate(write_json(tmp_path / "number.json", 42)).returncode == 2
    assert ors_gate(write_json(tmp_path / "bad.json", {"input": 5})).returncode == 2
    bad_tools = ors_gate(log, "--tools", write_json(tmp_path / "tools.json", "nope"))
    assert bad_tools.returncode == 2 and "TOOLS" in bad_tools.stderr


def test_the_module_runs_on_its_own(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app.gate_cli", write_json(tmp_path / "log.json", GOOD), "--unknown-tool", "reject"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 1 and "unknown_tool" in result.stdout
