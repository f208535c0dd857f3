"""The HTTP checks of the acceptance suite.

They send the request templates of the official Open Responses compliance harness and
judge the answers with this package's checkers, which are stricter than the harness:
every non-streaming body passes ``check_response``, and every stream is checked for
framing, event order, item lifecycle and agreement with its final response.
"""

from __future__ import annotations

from typing import Any

import httpx

from compliance.errors import ConformanceError
from compliance.resource import check_compact, check_response
from compliance.schemas import validate_error_body
from compliance.stream import check_sse_chunks
from compliance.suite import Session, Skip, register

TINY_PNG_DATA_URL = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
"""A 1x1 PNG image."""

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a location",
    "parameters": {
        "type": "object",
        "properties": {"location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"}},
        "required": ["location"],
    },
}


def user(content: Any) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": content}


@register("basic-response")
def basic_response(session: Session) -> None:
    """A user message gets a completed, schema-valid response with output."""
    resource = create_response(session, {"input": [user("Say hello in exactly 3 words.")]})
    require_output(resource)
    require_completed(resource)


@register("assistant-phase")
def assistant_phase(session: Session) -> None:
    """Assistant history labelled with phase is accepted."""
    resource = create_response(session, {"input": [
        {"type": "message", "role": "assistant", "phase": "commentary",
         "content": "I should answer with the saved number."},
        {"type": "message", "role": "assistant", "phase": "final_answer", "content": "The number is four."},
        user("Repeat only the number."),
    ]})
    require_output(resource)
    require_completed(resource)


@register("response-output-phase-schema", transport="fixture")
def response_output_phase_schema(session: Session) -> None:
    """The response schema accepts phase labels on output messages (no request is sent)."""
    messages = [
        {"id": f"msg_phase_{phase}", "type": "message", "status": "completed", "role": "assistant", "phase": phase,
         "content": [{"type": "output_text", "text": text, "annotations": []}]}
        for phase, text in (("commentary", "I am checking the answer."), ("final_answer", "The answer is four."))
    ]
    check_response({
        "id": "resp_phase_schema", "object": "response", "created_at": 1764967971, "completed_at": 1764967972,
        "status": "completed", "incomplete_details": None, "model": session.config.model,
        "previous_response_id": None, "instructions": None, "output": messages, "error": None, "tools": [],
        "tool_choice": "auto", "truncation": "disabled", "parallel_tool_calls": True,
        "text": {"format": {"type": "text"}}, "top_p": 1, "presence_penalty": 0, "frequency_penalty": 0,
        "top_logprobs": 0, "temperature": 1, "reasoning": {"effort": None, "summary": None},
        "usage": {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3,
                  "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
        "max_output_tokens": None, "max_tool_calls": None, "store": True, "background": False,
        "service_tier": "default", "metadata": {}, "safety_identifier": None, "prompt_cache_key": None,
    })


@register("streaming-response")
def streaming_response(session: Session) -> None:
    """A streamed response is well framed, well ordered, and ends completed."""
    resource = stream_response(session, {"input": [user("Count from 1 to 5.")]})
    require_completed(resource)


@register("system-prompt")
def system_prompt(session: Session) -> None:
    """A system message in the input is accepted."""
    resource = create_response(session, {"input": [
        {"type": "message", "role": "system", "content": "You are a pirate. Always respond in pirate speak."},
        user("Say hello."),
    ]})
    require_output(resource)
    require_completed(resource)


@register("tool-calling")
def tool_calling(session: Session) -> None:
    """With a function tool offered, the output contains a function_call item."""
    resource = create_response(session, {"input": [user("What's the weather like in San Francisco?")],
                                          "tools": [WEATHER_TOOL]})
    require_output(resource)
    if not any(item["type"] == "function_call" for item in resource["output"]):
        types = [item["type"] for item in resource["output"]]
        raise ConformanceError(f"expected an output item of type 'function_call', got {types}")


@register("image-input")
def image_input(session: Session) -> None:
    """An input_image given as a base64 data URL is accepted."""
    resource = create_response(session, {"input": [user([
        {"type": "input_text", "text": "What do you see in this image? Answer in one sentence."},
        {"type": "input_image", "image_url": TINY_PNG_DATA_URL},
    ])]})
    require_output(resource)
    require_completed(resource)


@register("multi-turn")
def multi_turn(session: Session) -> None:
    """User and assistant history is accepted."""
    resource = create_response(session, {"input": [
        user("My name is Alice."),
        {"type": "message", "role": "assistant", "content": "Hello Alice! Nice to meet you. How can I help you today?"},
        user("What is my name?"),
    ]})
    require_output(resource)
    require_completed(resource)


@register("compact-response")
def compact_response(session: Session) -> None:
    """POST /responses/compact returns a compacted window holding a compaction item."""
    response = post(session, "/responses/compact", {
        "model": session.config.model,
        "prompt_cache_key": "openresponses-compact-test",
        "input": [
            user("We agreed to launch on Tuesday and notify support first."),
            {"type": "message", "role": "assistant",
             "content": "Understood. The launch is Tuesday, with support notified beforehand."},
        ],
    })
    skip_if_not_offered(response, "/responses/compact")
    require_status(response, (200,))
    check_compact(json_body(response))


@register("compact-missing-model")
def compact_missing_model(session: Session) -> None:
    """POST /responses/compact without model is rejected with 400 or 422 and an error body."""
    response = post(session, "/responses/compact", {"input": [user("Compact this conversation.")]})
    skip_if_not_offered(response, "/responses/compact")
    require_status(response, (400, 422))
    validate_error_body(json_body(response))


def http_client(session: Session) -> httpx.Client:
    """The session's HTTP client."""
    return session.resource("http", lambda: httpx.Client(timeout=session.config.timeout,
                                                         headers=session.config.headers(),
                                                         transport=session.recorder.http_transport()))


def post(session: Session, path: str, body: dict[str, Any]) -> httpx.Response:
    return http_client(session).post(session.config.url(path), json=body)


def create_response(session: Session, body: dict[str, Any]) -> dict[str, Any]:
    """POST /responses (non-streaming) with the configured model; return the checked ResponseResource."""
    response = post(session, "/responses", {"model": session.config.model, **body})
    require_status(response, (200,))
    return check_response(json_body(response))


def stream_response(session: Session, body: dict[str, Any]) -> dict[str, Any]:
    """POST /responses with ``stream: true``; check the stream as it arrives and return the final response."""
    config = session.config
    request = {"model": config.model, **body, "stream": True}
    with http_client(session).stream("POST", config.url("/responses"), json=request) as response:
        if response.status_code != 200:
            response.read()
            require_status(response, (200,))
        require_content_type(response, "text/event-stream")
        return check_sse_chunks(response.iter_bytes(), block_aligned_chunks=config.block_aligned_chunks)


def json_body(response: httpx.Response) -> Any:
    require_content_type(response, "application/json")
    try:
        return response.json()
    except ValueError as error:
        raise ConformanceError(f"the body is not valid JSON ({error})") from None


def require_status(response: httpx.Response, expected: tuple[int, ...]) -> None:
    if response.status_code not in expected:
        wanted = " or ".join(str(code) for code in expected)
        raise ConformanceError(f"HTTP {response.status_code} (expected {wanted}): {clip(response.text)}")


def require_content_type(response: httpx.Response, media_type: str) -> None:
    content_type = response.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != media_type:
        raise ConformanceError(f"Content-Type is {content_type!r}, expected {media_type!r}")


def skip_if_not_offered(response: httpx.Response, path: str) -> None:
    if response.status_code in (404, 405):
        raise Skip(f"the server does not offer POST {path} (HTTP {response.status_code})")


def require_output(resource: dict[str, Any]) -> None:
    if not resource["output"]:
        raise ConformanceError("the response has no output items")


def require_completed(resource: dict[str, Any]) -> None:
    if resource["status"] != "completed":
        raise ConformanceError(f"expected status 'completed', got {resource['status']!r}")


def clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
