"""The server in front of a real OpenAI-compatible upstream: llama-cpp-python's own
server, started on loopback with SmolLM2 under an alias that is not a local model id."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from app.config import Settings
from app.main import create_app
from tests.client import Client
from tests.live import LiveServer
from tests.upstream_server import running_llama_server

# The upstream is llama-cpp-python's server with SmolLM2, and the local model is SmolLM2.
pytestmark = pytest.mark.model

UPSTREAM_MODEL = "upstream-smollm2"


@pytest.fixture(scope="module")
def upstream_url() -> Iterator[str]:
    with running_llama_server(model_alias=UPSTREAM_MODEL) as url:
        yield url


@pytest.fixture(scope="module")
def fronted(upstream_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The server as a user configures it: ``ORS_UPSTREAM_URL`` and the default model set."""
    settings = Settings(
        upstream_url=upstream_url,
        default_model=UPSTREAM_MODEL,
        data_dir=tmp_path_factory.mktemp("upstream-front"),
    )
    server = LiveServer(create_app(settings)).start()
    yield server
    server.stop()


def test_json_response_through_the_upstream(fronted: LiveServer) -> None:
    client = Client(fronted.url)
    response = client.create(model=UPSTREAM_MODEL, input="Say hello.", max_output_tokens=24)
    assert response["model"] == UPSTREAM_MODEL
    assert response["output"][0]["type"] == "message"
    assert response["status"] in ("completed", "incomplete")


def test_streamed_response_through_the_upstream(fronted: LiveServer) -> None:
    result = Client(fronted.url).stream(input="Count to three.", max_output_tokens=24)
    assert result.final["model"] == UPSTREAM_MODEL
    assert "response.output_text.delta" in result.types()
    assert result.text().strip()


def test_max_output_tokens_reaches_the_upstream(fronted: LiveServer) -> None:
    result = Client(fronted.url).stream(
        model=UPSTREAM_MODEL, input="Write a long story about a lighthouse.", max_output_tokens=16
    )
    assert result.final["status"] == "incomplete"
    assert result.final["incomplete_details"] == {"reason": "max_output_tokens"}


def test_models_lists_upstream_and_local(fronted: LiveServer) -> None:
    ids = {m["id"] for m in httpx.get(f"{fronted.url}/v1/models").json()["data"]}
    assert {UPSTREAM_MODEL, "smollm2-135m-instruct", "qwen2.5-coder-1.5b-instruct"} <= ids


def test_openai_sdk_through_the_upstream(fronted: LiveServer) -> None:
    sdk = OpenAI(base_url=f"{fronted.url}/v1", api_key="unused", max_retries=0)
    with sdk.responses.stream(model=UPSTREAM_MODEL, input="Hi!", max_output_tokens=16) as stream:
        final = stream.get_final_response()
    assert final.output_text == "".join(
        part.text for item in final.output if item.type == "message" for part in item.content
        if part.type == "output_text"
    )


def test_upstream_down_is_a_model_error(tmp_path: Path) -> None:
    settings = Settings(upstream_url="http://127.0.0.1:9/v1", default_model="smollm2-135m-instruct",
                        data_dir=tmp_path)
    with_dead_upstream = LiveServer(create_app(settings)).start()
    try:
        client = Client(with_dead_upstream.url)
        error = client.error({"model": "anything-upstream", "input": "x"}, 500)
        assert (error["type"], error["code"]) == ("model_error", "upstream_unavailable")
        result = client.stream(model="anything-upstream", input="x")
        assert result.types()[-2:] == ["error", "response.failed"]
    finally:
        with_dead_upstream.stop()


def test_without_upstream_unknown_models_are_404(tmp_path: Path) -> None:
    settings = Settings(default_model="smollm2-135m-instruct", data_dir=tmp_path)
    server = LiveServer(create_app(settings)).start()
    try:
        error = Client(server.url).error({"model": UPSTREAM_MODEL, "input": "x"}, 404)
        assert error["code"] == "model_not_found"
    finally:
        server.stop()


def test_logprobs_through_the_upstream(fronted: LiveServer) -> None:
    """llama-cpp-python's server returns logprobs (its ``logits_all`` defaults to on),
    with ``bytes: null`` and the sampled token among the alternatives: the adapter fills
    the bytes in and keeps the ``top_logprobs`` most likely alternatives, sorted."""
    client = Client(fronted.url)
    asked = {"include": ["message.output_text.logprobs"], "top_logprobs": 2, "max_output_tokens": 16}
    response = client.create(model=UPSTREAM_MODEL, input="Say hello.", **asked)
    result = client.stream(model=UPSTREAM_MODEL, input="Count to three.", **asked)
    deltas = [e for e in result.events if e["type"] == "response.output_text.delta"]
    assert deltas and all("".join(lp["token"] for lp in e["logprobs"]) == e["delta"] for e in deltas)
    parts = [
        part
        for final in (response, result.final)
        for item in final["output"]
        if item["type"] == "message"
        for part in item["content"]
    ]
    assert parts and all(part["logprobs"] for part in parts)
    for part in parts:
        assert "".join(lp["token"] for lp in part["logprobs"]) == part["text"]
        for lp in part["logprobs"]:
            assert lp["logprob"] <= 0 and bytes(lp["bytes"]) == lp["token"].encode("utf-8")
            alternatives = [alternative["logprob"] for alternative in lp["top_logprobs"]]
            assert len(alternatives) == 2 and alternatives == sorted(alternatives, reverse=True)


def test_a_json_answer_is_asked_whole_and_reports_usage(fronted: LiveServer) -> None:
    """A plain JSON answer is asked of the upstream without streaming. llama-cpp-python's
    streams carry no usage; its whole answers do, so the response has it."""
    response = Client(fronted.url).create(model=UPSTREAM_MODEL, input="Say hello.", max_output_tokens=16)
    usage = response["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0, usage
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_a_json_request_past_the_upstreams_window_is_a_400(fronted: LiveServer) -> None:
    """Asked whole, llama-cpp-python says what is wrong (a stream past its window is an
    empty body, which can only be a failed response)."""
    error = Client(fronted.url).error({"model": UPSTREAM_MODEL, "input": "word " * 3000}, 400)
    assert error["code"] == "context_length_exceeded", error
