"""Tool definitions and ``tool_choice``, as sent and as echoed."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from app.protocol.base import ParamModel, WireModel
from app.protocol.items import FunctionName

ToolChoiceMode = Literal["none", "auto", "required"]

# ---------------------------------------------------------------- params (input)


class FunctionToolParam(ParamModel):
    type: Literal["function"]
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class UnsupportedToolParam(ParamModel):
    """A tool of a type this server cannot run (hosted tools, Codex's ``custom`` or
    ``namespace`` tools, vendor tools). Accepted so such clients work; the engine leaves
    it out of what the model sees and logs that it did."""

    model_config = ParamModel.model_config | {"extra": "allow"}
    type: str


def _tool_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "function" if kind == "function" or not isinstance(kind, str) else "unsupported"


ToolParam = Annotated[
    Annotated[FunctionToolParam, Tag("function")] | Annotated[UnsupportedToolParam, Tag("unsupported")],
    Discriminator(_tool_tag),
]


class SpecificFunctionParam(ParamModel):
    type: Literal["function"]
    name: str


class AllowedToolsParam(ParamModel):
    type: Literal["allowed_tools"]
    tools: list[SpecificFunctionParam] = Field(min_length=1, max_length=128)
    mode: ToolChoiceMode = "auto"


ToolChoiceParam = (
    ToolChoiceMode
    | Annotated[SpecificFunctionParam | AllowedToolsParam, Field(discriminator="type")]
)

# ---------------------------------------------------------------- fields (output)


class FunctionTool(WireModel):
    type: Literal["function"] = "function"
    name: str
    description: str | None
    parameters: dict[str, Any] | None
    strict: bool | None


class FunctionToolChoice(WireModel):
    type: Literal["function"] = "function"
    name: str


class AllowedToolChoice(WireModel):
    type: Literal["allowed_tools"] = "allowed_tools"
    tools: list[FunctionToolChoice]
    mode: ToolChoiceMode


ToolChoice = ToolChoiceMode | FunctionToolChoice | AllowedToolChoice
