"""Semantic checks of response objects, beyond what their JSON schemas can say.

``check_response`` applies to any ``ResponseResource`` (a non-streaming body or a
streamed snapshot); ``check_compact`` to a ``CompactResource``. Both first validate the
object against its schema, then check the rules the prose states about the object as a
whole. Each returns the object unchanged, or raises ``ConformanceError``.
"""

from __future__ import annotations

from typing import Any

from compliance.errors import ConformanceError
from compliance.schemas import Spec, load_spec

TERMINAL_RESPONSE_STATUSES = ("completed", "failed", "incomplete")
TERMINAL_ITEM_STATUSES = ("completed", "incomplete")


def check_response(resource: Any, *, spec: Spec | None = None, validate: bool = True) -> dict[str, Any]:
    """Check a ``ResponseResource``: schema, item identity and status consistency.

    Rules, by ``status``:

    - every output item has ``id``, ``type`` and ``status`` (the prose requires all three
      on every item, although ``ReasoningBody`` and ``CompactionBody`` do not declare
      ``status``), and item ids are unique;
    - ``completed``: ``completed_at`` is set, ``error`` and ``incomplete_details`` are
      null, every item is ``completed``;
    - ``incomplete``: ``incomplete_details.reason`` is a non-empty string, ``error`` is
      null, items are terminal and only the last one may be ``incomplete``;
    - ``failed``: ``error`` is set;
    - ``queued`` / ``in_progress``: ``completed_at`` is null;
    - ``usage``, when present, adds up: ``total_tokens = input_tokens + output_tokens``,
      with cached and reasoning tokens within their totals.
    """
    if validate:
        (spec or load_spec()).validate_response(resource)
    output = resource["output"]
    _check_item_identities(output, "$.output")
    status = resource["status"]
    statuses = ["completed" if _failed_mcp_call(item) else item["status"] for item in output]
    if status == "completed":
        _require(isinstance(resource["completed_at"], int), "$.completed_at",
                 "a completed response must set completed_at")
        _require(resource["error"] is None, "$.error", "a completed response must have error null")
        _require(resource["incomplete_details"] is None, "$.incomplete_details",
                 "a completed response must have incomplete_details null")
        for index, item_status in enumerate(statuses):
            _require(item_status == "completed", f"$.output[{index}].status",
                     f"a completed response cannot hold an item with status {item_status!r}")
    elif status == "incomplete":
        details = resource["incomplete_details"]
        _require(isinstance(details, dict) and isinstance(details.get("reason"), str) and details["reason"] != "",
                 "$.incomplete_details", "an incomplete response must set incomplete_details.reason")
        _require(resource["error"] is None, "$.error", "an incomplete response must have error null")
        for index, item_status in enumerate(statuses):
            _require(item_status in TERMINAL_ITEM_STATUSES, f"$.output[{index}].status",
                     f"a finished response cannot hold an item with status {item_status!r}")
            _require(item_status != "incomplete" or index == len(statuses) - 1, f"$.output[{index}]",
                     "an incomplete item must be the last output item")
    elif status == "failed":
        _require(resource["error"] is not None, "$.error", "a failed response must set error")
    elif status in ("queued", "in_progress"):
        _require(resource["completed_at"] is None, "$.completed_at",
                 f"a response with status {status!r} must have completed_at null")
    if status != "incomplete":
        _require(resource["incomplete_details"] is None, "$.incomplete_details",
                 f"incomplete_details must be null unless the response is incomplete (status {status!r})")
    if resource["usage"] is not None:
        _check_usage(resource["usage"], "$.usage")
    return resource


def check_compact(resource: Any, *, spec: Spec | None = None, validate: bool = True) -> dict[str, Any]:
    """Check a ``CompactResource``: schema, ``object``, item identity, one ``compaction`` item, usage.

    Items of a compacted window need ``id`` and ``type``; ``status`` is not required
    here, as the spec's own example omits it on the ``compaction`` item.
    """
    if validate:
        (spec or load_spec()).validate_compact(resource)
    output = resource["output"]
    _check_item_identities(output, "$.output", require_status=False)
    _require(any(item.get("type") == "compaction" for item in output), "$.output",
             "a compacted window must contain a 'compaction' item")
    _check_usage(resource["usage"], "$.usage")
    return resource


def _failed_mcp_call(item: dict[str, Any]) -> bool:
    """OpenAI's ``mcp_call`` (a superset item) ends ``failed`` when its tool failed: the
    call is over, as a ``completed`` item's is."""
    return item.get("type") == "mcp_call" and item.get("status") == "failed"


def _check_item_identities(items: list[dict[str, Any]], path: str, *, require_status: bool = True) -> None:
    seen: dict[str, int] = {}
    for index, item in enumerate(items):
        required = ("id", "type", "status") if require_status else ("id", "type")
        for key in required:
            _require(isinstance(item.get(key), str) and item[key] != "", f"{path}[{index}].{key}",
                     f"every item must have a non-empty {key!r}")
        item_id = item["id"]
        _require(item_id not in seen, f"{path}[{index}].id",
                 f"item id {item_id!r} is also the id of item {seen.get(item_id)}")
        seen[item_id] = index


def _check_usage(usage: dict[str, Any], path: str) -> None:
    numbers = {
        "input_tokens": usage["input_tokens"],
        "output_tokens": usage["output_tokens"],
        "total_tokens": usage["total_tokens"],
        "input_tokens_details.cached_tokens": usage["input_tokens_details"]["cached_tokens"],
        "output_tokens_details.reasoning_tokens": usage["output_tokens_details"]["reasoning_tokens"],
    }
    for name, value in numbers.items():
        _require(value >= 0, f"{path}.{name}", f"token counts cannot be negative ({value})")
    _require(usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"], f"{path}.total_tokens",
             f"total_tokens {usage['total_tokens']} != input_tokens {usage['input_tokens']} "
             f"+ output_tokens {usage['output_tokens']}")
    _require(numbers["input_tokens_details.cached_tokens"] <= usage["input_tokens"],
             f"{path}.input_tokens_details.cached_tokens", "cached_tokens exceeds input_tokens")
    _require(numbers["output_tokens_details.reasoning_tokens"] <= usage["output_tokens"],
             f"{path}.output_tokens_details.reasoning_tokens", "reasoning_tokens exceeds output_tokens")


def _require(condition: bool, path: str, message: str) -> None:
    if not condition:
        raise ConformanceError(f"{message} (at {path})", json_path=path)
