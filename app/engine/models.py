"""Which backend serves a model id."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from app.backends.base import Backend, ModelInfo
from app.errors import ModelNotFound


class ModelRouter:
    """Routes a model id to the first backend that serves it, in the order given
    (local backends first, the upstream last, so local ids are never sent upstream).

    ``aliases`` map other names onto served ids (``gpt-4o-mini`` → the default local
    model): a request for an alias runs on its target, and the response echoes the name
    the client asked for; ``/v1/models`` lists the aliases beside their targets."""

    def __init__(
        self, backends: Sequence[Backend], default_model: str, aliases: Mapping[str, str] | None = None
    ) -> None:
        self.backends = list(backends)
        self.default_model = default_model
        self.aliases = dict(aliases or {})

    def resolve(self, model: str | None) -> tuple[str, Backend]:
        """The served model id (an alias's target) and its backend, or 404
        ``model_not_found``."""
        name = model or self.default_model
        name = self.aliases.get(name, name)
        for backend in self.backends:
            if backend.serves(name):
                return name, backend
        known = ", ".join(info.id for info in self.models()) or "none"
        raise ModelNotFound(
            f"The model '{name}' does not exist or is not served here. Models served: {known}.",
            param="model",
        )

    def models(self) -> list[ModelInfo]:
        """The models known without asking anyone (for error messages)."""
        return _unique(info for backend in self.backends for info in backend.models())

    async def available_models(self) -> list[ModelInfo]:
        """Every model served, upstream ones included, then the aliases (for ``/v1/models``)."""
        found: list[ModelInfo] = []
        for backend in self.backends:
            found += await backend.available_models()
        served = {info.id: info for info in found}
        for alias, target in self.aliases.items():
            if target in served:
                found.append(replace(served[target], id=alias))
        return _unique(found)


def _unique(infos: Iterable[ModelInfo]) -> list[ModelInfo]:
    seen: dict[str, ModelInfo] = {}
    for info in infos:
        seen.setdefault(info.id, info)
    return list(seen.values())
