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

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer


class WireModel(BaseModel):
    """A model the server emits. See the module docstring for the ``None`` rule."""

    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    omit_if_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _drop_optional_nones(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if self.omit_if_none and isinstance(data, dict):
            for name in self.omit_if_none:
                if name in data and data[name] is None:
                    del data[name]
        return data


class ParamModel(BaseModel):
    """A model clients send: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid")
