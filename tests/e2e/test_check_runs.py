"""Conformance runs over HTTP (``/ors/checks``, the playground's checks), against the real
server on loopback: the server checking itself (the scripted models, named as such, and
the embedded SmolLM2), a second ors server it is allowed to check, and a test double of
a server that answers one request only when the test says so (named as such), which
holds a run in the middle without any timing."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.config import Settings
from app.main import create_app
from compliance import validate_error_body
from compliance.html_report import render
from compliance.suite import REGISTRY, SuiteConfig, run, select
from tests.conftest import SMOL, scripted_backend
from tests.live import LiveServer

KEYS = ("alice-key", "bob-key", "carol-key", "dave-key")
OTHER_KEY = "other-server-key"
LOOK_ALIKE_ROOT = "http://allowed.example/v1"
"""An allowed root that is never requested: what look-alike URLs are compared with."""
TIMEOUT = httpx.Timeout(120)
"""Generous: a bound on a hang, never a measurement."""
QUICK = ["basic-response", "streaming-response"]


class _HeldHandler(BaseHTTPRequestHandler):
    """What :class:`HeldEndpoint` answers."""

    released: threading.Event

    def do_POST(self) -> None:  # noqa: N802 - the http.server interface
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if body.get("stream"):
            self.released.wait(timeout=300)
            self._send(500, {"error": {"type": "server_error", "code": None, "param": None, "message": "released"}})
        else:
            self._send(200, {"id": "resp_held", "object": "response", "status": "done", "output": []})

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None:
        pass


class HeldEndpoint:
    """A test double of a server, on loopback: a plain request is answered at once with a
    response the spec does not know; a streamed one is held until :meth:`release`, then
    refused (500). A run of two checks in order thus stops between them for as long as
    the test needs."""

    def __init__(self) -> None:
        self.released = threading.Event()
        handler = type("Handler", (_HeldHandler,), {"released": self.released})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        """Its API root."""

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.release()
        self._server.shutdown()


@pytest.fixture(scope="module")
def held() -> Iterator[HeldEndpoint]:
    endpoint = HeldEndpoint()
    yield endpoint
    endpoint.close()


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A second ors server, with a key of its own and no allowed URLs."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("checks-other"), default_model="scripted-text",
                        api_keys=[OTHER_KEY])
    live = LiveServer(create_app(settings, backends=[scripted_backend()])).start()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def ors(tmp_path_factory: pytest.TempPathFactory, other: LiveServer, held: HeldEndpoint) -> Iterator[LiveServer]:
    """The server under test: keyed tenants, allowed to check ``other``, ``held`` and
    :data:`LOOK_ALIKE_ROOT`."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("checks"), default_model="scripted-text",
                        api_keys=list(KEYS), check_allowed_urls=[f"{other.url}/v1", held.url, LOOK_ALIKE_ROOT])
    live = LiveServer(create_app(settings, backends=[scripted_backend()])).start()
    yield live
    live.stop()


def _client(server: LiveServer, key: str | None) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"} if key else {},
                        timeout=TIMEOUT)


@pytest.fixture()
def alice(ors: LiveServer) -> Iterator[httpx.Client]:
    with _client(ors, KEYS[0]) as client:
        yield client


@pytest.fixture()
def bob(ors: LiveServer) -> Iterator[httpx.Client]:
    with _client(ors, KEYS[1]) as client:
        yield client


@pytest.fixture()
def carol(ors: LiveServer) -> Iterator[httpx.Client]:
    with _client(ors, KEYS[2]) as client:
        yield client


def start(client: httpx.Client, **body: Any) -> dict[str, Any]:
    reply = client.post("/ors/checks", json=body)
    assert reply.status_code == 201, reply.text
    started = reply.json()
    assert started["object"] == "check_run" and started["status"] == "running" and started["id"].startswith("chk_")
    assert reply.headers["location"] == f"/ors/checks/{started['id']}"
    return started


def refused(reply: httpx.Response, status: int, *, code: str | None = None, param: str | None = None) -> str:
    """The message of an error answer, after checking it is the spec's error object."""
    assert reply.status_code == status, reply.text
    body = reply.json()
    validate_error_body(body)
    if code is not None:
        assert body["error"]["code"] == code, body
    assert body["error"]["param"] == param, body
    return body["error"]["message"]


Event = tuple[str, str, dict[str, Any]]
"""An SSE event: its type, its id, its data."""


class Follower:
    """A subscriber of a run's events, read one at a time as they arrive."""

    def __init__(self, client: httpx.Client, run_id: str, *, last_event_id: str | None = None) -> None:
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        self._stream = client.stream("GET", f"/ors/checks/{run_id}/events", headers=headers)
        reply = self._stream.__enter__()
        assert reply.status_code == 200, reply.read()
        assert reply.headers["content-type"].startswith("text/event-stream")
        self._lines = reply.iter_lines()

    def next(self) -> Event | None:
        """The next event, or None once the stream has ended."""
        fields: dict[str, str] = {}
        for line in self._lines:
            if not line:
                if "data" in fields:
                    return fields.get("event", "message"), fields.get("id", ""), json.loads(fields["data"])
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
        return None

    def rest(self) -> list[Event]:
        events = []
        while (event := self.next()) is not None:
            events.append(event)
        self.close()
        return events

    def close(self) -> None:
        self._stream.__exit__(None, None, None)


def follow_to_the_end(client: httpx.Client, run_id: str) -> list[Event]:
    """Every event of the run; the last is ``done`` and nothing follows it."""
    events = Follower(client, run_id).rest()
    assert events and events[-1][0] == "done", events
    assert [kind for kind, _, _ in events[:-1]] == ["check"] * (len(events) - 1)
    assert [number for _, number, _ in events] == [str(n) for n in range(1, len(events) + 1)]
    return events


def test_a_full_run_of_this_server_matches_ors_check(ors: LiveServer, alice: httpx.Client) -> None:
    started = start(alice, model="scripted-text")
    assert (started["endpoint"], started["model"], started["total"]) == (f"{ors.url}/v1", "scripted-text", len(REGISTRY))
    assert started["concurrent"] is True
    events = follow_to_the_end(alice, started["id"])
    checks = [data for _, _, data in events[:-1]]
    assert sorted(check["name"] for check in checks) == sorted(REGISTRY)  # one event per check
    done = events[-1][2]

    reply = alice.get(f"/ors/checks/{started['id']}")
    assert reply.status_code == 200
    finished = reply.json()
    assert finished["status"] == "completed" and finished["finished"] == len(REGISTRY)
    report = finished["report"]
    counts = {key: finished[key] for key in ("passed", "failed", "skipped")}
    assert counts == {key: report[key] for key in counts} == {key: done[key] for key in counts}
    assert finished["conformant"] == report["conformant"] == done["conformant"]
    assert {c["name"]: c["status"] for c in checks} == {c["name"]: c["status"] for c in report["checks"]}
    assert all("exchanges" in check for check in report["checks"])

    # the same checks, as `ors check` runs them against the same server
    cli = run(SuiteConfig(f"{ors.url}/v1", "scripted-text", api_key=KEYS[0]), select())
    assert {c["name"]: c["status"] for c in report["checks"]} == {outcome.name: outcome.status for outcome in cli}

    assert Follower(alice, started["id"]).rest() == events  # a subscriber after the end gets it all

    download = alice.get(f"/ors/checks/{started['id']}/report.json")
    assert download.status_code == 200 and download.headers["content-type"].startswith("application/json")
    assert download.headers["content-disposition"] == f'attachment; filename="ors-check-{started["id"]}.json"'
    assert download.json() == report
    page = alice.get(f"/ors/checks/{started['id']}/report.html")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.text == render(download.json())


def test_the_embedded_model_passes_what_ors_check_passes(server: LiveServer) -> None:
    """On the shared server (SmolLM2, no keys): a run in order, followed from its start."""
    with _client(server, None) as client:
        started = start(client, model=SMOL, only=QUICK, concurrent=False)
        assert started["total"] == 2 and started["concurrent"] is False
        events = follow_to_the_end(client, started["id"])
    assert [(data["name"], data["status"]) for _, _, data in events[:-1]] == [(name, "PASS") for name in QUICK]
    assert events[-1][2] == {"status": "completed", "total": 2, "passed": 2, "failed": 0, "skipped": 0,
                             "conformant": True}
    cli = run(SuiteConfig(f"{server.url}/v1", SMOL), select(QUICK))
    assert [(outcome.name, outcome.status) for outcome in cli] == [(name, "PASS") for name in QUICK]


def test_a_run_is_followed_live_and_late_and_refuses_a_second_run(held: HeldEndpoint, carol: httpx.Client) -> None:
    """Against the held endpoint a run in order stops after its first check until the
    test releases it: meanwhile a second run is 409, the reports are 409, and a late
    follower is given the finished check at once; after the release both followers get
    the rest live."""
    started = start(carol, model="m", base_url=held.url, only=QUICK, concurrent=False)
    assert started["endpoint"] == held.url
    early = Follower(carol, started["id"])
    first = early.next()
    assert first is not None and first[:2] == ("check", "1")
    assert (first[2]["name"], first[2]["status"]) == ("basic-response", "FAIL")
    assert first[2]["reason"] and first[2]["json_path"]

    message = refused(carol.post("/ors/checks", json={"model": "m"}), 409, code="check_running")
    assert started["id"] in message
    for report in ("report.json", "report.html"):
        refused(carol.get(f"/ors/checks/{started['id']}/{report}"), 409, code="check_running")
    running = carol.get(f"/ors/checks/{started['id']}").json()
    assert (running["status"], running["finished"], running["failed"], running["conformant"]) == ("running", 1, 1, None)
    assert [check["name"] for check in running["report"]["checks"]] == ["basic-response"]

    try:
        late = Follower(carol, started["id"])
        assert late.next() == first
    finally:
        held.release()
    rest = early.rest()
    assert [(kind, number, data.get("name")) for kind, number, data in rest] == [
        ("check", "2", "streaming-response"), ("done", "3", None)]
    assert rest[-1][2] == {"status": "completed", "total": 2, "passed": 0, "failed": 2, "skipped": 0,
                           "conformant": False}
    assert late.rest() == rest
    assert Follower(carol, started["id"], last_event_id="2").rest() == rest[1:]  # a reconnection resumes
    assert carol.get(f"/ors/checks/{started['id']}/report.json").json()["failed"] == 2


def test_another_ors_server_is_checked_with_its_own_key(other: LiveServer, bob: httpx.Client) -> None:
    root = f"{other.url}/v1"
    without = start(bob, model="scripted-text", base_url=root, only=QUICK)
    assert follow_to_the_end(bob, without["id"])[-1][2]["failed"] == 2  # its key is needed there
    started = start(bob, model="scripted-text", base_url=root + "/", api_key=OTHER_KEY, only=QUICK)
    assert started["endpoint"] == root
    done = follow_to_the_end(bob, started["id"])[-1][2]
    assert (done["passed"], done["conformant"]) == (2, True)
    for path in ("", "/report.json", "/report.html"):
        reply = bob.get(f"/ors/checks/{started['id']}{path}")
        assert reply.status_code == 200 and OTHER_KEY not in reply.text


def test_only_restricts_the_run_to_the_checks_named(ors: LiveServer, alice: httpx.Client) -> None:
    started = start(alice, model="scripted-text", base_url=f"{ors.url}/v1/", only=QUICK)
    assert (started["endpoint"], started["total"]) == (f"{ors.url}/v1", 2)
    events = follow_to_the_end(alice, started["id"])
    assert sorted(data["name"] for _, _, data in events[:-1]) == QUICK
    report = alice.get(f"/ors/checks/{started['id']}/report.json").json()
    assert [check["name"] for check in report["checks"]] == QUICK


@pytest.mark.parametrize(("body", "param"), [
    ({}, "model"),
    ({"model": 5}, "model"),
    ({"model": ""}, "model"),
    ({"model": "m", "concurrent": "yes"}, "concurrent"),
    ({"model": "m", "only": "basic-response"}, "only"),
    ({"model": "m", "only": []}, "only"),
    ({"model": "m", "only": ["basic-response", "no-such-check"]}, "only"),
    ({"model": "m", "base_url": 5}, "base_url"),
    ({"model": "m", "base_url": "ftp://allowed.example/v1"}, "base_url"),
    ({"model": "m", "base_url": "allowed.example/v1"}, "base_url"),
    ({"model": "m", "base_url": "http://user:secret@allowed.example/v1"}, "base_url"),
    ({"model": "m", "base_url": "http://allowed.example/v1?x=1"}, "base_url"),
    ({"model": "m", "base_url": "http://allowed.example/v1/%2e%2e/admin"}, "base_url"),
    ({"model": "m", "base_url": LOOK_ALIKE_ROOT, "api_key": 5}, "api_key"),
    ({"model": "m", "base_url": LOOK_ALIKE_ROOT, "api_key": "two words"}, "api_key"),
    ([{"model": "m"}], None),
])
def test_a_malformed_field_is_400_naming_it(alice: httpx.Client, body: Any, param: str | None) -> None:
    message = refused(alice.post("/ors/checks", json=body), 400, param=param)
    if body == {"model": "m", "only": ["basic-response", "no-such-check"]}:
        assert "no-such-check" in message


def test_a_body_that_is_not_json_is_400_and_no_key_is_401(ors: LiveServer, alice: httpx.Client) -> None:
    reply = alice.post("/ors/checks", content=b"{model", headers={"Content-Type": "application/json"})
    refused(reply, 400, code="invalid_json")
    with _client(ors, None) as anonymous:
        refused(anonymous.post("/ors/checks", json={"model": "m"}), 401, code="invalid_api_key")


def test_a_url_neither_this_server_nor_allowed_is_403(ors: LiveServer, other: LiveServer, alice: httpx.Client) -> None:
    allowed = f"{other.url}/v1"
    for base_url in [
        "http://allowed.example.evil.com/v1",  # the allowed host as a prefix of another
        "http://evil.com/allowed.example/v1",
        "http://allowed.example/v1x",  # a prefix, not a segment
        "http://allowed.example/v",
        "http://allowed.example/",  # above the root
        "http://allowed.example/v1/../admin",
        "https://allowed.example/v1",  # another scheme
        "http://allowed.example:8080/v1",  # another port
        allowed + "x",
        f"http://localhost:{other.port}/v1",  # another name, whatever it resolves to
        f"{ors.url}/v1/responses",  # below this server's root is not this server's root
    ]:
        message = refused(alice.post("/ors/checks", json={"model": "m", "base_url": base_url}), 403,
                          code="check_url_not_allowed", param="base_url")
        assert "ORS_CHECK_ALLOWED_URLS" in message
    with _client(other, OTHER_KEY) as client:  # the other server lists nothing
        refused(client.post("/ors/checks", json={"model": "m", "base_url": f"{ors.url}/v1"}), 403,
                code="check_url_not_allowed", param="base_url")


def test_another_tenant_gets_404_for_a_run(alice: httpx.Client, bob: httpx.Client) -> None:
    started = start(alice, model="scripted-text", only=["basic-response"])
    follow_to_the_end(alice, started["id"])
    for path in ("", "/events", "/report.json", "/report.html"):
        refused(bob.get(f"/ors/checks/{started['id']}{path}"), 404, code="check_run_not_found")
        assert alice.get(f"/ors/checks/{started['id']}{path}").status_code == 200
    refused(alice.get("/ors/checks/chk_unknown"), 404, code="check_run_not_found")


def test_the_ten_most_recent_runs_are_kept(ors: LiveServer) -> None:
    with _client(ors, KEYS[3]) as dave:
        ids = []
        for _ in range(11):
            ids.append(start(dave, model="scripted-text", only=["compact-missing-model"])["id"])
            follow_to_the_end(dave, ids[-1])
        refused(dave.get(f"/ors/checks/{ids[0]}"), 404, code="check_run_not_found")
        assert all(dave.get(f"/ors/checks/{run_id}").status_code == 200 for run_id in ids[1:])


def test_a_run_still_running_is_abandoned_when_the_server_stops(tmp_path: Path) -> None:
    """Its followers' streams end and the server stops, while the check at hand still
    waits on the server it checks (which never answers before the test ends)."""
    endpoint = HeldEndpoint()
    settings = Settings(data_dir=tmp_path, default_model="scripted-text", check_allowed_urls=[endpoint.url])
    live = LiveServer(create_app(settings, backends=[scripted_backend()])).start()
    try:
        with _client(live, None) as client:
            started = start(client, model="m", base_url=endpoint.url, only=QUICK, concurrent=False)
            follower = Follower(client, started["id"])
            first = follower.next()
            assert first is not None and first[2]["name"] == "basic-response"
            live.stop()
            assert not live.thread.is_alive()
            assert follower.rest() == []  # no check and no done: the stream just ended
    finally:
        endpoint.close()
