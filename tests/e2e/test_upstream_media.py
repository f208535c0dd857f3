"""Images and files reach an upstream as the client sent them: the real server in front of
a scripted loopback upstream (``tests.upstream_server``) that records the exact body of
every request, spoken to over Chat Completions and over Responses, under several
configurations of the same address (routes by prefix):

``chat/``      Chat Completions, images as ``image_url`` parts, files as their text
``files/``     Chat Completions with ``file_parts = true``: files as ``file`` parts
``far/``       Responses: ``input_image`` and ``input_file`` parts as they came
``blind/``, ``blindfar/``   either wire API declared ``input_modalities = ["text"]``:
               markers and file text, as for an embedded model (and ``plain-model``
               of ``chat/``, declared so alone)
"""

from __future__ import annotations

import base64
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from compliance.http_checks import TINY_PNG_DATA_URL
from tests.acceptance import run_acceptance
from tests.client import Client
from tests.live import LiveServer, serve_in_front
from tests.pdfs import text_pdf
from tests.upstream_server import DONE, ScriptedUpstream, chunk, running_scripted_upstream

PDF = text_pdf("The tiny file says: kumquat.")
PDF_DATA = "data:application/pdf;base64," + base64.b64encode(PDF).decode()
CAT = "https://example.com/cat.png"
MARKER = "[An image (a data URL) was attached here."


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with running_scripted_upstream() as scripted:
        yield scripted


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("media")


@pytest.fixture(scope="module")
def server(upstream: ScriptedUpstream, data: Path) -> Iterator[LiveServer]:
    url = upstream.base_url
    front = serve_in_front(data, f"""
[upstreams.chat]
base_url = "{url}"
prefixes = ["chat/"]
models = ["seeing-model", "plain-model"]
[upstreams.chat.model_input_modalities]
plain-model = ["text"]

[upstreams.files]
base_url = "{url}"
prefixes = ["files/"]
[upstreams.files.dialect]
file_parts = true

[upstreams.far]
base_url = "{url}"
wire_api = "responses"
prefixes = ["far/"]

[upstreams.blind]
base_url = "{url}"
prefixes = ["blind/"]
models = ["blind-model"]
input_modalities = ["text"]

[upstreams.blindfar]
base_url = "{url}"
wire_api = "responses"
prefixes = ["blindfar/"]
input_modalities = ["text"]
""", default_model="chat/none")
    yield front
    front.stop()


@pytest.fixture()
def client(server: LiveServer) -> Iterator[Client]:
    client = Client(server.url)
    yield client
    client.close()


def reply(upstream: ScriptedUpstream, wire: str) -> str:
    """A model of the upstream that answers one sentence, every time, over ``wire``."""
    if wire == "chat":
        return upstream.stream(chunk(content="I see one pixel."), chunk(finish_reason="stop"), DONE)
    said = {"type": "message", "id": "m1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "I see one pixel.", "annotations": []}]}
    return upstream.stream(
        {"type": "response.output_item.added", "output_index": 0,
         "item": {"type": "message", "id": "m1", "role": "assistant", "content": []}},
        {"type": "response.output_text.delta", "output_index": 0, "item_id": "m1", "delta": "I see one pixel."},
        {"type": "response.output_item.done", "output_index": 0, "item": said},
        {"type": "response.completed", "response": {"status": "completed", "output": [said],
                                                    "usage": {"input_tokens": 3, "output_tokens": 4}}},
    )


def wire_of(prefix: str) -> str:
    return "responses" if prefix.startswith(("far", "blindfar")) else "chat"


def sent(upstream: ScriptedUpstream, model: str) -> list[dict[str, Any]]:
    """The messages (Chat Completions) or input items (Responses) of each request for ``model``."""
    return [request.body.get("messages", request.body.get("input")) for request in upstream.requests_for(model)]


def user(*content: dict[str, Any]) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": list(content)}


def text(value: str) -> dict[str, Any]:
    return {"type": "input_text", "text": value}


def image(url: str, **more: Any) -> dict[str, Any]:
    return {"type": "input_image", "image_url": url, **more}


def images_in(conversation: list[dict[str, Any]]) -> list[str]:
    """Every image URL sent, in order, whichever the wire API."""
    found = []
    for entry in conversation:
        content = entry.get("content", entry.get("output"))
        for part in content if isinstance(content, list) else ():
            if part["type"] == "image_url":
                found.append(part["image_url"]["url"])
            elif part["type"] == "input_image":
                found.append(part["image_url"])
    return found


def payload(data_url: str) -> bytes:
    return base64.b64decode(data_url.split(",", 1)[1], validate=True)


# -- the official acceptance check, through each wire API ----------------------------------


@pytest.mark.parametrize("wire", ["chat", "responses"])
def test_the_acceptance_image_check_reaches_the_upstream_byte_for_byte(
        server: LiveServer, upstream: ScriptedUpstream, wire: str) -> None:
    model = reply(upstream, wire)
    prefix = "chat/" if wire == "chat" else "far/"
    verdicts, result = run_acceptance(f"{server.url}/v1", prefix + model, only=["image-input"])
    assert verdicts == {"image-input": "PASS"}, result.stdout + result.stderr
    (conversation,) = sent(upstream, model)
    if wire == "chat":
        assert conversation[-1]["content"] == [
            {"type": "text", "text": "What do you see in this image? Answer in one sentence."},
            {"type": "image_url", "image_url": {"url": TINY_PNG_DATA_URL}}]
    else:
        assert conversation[-1]["content"] == [
            {"type": "input_text", "text": "What do you see in this image? Answer in one sentence."},
            {"type": "input_image", "image_url": TINY_PNG_DATA_URL}]
    assert payload(images_in(conversation)[0]) == payload(TINY_PNG_DATA_URL)


@pytest.mark.parametrize("prefix", ["chat/", "far/"])
def test_urls_and_detail_are_kept_and_parts_keep_their_place(client: Client, upstream: ScriptedUpstream,
                                                             prefix: str) -> None:
    model = reply(upstream, wire_of(prefix))
    client.create(model=prefix + model, input=[user(text("one"), image(CAT, detail="low"), text("two"),
                                                     image(TINY_PNG_DATA_URL, detail="high"))])
    (conversation,) = sent(upstream, model)
    if prefix == "chat/":
        assert conversation[-1]["content"] == [
            {"type": "text", "text": "one"}, {"type": "image_url", "image_url": {"url": CAT, "detail": "low"}},
            {"type": "text", "text": "two"},
            {"type": "image_url", "image_url": {"url": TINY_PNG_DATA_URL, "detail": "high"}}]
    else:
        assert conversation[-1]["content"] == [
            {"type": "input_text", "text": "one"}, {"type": "input_image", "image_url": CAT, "detail": "low"},
            {"type": "input_text", "text": "two"},
            {"type": "input_image", "image_url": TINY_PNG_DATA_URL, "detail": "high"}]


# -- files ------------------------------------------------------------------------------------


def pdf_file() -> dict[str, Any]:
    return {"type": "input_file", "filename": "tiny.pdf", "file_data": PDF_DATA}


def test_a_pdf_reaches_a_responses_upstream_unchanged(client: Client, upstream: ScriptedUpstream) -> None:
    model = reply(upstream, "responses")
    response = client.create(model=f"far/{model}", input=[user(text("Summarise the file."), pdf_file())])
    assert response["status"] == "completed"
    (conversation,) = sent(upstream, model)
    assert conversation[-1]["content"][1] == pdf_file()
    assert payload(conversation[-1]["content"][1]["file_data"]) == PDF


def test_a_pdf_goes_as_a_file_part_where_the_dialect_takes_them(client: Client, upstream: ScriptedUpstream) -> None:
    model = reply(upstream, "chat")
    client.create(model=f"files/{model}", input=[user(text("Summarise the file."), pdf_file())])
    (conversation,) = sent(upstream, model)
    assert conversation[-1]["content"][1] == {"type": "file", "file": {"file_data": PDF_DATA,
                                                                       "filename": "tiny.pdf"}}


def test_without_file_parts_a_chat_upstream_gets_the_file_as_text(client: Client, upstream: ScriptedUpstream) -> None:
    model = reply(upstream, "chat")
    notes = "data:text/plain;base64," + base64.b64encode(b"The secret word is tangerine.").decode()
    client.create(model=f"chat/{model}", input=[user(
        text("Read these."), {"type": "input_file", "filename": "notes.txt", "file_data": notes}, pdf_file(),
        image(TINY_PNG_DATA_URL))])
    (conversation,) = sent(upstream, model)
    said, notes_part, pdf_part, image_part = conversation[-1]["content"]
    assert said == {"type": "text", "text": "Read these."}
    assert notes_part["type"] == "text" and "tangerine" in notes_part["text"]
    assert pdf_part["type"] == "text" and "tiny.pdf" in pdf_part["text"] and "kumquat" in pdf_part["text"]
    assert "base64" not in pdf_part["text"]
    assert image_part == {"type": "image_url", "image_url": {"url": TINY_PNG_DATA_URL}}


# -- an upstream that takes text only ---------------------------------------------------------


@pytest.mark.parametrize("prefix", ["blind/", "blindfar/"])
def test_a_text_only_upstream_gets_markers(client: Client, upstream: ScriptedUpstream, prefix: str) -> None:
    model = reply(upstream, wire_of(prefix))
    client.create(model=prefix + model, input=[user(text("What is this?"), image(TINY_PNG_DATA_URL), pdf_file())])
    (conversation,) = sent(upstream, model)
    content = conversation[-1]["content"]
    assert isinstance(content, str) and content.startswith("What is this?\n" + MARKER)
    assert "tiny.pdf" in content and "base64" not in content and not images_in(conversation)


def test_a_model_declared_text_only_gets_markers_from_an_upstream_that_takes_images(
        client: Client, upstream: ScriptedUpstream) -> None:
    model = upstream.stream(chunk(content="Text only."), chunk(finish_reason="stop"), DONE, model="plain-model")
    client.create(model=model, input=[user(text("What is this?"), image(TINY_PNG_DATA_URL))])
    (conversation,) = sent(upstream, model)
    assert conversation[-1]["content"].startswith("What is this?\n" + MARKER)


def test_models_and_the_codex_catalog_say_which_models_take_images(server: LiveServer) -> None:
    listed = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]
    assert {"seeing-model", "blind-model"} <= {model["id"] for model in listed}
    catalog = httpx.get(f"{server.url}/v1/models", params={"client_version": "0.171.0"}, timeout=30).json()
    modalities = {entry["slug"]: entry["input_modalities"] for entry in catalog["models"]}
    assert modalities["seeing-model"] == ["text", "image"]
    assert modalities["blind-model"] == modalities["plain-model"] == ["text"]


# -- an upstream's 400 about a part names the client's part ----------------------------------


@pytest.mark.parametrize(("prefix", "named", "expected"), [
    ("chat/", "messages[2].content[1].image_url", "input[1].content[1].image_url"),
    ("chat/", "messages.[2].content.[1].image_url.url", "input[1].content[1].image_url"),
    ("chat/", "messages[2].content[1].image_url.detail", "input[1].content[1].detail"),
    ("chat/", "messages[2].content[0]", None),  # a text part: nothing of the client's to name
    ("far/", "input[2].content[1].image_url", "input[1].content[1].image_url"),
    ("far/", "input[2].content[1]", "input[1].content[1]"),
])
def test_an_upstream_400_about_an_image_names_the_clients_part(
        client: Client, upstream: ScriptedUpstream, prefix: str, named: str, expected: str | None) -> None:
    """The instructions are the upstream's first message, so its index 2 is the client's 1."""
    model = upstream.respond(400, {"error": {"type": "invalid_request_error", "code": "invalid_image",
                                             "message": "The image could not be decoded.", "param": named}})
    body = {"model": prefix + model, "instructions": "Be brief.",
            "input": [user(text("hello")), user(text("look"), image(TINY_PNG_DATA_URL))]}
    error = client.error(body, 400)
    assert (error["code"], error["param"]) == ("upstream_rejected", expected), error
    assert "could not be decoded" in error["message"]
    streamed = client.stream(**body)
    (event,) = [event for event in streamed.events if event["type"] == "error"]
    assert event["error"]["param"] == expected, event


def test_an_error_event_about_an_image_names_the_clients_part(client: Client, upstream: ScriptedUpstream) -> None:
    """A Responses upstream may refuse in its stream: an ``error`` event with a ``param``."""
    model = upstream.stream({"type": "error", "error": {"type": "invalid_request_error", "code": "invalid_image",
                                                        "message": "Unreadable image.", "param": "input[1].content[1]"}})
    result = client.stream(model=f"far/{model}", input=[user(text("hello")), user(text("look"),
                                                                                  image(TINY_PNG_DATA_URL))])
    (event,) = [event for event in result.events if event["type"] == "error"]
    assert (event["error"]["code"], event["error"]["param"]) == ("upstream_rejected", "input[1].content[1]"), event


@pytest.mark.parametrize("prefix", ["chat/", "far/"])
def test_an_upstream_400_about_an_earlier_turns_image_names_the_chain(
        client: Client, upstream: ScriptedUpstream, prefix: str) -> None:
    model = reply(upstream, wire_of(prefix))
    first = client.create(model=prefix + model, input=[user(text("look"), image(TINY_PNG_DATA_URL))])
    refusing = upstream.respond(400, {"error": {"type": "invalid_request_error", "message": "bad image",
                                                "param": "messages[0].content[1].image_url" if prefix == "chat/"
                                                else "input[0].content[1]"}})
    error = client.error({"model": prefix + refusing, "previous_response_id": first["id"], "input": "and now?"}, 400)
    assert error["param"] == "previous_response_id", error


# -- chains: replayed on every turn, stored once ----------------------------------------------


@pytest.mark.parametrize("prefix", ["chat/", "far/"])
def test_a_chain_replays_the_image_on_later_turns(client: Client, upstream: ScriptedUpstream, prefix: str) -> None:
    model = reply(upstream, wire_of(prefix))
    first = client.create(model=prefix + model, input=[user(text("Remember this."), image(TINY_PNG_DATA_URL))])
    second = client.stream(model=prefix + model, previous_response_id=first["id"], input="What was it?").final
    client.create(model=prefix + model, previous_response_id=second["id"], input="And again?")
    turns = sent(upstream, model)
    assert len(turns) == 3
    for conversation in turns:
        (url,) = images_in(conversation)
        assert url == TINY_PNG_DATA_URL and payload(url) == payload(TINY_PNG_DATA_URL)


def big_png(size: int) -> str:
    """A data URL of ``size`` bytes that pass for a PNG (its signature and header chunk,
    then random bytes, which no compression shrinks)."""
    data = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + os.urandom(size)
    return "data:image/png;base64," + base64.b64encode(data).decode()


def stored_bytes(data: Path) -> int:
    """The bytes of every stored response, item and event log, read from the database."""
    with sqlite3.connect(f"file:{data / 'ors.db'}?mode=ro", uri=True) as db:
        return sum(db.execute(query).fetchone()[0] or 0 for query in (
            "SELECT sum(length(item)) FROM items", "SELECT sum(length(resource)) FROM responses",
            "SELECT sum(length(body)) FROM events"))


def test_ten_turns_with_a_megabyte_image_store_it_once(data: Path, client: Client,
                                                       upstream: ScriptedUpstream) -> None:
    model = reply(upstream, "chat")
    url = big_png(1_000_000)
    before = stored_bytes(data)
    previous = None
    for turn in range(10):
        content = [text("Look at this."), image(url)] if turn == 0 else [text(f"Turn {turn}: what was it?")]
        previous = client.create(model=f"chat/{model}", input=[user(*content)],
                                 **({"previous_response_id": previous} if previous else {}))["id"]
    turns = sent(upstream, model)
    assert len(turns) == 10 and all(images_in(conversation) == [url] for conversation in turns)
    grown = stored_bytes(data) - before
    assert len(url) <= grown < 1.5 * len(url), f"{grown} bytes stored for a {len(url)}-character image"
    assert json.dumps(turns[-1]).count(url[-64:]) == 1
