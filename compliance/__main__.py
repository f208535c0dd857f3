"""Run the acceptance suite against an Open Responses server.

    python -m compliance --base-url http://127.0.0.1:8080/v1 --model smollm2-135m-instruct [--api-key KEY]

Prints one line per check (``PASS name``, ``FAIL name: reason``, ``SKIP name: reason``)
and exits with status 1 when any check fails, 0 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from compliance import http_checks  # noqa: F401 - registers the HTTP checks
from compliance import ws_checks  # noqa: F401 - registers the WebSocket checks
from compliance.suite import REGISTRY, SuiteConfig, run, run_concurrently, select


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m compliance", description=__doc__.splitlines()[0])
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
    arguments = parser.parse_args(argv)
    if not arguments.list and not arguments.model:
        parser.error("--model is required")
    return arguments


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse_arguments(argv)
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
    outcomes = run_concurrently(config, checks) if arguments.concurrent else run(config, checks)
    for outcome in outcomes:
        timing = f" ({outcome.seconds:.1f} s)" if arguments.times else ""
        print(outcome.line() + timing, flush=True)
        failed = failed or outcome.status == "FAIL"
    if arguments.times:
        print(f"wall time {time.monotonic() - started:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
