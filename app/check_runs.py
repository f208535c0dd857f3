"""Conformance runs started by a request (the playground's checks): the suite of
:mod:`compliance` run in worker threads, its outcomes handed to the event loop, and the
recent runs of each tenant, in memory. Nothing here knows HTTP (:mod:`app.transport.checks`).

**Threads.** The suite is synchronous (httpx's and websockets' blocking clients), so it
never runs on the event loop: each run has one daemon worker thread. In order, the worker
runs the checks one after another in one session (:func:`compliance.suite.run`); at once,
it starts one daemon thread per check, each with a session of its own, as
:func:`compliance.suite.run_concurrently` does, but without its pool, whose threads the
interpreter would wait for at exit. A run against this same server works because its
requests are served by the event loop, which these threads never block.

**Event delivery.** A thread never touches a run's state: the worker hands each outcome
to the loop with ``loop.call_soon_threadsafe``, in the order the checks finish, then the
end of the run. On the loop, :class:`CheckRun` appends the outcome and wakes whoever
follows the run (:meth:`CheckRun.follow`) by setting and at once clearing an
:class:`asyncio.Event`. Every read of a run happens on the loop too, so a follower that
comes late is given what has finished, then waits for the rest: nothing is missed or
sent twice, and nobody polls.

**Keys.** The key a run sends lives in the worker's :class:`~compliance.suite.SuiteConfig`
for the run only; the run keeps a copy without it for its report, nothing here logs a
config, and the report never holds a key (traces record no request header).

**Shutdown.** :meth:`CheckRuns.abandon` (the server drains) ends every follower of a
running run and tells its worker to stop after the check at hand; a thread still waiting
on a server is a daemon, and a worker whose loop has closed stops there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import math
import queue
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from enum import StrEnum
from typing import Any

from app.errors import Conflict, NotFound
from compliance import suite
from compliance.__main__ import report  # importing it registers every check
from compliance.suite import Outcome, RegisteredCheck, SuiteConfig

log = logging.getLogger("ors.checks")

KEEP_PER_TENANT = 10
"""Runs kept per tenant; starting one more forgets the oldest."""


class RunStatus(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"


@dataclasses.dataclass(frozen=True)
class Done:
    """How a run ended, as its followers are told last."""

    passed: int
    failed: int
    skipped: int
    conformant: bool


class CheckRun:
    """One run: its outcomes in the order they finished, read and written on the loop only."""

    def __init__(self, run_id: str, tenant: str, config: SuiteConfig, total: int, *, concurrent: bool) -> None:
        self.id = run_id
        self.tenant = tenant
        self.config = dataclasses.replace(config, api_key=None)
        """What the report shows of the configuration: never the key."""
        self.total = total
        self.concurrent = concurrent
        self.created_at = int(time.time())
        self.status = RunStatus.RUNNING
        self.outcomes: list[Outcome] = []
        self._when = datetime.datetime.now(datetime.UTC)
        self._started = time.monotonic()
        self._final: dict[str, Any] | None = None
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self._stop = threading.Event()

    def counts(self) -> dict[str, int]:
        return {key: sum(1 for o in self.outcomes if o.status == status)
                for key, status in (("passed", "PASS"), ("failed", "FAIL"), ("skipped", "SKIP"))}

    def report(self) -> dict[str, Any]:
        """The run as ``ors check --json`` prints it, with the checks finished so far."""
        if self._final is not None:
            return self._final
        return json_safe(report(self.config, self.outcomes, self._when, time.monotonic() - self._started,
                                exchanges=True))

    def done(self) -> Done:
        counts = self.counts()
        return Done(**counts, conformant=counts["failed"] == 0 and counts["passed"] > 0)

    async def follow(self, after: int = 0) -> AsyncIterator[tuple[int, Outcome | Done]]:
        """Each finished check after the first ``after``, numbered from 1 in the order they
        finished, then the :class:`Done` (numbered one past the last check), whether the
        follower came at the start, in the middle or after the end. Ends after the
        :class:`Done`, or at once when the run is abandoned."""
        sent = max(after, 0)
        while True:
            while sent < len(self.outcomes):
                sent += 1
                yield sent, self.outcomes[sent - 1]
            if self.status is RunStatus.COMPLETED:
                if sent == len(self.outcomes):
                    yield sent + 1, self.done()
                return
            if self._stop.is_set():
                return
            await self._changed.wait()

    def abandon(self) -> None:
        """On the loop: end the followers, and stop the worker after its check at hand."""
        self._stop.set()
        self._wake()

    def deliver(self, outcome: Outcome | None) -> bool:
        """From a worker thread: hand ``outcome`` (``None``: the run is over) to the loop.
        False when the run goes no further (abandoned, or the loop has closed)."""
        if self._stop.is_set():
            return False
        try:
            if outcome is None:
                self._loop.call_soon_threadsafe(self._end)
            else:
                self._loop.call_soon_threadsafe(self._record, outcome)
        except RuntimeError:  # the loop has closed: the server is gone
            self._stop.set()
            return False
        return True

    def _record(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        self._wake()

    def _end(self) -> None:
        self._final = json_safe(report(self.config, self.outcomes, self._when, time.monotonic() - self._started,
                                       exchanges=True))
        self.status = RunStatus.COMPLETED
        self._wake()

    def _wake(self) -> None:
        self._changed.set()  # wakes every waiter now; those woken run even after the clear
        self._changed.clear()


class CheckRuns:
    """The recent runs of each tenant (at most ``keep``), at most one running; used on the
    event loop only."""

    def __init__(self, keep: int = KEEP_PER_TENANT) -> None:
        self._keep = keep
        self._runs: dict[str, OrderedDict[str, CheckRun]] = {}

    def start(self, tenant: str, config: SuiteConfig, checks: Sequence[RegisteredCheck], *,
              concurrent: bool) -> CheckRun:
        """Start ``checks`` against ``config``'s server in a worker thread; 409
        ``check_running`` while another run of ``tenant`` runs."""
        runs = self._runs.setdefault(tenant, OrderedDict())
        running = next((run for run in runs.values() if run.status is RunStatus.RUNNING), None)
        if running is not None:
            raise Conflict(f"Check run '{running.id}' is still running; one runs at a time.", code="check_running")
        run = CheckRun(f"chk_{secrets.token_hex(12)}", tenant, config, len(checks), concurrent=concurrent)
        runs[run.id] = run
        while len(runs) > self._keep:
            runs.popitem(last=False)
        threading.Thread(target=_work, args=(run, config, list(checks)), name=f"ors-{run.id}", daemon=True).start()
        return run

    def get(self, tenant: str, run_id: str) -> CheckRun:
        """The run, if it is ``tenant``'s and still kept; otherwise 404."""
        kept = self._runs.get(tenant)
        run = kept.get(run_id) if kept is not None else None
        if run is None:
            raise NotFound(f"No check run with id '{run_id}' found.", code="check_run_not_found")
        return run

    def abandon(self) -> None:
        for runs in self._runs.values():
            for run in runs.values():
                if run.status is RunStatus.RUNNING:
                    run.abandon()


def _work(run: CheckRun, config: SuiteConfig, checks: list[RegisteredCheck]) -> None:
    """The worker of ``run``: its outcomes as they finish, then its end, to the loop."""
    outcomes = _at_once(config, checks) if run.concurrent else suite.run(config, checks)
    try:
        for outcome in outcomes:
            if not run.deliver(outcome):
                return
    except Exception:  # a fault of the suite itself: the run ends with what it has
        log.exception("check run %s stopped", run.id)
    finally:
        close = getattr(outcomes, "close", None)
        if close is not None:
            close()  # ends an in-order run's session
    run.deliver(None)


def _at_once(config: SuiteConfig, checks: list[RegisteredCheck]) -> Iterator[Outcome]:
    """Every check at once, each in a daemon thread with a session of its own; the outcomes
    in the order they finish."""
    finished: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
    for check in checks:
        threading.Thread(target=_run_alone, args=(config, check, finished.put), name=f"ors-check-{check.name}",
                         daemon=True).start()
    for _ in checks:
        yield finished.get()


def _run_alone(config: SuiteConfig, check: RegisteredCheck, put: Callable[[Outcome], None]) -> None:
    try:
        for outcome in suite.run(config, [check]):
            put(outcome)
    except Exception as error:  # noqa: BLE001 - the suite's own fault is this check's failure
        put(Outcome(check.name, "FAIL", f"{type(error).__name__}: {error}"))


def json_safe(value: Any) -> Any:
    """``value`` as JSON any reader takes and UTF-8 can carry: a number that is not finite
    (what a server under test may have sent) becomes its name as a string, a lone
    surrogate U+FFFD."""
    if isinstance(value, dict):
        return {json_safe(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [json_safe(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    return value


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
