"""Identifiers. Opaque, unique, and prefixed by kind as the spec's examples are."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    """``prefix`` + ``_`` + 24 random hex characters (96 bits), e.g. ``msg_3f2a…``."""
    return f"{prefix}_{secrets.token_hex(12)}"


def response_id() -> str:
    return new_id("resp")


def message_id() -> str:
    return new_id("msg")


def function_call_id() -> str:
    return new_id("fc")


def call_id() -> str:
    return new_id("call")


def reasoning_id() -> str:
    return new_id("rs")


def function_call_output_id() -> str:
    return new_id("fco")


def custom_tool_call_id() -> str:
    return new_id("ctc")


def custom_tool_call_output_id() -> str:
    return new_id("ctco")


def compaction_id() -> str:
    return new_id("cmp")
