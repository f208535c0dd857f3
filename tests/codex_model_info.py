"""What Codex 0.171 requires of a catalog entry (``ModelInfo``), to judge catalogs by.

Codex parses ``model_catalog_json`` (and a fetched catalog) with serde into its
``ModelInfo``, and refuses the whole catalog for one bad entry. These are the rules it
applies, established against the real Codex 0.171.0 (``codex debug models`` with a
catalog missing each field in turn, or holding a wrong type or an unknown variant):

* the keys without a default, which must be present (:data:`REQUIRED`); ``Option``
  fields may be absent or ``null``;
* the types of the fields it reads, and the variants of its enums (:data:`ENUMS`): an
  ``apply_patch_tool_type`` of ``function`` is refused (only ``freeform`` or ``null``);
* instructions: a model with neither a non-empty ``base_instructions`` nor a
  ``model_messages.instructions_template`` is refused.

Unknown keys are ignored. The tests marked ``codex`` check the same catalogs with the
real binary; this module lets the others judge a catalog without it.
"""

from __future__ import annotations

from typing import Any

REQUIRED = {
    "slug": str,
    "display_name": str,
    "supported_reasoning_levels": list,
    "shell_type": str,
    "visibility": str,
    "supported_in_api": bool,
    "priority": int,
    "support_verbosity": bool,
    "truncation_policy": dict,
    "experimental_supported_tools": list,
}
OPTIONAL = {
    "description": (str, type(None)),
    "default_reasoning_level": (str, type(None)),
    "availability_nux": (dict, type(None)),
    "upgrade": (dict, type(None)),
    "base_instructions": (str,),
    "model_messages": (dict, type(None)),
    "default_verbosity": (str, type(None)),
    "apply_patch_tool_type": (str, type(None)),
    "supports_parallel_tool_calls": (bool,),
    "supports_image_detail_original": (bool,),
    "context_window": (int, type(None)),
    "max_context_window": (int, type(None)),
    "auto_compact_token_limit": (int, type(None)),
    "effective_context_window_percent": (int,),
    "input_modalities": (list,),
    "supports_search_tool": (bool,),
    "use_responses_lite": (bool,),
    "include_skills_usage_instructions": (bool,),
    "include_plugin_usage_instructions": (bool,),
    "include_apps_usage_instructions": (bool,),
}
ENUMS = {
    "shell_type": {"default", "local", "shell_command", "unified_exec", "disabled"},
    "visibility": {"list", "hide", "none"},
    "apply_patch_tool_type": {"freeform", None},
    "web_search_tool_type": {"text", "text_and_image"},
    "default_reasoning_summary": {"auto", "concise", "detailed", "none"},
}
MODALITIES = {"text", "image", "audio"}
TRUNCATION_MODES = {"bytes", "tokens"}


def check_entry(entry: Any, *, instructions: bool) -> None:
    """Fail unless Codex 0.171 would take ``entry``; ``instructions``: whether it must
    carry them (a catalog as Codex reads it) or leave them out (as the server serves it)."""
    assert isinstance(entry, dict), entry
    slug = entry.get("slug")
    for key, kind in REQUIRED.items():
        assert key in entry, f"{slug}: {key} is required"
        assert isinstance(entry[key], kind) and not (kind is int and isinstance(entry[key], bool)), \
            f"{slug}: {key} must be a {kind.__name__}, not {entry[key]!r}"
    for key, kinds in OPTIONAL.items():
        if key in entry:
            value = entry[key]
            assert isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds), \
                f"{slug}: {key} must be one of {kinds}, not {value!r}"
    for key, variants in ENUMS.items():
        if key in entry:
            assert entry[key] in variants, f"{slug}: {key} {entry[key]!r} is none of {variants}"
    policy = entry["truncation_policy"]
    assert policy.get("mode") in TRUNCATION_MODES and isinstance(policy.get("limit"), int), policy
    assert set(entry.get("input_modalities", ["text"])) <= MODALITIES
    for level in entry["supported_reasoning_levels"]:
        assert isinstance(level.get("effort"), str) and isinstance(level.get("description"), str), level
    template = (entry.get("model_messages") or {}).get("instructions_template")
    carries = bool(entry.get("base_instructions")) or bool(template)
    assert carries == instructions, f"{slug}: instructions {'missing' if instructions else 'served'}"


def check_catalog(catalog: Any, *, instructions: bool = False) -> None:
    """Fail unless Codex 0.171 would take every entry of ``catalog`` (see :func:`check_entry`)."""
    assert isinstance(catalog, dict) and isinstance(catalog.get("models"), list), catalog
    slugs = [entry.get("slug") for entry in catalog["models"]]
    assert len(slugs) == len(set(slugs)), f"slugs repeat: {slugs}"
    for entry in catalog["models"]:
        check_entry(entry, instructions=instructions)
