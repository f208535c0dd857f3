"""Decoding an OpenAI-compatible Chat Completions stream into normalized deltas.

Logprobs, when asked (``ChunkDecoder(top_logprobs=N)``): each chunk's
``choices[0].logprobs.content[]`` (``{token, logprob, bytes, top_logprobs}``) goes on the
``TextDelta`` of that chunk's ``content``; the alternatives are sorted, most likely first,
and cut to ``N`` (llama-cpp-python adds the sampled token to them); missing ``bytes``
(llama-cpp-python sends ``null``) are the token's UTF-8. Logprobs of a chunk without
content (a token that completes no character) go with the next content.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.backends.base import (
    Delta,
    Finish,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    Usage,
)
from app.backends.chat_errors import error_in_stream, json_object, json_or_text
from app.errors import ModelError

_FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
}



@dataclass(slots=True)
class _ToolCallState:
    index: int
    upstream_id: str | None
    name: str | None = None
    announced: bool = False
    held_arguments: list[str] = field(default_factory=list)
    arguments: list[str] = field(default_factory=list)


class ChunkDecoder:
    """Turns Chat Completions chunks (``delta``) or a whole completion (``message``) into deltas.

    Only choice 0 is read. Reasoning arrives as ``reasoning_content`` or ``reasoning``; when a
    server sends both in one delta they carry the same text, so only one is used.

    Tool calls are told apart by the upstream's ``index``; a delta on a known index that
    carries a ``name`` together with a different ``id``, or a different ``name``, starts a new
    call (servers that reuse index 0 for every call), and a delta without ``index`` continues
    the call its ``id`` names, or else the latest call. Calls are renumbered 0, 1, ... in
    order of appearance. A repeated ``name`` on later deltas (llama-cpp-python) is ignored.
    Argument text that arrives before the name is held back, so the first ``ToolCallDelta``
    of every call carries name and ``call_id``; arguments sent as a JSON object (not a
    string) are serialized.

    ``max_output_tokens`` is the budget the request gave the upstream. Some servers
    (llama-cpp-python) report ``tool_calls`` for a call that the budget cut short; a final
    call whose arguments are not complete JSON, when a budget was set and the usage (if
    sent) shows it spent, is reported as ``length``, which is what happened.
    """

    def __init__(self, max_output_tokens: int | None = None, *, top_logprobs: int | None = None) -> None:
        """``top_logprobs``: ``None`` when logprobs were not asked, else how many
        alternatives to keep with each token (see the module docstring)."""
        self.top_logprobs = top_logprobs
        self.sent_text = False
        self.sent_logprobs = False
        self._held_logprobs: list[TokenLogprob] = []
        self.max_output_tokens = max_output_tokens
        self.finish_reason: FinishReason | None = None
        self.usage: Usage | None = None
        self.done = False
        self.received = False
        self._calls: list[_ToolCallState] = []
        self._by_index: dict[int, _ToolCallState] = {}

    def feed_event(self, event: str, data: str) -> list[Delta]:
        """One SSE event: a chunk, ``[DONE]`` (sets :attr:`done`) or an error (raised)."""
        self.received = True
        if event == "error":
            raise error_in_stream(json_or_text(data))
        if data == "[DONE]":
            self.done = True
            return []
        if not data:
            return []
        chunk = json_object(data)
        if chunk.get("error"):
            raise error_in_stream(chunk["error"])
        return self.feed(chunk)

    def feed_events(self, events: Iterable[tuple[str, str]]) -> Iterator[Delta]:
        """:meth:`feed_event` for each of ``events``, in order (the deltas of an event
        come out before a later event can raise); those after ``[DONE]`` are read and
        dropped (a response read to its end gives its connection back to the pool)."""
        for event, data in events:
            if not self.done:
                yield from self.feed_event(event, data)

    def feed_whole(self, body: bytes) -> list[Delta]:
        """A non-streamed completion (or error object) sent as one JSON body."""
        self.received = True
        whole = json_object(body)
        if whole.get("error"):
            raise error_in_stream(whole["error"])
        deltas = self.feed(whole)
        self.done = True
        return deltas

    def feed(self, chunk: Mapping[str, Any]) -> list[Delta]:
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = _usage(usage)
        deltas: list[Delta] = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index") not in (0, None):
                continue
            whole = "message" in choice and "delta" not in choice
            delta = choice.get("message" if whole else "delta") or {}
            content = delta.get("content") if isinstance(delta, dict) else None
            if (content.__class__ is str and self.top_logprobs is None and not whole
                    and not (delta.get("reasoning_content") or delta.get("reasoning") or delta.get("refusal")
                             or delta.get("tool_calls"))):
                # a token of text and nothing else: what nearly every chunk is
                if content:
                    deltas.append(TextDelta(content))
            elif isinstance(delta, dict):
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                if isinstance(reasoning, str) and reasoning:
                    deltas.append(ReasoningDelta(reasoning))
                tokens = self._logprobs(choice, delta) if self.top_logprobs is not None else ()
                for key in ("content", "refusal"):
                    text = _text(delta.get(key))
                    if text:
                        deltas.append(TextDelta(text, tokens if key == "content" else ()))
                for position, call in enumerate(delta.get("tool_calls") or ()):
                    if isinstance(call, dict):
                        deltas.extend(self._tool_call(call, position if whole else None))
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                self.finish_reason = _FINISH_REASONS.get(reason, "stop")
        return deltas

    @property
    def missing_logprobs(self) -> bool:
        """Logprobs were asked and text came, but the upstream sent no logprobs with it."""
        return self.top_logprobs is not None and self.sent_text and not self.sent_logprobs

    def _logprobs(self, choice: Mapping[str, Any], delta: Mapping[str, Any]) -> tuple[TokenLogprob, ...]:
        """The logprobs for this chunk's content: held ones first. Without content they
        are held, unless the chunk carried reasoning (then they are the reasoning's)."""
        raw = choice.get("logprobs")
        entries = raw.get("content") if isinstance(raw, dict) else None
        tokens = [
            parsed
            for entry in (entries if isinstance(entries, list) else ())
            if (parsed := _token_logprob(entry, self.top_logprobs or 0)) is not None
        ]
        self.sent_logprobs = self.sent_logprobs or bool(tokens)
        if not _text(delta.get("content")):
            if not (delta.get("reasoning_content") or delta.get("reasoning")):
                self._held_logprobs += tokens
            return ()
        self.sent_text = True
        held, self._held_logprobs = self._held_logprobs, []
        return (*held, *tokens)

    def finish(self) -> Finish:
        """The terminal delta. A ``stop`` after tool calls is reported as ``tool_calls``.

        Raises ``ModelError`` if the stream ended with neither ``[DONE]`` nor a finish reason
        (a cut connection must not pass for a complete answer), or with a nameless tool call.
        """
        if not self.done and self.finish_reason is None:
            raise ModelError(
                "The upstream model server ended the stream before the model finished.",
                code="upstream_disconnected",
            )
        if any(not call.announced for call in self._calls):
            raise ModelError("The upstream sent a tool call without a function name.", code="upstream_error")
        reason = self.finish_reason or "stop"
        if reason == "stop" and self._calls:
            reason = "tool_calls"
        if reason == "tool_calls" and self._last_call_cut_by_budget():
            reason = "length"
        return Finish(reason=reason, usage=self.usage)

    def _last_call_cut_by_budget(self) -> bool:
        if self.max_output_tokens is None or not self._calls:
            return False
        if self.usage is not None and self.usage.output_tokens < self.max_output_tokens:
            return False
        try:
            json.loads("".join(self._calls[-1].arguments))
        except ValueError:
            return True
        return False

    def _tool_call(self, call: Mapping[str, Any], default_index: int | None) -> list[Delta]:
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else None
        name = function.get("name") if isinstance(function.get("name"), str) and function.get("name") else None
        arguments = function.get("arguments")
        if arguments is None:
            arguments = ""
        elif not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        index = call.get("index") if isinstance(call.get("index"), int) else default_index
        state = self._locate(index, call_id, name)
        if state.name is None and name is not None:
            state.name = name
        if state.upstream_id is None and call_id is not None and not state.announced:
            state.upstream_id = call_id
        if not state.announced:
            if state.name is None:
                state.held_arguments.append(arguments)
                return []
            state.announced = True
            text = "".join(state.held_arguments) + arguments
            state.held_arguments.clear()
            state.arguments.append(text)
            return [ToolCallDelta(index=state.index, name=state.name, arguments=text, call_id=state.upstream_id)]
        state.arguments.append(arguments)
        return [ToolCallDelta(index=state.index, arguments=arguments)] if arguments else []

    def _locate(self, index: int | None, call_id: str | None, name: str | None) -> _ToolCallState:
        if index is not None:
            known = self._by_index.get(index)
            if known is not None and not (name is not None and self._starts_another_call(known, call_id, name)):
                return known
            state = self._new_call(call_id)
            self._by_index[index] = state
            return state
        if call_id is not None:
            for known in self._calls:
                if known.upstream_id == call_id:
                    return known
            return self._new_call(call_id)
        return self._calls[-1] if self._calls else self._new_call(None)

    @staticmethod
    def _starts_another_call(known: _ToolCallState, call_id: str | None, name: str) -> bool:
        other_id = call_id is not None and known.upstream_id not in (None, call_id)
        other_name = known.name is not None and known.name != name
        return other_id or other_name

    def _new_call(self, call_id: str | None) -> _ToolCallState:
        state = _ToolCallState(index=len(self._calls), upstream_id=call_id)
        self._calls.append(state)
        return state


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts
        texts = (part.get("text") for part in value if isinstance(part, dict))
        return "".join(text for text in texts if isinstance(text, str))
    return ""


def _token_logprob(entry: Any, top: int) -> TokenLogprob | None:
    """One ``logprobs.content[]`` entry (or one of its ``top_logprobs``), if well formed."""
    if not isinstance(entry, dict):
        return None
    token, logprob = entry.get("token"), entry.get("logprob")
    if not isinstance(token, str) or not isinstance(logprob, int | float) or isinstance(logprob, bool):
        return None
    raw = entry.get("bytes")
    if isinstance(raw, list) and all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b < 256 for b in raw):
        token_bytes = bytes(raw)
    else:
        token_bytes = token.encode("utf-8")
    alternatives: list[TokenLogprob] = []
    if top > 0 and isinstance(entry.get("top_logprobs"), list):
        parsed = (_token_logprob(other, 0) for other in entry["top_logprobs"])
        alternatives = sorted((other for other in parsed if other is not None), key=_rank)[:top]
    return TokenLogprob(token, float(logprob), token_bytes, tuple(alternatives))


def _rank(token: TokenLogprob) -> float:
    return -token.logprob if math.isfinite(token.logprob) else math.inf


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _usage(raw: Mapping[str, Any]) -> Usage:
    prompt_details = raw.get("prompt_tokens_details") if isinstance(raw.get("prompt_tokens_details"), dict) else {}
    output_details = (
        raw.get("completion_tokens_details") if isinstance(raw.get("completion_tokens_details"), dict) else {}
    )
    return Usage(
        input_tokens=_count(raw.get("prompt_tokens")),
        output_tokens=_count(raw.get("completion_tokens")),
        cached_tokens=_count(prompt_details.get("cached_tokens")),
        reasoning_tokens=_count(output_details.get("reasoning_tokens")),
    )
