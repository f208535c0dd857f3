"""Which backend serves a model id."""

from __future__ import annotations

from collections.abc import Sequence

from app.backends.base import Backend, ModelInfo
from app.errors import ModelNotFound


class ModelRouter:
    """Routes a model id to the first backend that serves it, in the order given
    (local backends first, the upstream last, so local ids are never sent upstream)."""

    def __init__(self, backends: Sequence[Backend], default_model: str) -> None:
        self.backends = list(backends)
        self.default_model = default_model

    def resolve(self, model: str | None) -> tuple[str, Backend]:
        """The resolved model id and its backend, or 404 ``model_not_found``."""
        name = model or self.default_model
        for backend in self.backends:
            if backend.serves(name):
                return name, backend
        known = ", ".join(info.id for info in self.models()) or "none"
        raise ModelNotFound(
            f"The model '{name}' does not exist or is not served here. Models served: {known}.",
            param="model",
        )

    def models(self) -> list[ModelInfo]:
        seen: dict[str, ModelInfo] = {}
        for backend in self.backends:
            for info in backend.models():
                seen.setdefault(info.id, info)
        return list(seen.values())
