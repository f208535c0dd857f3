"""The response store goes away under a running server, and comes back.

A real ``ors serve`` process reaches the real PostgreSQL server through a TCP relay on
loopback that the test cuts (every connection closed, new ones refused, as a database
restart or a network partition does) and restores. While it is cut, everything that
needs the store is a 503 ``store_unavailable`` error object with ``Retry-After``, never a
500 or a dropped connection, and what does not need it (``store: false``) is served; a
stream whose end cannot be recorded is not announced as ended well: it ends with
``response.failed``, the same error, as its one terminal event. Once restored, the
server serves stored responses again without a restart, and writes the end it could
not write, as its client was told it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy.engine import make_url
from websockets.sync.client import connect

from compliance import SSEParser, StreamChecker, check_response, check_stream, validate_error_body, validate_ws_error
from tests.live import ServerProcess
from tests.tcp_relay import CuttableRelay, relayed_database
from tests.upstream_server import DONE, Pause, ScriptedUpstream, chunk, running_scripted_upstream

JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with running_scripted_upstream() as upstream:
        yield upstream


@pytest.fixture(scope="module")
def relayed(postgres_url: str) -> Iterator[tuple[CuttableRelay, str]]:
    with relayed_database(postgres_url) as relayed:
        yield relayed


@pytest.fixture(scope="module")
def relay(relayed: tuple[CuttableRelay, str]) -> CuttableRelay:
    return relayed[0]


@pytest.fixture(scope="module")
def server(relayed: tuple[CuttableRelay, str], upstream: ScriptedUpstream,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    relay, url = relayed
    env = {"ORS_DATABASE_URL": url, "ORS_UPSTREAM_URL": upstream.base_url, "ORS_DEFAULT_MODEL": "any-upstream-model"}
    server = ServerProcess(env, tmp_path_factory.mktemp("outage")).start()
    yield server
    relay.restore()  # a clean shutdown, whatever a failed test left
    server.terminate()


def _answer(upstream: ScriptedUpstream, text: str = "stored answer") -> str:
    return upstream.stream(chunk(content=text), chunk(finish_reason="stop"), DONE)


def _unavailable(reply: httpx.Response) -> None:
    assert reply.status_code == 503, reply.text
    validate_error_body(reply.json())
    error = reply.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "store_unavailable", error
    assert reply.headers["retry-after"] == "1"


def _stream(server: ServerProcess, body: dict[str, Any], on_event: Any = None) -> list[dict[str, Any]]:
    parser = SSEParser(require_done=True)
    checker = StreamChecker(transport="sse")
    events: list[dict[str, Any]] = []
    with httpx.stream("POST", f"{server.url}/v1/responses", json={**body, "stream": True}, timeout=60) as reply:
        assert reply.status_code == 200, reply.read()
        for data in reply.iter_raw():
            for event in parser.feed(data):
                checker.feed(event)
                events.append(event)
                if on_event is not None:
                    on_event(event)
    parser.close()
    checker.finish()
    return events


def test_while_the_store_is_cut_off_what_needs_it_is_a_503_and_the_rest_is_served(
    server: ServerProcess, upstream: ScriptedUpstream, relay: CuttableRelay
) -> None:
    stored = httpx.post(f"{server.url}/v1/responses", json={"model": _answer(upstream), "input": "Hi"}, timeout=60)
    response_id = check_response(stored.json())["id"]
    relay.cut()
    try:
        _unavailable(httpx.post(f"{server.url}/v1/responses", json={"model": _answer(upstream), "input": "Hi"},
                                timeout=60))
        _unavailable(httpx.post(f"{server.url}/v1/responses",
                                json={"model": _answer(upstream), "input": "Hi", "stream": True}, timeout=60))
        _unavailable(httpx.get(f"{server.url}/v1/responses/{response_id}", timeout=60))
        unstored = httpx.post(f"{server.url}/v1/responses",
                              json={"model": _answer(upstream, "not kept"), "input": "Hi", "store": False}, timeout=60)
        assert check_response(unstored.json())["status"] == "completed"
        # readiness says so, and stays 200: every replica shares the database
        ready = httpx.get(f"{server.url}/readyz", timeout=60)
        assert ready.status_code == 200 and ready.json() == {"status": "degraded", "server": "ok",
                                                            "store": "unreachable"}
    finally:
        relay.restore()
    assert httpx.get(f"{server.url}/readyz", timeout=60).json() == {"status": "ready", "server": "ok", "store": "ok"}
    # back: the pool's broken connections are replaced, without a restart
    again = httpx.post(f"{server.url}/v1/responses", json={"model": _answer(upstream), "input": "Hi"}, timeout=60)
    assert check_response(again.json())["status"] == "completed"
    fetched = httpx.get(f"{server.url}/v1/responses/{check_response(again.json())['id']}", timeout=60)
    assert check_response(fetched.json())["status"] == "completed"
    assert check_response(httpx.get(f"{server.url}/v1/responses/{response_id}", timeout=60).json())["id"] == response_id


def test_a_stream_whose_end_cannot_be_recorded_fails_instead_of_completing(
    server: ServerProcess, upstream: ScriptedUpstream, relay: CuttableRelay
) -> None:
    paced = upstream.stream(chunk(content="first"), Pause(1.0), chunk(content=" second"),
                            chunk(finish_reason="stop"), DONE)

    def cut_after_the_first_text(event: dict[str, Any]) -> None:
        if event["type"] == "response.output_text.delta" and event["delta"] == "first":
            relay.cut()

    try:
        events = _stream(server, {"model": paced, "input": "Hi"}, cut_after_the_first_text)
    finally:
        relay.restore()
    types = [event["type"] for event in events]
    assert "response.completed" not in types
    assert types[-2:] == ["error", "response.failed"]
    assert events[-2]["error"]["code"] == "store_unavailable"
    failed = events[-1]["response"]
    assert failed["error"]["code"] == "store_unavailable"
    # the output streamed is kept in the failed response: nothing the client saw is lost
    assert [part["text"] for item in failed["output"] for part in item["content"]] == ["first second"]
    # once the store is back, it says what the client was told
    deadline = time.monotonic() + 60  # a bound, not a measurement
    while True:
        fetched = httpx.get(f"{server.url}/v1/responses/{failed['id']}", timeout=60)
        if fetched.status_code == 200 and fetched.json()["status"] != "in_progress" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    stored = check_response(fetched.json())
    assert stored["status"] == "failed" and stored["error"]["code"] == "store_unavailable"
    assert stored["output"] == failed["output"]
    replay = httpx.get(f"{server.url}/v1/responses/{failed['id']}?stream=true", timeout=60)
    parser = SSEParser(require_done=True)
    replayed = parser.feed(replay.content)
    parser.close()
    assert replayed == events  # the events it kept are the ones the client read


def test_on_a_websocket_a_turn_the_store_cannot_start_is_an_error_and_the_socket_stays(
    server: ServerProcess, upstream: ScriptedUpstream, relay: CuttableRelay
) -> None:
    """Over a WebSocket as over HTTP: a turn whose start cannot be recorded is the
    store's error (an error envelope, before any event), and the connection goes on."""
    with connect(server.url.replace("http://", "ws://") + "/v1/responses", open_timeout=10) as socket:
        relay.cut()
        try:
            socket.send(json.dumps({"type": "response.create", "model": _answer(upstream), "input": "Hi"}))
            envelope = json.loads(socket.recv(timeout=60))
        finally:
            relay.restore()
        validate_ws_error(envelope)
        assert envelope["status"] == 503 and envelope["error"]["code"] == "store_unavailable", envelope
        socket.send(json.dumps({"type": "response.create", "model": _answer(upstream), "input": "Hi"}))
        events: list[dict[str, Any]] = []
        while not events or events[-1]["type"] not in ("response.completed", "response.failed", "error"):
            events.append(json.loads(socket.recv(timeout=60)))
        assert check_stream(events, expect_done=False, transport="websocket")["status"] == "completed"


def _advisory_locks_of_the_server(postgres_url: str, relay: CuttableRelay) -> int:
    """Session advisory locks held by the server's sessions (those that came through the
    relay): its instance lock, which says to other replicas that it is alive."""
    async def count() -> int:
        connection = await asyncpg.connect(make_url(postgres_url).set(drivername="postgresql").render_as_string(
            hide_password=False))
        try:
            return await connection.fetchval(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.locktype = 'advisory' AND l.granted AND a.client_port = ANY($1::int[])",
                sorted(relay.database_ports))
        finally:
            await connection.close()
    return asyncio.run(count())


def _lock_within(seconds: float, postgres_url: str, relay: CuttableRelay) -> int:
    deadline = time.monotonic() + seconds
    while (held := _advisory_locks_of_the_server(postgres_url, relay)) == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    return held


def test_the_instance_lock_is_taken_again_soon_after_the_store_is_back(
    server: ServerProcess, upstream: ScriptedUpstream, relay: CuttableRelay, postgres_url: str
) -> None:
    """A session's locks end with its connection: the cut takes the server's instance
    lock with it, and until it is taken again another replica's recovery could count
    this server as dead and fail its running responses. It is taken again within about
    a second of the database being back, not at the next recovery period (30 s)."""
    assert _lock_within(5, postgres_url, relay) == 1  # held (taken again after the tests before)
    relay.cut()
    try:
        _unavailable(httpx.post(f"{server.url}/v1/responses", json={"model": _answer(upstream), "input": "Hi"},
                                timeout=60))
        time.sleep(1.5)  # the server tries again, and finds the database still out of reach
    finally:
        relay.restore()
    # a bound, not a measurement: the recovery period is 30 s
    assert _lock_within(5, postgres_url, relay) == 1
    deadline = time.monotonic() + 30  # a bound, not a measurement: info lines are written soon
    while "The store's instance lock is taken again." not in server.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    log = server.log()
    assert "The store's instance lock is lost with the database" in log
    assert "The store's instance lock is taken again." in log, "\n".join(
        line for line in log.splitlines() if "ors.access" not in line)


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def test_a_server_started_before_its_database_waits_for_it(
    postgres_url: str, upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    """As in a compose file or a pod, where the database may come up after the server:
    the server keeps trying (once a second, one warning) and serves once it is there."""
    with relayed_database(postgres_url) as (relay, url):
        relay.cut()  # the database is not there yet
        env = {"ORS_DATABASE_URL": url, "ORS_UPSTREAM_URL": upstream.base_url,
               "ORS_DEFAULT_MODEL": "any-upstream-model"}
        server = ServerProcess(env, tmp_path)

        def restore_once_refused() -> None:
            deadline = time.monotonic() + 120  # a bound, not a measurement
            while "The database cannot be reached" not in _text(server.log_path) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(2.5)  # it tries again meanwhile, without another warning
            relay.restore()

        restorer = threading.Thread(target=restore_once_refused)
        restorer.start()
        try:
            server.start()  # healthy only once the store is open
        finally:
            restorer.join()
        try:
            stored = httpx.post(f"{server.url}/v1/responses", json={"model": _answer(upstream), "input": "Hi"},
                                timeout=60)
            assert check_response(stored.json())["status"] == "completed"
            deadline = time.monotonic() + 30  # a bound, not a measurement: info lines are written soon
            while "The database is reachable" not in server.log() and time.monotonic() < deadline:
                time.sleep(0.1)
            log = server.log()
            assert log.count("The database cannot be reached") == 1, log
            assert "The database is reachable: the store is open." in log
        finally:
            server.terminate()


def test_a_server_whose_database_stays_out_of_reach_exits_saying_why(
    postgres_url: str, upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    with relayed_database(postgres_url) as (relay, url):
        relay.cut()
        env = {"ORS_DATABASE_URL": url, "ORS_UPSTREAM_URL": upstream.base_url,
               "ORS_DEFAULT_MODEL": "any-upstream-model", "ORS_DATABASE_WAIT_SECONDS": "2"}
        with pytest.raises(RuntimeError, match="The database could not be reached for 2 s"):
            ServerProcess(env, tmp_path).start()


def test_no_request_in_the_outage_was_an_unhandled_error(server: ServerProcess) -> None:
    """Runs after the others (same module, same server): each failure was answered as
    the store's error, none fell through to the last-resort handler."""
    log = server.log()
    assert "store_unavailable" in log or "cannot be reached" in log
    assert "unhandled error" not in log and "Exception in ASGI application" not in log
