"""The acceptance-suite framework: a registry of named checks and a runner.

A check is a function that receives a ``Session`` (the target server's configuration
and a shared HTTP client) and returns normally to pass, raises ``ConformanceError`` to
fail, or raises ``Skip`` when the server does not offer an optional feature. Checks are
registered with ``@register(name, transport=...)``; ``run`` executes them in
registration order and reports one ``Outcome`` per check. Transports other than HTTP
(WebSocket) plug in by registering their own checks under their own transport name.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from compliance.errors import ConformanceError
from compliance.trace import Exchange, Recorder


@dataclass(frozen=True)
class SuiteConfig:
    """Where and how to reach the server under test."""

    base_url: str
    model: str
    api_key: str | None = None
    auth_header: str = "Authorization"
    bearer: bool = True
    timeout: float = 300.0
    block_aligned_chunks: bool = False

    def headers(self) -> dict[str, str]:
        """Request headers: JSON content type and, when a key is set, authorization."""
        headers = {"Content-Type": "application/json"}
        if self.api_key is not None:
            headers[self.auth_header] = f"Bearer {self.api_key}" if self.bearer else self.api_key
        return headers

    def url(self, path: str) -> str:
        return self.base_url.rstrip("/") + path


class Skip(Exception):
    """The server does not offer the (optional) feature a check exercises."""


@dataclass(frozen=True)
class Outcome:
    """The result of one check."""

    name: str
    status: Literal["PASS", "FAIL", "SKIP"]
    reason: str = ""
    seconds: float = 0.0
    json_path: str | None = None
    """Where in a JSON document the first violation sits, when it sits in one."""
    exchanges: tuple[Exchange, ...] = ()
    """What the check sent and received (see ``compliance.trace``)."""

    def line(self) -> str:
        """``PASS name``, ``FAIL name: reason`` or ``SKIP name: reason``."""
        return f"{self.status} {self.name}" + (f": {self.reason}" if self.reason else "")


@dataclass
class Session:
    """State shared by the checks of one run: the configuration and lazily created clients."""

    config: SuiteConfig
    resources: dict[str, Any] = field(default_factory=dict)
    recorder: Recorder = field(default_factory=Recorder)

    def resource(self, key: str, factory: Callable[[], Any]) -> Any:
        """The session-wide object stored under ``key``, created by ``factory`` on first use."""
        if key not in self.resources:
            self.resources[key] = factory()
        return self.resources[key]

    def close(self) -> None:
        for resource in self.resources.values():
            close = getattr(resource, "close", None)
            if callable(close):
                close()
        self.resources.clear()


Check = Callable[[Session], None]


@dataclass(frozen=True)
class RegisteredCheck:
    name: str
    transport: str
    function: Check
    description: str


REGISTRY: dict[str, RegisteredCheck] = {}


def register(name: str, *, transport: str = "http") -> Callable[[Check], Check]:
    """Register ``function`` as the check called ``name``; its docstring's first line describes it."""

    def decorate(function: Check) -> Check:
        if name in REGISTRY:
            raise ValueError(f"a check named {name!r} is already registered")
        description = (function.__doc__ or "").strip().splitlines()[0] if function.__doc__ else ""
        REGISTRY[name] = RegisteredCheck(name, transport, function, description)
        return function

    return decorate


def select(names: Iterable[str] | None = None, transports: Iterable[str] | None = None) -> list[RegisteredCheck]:
    """Registered checks filtered by name and transport, in registration order."""
    wanted = set(names) if names else None
    unknown = (wanted or set()) - REGISTRY.keys()
    if unknown:
        raise ValueError(f"unknown checks: {', '.join(sorted(unknown))}")
    allowed = set(transports) if transports else None
    return [check for check in REGISTRY.values()
            if (wanted is None or check.name in wanted) and (allowed is None or check.transport in allowed)]


def run(config: SuiteConfig, checks: Iterable[RegisteredCheck], *,
        session: Session | None = None) -> Iterator[Outcome]:
    """Run ``checks`` one after another against the server, yielding each outcome as it is known.

    ``session`` may be given with resources already in place (a client bound to an
    in-process server, for instance); it is closed at the end either way.
    """
    session = session or Session(config)
    try:
        for check in checks:
            yield _run_one(check, session)
    finally:
        session.close()


def run_concurrently(config: SuiteConfig, checks: Iterable[RegisteredCheck]) -> Iterator[Outcome]:
    """Run all ``checks`` at once, each in its own thread with its own session (as the
    official harness runs its tests in parallel), yielding outcomes as they finish."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    chosen = list(checks)
    if not chosen:
        return

    def one(check: RegisteredCheck) -> Outcome:
        session = Session(config)
        try:
            return _run_one(check, session)
        finally:
            session.close()

    with ThreadPoolExecutor(max_workers=len(chosen), thread_name_prefix="check") as pool:
        for finished in as_completed([pool.submit(one, check) for check in chosen]):
            yield finished.result()


def _run_one(check: RegisteredCheck, session: Session) -> Outcome:
    started = time.monotonic()
    mark = session.recorder.mark()

    def outcome(status: Literal["PASS", "FAIL", "SKIP"], reason: str = "", json_path: str | None = None) -> Outcome:
        return Outcome(check.name, status, reason, time.monotonic() - started, json_path,
                       tuple(session.recorder.since(mark)))

    try:
        check.function(session)
    except Skip as skip:
        return outcome("SKIP", str(skip))
    except ConformanceError as error:
        return outcome("FAIL", str(error), error.json_path)
    except Exception as error:  # noqa: BLE001 - any crash of a check is that check's failure
        return outcome("FAIL", f"{type(error).__name__}: {error}")
    return outcome("PASS")
