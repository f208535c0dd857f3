"""The contract between the engine and a model backend.

A backend receives a :class:`GenerationRequest` (a backend-neutral conversation plus
sampling and tool settings; a message's images and files are its ``parts``, see
:mod:`app.backends.parts`) and yields a stream of normalized deltas:

    TextDelta        visible assistant text (with its tokens' logprobs when asked)
    ReasoningDelta   raw reasoning text (never shown as output_text)
    ToolCallDelta    a piece of a function call; calls are told apart by ``index``
    ToolSearchCallDelta, ToolSearchOutputDelta  a whole tool search and what it loaded
                     (the engine's hosted search makes them; so does an upstream that
                     hosts tool search itself, ``Backend.hosts_tool_search``)
    McpListToolsDelta, McpCallDelta, McpApprovalRequestDelta  a whole MCP item (only
                     the engine's MCP loop makes them, never a model backend)
    CompactionDelta  a whole compaction item's sealed content (only a compaction turn
                     makes it: the engine's, from a model's summary; never a model backend)
    Finish           exactly once, last: why generation stopped, and token usage

The engine never sees a backend's wire format, and a backend never sees the Responses
protocol. Contract for ``Backend.stream``:

* It yields zero or more content deltas and then exactly one ``Finish``.
* Failures raise an :class:`app.errors.ORSError` subclass (``ModelError`` for a model or
  upstream that failed, ``InvalidRequest`` for a request the model cannot take).
  Upstream-specific exceptions are translated inside the backend, at one boundary.
* Cancellation: closing the iterator (``aclose``) or cancelling the consuming task stops
  generation promptly and releases the model or the upstream connection.
* For every call, the first ``ToolCallDelta`` of an ``index`` carries ``name`` and
  ``call_id`` (if the backend knows one); later ones carry argument text only.
* Logprobs: when ``request.sampling.logprobs`` is set, each ``TextDelta`` carries the
  :class:`TokenLogprob` of the tokens that produced its text, in order (possibly none, for
  an upstream that sends none), each with ``sampling.top_logprobs`` alternatives. When it
  is not set, ``TextDelta.logprobs`` stays empty and no per-token work is done. A backend
  that cannot produce logprobs at all refuses the request in :meth:`Backend.check`.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from app.backends.mcp_deltas import McpApprovalRequestDelta as McpApprovalRequestDelta
from app.backends.mcp_deltas import McpCallDelta as McpCallDelta
from app.backends.mcp_deltas import McpListToolsDelta as McpListToolsDelta
from app.backends.mcp_deltas import McpTool as McpTool
from app.backends.model_info import ModelGauges as ModelGauges
from app.backends.model_info import ModelInfo as ModelInfo
from app.backends.parts import TEXT_AND_IMAGES as TEXT_AND_IMAGES
from app.backends.parts import ContentPart, InputModality
from app.backends.parts import FilePart as FilePart
from app.backends.parts import ImagePart as ImagePart
from app.backends.parts import TextPart as TextPart
from app.errors import InvalidRequest

Role = Literal["system", "developer", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "tool_calls", "content_filter"]
ToolSearchExecution = Literal["server", "client"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call already made, replayed to the model as context."""

    call_id: str
    name: str
    arguments: str
    tool_search: ToolSearchExecution | None = None
    """Set when the call is a tool search (``tool_search_call``): how it was executed."""


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One turn of the backend-neutral conversation.

    ``parts`` are its content in the client's order when it holds an image or a file
    (empty for text alone); ``content`` is then made from them (each part's ``text``, one
    a line) and is what a text-only consumer reads: the embedded models, an upstream that
    takes text only, token counting. Parts are the one source: a message given both
    must agree (``ValueError``)."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    """For ``role == "tool"``: the call this message answers."""
    reasoning: str | None = None
    """Assistant reasoning restored from an earlier turn, if any."""
    phase: str | None = None
    """Assistant ``phase`` label (``commentary`` / ``final_answer``), kept for upstreams."""
    loaded: ToolSearchResult | None = None
    """For a tool message that answers a tool search (``tool_search_output``): what it
    loaded. ``content`` describes the tools to a model; an upstream that hosts tool
    search sends the item itself."""
    parts: tuple[ContentPart, ...] = ()
    """The content part by part, when it holds an image or a file (:mod:`app.backends.parts`)."""

    def __post_init__(self) -> None:
        if self.parts:
            made = "\n".join(part.text for part in self.parts)
            if self.content and self.content != made:
                raise ValueError("a message's content is made from its parts; give one or the other")
            object.__setattr__(self, "content", made)


@dataclass(frozen=True, slots=True)
class TextGrammar:
    """The grammar a custom tool's one string (its ``input``) must follow, beyond what
    ``parameters`` can say: ``definition`` in ``syntax`` (Lark), sent as the request's
    parameter ``param``. An embedded model is held to it by its own grammar (a refusal
    names ``param``); an upstream gets the tool without it."""

    syntax: Literal["lark"]
    definition: str
    param: str


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function tool the model can see."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    grammar: TextGrammar | None = None


@dataclass(frozen=True, slots=True)
class ToolSearchResult:
    """The tools a tool search loaded, as functions under their flat names."""

    tools: tuple[ToolSpec, ...]
    execution: ToolSearchExecution = "server"


@dataclass(frozen=True, slots=True)
class HostedToolSearch:
    """A request's tool search, for a backend that hosts tool search itself
    (``Backend.hosts_tool_search``): sent as OpenAI's ``tool_search`` tool, with the
    ``deferred`` functions offered as ``defer_loading`` tools. ``description`` and
    ``parameters`` are a client-executed search's own."""

    execution: ToolSearchExecution
    deferred: tuple[ToolSpec, ...] = ()
    description: str | None = None
    parameters: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """What the model may call.

    ``mode`` is ``auto`` (may call), ``none`` (must not call) or ``required`` (must call
    at least one). ``allowed`` limits which of the visible tools may be called; ``None``
    means all of them. A named tool choice is ``required`` with one allowed name.
    """

    mode: Literal["auto", "none", "required"] = "auto"
    allowed: tuple[str, ...] | None = None
    parallel: bool = True
    max_calls: int | None = None

    def may_call(self, name: str) -> bool:
        return self.mode != "none" and (self.allowed is None or name in self.allowed)


@dataclass(frozen=True, slots=True)
class Sampling:
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    top_logprobs: int | None = None
    """Alternatives to report with each token's logprob (0-20), when ``logprobs`` is set."""
    logprobs: bool = False
    """Report each generated token's logprob on the ``TextDelta``s. Set for
    ``include: ["message.output_text.logprobs"]``, and also for ``top_logprobs`` > 0
    without it: asking for alternatives means asking for logprobs."""


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """Constrains the visible text: ``text`` (free), ``json_object`` or ``json_schema``."""

    kind: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    model: str
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    tool_policy: ToolPolicy = field(default_factory=ToolPolicy)
    sampling: Sampling = field(default_factory=Sampling)
    output_format: OutputFormat = field(default_factory=OutputFormat)
    reasoning_effort: str | None = None
    cache_key: str | None = None
    """The request's ``prompt_cache_key``: requests that share one are likely to share a
    prompt prefix, so a backend with a prompt cache may route them together."""
    late_tools: tuple[ToolSpec, ...] = ()
    """Tools a tool search loaded (``ChatMessage.loaded``), callable like ``tools``. A
    backend that renders tools into its prompt shows these only where the conversation
    loaded them, never beside ``tools``, so the prompt before that point stays the same;
    one that sends a tool list sends them after ``tools``."""
    tool_search: HostedToolSearch | None = None
    """Set only for a backend that hosts tool search itself (see ``HostedToolSearch``);
    any other gets the engine's search as a function in ``tools``."""
    incremental: bool = True
    """Whether the output is wanted as it is made. ``False`` for a response nobody sees
    before it ends (a plain JSON answer): a backend may then produce it in one piece, as
    an upstream asked without ``stream`` answers (the same deltas, fewer of them, and no
    per-token work in between). Cancelling the stream still stops the generation."""


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One token's log probability under the model, and the most likely alternatives at
    its position (empty for an alternative itself, and when none were asked).

    ``token`` is the token's text as it appears in the output: for a token that holds only
    part of a multi-byte character it is empty (or the completed character, for the token
    that completes it), so the tokens of a text concatenate to that text. ``token_bytes``
    are the token's own bytes, whatever character boundaries they cut."""

    token: str
    logprob: float
    token_bytes: bytes
    top: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    """The tokens of ``text``, in order; only when ``Sampling.logprobs`` asked for them."""


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    index: int
    name: str | None = None
    arguments: str = ""
    call_id: str | None = None


@dataclass(frozen=True, slots=True)
class ToolSearchCallDelta:
    """A whole tool search the model made (``tool_search_call``): its ``arguments``, and
    whether the server ran it (``server``: a ``ToolSearchOutputDelta`` follows) or the
    client is to (``client``)."""

    call_id: str | None
    arguments: dict[str, Any]
    execution: ToolSearchExecution = "server"


@dataclass(frozen=True, slots=True)
class ToolSearchOutputDelta:
    """What a search loaded (``tool_search_output``): the flat names of the functions,
    callable from here on."""

    call_id: str | None
    names: tuple[str, ...]
    execution: ToolSearchExecution = "server"


@dataclass(frozen=True, slots=True)
class CompactionDelta:
    """The one output of a compaction turn: a ``compaction`` item's ``encrypted_content``
    (the summary, sealed). Made by the engine's compaction (``app.engine.compaction_turn``)."""

    encrypted_content: str


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Finish:
    reason: FinishReason
    usage: Usage | None = None


Delta = (TextDelta | ReasoningDelta | ToolCallDelta | ToolSearchCallDelta | ToolSearchOutputDelta | CompactionDelta
         | McpListToolsDelta | McpCallDelta | McpApprovalRequestDelta | Finish)


class Backend(abc.ABC):
    """A source of model output. See the module docstring for the stream contract."""

    input_modalities: tuple[InputModality, ...] = ("text",)
    """What of a message reaches the model as it came: text only (images and files are
    read from ``ChatMessage.content``, as markers and text), or images too (and files,
    where the wire API carries them: ``ChatMessage.parts``). An upstream takes
    :data:`TEXT_AND_IMAGES` unless configured otherwise."""

    def takes_images(self, model: str | None = None) -> bool:
        """Whether images (and files) reach ``model`` as they came: its backend's
        ``input_modalities``, unless the model declares its own."""
        return "image" in self.input_modalities

    hosts_tool_search: bool = False
    """Whether a request's tool search goes to this backend as it came
    (``GenerationRequest.tool_search``), which runs it or hands it to the client and
    reports it as ``ToolSearchCallDelta``/``ToolSearchOutputDelta``; otherwise the
    engine runs it, offering the model a search function."""

    @abc.abstractmethod
    def models(self) -> list[ModelInfo]:
        """The model ids this backend serves (may be empty for a pass-through upstream)."""

    def gauges(self) -> list[ModelGauges]:
        """The load of the models this backend runs itself (none for an upstream)."""
        return []

    async def available_models(self) -> list[ModelInfo]:
        """The models to list in ``/v1/models``; an upstream may ask its server."""
        return self.models()

    @abc.abstractmethod
    def serves(self, model: str) -> bool:
        """Whether a request for ``model`` belongs to this backend."""

    @abc.abstractmethod
    def stream(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        """Generate; an async generator honouring the contract above."""

    async def warm(self, request: GenerationRequest) -> None:
        """Start evaluating ``request``'s prompt into the model's prompt cache without
        generating anything, so that a later request sharing its prefix starts sooner (a
        WebSocket ``response.create`` with ``generate: false``). Returns at once; the work
        goes on in the background, best effort, and never raises. Default: nothing to
        warm (an upstream keeps its own cache)."""

    async def check(self, request: GenerationRequest) -> None:
        """Raise ``InvalidRequest`` now for a request the backend will certainly refuse
        (e.g. a schema it cannot enforce), so the client gets a plain 400 before any
        stream starts. Called by the engine before the response exists. A backend that
        cannot produce logprobs at all refuses ``sampling.logprobs`` here, with
        ``param="include"``."""

    def context_window(self, model: str) -> int | None:
        """Tokens of context (input plus output) of ``model``, if known."""
        return None

    async def count_tokens(
        self, model: str, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = ()
    ) -> int | None:
        """Input tokens of this conversation for ``model``, with its own tokenizer and
        chat template, if the backend can tell; ``None`` otherwise."""
        return None

    async def load(self, model: str) -> ModelInfo:
        """Load ``model`` now (``POST /v1/models/{id}/load``): a backend that runs its models."""
        raise InvalidRequest(f"The model '{model}' is served by an upstream: it is not loaded here", param="model")

    async def unload(self, model: str) -> ModelInfo:
        """Unload ``model`` now (``POST /v1/models/{id}/unload``); see :meth:`load`."""
        return await self.load(model)

    async def start(self) -> None:
        """Prepare resources (load models, open clients). Called once at app start."""

    async def aclose(self) -> None:
        """Release resources. Called once at app shutdown."""
