"""Base classes shared by every wire model.

Two kinds of models live in this package:

* **Params** (what clients send) are parsed leniently where the spec and real clients
  demand it and strictly elsewhere: unknown fields inside items are rejected.
* **Fields** (what the server emits) are serialized exactly as the spec requires.
  A required-but-nullable field is always written (``"x": null``); an optional field
  listed in ``omit_if_none`` is left out when it is ``None``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict


class WireModel(BaseModel):
    """A model the server emits. See the module docstring for the ``None`` rule.

    The rule is applied by pydantic-core itself (each listed field gets ``exclude_if``),
    not by a Python serializer around every model: a response serializes with no call
    back into Python, which matters at one serialization per streamed event."""

    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    omit_if_none: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if not cls.omit_if_none:
            return
        for name in cls.omit_if_none:
            cls.model_fields[name].exclude_if = _is_none
        cls.model_rebuild(force=True)


def _is_none(value: Any) -> bool:
    return value is None


class ParamModel(BaseModel):
    """A model clients send: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid")
