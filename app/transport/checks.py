"""Conformance runs over HTTP, for the playground: the suite of ``ors check`` run by the
server against itself or an allowed server (:mod:`app.check_runs` runs it), followed
check by check, and its reports. Authenticated like the API; a run is its tenant's, and
any other tenant is told 404.

* ``POST /ors/checks`` ``{model, base_url?, api_key?, concurrent?, only?}``: 201 with the
  run (``object: "check_run"``, ``status: "running"``). ``base_url`` defaults to this
  server's API root; any other must lie at or below a root of ``ORS_CHECK_ALLOWED_URLS``
  (scheme, host and port equal, path below on segment boundaries), else 403
  ``check_url_not_allowed``. A run of this server is sent to the address the request
  came in on (a ``Host`` header cannot point it elsewhere) with the caller's own
  ``Authorization``; ``api_key`` is for another server. One run per tenant at a time
  (409 ``check_running``); the last 10 are kept.
* ``GET /ors/checks/{id}``: the run, its counts, and ``report``: the ``--json`` report of
  the checks finished so far.
* ``GET /ors/checks/{id}/events``: SSE, one ``check`` event per finished check (in the
  order they finish), then ``done``; a late follower gets the finished ones first. Each
  event has an ``id`` (its number), so a reconnecting ``EventSource`` resumes after its
  ``Last-Event-ID``; the stream closes after ``done``, so a client closes its source on
  ``done`` rather than reconnect.
* ``GET /ors/checks/{id}/report.json`` (an attachment) and ``…/report.html``
  (:func:`compliance.html_report.render` of that JSON): 409 ``check_running`` before the end.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import ServerSentEvent

from app import jsontext
from app.check_runs import CheckRun, CheckRuns, Done, RunStatus
from app.engine.validation import decode_json, parse_body
from app.errors import Conflict, Forbidden, InvalidRequest
from app.transport.deps import StreamOptionsDep, TenantDep
from app.transport.sse import EventStream
from app.url_roots import UrlRoot
from compliance.html_report import render
from compliance.suite import Outcome, SuiteConfig, select

router = APIRouter(prefix="/ors/checks")

_HEADER_SAFE = re.compile(r"[\x21-\x7e]+")


class CheckRunRequest(BaseModel):
    model_config = ConfigDict(strict=True)

    model: str = Field(min_length=1, max_length=1_000)
    base_url: str | None = Field(default=None, max_length=2_000)
    api_key: str | None = Field(default=None, max_length=4_000)
    concurrent: bool = True
    only: list[str] | None = Field(default=None, min_length=1)


async def get_check_runs(request: Request) -> CheckRuns:
    """The app's runs (:func:`app.main.create_app` makes them; the drain abandons those
    still running)."""
    return request.app.state.check_runs  # type: ignore[no-any-return]


CheckRunsDep = Annotated[CheckRuns, Depends(get_check_runs)]


@router.post("", status_code=201)
async def start_check_run(request: Request, tenant: TenantDep, runs: CheckRunsDep) -> JSONResponse:
    body = parse_body(CheckRunRequest, decode_json(await request.body()))
    try:
        checks = select(body.only)
    except ValueError as error:
        raise InvalidRequest(f"Invalid value for 'only': {error}.", code="invalid_value", param="only") from None
    target, itself = _target(request, body.base_url)
    if itself:
        api_key, bearer = request.headers.get("authorization"), False
    else:
        api_key, bearer = body.api_key, True
        if api_key is not None and not _HEADER_SAFE.fullmatch(api_key):
            raise InvalidRequest("Invalid value for 'api_key': it must be printable ASCII without spaces.",
                                 code="invalid_value", param="api_key")
    config = SuiteConfig(base_url=target.url(), model=body.model, api_key=api_key, bearer=bearer)
    run = runs.start(tenant, config, checks, concurrent=body.concurrent)
    return JSONResponse(_summary(run), status_code=201, headers={"Location": f"/ors/checks/{run.id}"})


@router.get("/{run_id}")
async def get_check_run(run_id: str, tenant: TenantDep, runs: CheckRunsDep) -> JSONResponse:
    run = runs.get(tenant, run_id)
    done = run.done()
    return JSONResponse({
        **_summary(run), "finished": len(run.outcomes), **run.counts(),
        "conformant": done.conformant if run.status is RunStatus.COMPLETED else None,
        "report": run.report(),
    })


@router.get("/{run_id}/events")
async def follow_check_run(run_id: str, request: Request, tenant: TenantDep, runs: CheckRunsDep,
                           stream_options: StreamOptionsDep) -> EventStream:
    run = runs.get(tenant, run_id)
    last = request.headers.get("last-event-id", "")
    after = int(last) if last.isdecimal() and len(last) < 10 else 0

    async def body() -> AsyncIterator[bytes]:
        async for number, item in run.follow(after):
            yield _event(number, item, run)

    return EventStream(body(), stream_options)


@router.get("/{run_id}/report.json")
async def download_check_report(run_id: str, tenant: TenantDep, runs: CheckRunsDep) -> Response:
    run = _completed(runs.get(tenant, run_id))
    text = json.dumps(run.report(), indent=2, ensure_ascii=False) + "\n"
    return Response(text.encode(), media_type="application/json", headers={
        "Content-Disposition": f'attachment; filename="ors-check-{run.id}.json"',
        "X-Content-Type-Options": "nosniff",
    })


@router.get("/{run_id}/report.html")
async def show_check_report(run_id: str, tenant: TenantDep, runs: CheckRunsDep) -> HTMLResponse:
    run = _completed(runs.get(tenant, run_id))
    # the page is inert by construction (escaped, no scripts); the policy keeps it so
    return HTMLResponse(render(run.report()), headers={
        "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; sandbox",
        "X-Content-Type-Options": "nosniff",
    })


def _target(request: Request, base_url: str | None) -> tuple[UrlRoot, bool]:
    """Where the run's requests go, and whether that is this server (403 for a URL that is
    neither this server's root nor at or below an allowed root)."""
    named = _parsed_or_none(str(request.base_url) + "v1")
    server = request.scope.get("server")
    if server and server[1]:  # where this request came in: what a Host header cannot change
        own = UrlRoot("http", str(server[0]).lower(), int(server[1]), ("v1",))
    elif named is not None:
        own = named
    else:
        raise InvalidRequest("This server's own address is not known here.", code="invalid_value", param="base_url")
    if base_url is None:
        return own, True
    try:
        wanted = UrlRoot.parse(base_url)
    except ValueError as error:
        raise InvalidRequest(f"Invalid value for 'base_url': {error}.", code="invalid_value",
                             param="base_url") from None
    if wanted in (own, named):
        return own, True
    allowed = (_parsed_or_none(root) for root in request.app.state.settings.check_allowed_urls)
    if any(root is not None and root.covers(wanted) for root in allowed):
        return wanted, False
    raise Forbidden(
        f"The server may not check {wanted.url()}: it is neither this server nor below an API root listed "
        "in ORS_CHECK_ALLOWED_URLS.", code="check_url_not_allowed", param="base_url")


def _parsed_or_none(text: str) -> UrlRoot | None:
    try:
        return UrlRoot.parse(text)
    except ValueError:
        return None


def _completed(run: CheckRun) -> CheckRun:
    if run.status is not RunStatus.COMPLETED:
        raise Conflict(f"Check run '{run.id}' is still running; its report comes at its end.", code="check_running")
    return run


def _summary(run: CheckRun) -> dict[str, Any]:
    return {"id": run.id, "object": "check_run", "status": run.status.value, "endpoint": run.config.base_url,
            "model": run.config.model, "concurrent": run.concurrent, "total": run.total,
            "created_at": run.created_at}


def _event(number: int, item: Outcome | Done, run: CheckRun) -> bytes:
    if isinstance(item, Done):
        kind, data = "done", {"status": RunStatus.COMPLETED.value, "total": run.total, "passed": item.passed,
                              "failed": item.failed, "skipped": item.skipped, "conformant": item.conformant}
    else:
        kind, data = "check", {"name": item.name, "status": item.status, "reason": item.reason,
                               "json_path": item.json_path, "seconds": round(item.seconds, 2)}
    return ServerSentEvent(data=jsontext.dumps(data), event=kind, id=str(number), sep="\n").encode()
