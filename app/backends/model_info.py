"""What a backend says of the models it serves: as listed (``/v1/models``, Codex's
catalog), and their load at an instant (``/metrics``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """A served model, as listed, with what a client may count on from it."""

    id: str
    owned_by: str
    context_window: int | None = None
    images: bool = True
    """Whether an image in the input reaches the model (one that takes text only, an
    embedded model or an upstream that declares ``input_modalities = ["text"]``, is shown
    a note in its place); an upstream's model gets what is sent and decides."""
    lark_grammars: bool = False
    """Whether a ``custom`` tool's Lark grammar holds the model's calls of it (Codex's
    freeform ``apply_patch``); where it does not, such a tool is not offered."""
    status: str | None = None
    """An embedded model's ``ModelStatus`` (``unloaded``…``error``); ``None`` upstream."""


@dataclass(frozen=True, slots=True)
class ModelGauges:
    """One model's load at this instant, for ``/metrics``."""

    model: str
    slots: int
    slots_busy: int
    waiting: int
    up: bool = True
    """Its server runs and answers (not while it starts again after an exit)."""
    restarts: int = 0
    """Times its server exited on its own and was started again."""
    memory_mib: int = 0
    """What it is estimated to take, counted against ``ORS_MODEL_MEMORY_MIB``."""
