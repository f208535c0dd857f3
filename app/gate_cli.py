"""``ors gate LOG [--tools TOOLS.json]``: the replay gate, offline, over a logged item list.

Run it on a conversation log before replaying it (to this server or another provider).
``LOG`` (``-`` for standard input) is a JSON array of items, a JSONL file (one item a
line), a request body (its ``input``, and its ``tools`` unless ``--tools`` is given) or a
response (its ``output``, and its ``tools``). ``TOOLS.json`` is a JSON array of function
tool definitions, or an object with a ``tools`` array.

Prints one line per ``function_call`` and ``function_call_output``, and one per other
finding (a Chat Completions message, a non-object entry, a tool whose schema is invalid):
``<path> <kind> [<call_id>] [<name>] ok`` or ``... <reason>: <message>``; then a summary
on standard error. The checks are the server's. A call to a function that no tool
defines is reported as ``unknown_tool`` either way; with ``--unknown-tool accept`` (the
server's default, ``ORS_GATE_UNKNOWN_TOOL``) the line reads ``unknown_tool (accepted)``
and does not fail the log, with ``--unknown-tool reject`` it does. Unlike the server, a
failing ``function_call`` fails the log even when nothing answers it. Exit status: 0
when every line is ``ok`` or accepted, 1 when a check fails, 2 when a file cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from app.engine.gate import Finding, UnknownToolPolicy, check_items

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_UNREADABLE = 2


class Unreadable(Exception):
    """A file that holds no item list (or tool list) the gate can check."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", metavar="LOG", help="JSON array, JSONL, request or response of items ('-' for stdin)")
    parser.add_argument("--tools", metavar="TOOLS.json", help="JSON array of function tool definitions")
    parser.add_argument(
        "--unknown-tool", choices=("accept", "reject"), default="accept",
        help="a call of a function no tool defines: reported and accepted (default, as the server's "
             "ORS_GATE_UNKNOWN_TOOL), or reported as a failure",
    )


def run(args: argparse.Namespace) -> int:
    return check_log(args.log, args.tools, out=sys.stdout, err=sys.stderr, unknown_tool=args.unknown_tool)


def check_log(
    log: str, tools_file: str | None, *, out: TextIO, err: TextIO, unknown_tool: UnknownToolPolicy = "accept"
) -> int:
    """Check ``log`` against the tools of ``tools_file`` (or the log's own), print the
    findings to ``out`` and the summary to ``err``; the exit status."""
    try:
        items, paths, log_tools = read_log(_read_text(log))
        tools = read_tools(_read_text(tools_file)) if tools_file is not None else log_tools
    except Unreadable as exc:
        print(f"ors gate: {exc}", file=err)
        return EXIT_UNREADABLE
    findings = check_items(items, tools=tools, paths=paths, unknown_tool=unknown_tool)
    accept = unknown_tool == "accept"
    for finding in findings:
        print(format_finding(finding, accepted=accept and finding.undefined_tool), file=out)
    failed = sum(1 for finding in findings if not finding.ok and not (accept and finding.undefined_tool))
    if not findings:
        print("ors gate: no function calls or outputs to check", file=err)
    else:
        print(f"ors gate: {len(findings)} checked, {failed} failed", file=err)
    return EXIT_FAILED if failed else EXIT_OK


def format_finding(finding: Finding, *, accepted: bool = False) -> str:
    words = [finding.param, finding.kind]
    words += [word for word in (finding.call_id, finding.name) if word]
    reason = f"{finding.reason} (accepted)" if accepted else str(finding.reason)
    verdict = "ok" if finding.ok else f"{reason}: {' '.join(finding.message.split())}"
    return f"{' '.join(words)} {verdict}"


def read_log(text: str) -> tuple[list[Any], list[str], list[Any]]:
    """The items of a log, the path of each, and the tools the log itself carries."""
    document = _parse_json_or_jsonl(text)
    if isinstance(document, list):
        return document, [f"input[{index}]" for index in range(len(document))], []
    if isinstance(document, dict) and _is_envelope(document):
        items: list[Any] = []
        paths: list[str] = []
        for key in ("input", "output"):
            value = document.get(key)
            if isinstance(value, list):
                items += value
                paths += [f"{key}[{index}]" for index in range(len(value))]
            elif value is not None and not (key == "input" and isinstance(value, str)):
                raise Unreadable(f"LOG's {key!r} is {type(value).__name__}, not a list of items")
        tools = document.get("tools")
        return items, paths, tools if isinstance(tools, list) else []
    if isinstance(document, dict):
        return [document], ["input[0]"], []
    raise Unreadable(f"LOG holds {type(document).__name__} JSON, not a list of items")


def read_tools(text: str) -> list[Any]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise Unreadable(f"TOOLS is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if isinstance(document, dict) and isinstance(document.get("tools"), list):
        return list(document["tools"])
    if isinstance(document, dict) and "name" in document:
        return [document]
    if isinstance(document, list):
        return document
    raise Unreadable("TOOLS must be a JSON array of tool definitions, or an object with a 'tools' array")


def _is_envelope(document: dict[str, Any]) -> bool:
    """A request or response body rather than an item: no item ``type``/``role``, and an
    ``input`` or ``output``."""
    if "type" in document or "role" in document:
        return False
    return "input" in document or "output" in document


def _parse_json_or_jsonl(text: str) -> Any:
    if not text.strip():
        raise Unreadable("LOG is empty")
    try:
        return json.loads(text)
    except json.JSONDecodeError as whole:
        whole_error = f"{whole.msg} at line {whole.lineno} column {whole.colno}"
        lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
        if len(lines) < 2:
            raise Unreadable(f"LOG is not valid JSON: {whole_error}") from None
    items = []
    for number, line in lines:
        try:
            items.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise Unreadable(
                f"LOG is neither JSON ({whole_error}) nor JSONL (line {number}: {exc.msg} at column {exc.colno})"
            ) from None
    return items


def _read_text(name: str) -> str:
    try:
        data = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
    except OSError as exc:
        raise Unreadable(f"cannot read {name}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise Unreadable(f"{name} is not UTF-8 text") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ors gate", description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
