from __future__ import annotations

import pytest
from stream_factory import make_response, make_usage

from compliance import ConformanceError, check_compact, check_response

MESSAGE = {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
           "content": [{"type": "output_text", "text": "Hi", "annotations": []}]}


def raises(match: str):
    return pytest.raises(ConformanceError, match=match)


def completed(**overrides):
    return make_response(**{"status": "completed", "completed_at": 2, "output": [MESSAGE], "usage": make_usage(),
                            **overrides})


def test_completed_response_passes():
    assert check_response(completed()) is not None


def test_completed_response_needs_completed_at():
    with raises(r"a completed response must set completed_at \(at \$\.completed_at\)"):
        check_response(completed(completed_at=None))


def test_completed_response_holds_only_completed_items():
    with raises(r"cannot hold an item with status 'incomplete' \(at \$\.output\[0\]\.status\)"):
        check_response(completed(output=[{**MESSAGE, "status": "incomplete"}]))


def test_failed_response_needs_error():
    with raises("a failed response must set error"):
        check_response(make_response(status="failed"))


def test_incomplete_details_only_when_incomplete():
    with raises("incomplete_details must be null unless the response is incomplete"):
        check_response(make_response(incomplete_details={"reason": "max_output_tokens"}))


def test_duplicate_item_ids():
    with raises("item id 'msg_1' is also the id of item 0"):
        check_response(completed(output=[MESSAGE, MESSAGE]))


def test_reasoning_item_needs_status_although_its_schema_omits_it():
    with raises(r"every item must have a non-empty 'status' \(at \$\.output\[0\]\.status\)"):
        check_response(completed(output=[{"id": "rs_1", "type": "reasoning", "summary": []}]))


def test_usage_must_add_up():
    usage = make_usage()
    usage["total_tokens"] += 1
    with raises("total_tokens 13 != input_tokens 5 \\+ output_tokens 7"):
        check_response(completed(usage=usage))


def test_compact_resource_needs_a_compaction_item():
    body = {"id": "c_1", "object": "response.compaction", "created_at": 1, "usage": make_usage(),
            "output": [{"id": "cmp_1", "type": "compaction", "encrypted_content": "x"}]}
    check_compact(body)
    with raises("must contain a 'compaction' item"):
        check_compact({**body, "output": [MESSAGE]})
