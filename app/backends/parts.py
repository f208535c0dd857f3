"""The content of a message, part by part: what a client attached (images, files) kept in
its place among the text, for the backends that can take it as it came.

The engine (:mod:`app.engine.context`) makes a message's parts only when it holds an image
or a file; each part carries ``text``, what a model that cannot take it is shown instead
(the marker of an image, a file's text or the marker of a binary file), so
:attr:`app.backends.base.ChatMessage.content` is always the text rendering of the parts.
Which rendering a backend sends is its own choice, per model
(:meth:`~app.backends.base.Backend.takes_images`):

* the embedded models, and an upstream (or one of its models) declared
  ``input_modalities = ["text"]``: the text (markers and file text);
* a Chat Completions upstream: an image as an ``image_url`` part (its URL and ``detail``
  exactly as given; an image known by ``file_id`` only stays a marker), a file as a
  ``file`` part where its dialect says it takes them (``file_parts``), else its text;
* a Responses upstream: ``input_image`` and ``input_file`` parts as they came.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

InputModality = Literal["text", "image"]
TEXT_AND_IMAGES: tuple[InputModality, ...] = ("text", "image")
"""What an upstream takes unless it declares otherwise (``input_modalities``)."""


@dataclass(frozen=True, slots=True)
class TextPart:
    """Text of a message (an ``input_text``, ``output_text`` or ``refusal`` part, or the
    marker of content no backend takes, such as a video)."""

    text: str


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An ``input_image`` as the client sent it: its ``image_url`` (a data URL or an
    http(s) URL, exactly as given) or ``file_id``, and its ``detail``."""

    image_url: str | None
    file_id: str | None
    detail: str | None
    text: str
    """What a model that cannot take the image is shown in its place (a marker)."""
    param: str | None = None
    """Where the client sent it (``input[2].content[1]``), or ``None`` for a part of an
    earlier response of the chain (``previous_response_id``): what an upstream's error
    about it is mapped back to (:mod:`app.backends.media_params`)."""


@dataclass(frozen=True, slots=True)
class FilePart:
    """An ``input_file`` as the client sent it (``file_data`` a data URL or base64, as
    given; or ``file_url`` or ``file_id``; ``filename``)."""

    filename: str | None
    file_data: str | None
    file_url: str | None
    file_id: str | None
    text: str
    """What a model that cannot take the file is shown in its place: its text, when it
    has one, else a marker."""
    param: str | None = None
    """As :attr:`ImagePart.param`."""


ContentPart = TextPart | ImagePart | FilePart

