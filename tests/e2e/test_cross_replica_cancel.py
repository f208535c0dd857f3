"""Two real ``ors serve`` processes on 127.0.0.1 sharing one real PostgreSQL database, the
model a slow scripted upstream both of them reach: a cancel sent to one replica stops the
response the other generates, and a stream followed on one replica
(``GET /v1/responses/{id}?stream=true``) while the other generates it arrives live; both
still do after the database was out of reach (each replica's connections to it cut and
restored: their dedicated ``LISTEN`` connections come back)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from compliance import SSEParser, StreamChecker, check_response
from tests.live import ServerProcess
from tests.tcp_relay import CuttableRelay, relayed_database
from tests.upstream_server import DONE, Pause, ScriptedUpstream, chunk, running_scripted_upstream

JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with running_scripted_upstream() as upstream:
        yield upstream


def _two_replicas(database_url: str, upstream: ScriptedUpstream,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    env = {"ORS_DATABASE_URL": database_url, "ORS_UPSTREAM_URL": upstream.base_url,
           "ORS_DEFAULT_MODEL": "any-upstream-model"}
    first = ServerProcess(env, tmp_path_factory.mktemp("replica-1")).start()
    try:
        second = ServerProcess(env, tmp_path_factory.mktemp("replica-2")).start()
    except BaseException:
        first.kill()
        raise
    yield first, second
    for replica in (first, second):
        replica.terminate()


@pytest.fixture(scope="module")
def replicas(postgres_url: str, upstream: ScriptedUpstream,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    yield from _two_replicas(postgres_url, upstream, tmp_path_factory)


@pytest.fixture(scope="module")
def replicas_after_an_outage(postgres_url: str, upstream: ScriptedUpstream,
                             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Two replicas that reach the database through a relay, which was cut (every
    connection of theirs closed, new ones refused) and restored once they ran; yielded
    once each says its event relay connection is back."""
    with relayed_database(postgres_url) as (relay, url):
        yield from _after_an_outage(relay, url, upstream, tmp_path_factory)


def _after_an_outage(relay: CuttableRelay, url: str, upstream: ScriptedUpstream,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    for pair in _two_replicas(url, upstream, tmp_path_factory):
        relay.cut()
        time.sleep(1.0)  # they try to come back meanwhile, and are refused
        relay.restore()
        for replica in pair:
            assert _until(lambda replica=replica: "The event relay connection is back." in replica.log(), 30), \
                replica.log()[-3000:]
        yield pair


def _slow(upstream: ScriptedUpstream) -> str:
    """A model that writes for minutes unless stopped."""
    steps: list[Any] = []
    for _ in range(3000):
        steps += [chunk(content="tick "), Pause(0.05)]
    return upstream.stream(*steps, chunk(finish_reason="stop"), DONE)


def _until(condition: Any, timeout: float = 60) -> bool:  # a bound, not a measurement
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_cancel_sent_to_another_replica_stops_the_stream(
    replicas: tuple[ServerProcess, ServerProcess], upstream: ScriptedUpstream
) -> None:
    generating, other = replicas
    model = _slow(upstream)
    parser = SSEParser(require_done=True)
    checker = StreamChecker(transport="sse")
    events: list[dict[str, Any]] = []
    cancelled: dict[str, Any] | None = None
    body = {"model": model, "input": "Count.", "background": True, "stream": True}
    with httpx.stream("POST", f"{generating.url}/v1/responses", json=body, timeout=120) as reply:
        assert reply.status_code == 200
        for data in reply.iter_raw():
            for event in parser.feed(data):
                checker.feed(event)
                events.append(event)
                if event["type"] == "response.output_text.delta" and cancelled is None:
                    response_id = events[0]["response"]["id"]
                    answer = httpx.post(f"{other.url}/v1/responses/{response_id}/cancel", headers=JSON, timeout=30)
                    assert answer.status_code == 200, answer.text
                    cancelled = check_response(answer.json())
                    assert cancelled["status"] == "cancelled"
    parser.close()
    final = checker.finish()
    assert final["status"] == "cancelled"
    assert events[-1]["type"] == "response.incomplete"
    assert _until(lambda: model in upstream.disconnected), "replica 1 kept generating"
    for replica in (generating, other):
        stored = httpx.get(f"{replica.url}/v1/responses/{final['id']}", timeout=30)
        assert check_response(stored.json())["status"] == "cancelled"


def test_a_background_response_cancelled_elsewhere_is_cancelled_everywhere(
    replicas: tuple[ServerProcess, ServerProcess], upstream: ScriptedUpstream
) -> None:
    generating, other = replicas
    model = _slow(upstream)
    created = httpx.post(f"{generating.url}/v1/responses", json={"model": model, "input": "x", "background": True},
                         timeout=30)
    response_id = check_response(created.json())["id"]
    assert _until(lambda: upstream.requests_for(model)), "the run did not reach the model"
    answer = httpx.post(f"{other.url}/v1/responses/{response_id}/cancel", headers=JSON, timeout=30)
    assert check_response(answer.json())["status"] == "cancelled"
    assert _until(lambda: model in upstream.disconnected), "replica 1 kept generating"
    again = httpx.post(f"{generating.url}/v1/responses/{response_id}/cancel", headers=JSON, timeout=30)
    assert check_response(again.json())["status"] == "cancelled"


def _paced(upstream: ScriptedUpstream, *words: str, pause: float = 1.0) -> str:
    """A model that writes ``words`` with a pause before each but the first."""
    steps: list[Any] = []
    for number, word in enumerate(words):
        steps += [Pause(pause)] if number else []
        steps.append(chunk(content=word))
    return upstream.stream(*steps, chunk(finish_reason="stop"), DONE)


def _follow(replica: ServerProcess, response_id: str, starting_after: int | None = None,
            on_event: Any = None) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    query = "stream=true" + (f"&starting_after={starting_after}" if starting_after is not None else "")
    parser = SSEParser(require_done=True)
    checker = StreamChecker(transport="sse") if starting_after is None else None
    events: list[dict[str, Any]] = []
    with httpx.stream("GET", f"{replica.url}/v1/responses/{response_id}?{query}", timeout=120) as reply:
        assert reply.status_code == 200, reply.read()
        for data in reply.iter_raw():
            for event in parser.feed(data):
                if checker is not None:
                    checker.feed(event)
                events.append(event)
                if on_event is not None:
                    on_event(event)
    parser.close()
    return events, checker.finish() if checker is not None else None


def test_a_stream_followed_on_another_replica_arrives_live(
    replicas: tuple[ServerProcess, ServerProcess], upstream: ScriptedUpstream
) -> None:
    generating, other = replicas
    model = _paced(upstream, "one ", "two ", "three")
    created = httpx.post(f"{generating.url}/v1/responses", json={"model": model, "input": "x", "background": True},
                         timeout=30)
    response_id = check_response(created.json())["id"]
    seen_running: list[str] = []

    def on_event(event: dict[str, Any]) -> None:
        if event["type"] == "response.output_text.delta" and not seen_running:
            status = httpx.get(f"{generating.url}/v1/responses/{response_id}", timeout=30).json()["status"]
            seen_running.append(status)

    events, final = _follow(other, response_id, on_event=on_event)
    assert seen_running == ["in_progress"]  # the first delta came while the response still ran
    assert final is not None and final["status"] == "completed"
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "one two three"
    replayed, _ = _follow(generating, response_id)  # once ended: the stored record, the same events
    assert [(e["sequence_number"], e["type"]) for e in replayed] == [(e["sequence_number"], e["type"]) for e in events]


def test_a_follower_elsewhere_starts_after_the_number_it_names(
    replicas: tuple[ServerProcess, ServerProcess], upstream: ScriptedUpstream
) -> None:
    generating, other = replicas
    model = _paced(upstream, "alpha ", "beta", pause=1.5)
    created = httpx.post(f"{generating.url}/v1/responses", json={"model": model, "input": "x", "background": True},
                         timeout=30)
    response_id = check_response(created.json())["id"]
    events, _ = _follow(other, response_id, starting_after=3)
    assert [e["sequence_number"] for e in events] == list(range(4, 4 + len(events)))
    assert events[-1]["type"] == "response.completed"


def test_after_an_outage_a_stream_followed_on_another_replica_arrives_live(
    replicas_after_an_outage: tuple[ServerProcess, ServerProcess], upstream: ScriptedUpstream
) -> None:
    test_a_stream_followed_on_another_replica_arrives_live(replicas_after_an_outage, upstream)


def test_after_an_outage_a_cancel_sent_to_another_replica_stops_the_stream(
    replicas_after_an_outage: tuple[ServerProcess, ServerProcess], upstream: ScriptedUpstream
) -> None:
    test_a_cancel_sent_to_another_replica_stops_the_stream(replicas_after_an_outage, upstream)


def test_the_log_of_each_replica_is_clean(replicas: tuple[ServerProcess, ServerProcess]) -> None:
    for replica in replicas:
        assert "Traceback" not in replica.log()

