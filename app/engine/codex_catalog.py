"""Codex's model catalog: ``GET /v1/models?client_version=X.Y.Z``.

Codex reads what it knows of a model (its window, its tools, its modalities) from a
catalog in its own shape, ``{"models": [ModelInfo, ...]}`` (``ModelInfo`` of Codex's
``codex-rs/protocol/src/openai_models.rs``), which it fetches from ``{base_url}/models``
with its version as ``client_version`` (only with a login of OpenAI's or a provider whose
key comes from a command), or reads from the file its ``model_catalog_json`` setting
names (what ``ors codex`` writes). A model it finds in neither gets generic
metadata and a warning. The query parameter is the content negotiation: with it this
server answers in Codex's shape, without it in OpenAI's list shape, as before.

Each served model gets one entry (the fields of Codex 0.171's ``ModelInfo``; Codex
ignores fields it does not know):

* ``context_window`` is the window the model is served with, when the server knows it
  (an upstream's model may not say; the field is then left out), and
  ``auto_compact_token_limit`` :data:`AUTO_COMPACT_SHARE` of it, leaving room for the
  answer and for the summary a compaction writes;
* ``input_modalities`` is ``text`` alone for a model that cannot see images (the embedded
  ones), so Codex keeps images out of its requests; ``text`` and ``image`` otherwise;
* ``apply_patch_tool_type`` is ``freeform`` (Codex's ``apply_patch`` as a ``custom`` tool
  with a Lark grammar) only where the model is held to that grammar
  (:attr:`ModelInfo.lark_grammars`); elsewhere it is ``null``, and Codex offers no
  ``apply_patch`` (Codex 0.171 knows no other kind: ``function`` is refused), so files
  are edited through the shell tool;
* tool calls may be parallel (the server takes any number of calls per turn and
  enforces ``parallel_tool_calls: false`` when asked), Responses Lite is off (its
  internal tool carrier is no public API), and no reasoning levels are offered (none of
  the models reasons on request);
* the entries carry no instructions. Codex's instructions are Codex's, not this server's
  to serve, and Codex 0.171 refuses a catalog whose model has neither
  ``base_instructions`` nor ``model_messages.instructions_template`` (and, for a model it
  finds in no catalog, sends none at all): ``ors codex`` (:mod:`app.codex_launcher`)
  writes each entry's instructions from the installed Codex before Codex reads the file.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from app.backends.base import ModelInfo
from app.errors import InvalidRequest

AUTO_COMPACT_SHARE = 0.8
"""The share of a model's window after which Codex compacts the conversation."""
TOOL_OUTPUT_SHARE = 8
"""A tool's output is truncated by Codex to a window's ``1/TOOL_OUTPUT_SHARE``..."""
TOOL_OUTPUT_TOKENS = 10_000
"""... and to this many tokens at most (Codex's own default)."""
CLIENT_VERSION = re.compile(r"\d{1,9}\.\d{1,9}\.\d{1,9}(?:[-+][0-9A-Za-z.+-]{1,64})?")
"""A Codex version as Codex sends it (``0.171.0``, a pre-release ``0.172.0-alpha.1``)."""


def check_client_version(value: str) -> str:
    """``value`` if it is a version, else 400 with ``param: client_version``."""
    if not CLIENT_VERSION.fullmatch(value):
        raise InvalidRequest(
            f"client_version must be a version like 0.171.0, got {value[:80]!r}", param="client_version"
        )
    return value


def codex_catalog(models: Sequence[ModelInfo], default_model: str | None = None) -> dict[str, Any]:
    """The catalog of ``models``: ``default_model`` first (``priority`` 0, which Codex
    takes when it is given no model), then the others in the order given."""
    ordered = sorted(models, key=lambda info: info.id != default_model)
    return {"models": [codex_model(info, priority) for priority, info in enumerate(ordered)]}


def codex_model(info: ModelInfo, priority: int = 0) -> dict[str, Any]:
    """One ``ModelInfo`` of Codex's catalog for ``info``, without instructions."""
    window = info.context_window
    entry: dict[str, Any] = {
        "slug": info.id,
        "display_name": info.id,
        "description": f"{info.id}, served by ors" + ("" if info.owned_by == "ors" else f" from {info.owned_by}"),
        "supported_reasoning_levels": [],
        "shell_type": "unified_exec",
        "visibility": "list",
        "supported_in_api": True,
        "priority": priority,
        "availability_nux": None,
        "upgrade": None,
        "supports_reasoning_summaries": False,
        "default_reasoning_summary": "none",
        "support_verbosity": False,
        "default_verbosity": None,
        "apply_patch_tool_type": "freeform" if info.lark_grammars else None,
        "web_search_tool_type": "text",
        "truncation_policy": {"mode": "tokens", "limit": tool_output_limit(window)},
        "supports_parallel_tool_calls": True,
        "supports_image_detail_original": False,
        "experimental_supported_tools": [],
        "input_modalities": ["text", "image"] if info.images else ["text"],
        "supports_search_tool": False,
        "use_responses_lite": False,
        "include_skills_usage_instructions": False,
        "include_plugin_usage_instructions": False,
        "include_apps_usage_instructions": False,
    }
    if window is not None:
        entry["context_window"] = window
        entry["max_context_window"] = window
        entry["auto_compact_token_limit"] = int(window * AUTO_COMPACT_SHARE)
    return entry


def tool_output_limit(window: int | None) -> int:
    """Tokens of one tool's output Codex keeps in the conversation."""
    if window is None:
        return TOOL_OUTPUT_TOKENS
    return max(256, min(TOOL_OUTPUT_TOKENS, window // TOOL_OUTPUT_SHARE))
