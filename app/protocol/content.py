"""Content parts: what goes inside messages, reasoning items and tool outputs."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from app.protocol.base import ParamModel, WireModel

ImageDetail = Literal["low", "high", "auto"]

# ---------------------------------------------------------------- params (input)


class InputTextParam(ParamModel):
    type: Literal["input_text"]
    text: str = Field(max_length=10_485_760)


class InputImageParam(ParamModel):
    type: Literal["input_image"]
    image_url: str | None = Field(default=None, max_length=20_971_520)
    detail: ImageDetail | None = None
    file_id: str | None = None
    """Accepted for OpenAI clients; this server has no file store, so it is never resolved."""


class InputFileParam(ParamModel):
    type: Literal["input_file"]
    filename: str | None = None
    file_data: str | None = Field(default=None, max_length=33_554_432)
    file_url: str | None = None
    file_id: str | None = None


class InputVideoParam(ParamModel):
    type: Literal["input_video"]
    video_url: str


class UrlCitationParam(ParamModel):
    type: Literal["url_citation"]
    url: str
    start_index: int
    end_index: int
    title: str


class OutputTextParam(ParamModel):
    type: Literal["output_text"]
    text: str = Field(max_length=10_485_760)
    annotations: list[UrlCitationParam] | None = None
    logprobs: list[Any] | None = None
    """Sent back by SDKs that replay output items verbatim; ignored."""


class RefusalParam(ParamModel):
    type: Literal["refusal"]
    refusal: str


class SummaryTextParam(ParamModel):
    type: Literal["summary_text"]
    text: str


class ReasoningTextParam(ParamModel):
    type: Literal["reasoning_text"]
    text: str


UserContentParam = Annotated[
    InputTextParam | InputImageParam | InputFileParam, Field(discriminator="type")
]
SystemContentParam = Annotated[InputTextParam, Field(discriminator="type")]
AssistantContentParam = Annotated[OutputTextParam | RefusalParam, Field(discriminator="type")]
ToolOutputContentParam = Annotated[
    InputTextParam | InputImageParam | InputFileParam | InputVideoParam, Field(discriminator="type")
]

# ---------------------------------------------------------------- fields (output)


class TopLogProb(WireModel):
    token: str
    logprob: float
    bytes: list[int]


class LogProb(WireModel):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogProb]


class UrlCitation(WireModel):
    type: Literal["url_citation"] = "url_citation"
    url: str
    start_index: int
    end_index: int
    title: str


class InputText(WireModel):
    type: Literal["input_text"] = "input_text"
    text: str


class OutputText(WireModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[UrlCitation] = Field(default_factory=list)
    logprobs: list[LogProb] | None = None
    omit_if_none = frozenset({"logprobs"})


class Text(WireModel):
    type: Literal["text"] = "text"
    text: str


class SummaryText(WireModel):
    type: Literal["summary_text"] = "summary_text"
    text: str


class ReasoningText(WireModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class Refusal(WireModel):
    type: Literal["refusal"] = "refusal"
    refusal: str


class InputImage(WireModel):
    type: Literal["input_image"] = "input_image"
    image_url: str | None
    detail: ImageDetail = "auto"


class InputFile(WireModel):
    type: Literal["input_file"] = "input_file"
    filename: str | None = None
    file_url: str | None = None
    omit_if_none = frozenset({"filename", "file_url"})


class InputVideo(WireModel):
    type: Literal["input_video"] = "input_video"
    video_url: str


ContentPart = Annotated[
    InputText
    | OutputText
    | Text
    | SummaryText
    | ReasoningText
    | Refusal
    | InputImage
    | InputFile
    | InputVideo,
    Field(discriminator="type"),
]
"""Any part of a ``Message``'s content (the spec's shared content union)."""

StreamablePart = Annotated[
    InputText | OutputText | Text | SummaryText | ReasoningText | Refusal | InputImage | InputFile,
    Field(discriminator="type"),
]
"""The ``part`` of content-part events (the same union without video)."""

ToolOutputPart = Annotated[InputText | InputImage | InputFile, Field(discriminator="type")]
