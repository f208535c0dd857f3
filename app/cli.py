"""The ``ors`` console script: ``ors serve``, ``ors check``, ``ors gate`` and ``ors codex``."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from app import codex_launcher, gate_cli, logs
from app.config import Settings
from app.settings_doc import shown_default
from compliance import __main__ as compliance_cli

PRIVATE_UMASK = 0o077
"""The file mode creation mask of ``ors serve``: files 0600, directories 0700."""
GRACEFUL_SHUTDOWN_SECONDS = 15
"""How long open streams get to end after a stop signal; they need far less."""


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.main import create_app, settle_heap
    from app.serve import Server, transport_options
    from app.transport.guards import exposure_problem

    try:
        settings = settings_from(args)
    except ValidationError as exc:
        for error in exc.errors():
            name = ".".join(str(part) for part in error["loc"])
            print(f"ors serve: --{name.replace('_', '-')} / ORS_{name.upper()}: {error['msg']}", file=sys.stderr)
        return 2
    problem = exposure_problem(
        settings.host, has_keys=bool(settings.api_keys), allow_unauthenticated=settings.allow_unauthenticated
    )
    if problem is not None:
        print(f"ors serve: {problem}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level, settings.log_format, queued=True)
    keep_private(settings.data_dir)
    if settings.workers > 1:
        return _serve_workers(args, settings)
    try:
        app = create_app(settings)
    except ValueError as exc:  # a setting that parses but cannot be used (e.g. a bad key entry)
        print(f"ors serve: {exc}", file=sys.stderr)
        return 2
    app.state.on_serving = settle_heap
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # uvicorn's loggers go through ours (format, request ids)
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        **transport_options(settings),
    )
    try:
        Server(config, app.state.drain).run()
    except KeyboardInterrupt:
        # uvicorn raises the SIGINT that stopped it again once it has finished, so that
        # the process ends as Ctrl-C ends it; Python turns that into a KeyboardInterrupt,
        # whose traceback would end the log. End by the signal itself instead.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return 0


def keep_private(data_dir: Path) -> None:
    """What the server writes is for the user it runs as only: stored responses, prompt
    caches (the KV state of conversations), logs, keys. The file mode creation mask
    becomes 077 for this process and every process it starts (workers, llama-server);
    with the usual 022, the database and the slot files were
    readable by every local user. A data directory that already lets others in is named
    in a warning: its files made before stay as they are."""
    os.umask(PRIVATE_UMASK)
    try:
        mode = data_dir.stat().st_mode
    except OSError:
        return
    if mode & 0o077:
        logging.getLogger("ors").warning(
            "The data directory %s can be read by other users (mode %03o): what it holds (stored responses, "
            "prompt caches) is theirs to read too. `chmod 700` it to keep it private.", data_dir, mode & 0o777)


def _serve_workers(args: argparse.Namespace, settings: Settings) -> int:
    """``--workers N``: uvicorn's supervisor binds the port once and runs N processes of
    :func:`app.main.worker_app` on it (the kernel spreads connections among them),
    restarting one that dies. The flags reach the workers as ``ORS_*`` variables, so a
    worker's settings are the parent's."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    from app.main import upstream_routes, workers_problem
    from app.serve import transport_options

    problem = workers_problem(settings)
    if problem is None:
        try:
            upstream_routes(settings)  # a broken upstream file stops here, not in every worker
        except ValueError as exc:
            problem = str(exc)
    if problem is not None:
        print(f"ors serve: {problem}", file=sys.stderr)
        return 2
    for name in Settings.model_fields:
        if (value := getattr(args, name)) is not None:
            os.environ[f"ORS_{name.upper()}"] = value
    if settings.rate_limit_rpm or settings.rate_limit_concurrent:
        if settings.redis_url is None:
            print("ors serve: warning: without ORS_REDIS_URL each worker counts its own rate limits", file=sys.stderr)
    # every worker's metrics in files of one folder, summed by whichever worker is scraped
    metrics_dir = tempfile.TemporaryDirectory(prefix="ors-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir.name
    config = uvicorn.Config(
        "app.main:worker_app",
        factory=True,
        workers=settings.workers,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        **transport_options(settings),
    )
    with metrics_dir:
        supervisor = Multiprocess(config, sockets=[config.bind_socket()])
        supervisor.run()
    if any(process.exitcode == STARTUP_FAILURE for process in supervisor.processes):
        # uvicorn's supervisor stops when a worker cannot start (it would fail the same
        # way again), and ends well; a supervisor of ours (systemd, a restart policy)
        # must see the failure, as it does with one process
        return STARTUP_FAILURE
    return 0


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per field of :class:`Settings` (``model_parallel`` → ``--model-parallel``),
    its help the field's docstring, its default and its variable. Values are passed to
    ``Settings`` as text, so a flag parses exactly as its ``ORS_*`` variable does."""
    for name, field in Settings.model_fields.items():
        description = " ".join((field.description or "").replace("``", "'").split())
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            metavar="VALUE",
            help=f"{description} [default: {shown_default(field)}; env ORS_{name.upper()}]".replace("%", "%%"),
        )


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings: flags given on the command line over ``ORS_*`` variables over defaults."""
    return Settings(**{name: value for name in Settings.model_fields if (value := getattr(args, name)) is not None})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ors", description="Open Responses Server")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the HTTP/WebSocket server",
        description="Run the HTTP/WebSocket server. Every setting is a flag here and an ORS_* "
        "environment variable; a flag wins over the variable.",
    )
    add_settings_flags(serve)
    serve.set_defaults(handler=_serve)
    check = commands.add_parser(
        "check",
        help="run the conformance suite against any Open Responses endpoint",
        description="Run the conformance suite (schema, stream and acceptance checks) against any "
        "Open Responses endpoint; --report writes a JSON pass/fail record of the run.",
    )
    compliance_cli.add_arguments(check)
    check.set_defaults(handler=compliance_cli.run_arguments)
    gate = commands.add_parser("gate", help="check a logged item list with the replay gate, offline")
    gate_cli.add_arguments(gate)
    gate.set_defaults(handler=gate_cli.run)
    codex = commands.add_parser(
        "codex",
        help="run the Codex CLI against this server",
        description="Run the installed Codex CLI (ORS_CODEX_BIN) against an ors server, with a Codex home "
        "of its own in ORS_DATA_DIR/codex: a provider for the server and the server's model catalog. "
        "Arguments after -- are Codex's.",
    )
    codex_launcher.add_arguments(codex)
    codex.set_defaults(handler=codex_launcher.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Must be set before llama.cpp's OpenMP runtime loads: idle threads then sleep instead
    # of spinning, which keeps generation fast when cores are shared.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
