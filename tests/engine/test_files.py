"""Attached files read as text: PDFs made here by fpdf2 (text layers), pages that hold
only an image (a scan), encrypted and cut PDFs; the limits; the 400s at admission."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from app.engine import files
from app.engine.context import build_messages, file_text
from app.engine.files import FileLimits, check_files, readable_text
from app.engine.pdf import PdfRefused, pdf_text
from app.engine.validation import parse_body
from app.errors import InvalidRequest
from app.protocol.content import InputFileParam
from app.protocol.responses import CreateResponseBody
from tests.pdfs import data_url, encrypted_pdf, scanned_pdf, text_pdf

FACTS = text_pdf("The launch code is PELICAN-42.", "", "The harbour opens at dawn.")
WIDE = FileLimits(max_pages=10, max_text_chars=10_000)

pytestmark = pytest.mark.anyio


def _read(data: bytes, **limits: Any) -> str:
    return pdf_text(data, **{"max_pages": 10, "max_chars": 10_000, **limits})


def _refusal(data: bytes, **limits: Any) -> PdfRefused:
    with pytest.raises(PdfRefused) as caught:
        _read(data, **limits)
    return caught.value


# ---------------------------------------------------------------- the PDF's text


def test_each_page_is_read_after_its_marker_in_order() -> None:
    text = _read(FACTS)
    assert text.splitlines() == [
        "[Page 1 of 3]", "The launch code is PELICAN-42.",
        "[Page 2 of 3]", "(no text on this page)",
        "[Page 3 of 3]", "The harbour opens at dawn.",
    ]


def test_a_scanned_pdf_says_it_has_pages_but_no_text_layer() -> None:
    text = _read(scanned_pdf(4))
    assert "4 pages but no text layer" in text and "[Page" not in text


def test_a_pdf_that_needs_a_password_is_refused_and_one_with_an_empty_user_password_is_read() -> None:
    assert _refusal(encrypted_pdf(FACTS, user_password="secret")).code == "file_encrypted"
    assert "PELICAN-42" in _read(encrypted_pdf(FACTS, user_password=""))


@pytest.mark.parametrize("data", [FACTS[: len(FACTS) // 2], b"%PDF-1.7\n" + bytes(range(256)) * 4, b"%PDF-"])
def test_a_pdf_that_cannot_be_parsed_is_refused(data: bytes) -> None:
    assert _refusal(data).code == "invalid_file"


def test_past_the_page_limit_strict_refuses_and_lenient_cuts_with_a_marker() -> None:
    refused = _refusal(FACTS, max_pages=2)
    assert refused.code == "file_too_many_pages" and "3 pages" in refused.message
    cut = _read(FACTS, max_pages=2, strict=False)
    assert "[Page 2 of 3]" in cut and "Page 3 of 3" not in cut and "dawn" not in cut
    assert cut.endswith("[... the rest, from page 3 of 3, is not read: this server reads at most 2 pages of a file ...]")
    assert _read(FACTS, max_pages=3) == _read(FACTS)  # at the limit: whole


def test_past_the_character_limit_strict_refuses_and_lenient_cuts_with_a_marker() -> None:
    whole = len("The launch code is PELICAN-42.The harbour opens at dawn.")  # markers not counted
    assert _read(FACTS, max_chars=whole) == _read(FACTS)
    refused = _refusal(FACTS, max_chars=whole - 1)
    assert refused.code == "file_text_too_long" and "page 3" in refused.message
    cut = _read(FACTS, max_chars=10, strict=False)
    assert cut.splitlines()[:2] == ["[Page 1 of 3]", "The launch"]
    assert "PELICAN" not in cut and "on page 1 of 3" in cut


# ---------------------------------------------------------------- files in a request


def _input(*parts: dict[str, Any], output: bool = False) -> list[object]:
    items: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "input_text", "text": "Read this."}, *parts]}]
    if output:
        items = [{"type": "function_call", "call_id": "c1", "name": "fetch", "arguments": "{}"},
                 {"type": "function_call_output", "call_id": "c1", "output": list(parts)}]
    return parse_body(CreateResponseBody, {"model": "m", "input": items}).input  # type: ignore[return-value]


def _file(data: str, name: str = "facts.pdf") -> dict[str, Any]:
    return {"type": "input_file", "filename": name, "file_data": data}


async def _admission_error(items: list[object], limits: FileLimits = WIDE) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        await check_files(items, limits)
    return caught.value


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (data_url(FACTS[:300]), "invalid_file"),
        (data_url(encrypted_pdf(FACTS, user_password="secret")), "file_encrypted"),
        (data_url(b"just some text, no PDF"), "invalid_file"),  # declared a PDF
        ("data:application/pdf;base64,%%%not-base64%%%", "invalid_base64"),
        (data_url(FACTS[:300], "application/octet-stream"), "invalid_file"),  # a PDF by its bytes
        (data_url(FACTS[:300], None), "invalid_file"),  # bare base64
    ],
)
async def test_a_pdf_that_cannot_be_read_is_a_400_naming_its_file_data(data: str, code: str) -> None:
    error = await _admission_error(_input(_file(data)))
    assert (error.code, error.param) == (code, "input[0].content[1].file_data")


async def test_a_file_in_a_tool_output_is_named_there() -> None:
    error = await _admission_error(_input(_file(data_url(b"%PDF-1.4 cut")), output=True))
    assert (error.code, error.param) == ("invalid_file", "input[1].output[0].file_data")


async def test_files_over_the_limits_are_400s_and_files_at_them_are_taken() -> None:
    limits = FileLimits(max_pages=2, max_text_chars=20)
    error = await _admission_error(_input(_file(data_url(FACTS))), limits)
    assert error.code == "file_too_many_pages" and "ORS_FILE_MAX_PAGES" in error.message
    error = await _admission_error(_input(_file(data_url(b"x" * 21, "text/plain"), "a.txt")), limits)
    assert (error.code, error.param) == ("file_text_too_long", "input[0].content[1].file_data")
    await check_files(_input(_file(data_url(b"x" * 20, "text/plain"), "a.txt"),
                             _file(data_url(text_pdf("Short.", "Shorter.")))), limits)


async def test_what_is_not_text_is_not_refused() -> None:
    await check_files(_input(_file(data_url(b"\x89PNG\r\n\x1a\n", "image/png"), "a.png"),
                             _file(data_url(b"\xff\xfe", "text/plain"), "bad.txt"),
                             _file("not base64 at all", "raw.txt")), WIDE)
    await check_files("just text", WIDE)


async def test_the_conversation_reads_the_pdf_in_its_frame_and_parses_it_once(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    parsed: list[bytes] = []

    def counting(data: bytes, **options: Any) -> str:
        parsed.append(data)
        return pdf_text(data, **options)

    monkeypatch.setattr(files, "pdf_text", counting)
    fresh = text_pdf("The launch code is PELICAN-42.", "Checked once.")
    items = _input(_file(data_url(fresh)))
    await check_files(items, WIDE)
    (message,) = build_messages(None, items)
    assert message.content == ("Read this.\n[File facts.pdf]\n[Page 1 of 2]\nThe launch code is PELICAN-42.\n"
                               "[Page 2 of 2]\nChecked once.\n[End of file facts.pdf]")
    assert len(parsed) == 1


async def test_a_pdf_read_with_no_kept_extract_is_read_within_the_default_limits() -> None:
    pages = [f"Page number {n}." for n in range(files.DEFAULT_MAX_PAGES + 2)]
    text = readable_text(data_url(text_pdf(*pages)))
    assert text is not None and f"[Page {files.DEFAULT_MAX_PAGES} of {len(pages)}]" in text
    assert f"from page {files.DEFAULT_MAX_PAGES + 1} of {len(pages)}, is not read" in text


def test_a_file_that_is_not_readable_as_text_is_a_marker() -> None:
    for data in (data_url(b"%PDF-1.4 cut"), data_url(encrypted_pdf(FACTS, user_password="pw")),
                 data_url(b"\x00\x01", "application/octet-stream")):
        text = file_text(InputFileParam(type="input_file", filename="x.pdf", file_data=data))
        assert text == "[A file (x.pdf) was attached here. Its content is not readable as text by this model.]"


def test_text_files_read_as_before() -> None:
    encoded = base64.b64encode("Die Glocke läutet.".encode()).decode()
    for data in (f"data:text/plain;base64,{encoded}", encoded, f"data:application/json;base64,{encoded}"):
        text = file_text(InputFileParam(type="input_file", filename="n.txt", file_data=data))
        assert text == "[File n.txt]\nDie Glocke läutet.\n[End of file n.txt]"
