"""Compaction: a long conversation shrunk into a window that a new chain can start from.

The conversation is the ``previous_response_id`` chain's items (oldest first) followed by
the request's ``input``. It is cut at its last user message:

* **kept**: the last turn (from the last user message on), and every older system or
  developer message (instructions are never paraphrased; as in truncation), each in its
  stored wire form with an ``id`` and a ``status``;
* **summarised**: everything else older, rendered as a plain transcript and summarised
  by the requested model (at most :data:`SUMMARY_TOKENS` tokens per call). A transcript
  too long for the model's window is summarised in chunks, each call extending the
  summary so far. Earlier compaction items are expanded into their summaries first.

The summary goes into one ``compaction`` item whose ``encrypted_content`` is
``sealer.seal("compaction", {"summary", "model", "created_at"})``; the client cannot read
or alter it. The window is: older system/developer messages, the compaction item, then
the kept turn. When nothing older needs summarising, the compaction item still appears,
with an empty summary and without a model call.

``usage`` is what the pass cost: the summarising calls' own usage, plus the input tokens
of the kept items when the backend can count them. Nothing is stored, and no response id
is created.

When a compaction item comes back as input, :func:`compaction_context` gives the text
the model is to see in its place. A compaction turn (``compaction_trigger`` on
``/v1/responses``: :mod:`app.engine.compaction_turn`) makes its item with the same
:func:`summarise` and :func:`sealed_item`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.backends.base import (
    Backend,
    ChatMessage,
    Finish,
    GenerationRequest,
    Sampling,
    TextDelta,
)
from app.backends.base import Usage as BackendUsage
from app.engine import ids
from app.engine.context import build_messages
from app.engine.history import History, HistorySource
from app.engine.items import stored_form
from app.engine.models import ModelRouter
from app.engine.sealing import Sealer, SealError
from app.errors import InvalidRequest, ModelError
from app.protocol.compaction import CompactBody, CompactResource
from app.protocol.items import (
    Compaction,
    CompactionParam,
    CompactionTriggerParam,
    DeveloperMessageParam,
    ExtensionItemParam,
    ItemReferenceParam,
    SystemMessageParam,
    UserMessageParam,
)
from app.protocol.responses import InputTokensDetails, OutputTokensDetails, Usage
from app.protocol.states import ItemStatus, ItemType

log = logging.getLogger("ors.compaction")

PURPOSE = "compaction"
SUMMARY_TOKENS = 256
"""Output budget of each summarising call."""
SUMMARY_HEADER = "Summary of the earlier conversation:"

_SYSTEM_PROMPT = (
    "You compress conversations. Summarise the conversation you are given so that it can be "
    "continued without it: keep every fact, decision, name, number, commitment, tool result and "
    "open question; leave out greetings and filler. Write plain prose in the conversation's "
    "language, without any preamble."
)
_SLACK_TOKENS = 32

JSON = dict[str, Any]

_NEW_IDS = {
    ItemType.MESSAGE: ids.message_id,
    ItemType.FUNCTION_CALL: ids.function_call_id,
    ItemType.FUNCTION_CALL_OUTPUT: ids.function_call_output_id,
    ItemType.CUSTOM_TOOL_CALL: ids.custom_tool_call_id,
    ItemType.CUSTOM_TOOL_CALL_OUTPUT: ids.custom_tool_call_output_id,
    ItemType.REASONING: ids.reasoning_id,
    ItemType.COMPACTION: ids.compaction_id,
}


@dataclass(frozen=True, slots=True)
class Entry:
    """An item of the conversation and where it came from (``input[2]``,
    ``previous_response_id``), for error ``param``s."""

    item: object
    param: str


async def compact_request(
    body: CompactBody, *, router: ModelRouter, history: HistorySource, sealer: Sealer
) -> CompactResource:
    """Compact what ``body`` names: 404 ``model_not_found`` for an unknown model, 400
    ``previous_response_not_found`` for an unknown (or another tenant's) previous
    response, 400 for an input item that cannot be compacted."""
    model, backend = router.resolve(body.model)
    past = await history.load(body.previous_response_id) if body.previous_response_id else History()
    entries = [Entry(item, "previous_response_id") for item in past.items]
    entries += input_entries(body.input)
    return await compact(backend=backend, model=model, sealer=sealer, entries=entries, instructions=body.instructions)


def input_entries(raw: str | Sequence[object] | None) -> list[Entry]:
    """The request's ``input`` as entries; a string is one user message."""
    if raw is None:
        return []
    if isinstance(raw, str):
        return [Entry(UserMessageParam(role="user", content=raw), "input")]
    return [Entry(item, f"input[{index}]") for index, item in enumerate(raw)]


async def compact(
    *,
    backend: Backend,
    model: str,
    sealer: Sealer,
    entries: Sequence[Entry],
    instructions: str | None = None,
    summary_tokens: int = SUMMARY_TOKENS,
) -> CompactResource:
    """The compacted window of ``entries`` (oldest first). See the module docstring."""
    for entry in entries:
        _check_compactable(entry)
    cut = _last_user_message(entries)
    older, turn = entries[:cut], entries[cut:]
    pinned = [e for e in older if _is_instruction(e)]
    for entry in turn:
        if isinstance(entry.item, CompactionParam):
            _expand(sealer, entry.item, entry.param)

    summary, usage = await summarise(backend=backend, model=model, sealer=sealer, entries=older,
                                     instructions=instructions, summary_tokens=summary_tokens)
    kept = [*pinned, *turn]
    counted = await backend.count_tokens(model, _as_messages(sealer, kept)) if kept else 0
    item = sealed_item(sealer, summary, model)
    output = _with_unique_ids(
        [*(stored_form(e.item) for e in pinned), item.model_dump(mode="json"), *(stored_form(e.item) for e in turn)]
    )
    return CompactResource(
        id=ids.new_id("compact"),
        output=output,
        created_at=int(time.time()),
        usage=_wire_usage(usage, extra_input=counted or 0),
    )


async def summarise(
    *,
    backend: Backend,
    model: str,
    sealer: Sealer,
    entries: Sequence[Entry],
    instructions: str | None = None,
    summary_tokens: int = SUMMARY_TOKENS,
) -> tuple[str, BackendUsage]:
    """The summary of ``entries`` (oldest first) by ``model``, and what the summarising
    calls cost: system and developer messages are left out (instructions are never
    paraphrased), earlier compaction items are expanded into their summaries, and a
    transcript too long for the model's window is summarised in chunks. ``("", no
    usage)`` without a model call when nothing is left to summarise."""
    pieces = [piece for entry in entries if not _is_instruction(entry) and (piece := _render(sealer, entry))]
    if not pieces:
        return "", BackendUsage()
    return await _summarise(backend, model, pieces, instructions, summary_tokens)


def sealed_item(sealer: Sealer, summary: str, model: str) -> Compaction:
    """A new ``compaction`` item holding ``summary``, sealed (see the module docstring)."""
    created_at = int(time.time())
    return Compaction(
        id=ids.compaction_id(),
        encrypted_content=sealer.seal(PURPOSE, {"summary": summary, "model": model, "created_at": created_at}),
    )


def compaction_context(sealer: Sealer, encrypted_content: str) -> str:
    """The text the model sees in place of a compaction item sent back as input:
    ``"Summary of the earlier conversation:\\n<summary>"``, or ``""`` when the item
    summarises nothing (add no message then). Raises :class:`SealError` (``param``
    unset) for a blob this server did not seal for compaction."""
    summary = summary_of(sealer, encrypted_content)
    return f"{SUMMARY_HEADER}\n{summary}" if summary else ""


def summary_of(sealer: Sealer, encrypted_content: str) -> str:
    """The summary sealed in a compaction item's ``encrypted_content``."""
    payload = sealer.unseal(PURPOSE, encrypted_content)
    summary = payload.get("summary")
    if not isinstance(summary, str):
        raise SealError("The encrypted content of this compaction item holds no summary.")
    return summary


# ---------------------------------------------------------------- the window


def _check_compactable(entry: Entry) -> None:
    if isinstance(entry.item, ItemReferenceParam):
        raise InvalidRequest(
            f"Item '{entry.item.id}' cannot be referenced: item references are not supported; "
            "send the item itself or use previous_response_id.",
            code="unsupported_item",
            param=entry.param,
        )
    if isinstance(entry.item, CompactionTriggerParam):
        raise InvalidRequest(
            "A compaction_trigger item asks POST /v1/responses for a compaction turn; this endpoint "
            "compacts without one. Remove it from the input.",
            code="unsupported_item",
            param=entry.param,
        )
    if isinstance(entry.item, ExtensionItemParam):
        raise InvalidRequest(
            f"Item type '{entry.item.type}' is not one this server can compact.",
            code="unsupported_item",
            param=entry.param,
        )


def _is_instruction(entry: Entry) -> bool:
    return isinstance(entry.item, SystemMessageParam | DeveloperMessageParam)


def _last_user_message(entries: Sequence[Entry]) -> int:
    for index in range(len(entries) - 1, -1, -1):
        if isinstance(entries[index].item, UserMessageParam):
            return index
    return len(entries)


def _expand(sealer: Sealer, item: CompactionParam, param: str) -> str:
    """:func:`compaction_context`, with the item's place as the error's ``param``."""
    try:
        return compaction_context(sealer, item.encrypted_content)
    except SealError as exc:
        exc.param = param
        raise


def _as_messages(sealer: Sealer, entries: Sequence[Entry]) -> list[ChatMessage]:
    """What the model would read for ``entries`` (for counting tokens)."""
    messages: list[ChatMessage] = []
    for entry in entries:
        if isinstance(entry.item, CompactionParam):
            text = _expand(sealer, entry.item, entry.param)
            if text:
                messages.append(ChatMessage(role="system", content=text))
        else:
            messages += build_messages(None, [entry.item])
    return messages


def _with_unique_ids(items: list[JSON]) -> list[JSON]:
    """Every item with a ``status`` and an ``id`` of its own (a resent item may repeat an
    id of the chain)."""
    seen: set[str] = set()
    for item in items:
        item.setdefault("status", ItemStatus.COMPLETED)
        if item["id"] in seen:
            item["id"] = _NEW_IDS.get(item["type"], lambda: ids.new_id("item"))()
        seen.add(item["id"])
    return items


def _wire_usage(usage: BackendUsage, *, extra_input: int) -> Usage:
    input_tokens = usage.input_tokens + extra_input
    return Usage(
        input_tokens=input_tokens,
        output_tokens=usage.output_tokens,
        total_tokens=input_tokens + usage.output_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=min(usage.cached_tokens, input_tokens)),
        output_tokens_details=OutputTokensDetails(reasoning_tokens=min(usage.reasoning_tokens, usage.output_tokens)),
    )


# ---------------------------------------------------------------- the summary


_LABELS = {"user": "User", "assistant": "Assistant", "system": "System", "developer": "Developer"}


def _render(sealer: Sealer, entry: Entry) -> str:
    """One item of the transcript as text (``""`` for an item with nothing to say)."""
    if isinstance(entry.item, CompactionParam):
        return _expand(sealer, entry.item, entry.param)
    lines: list[str] = []
    for message in build_messages(None, [entry.item]):
        if message.role == "tool":
            lines.append(f"Tool result (call {message.tool_call_id}): {message.content}")
            continue
        if message.content:
            lines.append(f"{_LABELS[message.role]}: {message.content}")
        for call in message.tool_calls:
            lines.append(f"Assistant called {call.name}({call.arguments}) (call {call.call_id})")
    return "\n".join(lines)


async def _summarise(
    backend: Backend, model: str, pieces: list[str], instructions: str | None, max_tokens: int
) -> tuple[str, BackendUsage]:
    """The summary of the transcript ``pieces`` and the usage of the calls that made it."""
    system = _SYSTEM_PROMPT
    if instructions:
        system += f"\n\nThe assistant in this conversation was following these instructions:\n{instructions}"
    chunks = await _chunks(backend, model, pieces, system, max_tokens)
    summary = ""
    total = BackendUsage()
    for chunk in chunks:
        text = "\n\n".join(chunk)
        request = GenerationRequest(
            model=model,
            messages=(
                ChatMessage(role="system", content=system),
                ChatMessage(role="user", content=_ask(summary, text)),
            ),
            sampling=Sampling(max_output_tokens=max_tokens, temperature=0.2),
        )
        produced, usage = await _generate(backend, request)
        total = BackendUsage(
            input_tokens=total.input_tokens + usage.input_tokens,
            output_tokens=total.output_tokens + usage.output_tokens,
            cached_tokens=total.cached_tokens + usage.cached_tokens,
            reasoning_tokens=total.reasoning_tokens + usage.reasoning_tokens,
        )
        if produced.strip():
            summary = produced.strip()
        else:
            log.warning("model %s wrote an empty summary; keeping the transcript instead", model)
            summary = f"{summary}\n\n{text}".strip()
    return summary, total


def _ask(summary: str, transcript: str) -> str:
    if summary:
        return (f"Summary so far:\n{summary}\n\nThe conversation then continued:\n{transcript}\n\n"
                "Write the summary of the whole conversation now.")
    return f"Conversation:\n{transcript}\n\nWrite the summary now."


async def _chunks(
    backend: Backend, model: str, pieces: list[str], system: str, max_tokens: int
) -> list[list[str]]:
    """``pieces`` grouped so that each summarising call fits the model's window (one
    group when the window or the token count is unknown). A piece too long for a call
    on its own is cut."""
    window = backend.context_window(model)
    if window is None:
        return [pieces]
    overhead = await backend.count_tokens(
        model, [ChatMessage(role="system", content=system), ChatMessage(role="user", content=_ask("x", ""))]
    )
    if overhead is None:
        return [pieces]
    # room for the answer, and for the summary so far carried into the next call
    budget = max(window - overhead - 2 * max_tokens - _SLACK_TOKENS, 64)
    chunks: list[list[str]] = [[]]
    used = 0
    for piece in pieces:
        tokens = await backend.count_tokens(model, [ChatMessage(role="user", content=piece)]) or 0
        if tokens > budget:
            piece = piece[: max(1, int(len(piece) * budget / tokens * 0.9))] + " [...]"
            tokens = budget
        if chunks[-1] and used + tokens > budget:
            chunks.append([])
            used = 0
        chunks[-1].append(piece)
        used += tokens
    return chunks


async def _generate(backend: Backend, request: GenerationRequest) -> tuple[str, BackendUsage]:
    text: list[str] = []
    async with contextlib.aclosing(backend.stream(request)) as stream:  # type: ignore[type-var]
        async for delta in stream:
            if isinstance(delta, TextDelta):
                text.append(delta.text)
            elif isinstance(delta, Finish):
                return "".join(text), delta.usage or BackendUsage()
    raise ModelError("The model stream ended without a finish.", code="model_stream_ended")
