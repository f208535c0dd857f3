"""Run the acceptance suite against an Open Responses server.

    python -m compliance --base-url http://127.0.0.1:8080/v1 --model smollm2-135m-instruct [--api-key KEY]

Prints one line per check (``PASS name``, ``FAIL name: reason``, ``SKIP name: reason``)
and exits with status 1 when any check fails, 0 otherwise. ``--report FILE`` also writes
the run as JSON (the endpoint, the model, when, each check's status, reason, JSON path of
the violation and seconds, and the counts), one file per endpoint, for publishing a
pass/fail index. ``--json`` prints that record on standard output instead of the lines,
with every check's requests and what the server answered; ``--html FILE`` writes the same
as one self-contained page. The same command is ``ors check``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compliance import (
    http_checks,  # noqa: F401 - registers the HTTP checks
    ws_checks,  # noqa: F401 - registers the WebSocket checks
)
from compliance.html_report import render
from compliance.suite import REGISTRY, Outcome, SuiteConfig, run, run_concurrently, select


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", default="http://127.0.0.1:8080/v1",
                        help="the API root, ending in /v1 (default: %(default)s)")
    parser.add_argument("--model", help="the model name to request (required unless --list)")
    parser.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY' (no header when absent)")
    parser.add_argument("--auth-header", default="Authorization", help="header that carries the key")
    parser.add_argument("--no-bearer", action="store_true", help="send the key without the 'Bearer ' prefix")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per request (default: %(default)s)")
    parser.add_argument("--strict-chunking", action="store_true",
                        help="fail a stream whose network chunks split an SSE event")
    parser.add_argument("--only", action="append", metavar="NAME", help="run only this check (repeatable)")
    parser.add_argument("--transport", action="append", metavar="NAME",
                        help="run only the checks of this transport (repeatable)")
    parser.add_argument("--concurrent", action="store_true",
                        help="run all checks at once, as the official harness does (default: one after another)")
    parser.add_argument("--times", action="store_true", help="print each check's seconds and the wall time")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    parser.add_argument("--report", type=Path, metavar="FILE", help="also write the run as JSON to FILE")
    parser.add_argument("--json", action="store_true",
                        help="print the run as JSON (with each check's requests and answers) instead of lines")
    parser.add_argument("--html", type=Path, metavar="FILE",
                        help="also write the run as one self-contained HTML page to FILE")


def parse_arguments(argv: Sequence[str] | None, prog: str = "python -m compliance") -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    add_arguments(parser)
    arguments = parser.parse_args(argv)
    if not arguments.list and not arguments.model:
        parser.error("--model is required")
    return arguments


def main(argv: Sequence[str] | None = None, prog: str = "python -m compliance") -> int:
    return run_arguments(parse_arguments(argv, prog))


def run_arguments(arguments: argparse.Namespace) -> int:
    """Run the suite as ``arguments`` say (see :func:`add_arguments`); the exit status."""
    if not arguments.list and not arguments.model:
        print("--model is required", file=sys.stderr)
        return 2
    if arguments.list:
        for check in REGISTRY.values():
            print(f"{check.name:32} {check.transport:10} {check.description}")
        return 0
    config = SuiteConfig(
        base_url=arguments.base_url,
        model=arguments.model,
        api_key=arguments.api_key,
        auth_header=arguments.auth_header,
        bearer=not arguments.no_bearer,
        timeout=arguments.timeout,
        block_aligned_chunks=arguments.strict_chunking,
    )
    try:
        checks = select(arguments.only, arguments.transport)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    failed = False
    started = time.monotonic()
    when = datetime.datetime.now(datetime.UTC)
    seen: list[Outcome] = []
    outcomes = run_concurrently(config, checks) if arguments.concurrent else run(config, checks)
    for outcome in outcomes:
        seen.append(outcome)
        timing = f" ({outcome.seconds:.1f} s)" if arguments.times else ""
        if not arguments.json:
            print(outcome.line() + timing, flush=True)
        failed = failed or outcome.status == "FAIL"
    wall = time.monotonic() - started
    if arguments.times and not arguments.json:
        print(f"wall time {wall:.1f} s", flush=True)
    if arguments.report is not None:
        arguments.report.write_text(json.dumps(report(config, seen, when, wall), indent=2) + "\n")
    if arguments.json or arguments.html is not None:
        full = report(config, seen, when, wall, exchanges=True)
        if arguments.json:
            print(json.dumps(full, indent=2, ensure_ascii=False), flush=True)
        if arguments.html is not None:
            arguments.html.write_text(render(full), encoding="utf-8")
    return 1 if failed else 0


def report(config: SuiteConfig, outcomes: Sequence[Outcome], when: datetime.datetime, wall: float,
           *, exchanges: bool = False) -> dict[str, Any]:
    """One endpoint's run, as written by ``--report`` (no key is ever included); with
    ``exchanges``, each check also carries what it sent and received (``--json``, ``--html``)."""
    counts = {status: sum(1 for o in outcomes if o.status == status) for status in ("PASS", "FAIL", "SKIP")}
    return {
        "endpoint": config.base_url,
        "model": config.model,
        "checked_at": when.isoformat(timespec="seconds"),
        "wall_seconds": round(wall, 1),
        "passed": counts["PASS"],
        "failed": counts["FAIL"],
        "skipped": counts["SKIP"],
        "conformant": counts["FAIL"] == 0 and counts["PASS"] > 0,
        "checks": [
            {"name": o.name, "status": o.status, "reason": o.reason, "json_path": o.json_path,
             "seconds": round(o.seconds, 2)}
            | ({"exchanges": [exchange.as_json() for exchange in o.exchanges]} if exchanges else {})
            for o in sorted(outcomes, key=lambda o: o.name)
        ],
    }


if __name__ == "__main__":
    sys.exit(main())
