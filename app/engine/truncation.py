"""``truncation``: fitting the conversation into the model's context window.

``disabled`` (the default) never drops anything: a conversation that does not fit fails
with 400 ``context_length_exceeded`` before any stream starts. ``auto`` drops the oldest
turns (a turn starts at a user message and runs to the next one, so a tool call is never
separated from its output) and keeps every system/developer message and the most recent
turn. Tokens are counted with the model's own tokenizer and chat template where the
backend can count; where it cannot (an upstream), the upstream's own answer decides.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.backends.base import Backend, ChatMessage, ToolSpec
from app.errors import ContextLengthExceeded

MIN_OUTPUT_TOKENS = 16
"""Room always left for the answer (the spec's minimum ``max_output_tokens``)."""


async def fit_context(
    backend: Backend,
    model: str,
    messages: list[ChatMessage],
    tools: Sequence[ToolSpec],
    *,
    truncation: str,
    max_output_tokens: int | None,
) -> list[ChatMessage]:
    window = backend.context_window(model)
    if window is None:
        return messages
    reserve = MIN_OUTPUT_TOKENS if truncation == "disabled" else min(max_output_tokens or window // 4, window // 2)
    budget = window - max(reserve, MIN_OUTPUT_TOKENS)

    async def fits(candidate: list[ChatMessage]) -> tuple[bool, int]:
        counted = await backend.count_tokens(model, candidate, tools)
        return counted is None or counted <= budget, counted or 0

    ok, used = await fits(messages)
    if ok:
        return messages
    if truncation != "auto":
        raise _too_long(used, window, model, hint=True)

    pinned, turns = _split_turns(messages)
    # Binary search for the fewest oldest turns to drop; the last turn is always kept.
    low, high = 1, len(turns) - 1
    best: list[ChatMessage] | None = None
    while low <= high:
        middle = (low + high) // 2
        candidate = _join(pinned, turns[middle:])
        ok, used = await fits(candidate)
        if ok:
            best, high = candidate, middle - 1
        else:
            low = middle + 1
    if best is None:
        ok, used = await fits(_join(pinned, turns[-1:]))
        if not ok:
            raise _too_long(used, window, model, hint=False)
        best = _join(pinned, turns[-1:])
    return best


_Numbered = list[tuple[int, ChatMessage]]


def _split_turns(messages: list[ChatMessage]) -> tuple[_Numbered, list[_Numbered]]:
    """System/developer messages (with their positions) and the other messages grouped
    into turns."""
    pinned: list[tuple[int, ChatMessage]] = []
    turns: list[list[tuple[int, ChatMessage]]] = []
    for position, message in enumerate(messages):
        if message.role in ("system", "developer"):
            pinned.append((position, message))
            continue
        if message.role == "user" or not turns:
            turns.append([])
        turns[-1].append((position, message))
    return pinned, turns


def _join(
    pinned: list[tuple[int, ChatMessage]], turns: Sequence[list[tuple[int, ChatMessage]]]
) -> list[ChatMessage]:
    kept = pinned + [entry for turn in turns for entry in turn]
    return [message for _, message in sorted(kept, key=lambda entry: entry[0])]


def _too_long(used: int, window: int, model: str, *, hint: bool) -> ContextLengthExceeded:
    advice = " Send less input, or set truncation to 'auto' to drop the oldest turns." if hint else (
        " Even the most recent turn alone does not fit."
    )
    return ContextLengthExceeded(
        f"The input takes {used} tokens, but model '{model}' has a context window of {window} tokens "
        f"(at least {MIN_OUTPUT_TOKENS} are kept for the answer).{advice}",
        param="input",
    )
