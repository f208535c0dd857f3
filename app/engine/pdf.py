"""A PDF read as text, for a model that reads only text: its text layer, page by page.

:func:`pdf_text` gives each page's text after a marker ``[Page 2 of 5]`` (a page with no
text says so), or, for a PDF whose pages hold no text at all (scanned images), one line
saying that it has N pages but no text layer, so the model can tell the user.

Limits (``max_pages``, ``max_chars``: the extracted text, markers not counted) bound the
work: the page count is read before any text, and extraction stops as soon as the text
passes ``max_chars``. Past a limit, ``strict`` refuses the PDF (:class:`PdfRefused`,
code ``file_too_many_pages`` or ``file_text_too_long``); otherwise the text is cut there,
with a marker saying what was left out. A PDF that cannot be parsed (``invalid_file``)
or that needs a password to be read (``file_encrypted``; one encrypted with an empty
user password, as most "protected" PDFs are, is read) is refused either way.

Parsing is CPU work linear in the file: callers on an event loop run this in a thread.
"""

from __future__ import annotations

import io
import logging

from pypdf import PasswordType, PdfReader

log = logging.getLogger("ors.pdf")

MAGIC = b"%PDF-"


class PdfRefused(Exception):
    """Why a PDF is not read: ``code`` (the error code of a 400) and a message for the client."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def is_pdf(data: bytes) -> bool:
    """Whether ``data`` is a PDF by its signature."""
    return data.startswith(MAGIC)


def pdf_text(data: bytes, *, max_pages: int, max_chars: int, strict: bool = True) -> str:
    """The text a model reads for the PDF ``data`` (see the module's docstring)."""
    reader = _open(data)
    try:
        count = len(reader.pages)
    except Exception as error:  # pypdf raises many kinds on hostile input; all mean "unreadable"
        raise _unreadable(error) from None
    if count == 0:
        return "[This PDF has no pages.]"
    if count > max_pages and strict:
        raise PdfRefused(
            f"The PDF has {count} pages; this server reads at most {max_pages} pages of a file "
            "(ORS_FILE_MAX_PAGES).", "file_too_many_pages")
    read = min(count, max_pages)
    pieces: list[str] = []
    total = 0
    cut = False
    for number in range(read):
        try:
            text = (reader.pages[number].extract_text() or "").strip()
        except Exception as error:
            raise _unreadable(error, page=number + 1) from None
        if total + len(text) > max_chars:
            if strict:
                raise PdfRefused(
                    f"The PDF's text is longer than {max_chars} characters (by page {number + 1}), the most "
                    "this server reads of a file (ORS_FILE_MAX_TEXT_CHARS).", "file_text_too_long")
            text, cut = text[: max_chars - total], True
        total += len(text)
        pieces.append(f"[Page {number + 1} of {count}]\n{text or '(no text on this page)'}")
        if cut:
            pieces.append(f"[... the text is cut here, on page {number + 1} of {count}: this server reads at "
                          f"most {max_chars} characters of a file ...]")
            break
    if total == 0:
        return (f"[This PDF has {count} page{'s' if count != 1 else ''} but no text layer (scanned images?): "
                "its content cannot be read by this model.]")
    if read < count and not cut:
        pieces.append(f"[... the rest, from page {read + 1} of {count}, is not read: this server reads at most "
                      f"{max_pages} pages of a file ...]")
    return "\n".join(pieces)


def _open(data: bytes) -> PdfReader:
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        encrypted = reader.is_encrypted
    except Exception as error:
        raise _unreadable(error) from None
    if encrypted:
        try:
            opened = reader.decrypt("")
        except Exception as error:  # e.g. an encryption scheme pypdf cannot open
            log.info("an encrypted PDF could not be opened: %s", error)
            opened = PasswordType.NOT_DECRYPTED
        if opened == PasswordType.NOT_DECRYPTED:
            raise PdfRefused("The PDF is encrypted: it cannot be read without its password.", "file_encrypted")
    return reader


def _unreadable(error: Exception, *, page: int | None = None) -> PdfRefused:
    where = f" (page {page})" if page is not None else ""
    log.info("a PDF could not be parsed%s: %s: %s", where, type(error).__name__, error)
    return PdfRefused(f"The file is not a readable PDF{where}: it could not be parsed.", "invalid_file")
