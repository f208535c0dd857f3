"""Nothing is lost: the server is killed with SIGKILL and started again on the same data."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.client import Client
from tests.conftest import SMOL
from tests.live import ServerProcess

# Every test starts `ors serve` with SmolLM2 as its default model.
pytestmark = pytest.mark.model


def test_chain_survives_kill_9_and_restart(tmp_path: Path) -> None:
    env = {"ORS_DEFAULT_MODEL": SMOL}
    first_life = ServerProcess(env, tmp_path).start()
    client = Client(first_life.url)
    one = client.create(input="Remember the number 314.", max_output_tokens=16)
    two = client.create(input="And the colour blue.", previous_response_id=one["id"], max_output_tokens=16)
    first_life.kill()  # SIGKILL: no shutdown code runs

    second_life = ServerProcess(env, tmp_path).start()
    client = Client(second_life.url)
    for old in (one, two):
        fetched = client.http.get(f"/v1/responses/{old['id']}")
        assert fetched.status_code == 200 and fetched.json() == old
    three = client.create(input="What number and colour?", previous_response_id=two["id"], max_output_tokens=16)
    assert three["previous_response_id"] == two["id"] and three["status"] in ("completed", "incomplete")
    items = client.http.get(f"/v1/responses/{one['id']}/input_items").json()["data"]
    assert items[0]["content"][0]["text"] == "Remember the number 314."
    second_life.kill()


def test_response_in_flight_at_kill_9_is_marked_failed(tmp_path: Path) -> None:
    env = {"ORS_DEFAULT_MODEL": SMOL}
    first_life = ServerProcess(env, tmp_path).start()
    body = {"input": "Write a very long story about mountains.", "max_output_tokens": 4000, "stream": True}
    response_id = None
    with httpx.stream("POST", f"{first_life.url}/v1/responses", json=body, timeout=60) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {") and response_id is None:
                response_id = line.split('"id":"', 1)[1].split('"', 1)[0]
            if line.startswith("event: response.output_text.delta"):
                assert first_life.process is not None
                first_life.process.send_signal(signal.SIGKILL)
                break
    assert response_id is not None
    first_life.process.wait(timeout=30)  # type: ignore[union-attr]
    time.sleep(0.1)

    second_life = ServerProcess(env, tmp_path).start()
    fetched = httpx.get(f"{second_life.url}/v1/responses/{response_id}").json()
    assert fetched["status"] == "failed"
    assert fetched["error"]["code"] == "server_restarted"
    assert all(item.get("status") != "completed" for item in fetched["output"])
    # its input is still there: the chain can go on from it
    after = Client(second_life.url).create(input="Shorter, please.", previous_response_id=response_id,
                                           max_output_tokens=16)
    assert after["previous_response_id"] == response_id
    second_life.kill()
