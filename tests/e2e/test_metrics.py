"""GET /metrics against the real server: what a Prometheus scrape sees after real traffic."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from app.config import Settings
from app.main import create_app
from compliance import validate_error_body
from tests.client import Client
from tests.conftest import SMOL, scripted_backend
from tests.live import live_server


def scrape(url: str, key: str | None = None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    reply = httpx.get(f"{url}/metrics", headers=headers, timeout=30)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_traffic_is_counted(client: Client) -> None:
    url = str(client.http.base_url).rstrip("/")
    before = scrape(url)
    client.create(model="scripted-text", input="hi")
    client.stream(model="scripted-text", input="hi")
    client.error({"model": "scripted-fail", "input": "x"}, 500)
    client.create(model=SMOL, input="Say hi.", max_output_tokens=16)
    bad_call = [
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{"},
        {"type": "function_call_output", "call_id": "c1", "output": "x"},
    ]
    client.error({"model": "scripted-text", "input": bad_call}, 400)
    client.http.get("/v1/responses/resp_does_not_exist")
    after = scrape(url)

    def grew(name: str, by: float = 1, **labels: str) -> bool:
        return value(after, name, **labels) - value(before, name, **labels) >= by

    assert grew("ors_http_requests_total", 2, route="/v1/responses", method="POST", status="200", model="scripted-text")
    assert grew("ors_http_requests_total", route="/v1/responses", method="POST", status="400", model="")
    assert grew("ors_http_requests_total", route="/v1/responses/{response_id}", method="GET", status="404", model="")
    assert grew("ors_responses_total", 2, model="scripted-text", status="completed")
    assert grew("ors_response_failures_total", model="scripted-fail", code="upstream_unavailable")
    assert grew("ors_gate_rejections_total", reason="arguments_parse")
    assert grew("ors_time_to_first_token_seconds_count", 2, model="scripted-text")
    assert grew("ors_response_duration_seconds_count", 1, model=SMOL)
    assert grew("ors_tokens_total", 1, model=SMOL, kind="output")
    assert grew("ors_tokens_total", 1, model=SMOL, kind="input")
    assert value(after, "ors_model_slots", model=SMOL) >= 1
    assert value(after, "ors_model_slots_busy", model=SMOL) == 0
    assert value(after, "ors_model_queue_depth", model=SMOL) == 0
    assert value(after, "ors_responses_in_progress") == 0


def test_repeated_prompt_is_a_prompt_cache_hit(client: Client) -> None:
    url = str(client.http.base_url).rstrip("/")
    prompt = "Repeat after me, slowly and exactly: " + " ".join(f"word{i}" for i in range(200))
    client.create(model=SMOL, input=prompt, max_output_tokens=16, temperature=0)
    before = scrape(url)
    client.create(model=SMOL, input=prompt, max_output_tokens=16, temperature=0)
    after = scrape(url)
    assert value(after, "ors_prompt_cache_hits_total", model=SMOL) > value(before, "ors_prompt_cache_hits_total", model=SMOL)
    assert value(after, "ors_tokens_total", model=SMOL, kind="cached") > value(before, "ors_tokens_total", model=SMOL, kind="cached")


def test_websocket_connections_are_a_gauge(client: Client) -> None:
    from websockets.sync.client import connect

    url = str(client.http.base_url).rstrip("/")
    with connect(url.replace("http://", "ws://") + "/v1/responses", open_timeout=10) as ws:
        open_now = scrape(url)
        ws.send(json.dumps({"type": "response.create", "model": "scripted-text", "input": "hi", "store": False}))
        while json.loads(ws.recv(timeout=30))["type"] != "response.completed":
            pass
    assert value(open_now, "ors_websocket_connections") >= 1


def test_metrics_are_protected_like_the_api(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "a", api_keys=["alice:k-alice"], default_model="scripted-text")
    with live_server(create_app(settings, backends=[scripted_backend()])) as server:
        refused = httpx.get(f"{server.url}/metrics", timeout=30)
        assert refused.status_code == 401
        validate_error_body(refused.json())
        assert scrape(server.url, "k-alice") is not None
    settings = Settings(data_dir=tmp_path / "b", api_keys=["alice:k-alice"], metrics_key="k-metrics",
                        default_model="scripted-text")
    with live_server(create_app(settings, backends=[scripted_backend()])) as server:
        assert httpx.get(f"{server.url}/metrics", headers={"Authorization": "Bearer k-alice"}, timeout=30).status_code == 401
        assert scrape(server.url, "k-metrics") is not None
