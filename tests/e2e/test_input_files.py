"""Attached files against the real server: a PDF reaches a text-only model as its text,
page by page; one that cannot be read, or is over the limits, is a 400 naming its
``file_data`` before any generation, for a JSON and a streamed request alike; and the
embedded model answers from a PDF's text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.sync.client import connect

from app.backends.scripted import ScriptedBackend
from app.config import Settings
from app.main import create_app
from compliance import validate_ws_error
from tests.client import Client
from tests.conftest import QWEN
from tests.live import LiveServer
from tests.pdfs import data_url, encrypted_pdf, scanned_pdf, text_pdf

FACT = "The launch code is PELICAN-42."


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory, scripted: ScriptedBackend) -> Iterator[LiveServer]:
    """A server of the scripted models that reads at most 3 pages and 200 characters of a file."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("files"), file_max_pages=3, file_max_text_chars=200)
    server = LiveServer(create_app(settings, backends=[scripted])).start()
    yield server
    server.stop()


@pytest.fixture()
def small(small_server: LiveServer) -> Iterator[Client]:
    client = Client(small_server.url)
    yield client
    client.close()


def _ask(file_data: str, question: str = "What does it say?", name: str = "facts.pdf") -> list[dict[str, Any]]:
    return [{"role": "user", "content": [
        {"type": "input_text", "text": question},
        {"type": "input_file", "filename": name, "file_data": file_data},
    ]}]


def test_a_pdf_reaches_the_model_as_its_text_page_by_page(small: Client, scripted: ScriptedBackend) -> None:
    small.create(model="scripted-text", input=_ask(data_url(text_pdf(FACT, "Second page."))))
    seen = scripted.requests[-1].messages[-1].content
    assert seen == ("What does it say?\n[File facts.pdf]\n[Page 1 of 2]\nThe launch code is PELICAN-42.\n"
                    "[Page 2 of 2]\nSecond page.\n[End of file facts.pdf]")


def test_a_scanned_pdf_tells_the_model_it_has_no_text_layer(small: Client, scripted: ScriptedBackend) -> None:
    result = small.stream(model="scripted-text", input=_ask(data_url(scanned_pdf(2), "application/octet-stream")))
    assert result.final["status"] == "completed"
    assert "This PDF has 2 pages but no text layer" in scripted.requests[-1].messages[-1].content


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(
    ("data", "code"),
    [
        (data_url(text_pdf(FACT)[:400]), "invalid_file"),
        (data_url(encrypted_pdf(text_pdf(FACT), user_password="secret")), "file_encrypted"),
        (data_url(text_pdf("One.", "Two.", "Three.", "Four.")), "file_too_many_pages"),
        (data_url(text_pdf("A long line of text. " * 10)), "file_text_too_long"),
        (data_url(b"A plain text file. " * 11, "text/plain"), "file_text_too_long"),
    ],
    ids=["malformed", "encrypted", "pages", "pdf-text", "text-file"],
)
def test_a_file_that_cannot_be_read_is_a_400_before_any_generation(
    small: Client, scripted: ScriptedBackend, data: str, code: str, stream: bool
) -> None:
    before = len(scripted.requests)
    body = {"model": "scripted-text", "input": _ask("data:text/plain;base64,T0s=") + _ask(data), "stream": stream}
    error = small.error(body, 400)
    assert (error["code"], error["param"]) == (code, "input[1].content[1].file_data"), error
    assert len(scripted.requests) == before  # the model never saw it


def test_a_file_that_cannot_be_read_is_an_error_envelope_on_the_websocket(small_server: LiveServer) -> None:
    url = small_server.url.replace("http://", "ws://") + "/v1/responses"
    with connect(url, open_timeout=10) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "scripted-text",
                            "input": _ask(data_url(b"%PDF-1.4 cut"))}))
        envelope = json.loads(ws.recv(timeout=30))
        validate_ws_error(envelope)
        assert (envelope["error"]["code"], envelope["error"]["param"]) == ("invalid_file", "input[0].content[1].file_data")


def test_a_pdf_of_as_many_pages_as_the_limit_is_read_whole(small: Client, scripted: ScriptedBackend) -> None:
    small.create(model="scripted-text", input=_ask(data_url(text_pdf("One.", "Two.", "Three."))))
    assert "[Page 3 of 3]\nThree.\n[End of file facts.pdf]" in scripted.requests[-1].messages[-1].content


def test_compact_refuses_an_unreadable_pdf_too(small: Client) -> None:
    error = small.error({"model": "scripted-text", "input": _ask(data_url(b"%PDF-1.4 cut"))}, 400,
                        path="/v1/responses/compact")
    assert (error["code"], error["param"]) == ("invalid_file", "input[0].content[1].file_data")


def test_the_embedded_model_answers_from_a_pdf(client: Client) -> None:
    pdf = text_pdf("Mission notes for the crew.", FACT)
    question = "What is the launch code in the attached PDF? Reply with the code only."
    content = [{"type": "input_file", "filename": "mission.pdf", "file_data": data_url(pdf)},
               {"type": "input_text", "text": question}]
    response = client.create(model=QWEN, temperature=0, max_output_tokens=16, store=False,
                             input=[{"role": "user", "content": content}])
    answer = "".join(part["text"] for item in response["output"] if item["type"] == "message"
                     for part in item["content"] if part["type"] == "output_text")
    assert "PELICAN-42" in answer, answer
