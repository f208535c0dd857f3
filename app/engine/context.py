"""What the model sees: Responses items turned into the backend-neutral conversation.

Order is the spec's: instructions first (as a system message), then the items in the
order given (for a chain: previous input, previous output, new input). A message (or a
tool's output) that holds an image or a file keeps them as its ``parts``, in their place
among its text (:mod:`app.backends.parts`), for a backend that takes them as they came.
Each part also says what a text-only model is shown instead, so content such a model
cannot take is never dropped silently: an image or a binary file becomes a short marker
that tells the model it was there; a text file, its text. Each image and file of the
request's own input knows where the client sent it (``input[i].content[j]``); those of
earlier responses of a chain do not (``param`` ``None``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from app.backends.base import ChatMessage, ContentPart, FilePart, ImagePart, Role, TextPart, ToolCall, ToolSearchResult
from app.engine.files import readable_text
from app.engine.mcp import mcp_result_text
from app.engine.tool_search import SEARCH_FUNCTION, UNNAMED_CALL, function_spec, loaded_functions, loaded_text
from app.protocol.content import (
    InputFileParam,
    InputImageParam,
    InputTextParam,
    InputVideoParam,
    OutputTextParam,
    RefusalParam,
)
from app.protocol.items import (
    AssistantMessageParam,
    CompactionParam,
    CustomToolCallOutputParam,
    CustomToolCallParam,
    DeveloperMessageParam,
    FunctionCallOutputParam,
    FunctionCallParam,
    ReasoningParam,
    SystemMessageParam,
    ToolSearchCallParam,
    ToolSearchOutputParam,
    UserMessageParam,
)
from app.protocol.mcp import McpApprovalRequestParam, McpApprovalResponseParam, McpCallParam, McpListToolsParam
from app.protocol.tools import CUSTOM_INPUT, qualified_name

log = logging.getLogger("ors.context")


def image_marker(part: InputImageParam) -> str:
    source = ("an uploaded file" if part.file_id
              else "a data URL" if (part.image_url or "").startswith("data:") else "a URL")
    return (f"[An image ({source}) was attached here. This model cannot see images; "
            "say so if the question depends on it.]")


def file_text(part: InputFileParam) -> str:
    """The text of an attached file when it reads as text (a PDF's text layer, page by
    page: :mod:`app.engine.files`), else a marker naming it."""
    name = part.filename or "unnamed file"
    text = readable_text(part.file_data) if part.file_data else None
    if text is not None:
        return f"[File {name}]\n{text}\n[End of file {name}]"
    where = f" at {part.file_url}" if part.file_url else ""
    return f"[A file ({name}{where}) was attached here. Its content is not readable as text by this model.]"


def _parts(content: Iterable[object], where: str | None) -> tuple[tuple[ContentPart, ...], bool]:
    """The parts of a content list (each image and file with its path below ``where``,
    the list's own path), and whether an image or a file is among them."""
    parts: list[ContentPart] = []
    media = False
    for index, part in enumerate(content):
        param = f"{where}[{index}]" if where is not None else None
        if isinstance(part, InputTextParam | OutputTextParam):
            parts.append(TextPart(part.text))
        elif isinstance(part, RefusalParam):
            parts.append(TextPart(part.refusal))
        elif isinstance(part, InputImageParam):
            parts.append(ImagePart(part.image_url, part.file_id, part.detail, image_marker(part), param))
            media = True
        elif isinstance(part, InputFileParam):
            parts.append(FilePart(part.filename, part.file_data, part.file_url, part.file_id, file_text(part), param))
            media = True
        elif isinstance(part, InputVideoParam):
            parts.append(TextPart("[A video was attached here. This model cannot watch videos.]"))
    return tuple(parts), media


def _message(role: Role, content: str | Sequence[object], where: str | None, *, tool_call_id: str | None = None,
             reasoning: str | None = None, phase: str | None = None) -> ChatMessage:
    """A message of ``content``: with its parts when it holds an image or a file."""
    parts: tuple[ContentPart, ...] = ()
    if isinstance(content, str):
        text = content
    else:
        made, media = _parts(content, where)
        text, parts = ("", made) if media else ("\n".join(part.text for part in made), ())
    return ChatMessage(role=role, content=text, parts=parts, tool_call_id=tool_call_id, reasoning=reasoning,
                       phase=phase)


def _reasoning_text(item: ReasoningParam, sealed: SealedContent | None) -> str:
    if item.encrypted_content:
        opened = sealed.reasoning_text(item.encrypted_content) if sealed is not None else None
        if opened is not None:
            return opened
        log.info("dropped reasoning item %s: its encrypted_content was not sealed by this server", item.id)
    raw = "\n".join(str(c.get("text", "")) for c in item.content or [] if isinstance(c, dict))
    return raw or "\n".join(part.text for part in item.summary)


class SealedContent(Protocol):
    """Opens content this server sealed earlier (see ``app.engine.sealing``)."""

    def compaction_text(self, encrypted_content: str) -> str:
        """The text a compaction item stands for; raises ``SealError`` if not ours."""

    def reasoning_text(self, encrypted_content: str) -> str | None:
        """Reasoning sealed by this server, or ``None`` (another provider's blob)."""


@dataclass(frozen=True, slots=True)
class Conversation:
    """The chat messages some items make (see :func:`build_messages`), and the reasoning
    that waits for the next assistant message. Extending one with more items gives what
    building all the items at once gives, so a chain's conversation is built once and
    each turn only adds its own items."""

    messages: tuple[ChatMessage, ...] = ()
    pending_reasoning: tuple[str, ...] = ()


EMPTY = Conversation()


def build_messages(
    instructions: str | None,
    items: Iterable[object],
    *,
    sealed: SealedContent | None = None,
    start: Conversation = EMPTY,
    paths: Mapping[int, str] | None = None,
) -> list[ChatMessage]:
    """Turn ``instructions`` and input items (already checked) into chat messages, after
    the conversation ``start`` (the earlier items of a chain, already built).

    Consecutive ``function_call`` items become one assistant message with several tool
    calls, joined to the assistant text right before them; reasoning is attached to the
    assistant message that follows it. A ``tool_search_call`` is such a call, of the
    search function; a ``tool_search_output`` is a tool message that describes the
    functions it loaded (:mod:`app.engine.tool_search`). A compaction item becomes a system message with
    the summary it holds; reasoning whose ``encrypted_content`` this server cannot open
    is dropped (with a log line), never fatal. ``paths``: where the client sent each item
    (``input[3]``), by the item's ``id()``, for the parts' ``param``.
    """
    conversation = extend_conversation(start, items, sealed=sealed, paths=paths)
    head = [ChatMessage(role="system", content=instructions)] if instructions else []
    return [*head, *conversation.messages]


def extend_conversation(
    start: Conversation, items: Iterable[object], *, sealed: SealedContent | None = None,
    paths: Mapping[int, str] | None = None,
) -> Conversation:
    """``start`` followed by ``items`` (see :func:`build_messages`)."""
    messages = list(start.messages)
    pending_reasoning = list(start.pending_reasoning)
    for item in items:
        where = paths.get(id(item)) if paths is not None else None
        if isinstance(item, UserMessageParam | SystemMessageParam | DeveloperMessageParam):
            messages.append(_message(item.role, item.content, f"{where}.content" if where else None))
        elif isinstance(item, AssistantMessageParam):
            messages.append(
                _message("assistant", item.content, None,
                         reasoning="\n".join(pending_reasoning) or None, phase=item.phase)
            )
            pending_reasoning = []
        elif isinstance(item, FunctionCallParam | CustomToolCallParam | ToolSearchCallParam):
            call = _tool_call(item)
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":
                messages[-1] = ChatMessage(
                    role="assistant",
                    content=last.content,
                    tool_calls=(*last.tool_calls, call),
                    reasoning=last.reasoning,
                    phase=last.phase,
                )
            else:
                messages.append(
                    ChatMessage(
                        role="assistant",
                        tool_calls=(call,),
                        reasoning="\n".join(pending_reasoning) or None,
                    )
                )
                pending_reasoning = []
        elif isinstance(item, FunctionCallOutputParam | CustomToolCallOutputParam):
            messages.append(_message("tool", item.output, f"{where}.output" if where else None,
                                     tool_call_id=item.call_id))
        elif isinstance(item, ToolSearchOutputParam):
            functions = loaded_functions(item.tools)
            loaded = ToolSearchResult(tuple(function_spec(f) for f in functions), item.execution or "server")
            messages.append(ChatMessage(role="tool", content=loaded_text(functions),
                                        tool_call_id=item.call_id or UNNAMED_CALL, loaded=loaded))
        elif isinstance(item, McpCallParam):
            call = ToolCall(call_id=item.id or UNNAMED_CALL, name=qualified_name(item.server_label, item.name),
                            arguments=item.arguments or "{}")
            messages.append(ChatMessage(role="assistant", tool_calls=(call,),
                                        reasoning="\n".join(pending_reasoning) or None))
            pending_reasoning = []
            messages.append(ChatMessage(role="tool", content=mcp_result_text(item.output, item.error),
                                        tool_call_id=call.call_id))
        elif isinstance(item, McpListToolsParam | McpApprovalRequestParam | McpApprovalResponseParam):
            pass  # a server's tools are offered as functions; an approval is acted on when it comes
        elif isinstance(item, ReasoningParam):
            text = _reasoning_text(item, sealed)
            if text:
                pending_reasoning.append(text)
        elif isinstance(item, CompactionParam):
            if sealed is None:
                raise TypeError("compaction items need sealed content to be opened")
            summary = sealed.compaction_text(item.encrypted_content)
            if summary:
                messages.append(ChatMessage(role="system", content=summary))
        else:
            raise TypeError(f"item of type {type(item).__name__} must be resolved before build_messages")
    return Conversation(tuple(messages), tuple(pending_reasoning))


def _tool_call(item: FunctionCallParam | CustomToolCallParam | ToolSearchCallParam) -> ToolCall:
    """A replayed call as the model made it: under its flat name, and a custom tool's
    input as the one argument it was offered with; a search as a call of the search
    function."""
    if isinstance(item, ToolSearchCallParam):
        return ToolCall(call_id=item.call_id or UNNAMED_CALL, name=SEARCH_FUNCTION,
                        arguments=json.dumps(item.arguments, ensure_ascii=False),
                        tool_search=item.execution or "server")
    if isinstance(item, CustomToolCallParam):
        return ToolCall(call_id=item.call_id, name=item.name, arguments=json.dumps({CUSTOM_INPUT: item.input}))
    return ToolCall(call_id=item.call_id, name=qualified_name(item.namespace, item.name), arguments=item.arguments)
