"""Tool names as strict upstreams take them, and back.

OpenAI's APIs (and servers that copy their validation) take a function's name only when
it matches ``^[a-zA-Z0-9_-]{1,64}$``. A name this server offers may not: the request's
validation holds each name to those characters, but the flat name of a namespace tool's
function (``namespace__name``, see :mod:`app.protocol.tools`) can pass 64 characters
(Codex names MCP tools ``mcp__<server>__<tool>``). Such a name goes on the wire as
:func:`wire_name` makes it: cut to fit (any character a strict upstream refuses would
become ``_``), and a hash of the whole name appended, so two names never meet; a name
that already fits goes as it is. The adapters (:mod:`app.backends.chat_completions`,
:mod:`app.backends.responses_upstream`) use the wire name for the tools they offer, a
named ``tool_choice`` and the calls they replay, and turn a call's wire name back
(:func:`names_back`, :func:`restored`), so nothing past the adapter ever sees one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence

from app.backends.base import Delta, ToolCallDelta, ToolSearchOutputDelta, ToolSpec

MAX_LENGTH = 64
HASH_LENGTH = 12
"""Hex digits of SHA-256 kept: 48 bits, so two names of one request never collide."""
_FITS = re.compile(r"[A-Za-z0-9_-]{1,64}")
_REFUSED = re.compile(r"[^A-Za-z0-9_-]")


def wire_name(name: str) -> str:
    """``name`` if a strict upstream takes it; otherwise its allowed characters (others
    as ``_``), cut to 51, then ``_`` and 12 hex digits of its SHA-256: 64 characters
    that still read as the name."""
    if _FITS.fullmatch(name):
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_LENGTH]
    return f"{_REFUSED.sub('_', name)[: MAX_LENGTH - HASH_LENGTH - 1]}_{digest}"


def names_back(tools: Sequence[ToolSpec]) -> dict[str, str]:
    """Each wire name that differs from its tool's name, to that name (empty when every
    name goes as it is, the usual case)."""
    return {wire: tool.name for tool in tools if (wire := wire_name(tool.name)) != tool.name}


def restored(delta: Delta, back: Mapping[str, str]) -> Delta:
    """``delta`` with a call's wire name (or those a tool search loaded) turned back into
    the tool's name."""
    if isinstance(delta, ToolCallDelta) and delta.name in back:
        return dataclasses.replace(delta, name=back[delta.name])
    if isinstance(delta, ToolSearchOutputDelta) and any(name in back for name in delta.names):
        return dataclasses.replace(delta, names=tuple(back.get(name, name) for name in delta.names))
    return delta
