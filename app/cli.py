"""The ``ors`` console script: ``ors serve`` and ``ors gate``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from app import gate_cli
from app.config import Settings

GRACEFUL_SHUTDOWN_SECONDS = 15
"""How long open streams get to end after a stop signal; they need far less."""


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.main import create_app
    from app.serve import Server, transport_options
    from app.transport.guards import exposure_problem

    overrides = {key: value for key, value in {"host": args.host, "port": args.port}.items() if value is not None}
    settings = Settings(**overrides)
    problem = exposure_problem(
        settings.host, has_keys=bool(settings.api_keys), allow_unauthenticated=settings.allow_unauthenticated
    )
    if problem is not None:
        print(f"ors: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        **transport_options(settings),
    )
    Server(config, app.state.drain).run()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ors", description="Open Responses Server")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the HTTP/WebSocket server")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1, or ORS_HOST)")
    serve.add_argument("--port", type=int, help="port to bind (default 8080, or ORS_PORT)")
    serve.set_defaults(handler=_serve)
    gate = commands.add_parser("gate", help="check a logged item list with the replay gate, offline")
    gate_cli.add_arguments(gate)
    gate.set_defaults(handler=gate_cli.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Must be set before llama.cpp's OpenMP runtime loads: idle threads then sleep instead
    # of spinning, which keeps generation fast when cores are shared.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
