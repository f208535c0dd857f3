"""Real PDFs made in the tests: text layers written by fpdf2, pages that hold only an
image (as a scan does), and encryption by pypdf's writer."""

from __future__ import annotations

import base64
import io

from fpdf import FPDF
from PIL import Image
from pypdf import PdfReader, PdfWriter


def text_pdf(*pages: str) -> bytes:
    """A PDF of one page per text, each with that text in its text layer (an empty text:
    a page with no text)."""
    pdf = FPDF()
    pdf.set_font("Helvetica", size=12)
    for text in pages:
        pdf.add_page()
        if text:
            pdf.multi_cell(0, 8, text)
    return bytes(pdf.output())


def scanned_pdf(pages: int) -> bytes:
    """A PDF whose pages each hold an image and no text at all."""
    picture = Image.new("L", (64, 32), color=200)
    pdf = FPDF()
    for _ in range(pages):
        pdf.add_page()
        pdf.image(picture, x=10, y=10, w=180)
    return bytes(pdf.output())


def encrypted_pdf(data: bytes, *, user_password: str, owner_password: str = "owner") -> bytes:
    """``data`` encrypted (AES-256); an empty ``user_password`` opens it without one."""
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(data)))
    writer.encrypt(user_password=user_password, owner_password=owner_password, algorithm="AES-256")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def data_url(data: bytes, media_type: str | None = "application/pdf") -> str:
    """``data`` as ``file_data``: a base64 data URL, or the bare base64 without a media type."""
    payload = base64.b64encode(data).decode()
    return f"data:{media_type};base64,{payload}" if media_type else payload
