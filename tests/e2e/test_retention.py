"""``ORS_RESPONSE_RETENTION_DAYS`` on a real ``ors serve``, on both store engines: a
stored response is fetched while it is young, and is gone, as if deleted, once it is past
the retention; a later turn created in time still continues its conversation."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from compliance import check_response, validate_error_body
from tests.conftest import SMOL
from tests.live import ServerProcess

# Every test starts `ors serve` with SmolLM2 as its default model.
pytestmark = pytest.mark.model

RETENTION_SECONDS = 3


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_responses_past_the_retention_are_gone(engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    env = {"ORS_DEFAULT_MODEL": SMOL, "ORS_LOG_LEVEL": "info",
           "ORS_RESPONSE_RETENTION_DAYS": str(RETENTION_SECONDS / 86_400)}
    if engine == "postgresql":
        env["ORS_DATABASE_URL"] = request.getfixturevalue("postgres_url")
    server = ServerProcess(env, tmp_path).start()
    try:
        body = {"model": SMOL, "input": "Say hi.", "max_output_tokens": 16}
        first = check_response(httpx.post(f"{server.url}/v1/responses", json=body, timeout=60).json())
        assert httpx.get(f"{server.url}/v1/responses/{first['id']}", timeout=30).status_code == 200
        deadline = time.monotonic() + 30
        while (fetched := httpx.get(f"{server.url}/v1/responses/{first['id']}", timeout=30)).status_code == 200:
            assert time.monotonic() < deadline, "still there long past the retention"
            time.sleep(0.2)
        assert fetched.status_code == 404
        validate_error_body(fetched.json())
        gone = httpx.get(f"{server.url}/v1/responses/{first['id']}/input_items", timeout=30)
        assert gone.status_code == 404
        continued = httpx.post(f"{server.url}/v1/responses", json={**body, "previous_response_id": first["id"]},
                               timeout=60)
        assert continued.status_code == 400 and continued.json()["error"]["code"] == "previous_response_not_found"
        while "older than the retention" not in server.log():  # info lines are written within 0.5 s
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.1)
    finally:
        server.terminate()
