"""The official ``openai`` Python SDK against the real server: its typed parsing of
responses and stream events must accept everything the server sends."""

from __future__ import annotations

import openai
import pytest
from openai import OpenAI

from tests.conftest import SMOL
from tests.live import LiveServer


@pytest.fixture()
def sdk(server: LiveServer) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_create_without_stream(sdk: OpenAI) -> None:
    response = sdk.responses.create(model=SMOL, input="Say hi.", max_output_tokens=16)
    assert response.id.startswith("resp_")
    assert response.status in ("completed", "incomplete")
    assert response.output_text.strip()
    assert response.usage is not None and response.usage.total_tokens > 0


def test_create_with_stream(sdk: OpenAI) -> None:
    seen: list[str] = []
    with sdk.responses.create(model=SMOL, input="Say hi.", max_output_tokens=16, stream=True) as stream:
        for event in stream:
            seen.append(event.type)
            assert type(event).__name__ != "BaseModel"
    assert seen[0] == "response.created" and seen[-1] in ("response.completed", "response.incomplete")
    assert "response.output_text.delta" in seen


def test_stream_helper_accumulates_the_final_response(sdk: OpenAI) -> None:
    with sdk.responses.stream(model="scripted-reasoning", input="x") as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "Answer."
    assert [item.type for item in final.output] == ["reasoning", "message"]


def test_function_call_items_parse(sdk: OpenAI) -> None:
    response = sdk.responses.create(
        model="scripted-tool",
        input="weather in Paris?",
        tools=[{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": False}],
    )
    call = response.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.arguments == '{"city": "Paris"}'


def test_errors_become_sdk_exceptions(sdk: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.responses.create(model="no-such-model", input="x")
    assert caught.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.responses.create(model=SMOL, input="x", temperature=5)
    assert bad.value.param == "temperature"


def test_lifecycle_endpoints(sdk: OpenAI) -> None:
    created = sdk.responses.create(model="scripted-text", input=[
        {"role": "user", "content": "first"}, {"role": "user", "content": "second"}])
    fetched = sdk.responses.retrieve(created.id)
    assert fetched.id == created.id and fetched.output_text == created.output_text == "Hello, world."
    items = sdk.responses.input_items.list(created.id, order="asc")
    texts = [item.content[0].text for item in items.data]  # type: ignore[union-attr]
    assert texts == ["first", "second"]
    page = sdk.responses.input_items.list(created.id, limit=1, order="asc")
    assert page.has_more and len(page.data) == 1
    every = [item.id for item in sdk.responses.input_items.list(created.id, limit=1, order="asc")]
    assert every == [item.id for item in items.data]  # the SDK's auto-pagination follows `after`
    sdk.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(created.id)


def test_background_cancel_with_the_sdk(sdk: OpenAI) -> None:
    queued = sdk.responses.create(model="scripted-slow", input="x", background=True)
    assert queued.status in ("queued", "in_progress")
    cancelled = sdk.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    assert sdk.responses.retrieve(queued.id).status == "cancelled"


def test_input_tokens_count(sdk: OpenAI) -> None:
    counted = sdk.responses.input_tokens.count(model=SMOL, input="Say hi.", instructions="Be brief.")
    assert counted.object == "response.input_tokens"
    ran = sdk.responses.create(model=SMOL, input="Say hi.", instructions="Be brief.", max_output_tokens=16)
    assert ran.usage is not None and ran.usage.input_tokens == counted.input_tokens
