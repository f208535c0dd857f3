"""Attached files (``input_file``) as the text a model that reads only text is given.

A part's ``file_data`` (base64: a ``data:<media type>;base64,<payload>`` URL, or the bare
payload) is read as

* a PDF when it declares ``application/pdf`` or its bytes begin ``%PDF-``: its text
  layer, page by page (:mod:`app.engine.pdf`);
* text when it declares a text media type (``text/*``, JSON, XML, YAML) or none, and its
  bytes are UTF-8;
* nothing otherwise: the conversation says a file was attached that this model cannot
  read (:func:`app.engine.context.file_text`).

At admission, :func:`check_files` reads each part under the server's :class:`FileLimits`
(``ORS_FILE_MAX_PAGES``, ``ORS_FILE_MAX_TEXT_CHARS``), before any model sees the request.
Each failure is a 400 whose ``param`` is the part's ``file_data``
(``input[2].content[1].file_data``): a PDF with more pages than the limit
(``file_too_many_pages``), a file whose text is longer than the limit
(``file_text_too_long``; a PDF's is counted without its page markers), a PDF that cannot
be parsed or a declared PDF that is not one (``invalid_file``), one that needs a password
(``file_encrypted``), or a declared PDF whose payload is not base64 (``invalid_base64``).
As OpenAI's API does with its own page and size limits, nothing is cut silently: a file
is read whole or refused.

PDF extracts made at admission are kept (by a digest of ``file_data``; the least recently
used go first) so the conversation built right after reads them without parsing again
(:func:`readable_text`). A PDF read with no kept extract (one from earlier in a chain,
rebuilt from the store) is parsed again within the default limits, cut past them with a
marker saying what was left out; one that cannot be read becomes the marker. Parsing at
admission runs on a worker thread, as does decoding a large payload.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from app.engine.images import input_parts
from app.engine.pdf import MAGIC, PdfRefused, is_pdf, pdf_text
from app.errors import InvalidRequest
from app.protocol.content import InputFileParam

DEFAULT_MAX_PAGES = 100
DEFAULT_MAX_TEXT_CHARS = 100_000
TEXT_MEDIA_PREFIXES = ("text/", "application/json", "application/xml", "application/x-yaml")
PDF_MEDIA_TYPE = "application/pdf"

_INLINE_DECODE_CHARS = 256 * 1024
_KEPT_EXTRACTS = 64
_KEPT_CHARS = 8_000_000


@dataclass(frozen=True, slots=True)
class FileLimits:
    """How much of one attached file is read (each past it a 400 at admission)."""

    max_pages: int = DEFAULT_MAX_PAGES
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS


async def check_files(items: object, limits: FileLimits) -> None:
    """Raise ``InvalidRequest`` for the first attached file of ``items`` (a request's
    parsed ``input``: a string or a list of items) that cannot be read within ``limits``,
    in document order; keep the PDF extracts made."""
    if not isinstance(items, list):
        return
    for param, data in _file_data(items):
        if len(data) > _INLINE_DECODE_CHARS or _is_pdf_data(data):
            await asyncio.to_thread(_read, data, limits, param)
        else:
            _read(data, limits, param)


def readable_text(file_data: str) -> str | None:
    """The text a model reads for ``file_data``, or ``None`` when it is not readable as
    text (the module's docstring). Never raises."""
    return _read(file_data, FileLimits(), None)


def split_data_url(data: str) -> tuple[str | None, str]:
    """The media type of a ``data:`` URL (lower case; ``None`` if it names none) and its
    payload; bare data has no media type."""
    if data.startswith("data:") and "," in data:
        header, payload = data[5:].split(",", 1)
        return header.split(";", 1)[0].strip().lower() or None, payload
    return None, data


def _file_data(items: list[object]) -> Iterator[tuple[str, str]]:
    for where, part in input_parts(items):
        if isinstance(part, InputFileParam) and part.file_data:
            yield f"{where}.file_data", part.file_data


def _is_pdf_data(file_data: str) -> bool:
    media, payload = split_data_url(file_data)
    if media == PDF_MEDIA_TYPE:
        return True
    head = payload.lstrip()[:8]  # two base64 quanta: six bytes
    try:
        return base64.b64decode(head, validate=True).startswith(MAGIC)
    except (binascii.Error, ValueError):
        return False


def _read(file_data: str, limits: FileLimits, param: str | None) -> str | None:
    """The file's text; with a ``param``, a 400 naming it for what cannot be read within
    ``limits``, else ``None`` for that (or the text cut past the limits)."""
    if _is_pdf_data(file_data):
        return _read_pdf(file_data, limits, param)
    media, payload = split_data_url(file_data)
    if media is not None and not media.startswith(TEXT_MEDIA_PREFIXES):
        return None
    try:
        text = base64.b64decode(payload, validate=True).decode("utf-8")
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    if len(text) > limits.max_text_chars:
        if param is not None:
            raise InvalidRequest(
                f"The file's text is {len(text)} characters long; this server reads at most "
                f"{limits.max_text_chars} characters of a file (ORS_FILE_MAX_TEXT_CHARS).",
                code="file_text_too_long", param=param,
            )
        text = text[: limits.max_text_chars] + "\n[... file truncated ...]"
    return text


def _read_pdf(file_data: str, limits: FileLimits, param: str | None) -> str | None:
    key = hashlib.blake2b(file_data.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    kept = _kept.get(key)
    if kept is not None and (param is None or kept[0] == limits):
        return kept[1]
    _, payload = split_data_url(file_data)
    try:
        data = base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError):
        if param is None:
            return None
        raise InvalidRequest("The file_data is not valid base64.", code="invalid_base64", param=param) from None
    if not is_pdf(data):
        if param is None:
            return None
        raise InvalidRequest("The file_data declares application/pdf, but its data is not a PDF.",
                             code="invalid_file", param=param)
    try:
        text = pdf_text(data, max_pages=limits.max_pages, max_chars=limits.max_text_chars, strict=param is not None)
    except PdfRefused as refused:
        if param is None:
            return None
        raise InvalidRequest(refused.message, code=refused.code, param=param) from None
    if param is not None:
        _kept.put(key, limits, text)
    return text


class _Kept:
    """PDF extracts by digest, with the limits they were read within: at most
    ``_KEPT_EXTRACTS`` of them and ``_KEPT_CHARS`` characters, least recently used out.
    Shared by the event loop and worker threads."""

    def __init__(self) -> None:
        self._entries: OrderedDict[bytes, tuple[FileLimits, str]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def get(self, key: bytes) -> tuple[FileLimits, str] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: bytes, limits: FileLimits, text: str) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._chars -= len(old[1])
            self._entries[key] = (limits, text)
            self._chars += len(text)
            while len(self._entries) > _KEPT_EXTRACTS or (self._chars > _KEPT_CHARS and len(self._entries) > 1):
                _, (_, dropped) = self._entries.popitem(last=False)
                self._chars -= len(dropped)


_kept = _Kept()
