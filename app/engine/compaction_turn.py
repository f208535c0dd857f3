"""Compaction turns: ``POST /v1/responses`` with ``{"type": "compaction_trigger"}`` last in
its ``input`` (OpenAI's second compaction, which Codex uses for remote compaction).

The contract:

* **The trigger** is the last input item, once, and bare: ``{"type": "compaction_trigger"}``
  with no other field (not even ``id``). One anywhere else, a second one, or one with
  another field is a 400 whose ``param`` names it (``input[3]``, ``input[3].id``).
* **The output** is exactly one ``compaction`` item, whose ``encrypted_content`` seals a
  summary of the whole conversation: the ``previous_response_id`` chain, then the input
  (the trigger aside). Everything but system and developer messages is summarised
  (instructions are never paraphrased: the client sends them again), earlier compaction
  items are expanded into their summaries, by the requested model, with the summariser of
  ``/v1/responses/compact`` (:func:`app.engine.compaction.summarise`): the item is read
  back on later turns exactly as that endpoint's is. The request's ``instructions`` are
  shown to the summariser as the instructions the assistant followed.
* **Events**, streamed or not, over SSE or WebSocket: ``response.created``,
  ``response.in_progress``, ``response.output_item.added`` (the item with
  ``encrypted_content: ""``, ``in_progress``), ``response.output_item.done`` (sealed,
  ``completed``), ``response.completed``, whose ``usage`` is what the summarising calls
  cost. A model failure ends it ``response.failed``, like any response.
* **Nothing of the trigger is kept**: the stored input (``input_items``, a chain replayed
  through ``previous_response_id``, a WebSocket's connection-local turn) is the input
  without it; the compaction item is the response's stored output.
* **The rest of the request**: ``tools`` are checked and echoed as usual but never offered
  (the model cannot call a tool instead of compacting); a ``tool_choice`` that demands a
  call (``required``, a named function, ``allowed_tools`` in ``required`` mode) is a 400 on
  ``tool_choice``, since a compaction turn makes none; ``text.format`` is echoed and has
  nothing to apply to (the output holds no text); ``max_output_tokens`` bounds each
  summarising call; ``truncation`` is not applied: a conversation longer than the window
  is summarised in chunks, which is what compacting it is for.

The turn runs as any response does: :class:`CompactionTurn` is the backend of its run,
so storage, background, cancellation and every delivery need nothing of their own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from app.backends.base import (
    Backend,
    ChatMessage,
    CompactionDelta,
    Delta,
    Finish,
    GenerationRequest,
    ModelInfo,
    ToolSpec,
)
from app.engine.compaction import SUMMARY_TOKENS, Entry, sealed_item, summarise
from app.engine.sealing import Sealer
from app.errors import InvalidRequest
from app.protocol.items import CompactionTriggerParam
from app.protocol.responses import CreateResponseBody
from app.protocol.tools import AllowedToolsParam, McpToolChoiceParam, SpecificFunctionParam


def trigger_index(body: CreateResponseBody) -> int | None:
    """Where the request's ``compaction_trigger`` is (``None``: it has none, an ordinary
    turn). Raises the 400 of a trigger that is not the one last input item."""
    items = body.input if isinstance(body.input, list) else []
    found = [index for index, item in enumerate(items) if isinstance(item, CompactionTriggerParam)]
    if not found:
        return None
    if len(found) > 1:
        raise InvalidRequest(
            f"The input holds {len(found)} compaction_trigger items; a compaction turn takes exactly one, "
            "as the last input item.",
            code="invalid_value",
            param=f"input[{found[1]}]",
        )
    index = found[0]
    if index != len(items) - 1:
        raise InvalidRequest(
            "A compaction_trigger must be the last input item: it asks for a compaction of everything before it.",
            code="invalid_value",
            param=f"input[{index}]",
        )
    return index


def check_compaction_turn(body: CreateResponseBody, sealer: Sealer | None, trigger: int) -> None:
    """What a compaction turn cannot be asked for (see the module docstring)."""
    if sealer is None:
        raise InvalidRequest("This server cannot seal compaction items.", code="unsupported_item",
                             param=f"input[{trigger}]")
    choice = body.tool_choice
    demands_call = (
        choice == "required"
        or isinstance(choice, SpecificFunctionParam | McpToolChoiceParam)
        or (isinstance(choice, AllowedToolsParam) and choice.mode == "required")
    )
    if demands_call:
        raise InvalidRequest(
            "tool_choice demands a tool call, but a compaction turn (compaction_trigger in the input) makes "
            "none: its output is one compaction item. Send tool_choice 'auto' or 'none', or leave it out.",
            code="invalid_value",
            param="tool_choice",
        )


def conversation_entries(past_items: Sequence[object], new_items: Sequence[object]) -> list[Entry]:
    """The conversation a compaction turn summarises: the chain, then the input."""
    return [*(Entry(item, "previous_response_id") for item in past_items),
            *(Entry(item, "input") for item in new_items)]


class CompactionTurn(Backend):
    """The backend of a compaction turn: the summary of ``entries`` by ``model`` on the
    model's own ``backend``, sealed, as one :class:`CompactionDelta`, then a ``Finish``
    with the summarising calls' usage. Closing its stream closes the summarising call's.
    It is made for one request, and answers for the model it was made for only."""

    def __init__(self, backend: Backend, *, model: str, sealer: Sealer, entries: Sequence[Entry],
                 instructions: str | None, max_output_tokens: int | None) -> None:
        self.backend = backend
        self.model = model
        self.sealer = sealer
        self.entries = list(entries)
        self.instructions = instructions
        self.summary_tokens = min(SUMMARY_TOKENS, max_output_tokens) if max_output_tokens else SUMMARY_TOKENS

    def models(self) -> list[ModelInfo]:
        return [info for info in self.backend.models() if info.id == self.model]

    def serves(self, model: str) -> bool:
        return model == self.model

    def context_window(self, model: str) -> int | None:
        return self.backend.context_window(model)

    async def count_tokens(self, model: str, messages: Sequence[ChatMessage],
                           tools: Sequence[ToolSpec] = ()) -> int | None:
        return await self.backend.count_tokens(model, messages, tools)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        summary, usage = await summarise(backend=self.backend, model=self.model, sealer=self.sealer,
                                         entries=self.entries, instructions=self.instructions,
                                         summary_tokens=self.summary_tokens)
        yield CompactionDelta(sealed_item(self.sealer, summary, self.model).encrypted_content)
        yield Finish("stop", usage)
