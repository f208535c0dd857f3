"""Tool names as strict upstreams take them (``app.backends.tool_names``): a name that
fits goes as it is; one that does not becomes 64 allowed characters that still read as
it, never the same for two names; a call's wire name turns back into the tool's name."""

from __future__ import annotations

import re

from app.backends.base import TextDelta, ToolCallDelta, ToolSpec
from app.backends.tool_names import names_back, restored, wire_name

STRICT = re.compile(r"[A-Za-z0-9_-]{1,64}")
LONG = "mcp__an_issue_tracker_with_a_rather_long_server_name__create_issue_comment_reply"


def test_a_name_that_fits_goes_as_it_is() -> None:
    for name in ("get_weather", "multi_agent_v1__spawn_agent", "a" * 64, "x-y_Z9"):
        assert wire_name(name) == name


def test_a_long_name_becomes_64_characters_that_read_as_it() -> None:
    wire = wire_name(LONG)
    assert len(LONG) > 64 and len(wire) == 64 and STRICT.fullmatch(wire)
    assert wire.startswith(LONG[:51] + "_")
    assert wire_name(LONG) == wire  # the same on every turn, in every process


def test_names_that_share_their_first_64_characters_stay_apart() -> None:
    names = [LONG + suffix for suffix in ("", "s", "_v2", "_v3")]
    assert len({wire_name(name) for name in names}) == len(names)


def test_a_character_a_strict_upstream_refuses_is_replaced() -> None:
    wire = wire_name("files.read")
    assert STRICT.fullmatch(wire) and wire.startswith("files_read_")
    assert wire != wire_name("files_read")


def test_calls_come_back_under_the_tool_name() -> None:
    tools = [ToolSpec(name=LONG), ToolSpec(name="shell")]
    back = names_back(tools)
    assert back == {wire_name(LONG): LONG}
    assert names_back([ToolSpec(name="shell")]) == {}
    assert restored(ToolCallDelta(0, name=wire_name(LONG), arguments="{"), back) == ToolCallDelta(0, name=LONG,
                                                                                               arguments="{")
    assert restored(ToolCallDelta(0, arguments="}"), back) == ToolCallDelta(0, arguments="}")
    assert restored(ToolCallDelta(1, name="shell"), back) == ToolCallDelta(1, name="shell")
    assert restored(TextDelta("hi"), back) == TextDelta("hi")
