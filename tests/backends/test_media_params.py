"""A message's parts, their renderings by each wire adapter, and an upstream's ``param``
about one mapped back to the client's path."""

from __future__ import annotations

import pytest

from app.backends.base import ChatMessage, FilePart, GenerationRequest, ImagePart, TextPart, ToolCall
from app.backends.chat_completions import ChatCompletionsBackend
from app.backends.media_params import CHAINED, chat_param, responses_param, upstream_param
from app.backends.responses_upstream import ResponsesUpstreamBackend, input_items

IMAGE = ImagePart("data:image/png;base64,AAAA", None, "low", "[image]", "input[3].content[1]")
OLD_IMAGE = ImagePart("https://example.com/a.png", None, None, "[image]", None)
FILE = FilePart("a.pdf", "data:application/pdf;base64,JVBE", None, None, "[file a.pdf]", "input[3].content[2]")
LOOK = ChatMessage("user", parts=(TextPart("look"), IMAGE, FILE))


def test_the_content_is_made_from_the_parts() -> None:
    assert LOOK.content == "look\n[image]\n[file a.pdf]"
    assert ChatMessage("user", "look\n[image]\n[file a.pdf]", parts=LOOK.parts) == LOOK
    with pytest.raises(ValueError):
        ChatMessage("user", "something else", parts=LOOK.parts)


def test_a_chat_upstream_gets_parts_unless_it_takes_text_only() -> None:
    seeing = ChatCompletionsBackend("http://127.0.0.1:9/v1", file_parts=True)
    assert seeing._message(LOOK)["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBE", "filename": "a.pdf"}},
    ]
    plain = ChatCompletionsBackend("http://127.0.0.1:9/v1")
    assert plain._message(LOOK)["content"][2] == {"type": "text", "text": "[file a.pdf]"}
    assert plain._message(LOOK, media=False)["content"] == LOOK.content
    by_id = ChatMessage("user", parts=(ImagePart(None, "file-1", None, "[image]"),))
    assert plain._message(by_id)["content"] == [{"type": "text", "text": "[image]"}]
    assert plain._message(ChatMessage("system", parts=LOOK.parts))["content"] == LOOK.content


def test_a_responses_upstream_gets_the_parts_as_they_came() -> None:
    output = ChatMessage("tool", parts=(OLD_IMAGE,), tool_call_id="c1")
    assert input_items([LOOK, output]) == [
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"},
            {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBE"}]},
        {"type": "function_call_output", "call_id": "c1",
         "output": [{"type": "input_image", "image_url": "https://example.com/a.png"}]},
    ]
    assert input_items([LOOK], media=False)[0]["content"] == LOOK.content


@pytest.mark.parametrize("kind", [ChatCompletionsBackend, ResponsesUpstreamBackend])
def test_what_an_upstream_or_one_of_its_models_declares_it_takes(kind: type) -> None:
    backend = kind("http://127.0.0.1:9/v1", input_modalities=["text"], model_input_modalities={"eyes": ["text", "image"]})
    seeing = kind("http://127.0.0.1:9/v1", model_input_modalities={"blind": ["text"]})
    for upstream, model, takes in ((backend, "any", False), (backend, "eyes", True), (seeing, "any", True),
                                   (seeing, "blind", False)):
        assert upstream.takes_images(model) is takes
        sent = upstream.payload(GenerationRequest(model=model, messages=(LOOK,)))
        content = sent["messages" if kind is ChatCompletionsBackend else "input"][0]["content"]
        assert (content != LOOK.content) is takes, (model, content)


def test_a_chat_param_names_the_clients_part() -> None:
    messages = [ChatMessage("system", "be brief"), LOOK, ChatMessage("user", parts=(TextPart("x"), OLD_IMAGE))]
    assert chat_param("messages[1].content[1].image_url", messages) == "input[3].content[1].image_url"
    assert chat_param("messages.[1].content.[1].image_url.url", messages) == "input[3].content[1].image_url"
    assert chat_param("messages[1].content[2].file.file_data", messages) == "input[3].content[2].file_data"
    assert chat_param("messages[1].content[2].file.something", messages) == "input[3].content[2]"
    assert chat_param("messages[2].content[1]", messages) == CHAINED
    for other in ("messages[1].content[0]", "messages[0].content[0]", "messages[9].content[1]",
                  "messages[1].content[7]", "temperature", None):
        assert chat_param(other, messages) is None


def test_a_responses_param_names_the_clients_part() -> None:
    assistant = ChatMessage("assistant", "ok", tool_calls=(ToolCall("c1", "f", "{}"),))
    messages = [ChatMessage("system", "be brief"), assistant, ChatMessage("tool", "42", tool_call_id="c1"), LOOK]
    backend = ResponsesUpstreamBackend("http://127.0.0.1:9/v1")
    owners = backend._owners(GenerationRequest(model="m", messages=tuple(messages)))
    assert len(owners) == 5  # the assistant message is two items: its text and its call
    assert responses_param("input[4].content[1]", owners) == "input[3].content[1]"
    assert responses_param("input[4].content[1].detail", owners) == "input[3].content[1].detail"
    assert responses_param("input[4].content[2].file_data", owners) == "input[3].content[2].file_data"
    assert responses_param("input[4].content[0]", owners) is None
    assert responses_param("input[1].content[0]", owners) is None


def test_the_param_of_an_error_body() -> None:
    assert upstream_param({"error": {"param": "messages[0]"}}) == "messages[0]"
    assert upstream_param({"error": {"param": None}}) is None
    assert upstream_param("plain text") is None
