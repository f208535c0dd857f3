"""Many upstreams from a configuration file, against a scripted Chat Completions server
on loopback (named as such: it records what it is sent, which no real server does): the
routes, the stripped prefix, a dialect option that changes what is sent, the listing, and
the ``ORS_UPSTREAM_*`` shortcut beside a file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.config import Settings
from app.main import create_app
from tests.client import Client
from tests.live import LiveServer
from tests.upstream_server import DONE, ScriptedUpstream, chunk, running_scripted_upstream

THOUGHT = "A greeting deserves a greeting."


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with running_scripted_upstream() as scripted:
        yield scripted


def config_file(tmp_path: Path, base_url: str) -> Path:
    path = tmp_path / "ors.toml"
    path.write_text(f"""
[upstreams.alpha]
base_url = "{base_url}"
api_key = "alpha-key"
prefixes = ["alpha/"]
[upstreams.alpha.dialect]
replay_reasoning = true

[upstreams.beta]
base_url = "{base_url}"
api_key_env = "ORS_TEST_BETA_KEY"
models = ["beta-model", "plain"]
""")
    return path


@pytest.fixture(scope="module")
def front(upstream: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    data = tmp_path_factory.mktemp("routes")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ORS_TEST_BETA_KEY", "beta-key")
        settings = Settings(data_dir=data, default_model="beta-model", config=config_file(data, upstream.base_url),
                            upstream_url=upstream.base_url, upstream_models=["short-model"])
        app = create_app(settings, backends=[])
    server = LiveServer(app).start()
    client = Client(server.url)
    yield client
    client.close()
    server.stop()


def answer(upstream: ScriptedUpstream, model: str, text: str = "Hi.") -> None:
    upstream.stream(chunk(content=text, finish_reason="stop"), DONE, model=model)


def test_a_prefix_is_stripped_and_the_response_echoes_the_id_asked(front: Client, upstream: ScriptedUpstream) -> None:
    answer(upstream, "llama3")
    response = front.create(model="alpha/llama3", input="hi")
    assert response["model"] == "alpha/llama3"
    sent = upstream.requests_for("llama3")[-1]
    assert sent.headers["authorization"] == "Bearer alpha-key"


def test_exact_ids_go_to_their_upstream_with_its_key(front: Client, upstream: ScriptedUpstream) -> None:
    answer(upstream, "beta-model")
    assert front.create(input="hi")["model"] == "beta-model"  # the default model
    assert upstream.requests_for("beta-model")[-1].headers["authorization"] == "Bearer beta-key"


def test_the_shortcut_variables_still_route(front: Client, upstream: ScriptedUpstream) -> None:
    answer(upstream, "short-model")
    assert front.create(model="short-model", input="hi")["model"] == "short-model"
    assert "authorization" not in upstream.requests_for("short-model")[-1].headers


def test_unrouted_ids_are_404(front: Client) -> None:
    error = front.error({"model": "gamma/x", "input": "hi"}, 404)
    assert error["code"] == "model_not_found" and "'alpha/'" in error["message"]


def test_replay_reasoning_reaches_only_the_upstream_that_sets_it(front: Client, upstream: ScriptedUpstream) -> None:
    """The decrypted reasoning of an earlier turn is sent as ``reasoning_content`` to
    ``alpha`` (``replay_reasoning = true``), and not to ``beta`` (the default)."""
    upstream.stream(chunk(reasoning_content=THOUGHT), chunk(content="Hello!", finish_reason="stop"), DONE,
                    model="thinker")
    first = front.create(model="alpha/thinker", input="hi", store=False, include=["reasoning.encrypted_content"])
    reasoning, message = first["output"]
    assert reasoning["encrypted_content"] and THOUGHT not in reasoning["encrypted_content"]
    replay = [
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "id": reasoning["id"], "summary": [], "encrypted_content": reasoning["encrypted_content"]},
        message,
        {"role": "user", "content": "and now?"},
    ]
    answer(upstream, "replayed")
    answer(upstream, "plain")
    front.create(model="alpha/replayed", input=replay, store=False)
    front.create(model="plain", input=replay, store=False)

    def assistant(model: str) -> dict[str, object]:
        messages = upstream.requests_for(model)[-1].body["messages"]
        return next(m for m in messages if m["role"] == "assistant")

    assert assistant("replayed")["reasoning_content"] == THOUGHT
    assert "reasoning_content" not in assistant("plain")


def test_models_lists_the_configured_ids(front: Client) -> None:
    listed = {m["id"]: m["owned_by"] for m in httpx.get(f"{front.http.base_url}/v1/models").json()["data"]}
    assert listed["beta-model"] == "beta" and listed["plain"] == "beta"
    assert listed["short-model"] == "upstream"


def test_one_kept_alive_connection_per_upstream(front: Client, upstream: ScriptedUpstream) -> None:
    answer(upstream, "again")
    front.create(model="alpha/again", input="one")
    front.create(model="alpha/again", input="two")
    first, second = (request.peer for request in upstream.requests_for("again"))
    assert first == second
