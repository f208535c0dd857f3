"""The HTTP error body ``{"error": {type, code, param, message}}``."""

from __future__ import annotations

from app.protocol.base import WireModel
from app.protocol.events import ErrorPayload


class ErrorBody(WireModel):
    error: ErrorPayload
