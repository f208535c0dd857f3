"""A conversation across two replicas sharing one PostgreSQL: what one adds the other
reads, and while a response runs on it at one replica the other refuses a second one
(409 ``conversation_busy``), then serves it once the first has ended. The scripted
backend (named as such) makes a stream that runs long enough to be seen running."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from app.backends.scripted import Script, ScriptedBackend, text_script
from app.config import Settings
from app.main import create_app
from compliance import validate_error_body
from tests.live import LiveServer


def _backend() -> ScriptedBackend:
    return ScriptedBackend({"slow": Script(text_script(*["word "] * 60), delay=0.05),
                            "quick": text_script("Done.")})


@pytest.fixture(scope="module")
def replicas(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, LiveServer]]:
    servers = [LiveServer(create_app(Settings(data_dir=tmp_path_factory.mktemp(f"replica-{n}"),
                                              database_url=postgres_url, default_model="quick"),
                                     backends=[_backend()])).start() for n in (1, 2)]
    yield servers[0], servers[1]
    for server in servers:
        server.stop()


def test_a_conversation_is_shared_and_held_across_replicas(replicas: tuple[LiveServer, LiveServer]) -> None:
    first, second = replicas
    conversation = httpx.post(f"{first.url}/v1/conversations", json={"items": [
        {"type": "message", "role": "user", "content": "Hello from the first replica."}]}).json()
    path = f"/v1/conversations/{conversation['id']}/items"
    assert [item["content"][0]["text"] for item in httpx.get(f"{second.url}{path}").json()["data"]] == [
        "Hello from the first replica."]
    body = {"model": "slow", "conversation": conversation["id"], "input": "Go on.", "stream": True}
    with httpx.stream("POST", f"{first.url}/v1/responses", json=body, timeout=120) as running:
        lines = running.iter_lines()
        assert next(line for line in lines if line.startswith("data: ")).startswith('data: {"type":"response.created"')
        busy = httpx.post(f"{second.url}/v1/responses", timeout=60,
                          json={"model": "quick", "conversation": conversation["id"], "input": "Me too."})
        assert busy.status_code == 409, busy.text
        validate_error_body(busy.json())
        assert busy.json()["error"]["code"] == "conversation_busy"
        for _ in lines:
            pass
    served = httpx.post(f"{second.url}/v1/responses", timeout=60,
                        json={"model": "quick", "conversation": conversation["id"], "input": "Me too."})
    assert served.status_code == 200, served.text
    texts = [part.get("text") for item in httpx.get(f"{first.url}{path}?order=asc").json()["data"]
             for part in item["content"]]
    assert texts == ["Hello from the first replica.", "Go on.", "word " * 60, "Me too.", "Done."]
