"""Images in the input are checked before any model sees the request.

An ``input_image`` (in a message, or in a ``function_call_output``'s output) carries its
image as a URL. What is checked, each failure a 400 whose ``param`` is the part's
``image_url`` (``input[2].content[1].image_url``):

* the URL is ``http(s)://…`` or a ``data:`` URL (code ``invalid_image_url``); a part
  with neither ``image_url`` nor ``file_id`` has no image at all;
* a data URL is ``data:<media type>;base64,<payload>``, with a media type of a format a
  vision model takes (PNG, JPEG, GIF, WebP; code ``invalid_image_format``), and a payload
  that is valid base64 (``invalid_base64``), at most ``max_bytes`` once decoded
  (``image_too_large``), and whose bytes are an image of the declared format by its
  signature (``invalid_image``).

A remote URL is not fetched here (the server fetches nothing on a client's behalf).
Decoding is linear in the payload; payloads past ``_INLINE_DECODE_CHARS`` are decoded on a
worker thread so the event loop never stalls on a large image.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from app.errors import InvalidRequest
from app.protocol.content import InputImageParam
from app.protocol.items import CustomToolCallOutputParam, FunctionCallOutputParam

DEFAULT_MAX_IMAGE_BYTES = 20 * 1024 * 1024

_INLINE_DECODE_CHARS = 256 * 1024

_FORMATS: dict[str, str] = {
    "image/png": "PNG",
    "image/jpeg": "JPEG",
    "image/jpg": "JPEG",
    "image/gif": "GIF",
    "image/webp": "WebP",
}


@dataclass(frozen=True, slots=True)
class _DataImage:
    param: str
    media_type: str
    payload: str


def sniff(data: bytes) -> str | None:
    """The image format of ``data`` by its signature (magic bytes), or ``None``."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR":
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WebP"
    return None


async def check_images(items: object, *, max_bytes: int = DEFAULT_MAX_IMAGE_BYTES) -> None:
    """Raise ``InvalidRequest`` for the first bad image of ``items`` (a request's parsed
    ``input``: a string or a list of items), in document order."""
    if not isinstance(items, list):
        return
    for image in _data_images(_image_parts(items)):
        if len(image.payload) > _INLINE_DECODE_CHARS:
            await asyncio.to_thread(_check_data_image, image, max_bytes)
        else:
            _check_data_image(image, max_bytes)


def input_parts(items: list[object]) -> Iterator[tuple[str, object]]:
    """Every content part of the input's messages and tool outputs, with its path
    (``input[i].content[j]``, ``input[i].output[j]``)."""
    for index, item in enumerate(items):
        parts: object
        if isinstance(item, FunctionCallOutputParam | CustomToolCallOutputParam):
            parts, where = item.output, f"input[{index}].output"
        else:
            parts, where = getattr(item, "content", None), f"input[{index}].content"
        if isinstance(parts, list):
            for number, part in enumerate(parts):
                yield f"{where}[{number}]", part


def _image_parts(items: list[object]) -> Iterator[tuple[str, InputImageParam]]:
    return ((where, part) for where, part in input_parts(items) if isinstance(part, InputImageParam))


def _data_images(parts: Iterable[tuple[str, InputImageParam]]) -> Iterator[_DataImage]:
    """Each part's URL checked for its shape; the data URLs, split, for decoding."""
    for where, part in parts:
        param = f"{where}.image_url"
        url = part.image_url
        if url is None:
            if part.file_id is None:
                raise InvalidRequest(
                    "This input_image has neither an image_url nor a file_id.",
                    code="missing_required_parameter", param=param,
                )
            continue
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        if scheme in ("http", "https"):
            if not url.split(":", 1)[1].startswith("//") or len(url) <= len(scheme) + 3:
                raise InvalidRequest(f"The image_url is not a valid {scheme} URL.", code="invalid_image_url",
                                     param=param)
            continue
        if scheme != "data":
            raise InvalidRequest(
                "The image_url must be an http(s) URL or a data URL (data:image/png;base64,...).",
                code="invalid_image_url", param=param,
            )
        header, comma, payload = url[5:].partition(",")
        media_type, *options = header.split(";")
        if not comma or "base64" not in (option.strip().lower() for option in options):
            raise InvalidRequest(
                "An image data URL must be base64-encoded: data:image/png;base64,<data>.",
                code="invalid_image_url", param=param,
            )
        media_type = media_type.strip().lower()
        if media_type not in _FORMATS:
            shown = repr(media_type) if media_type else "no media type"
            raise InvalidRequest(
                f"The image data URL declares {shown}; supported image types are image/png, image/jpeg, "
                "image/gif and image/webp.",
                code="invalid_image_format", param=param,
            )
        yield _DataImage(param, media_type, payload)


def _check_data_image(image: _DataImage, max_bytes: int) -> None:
    payload = "".join(image.payload.split())
    if len(payload) // 4 * 3 > max_bytes + 2:
        raise _too_large(image, max_bytes)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(
            "The image data URL's payload is not valid base64.", code="invalid_base64", param=image.param
        ) from None
    if not data:
        raise InvalidRequest("The image data URL holds no data.", code="invalid_image", param=image.param)
    if len(data) > max_bytes:
        raise _too_large(image, max_bytes)
    declared, found = _FORMATS[image.media_type], sniff(data)
    if found != declared:
        what = f"a {found} image" if found else "not an image of any supported format"
        raise InvalidRequest(
            f"The image data URL declares {image.media_type}, but its data is {what}.",
            code="invalid_image", param=image.param,
        )


def _too_large(image: _DataImage, max_bytes: int) -> InvalidRequest:
    return InvalidRequest(
        f"The image is larger than {max_bytes} bytes, the most this server takes per image.",
        code="image_too_large", param=image.param,
    )
