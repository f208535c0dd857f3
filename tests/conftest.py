"""Shared fixtures: real servers on loopback, the test model, the scripted backend.

``SMOL`` (SmolLM2-135M, ~100 tokens/s) is the model for plumbing tests; the default
Qwen model is used only where a test needs a model that can reason or pick a tool.

Tests are marked by what they need beyond this checkout (markers in ``pyproject.toml``):
``postgres`` (the PostgreSQL server, ``ORS_TEST_POSTGRES_URL``), ``redis`` (the Redis
server, ``ORS_TEST_REDIS_URL``) and ``model`` (an embedded model: llama-server and the
model files). :func:`pytest_collection_modifyitems` marks a test by the fixtures it uses
(:data:`NEEDS`) and by the parameters it runs with (``"postgresql"``, ``"redis"``); a
test that starts such a thing itself carries the mark explicitly. ``make test-fast``
leaves all three out.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.backends.base import Finish, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from app.backends.local import LocalBackend
from app.backends.scripted import Script, ScriptedBackend, text_script
from app.config import Settings
from app.errors import ModelError
from app.main import create_app
from tests.client import Client
from tests.live import LiveServer

SMOL = "smollm2-135m-instruct"
QWEN = "qwen2.5-coder-1.5b-instruct"


NEEDS: dict[str, str] = {
    "postgres_url": "postgres",
    "postgres_database_url": "postgres",
    "redis_url": "redis",
    "model_dir": "model",
    "smollm2": "model",
    "qwen_cache_dir": "model",
    "chromium": "browser",
}
"""Fixtures that need a service or an embedded model, and the marker of that need. A
fixture that uses one of them (``server`` uses ``model_dir``) passes its need on."""

PARAMETERS: dict[str, str] = {"postgresql": "postgres", "redis": "redis"}
"""Parameter values that select a service (a test run on both store engines, or on both
rate limit stores), and the marker of that need."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test by what it needs: a fixture of :data:`NEEDS` anywhere among those it
    uses (its fixture closure), or a parameter of :data:`PARAMETERS` it runs with."""
    for item in items:
        needs = {NEEDS[name] for name in getattr(item, "fixturenames", ()) if name in NEEDS}
        callspec = getattr(item, "callspec", None)
        if callspec is not None:
            needs |= {PARAMETERS[value] for value in callspec.params.values()
                      if isinstance(value, str) and value in PARAMETERS}
        for need in sorted(needs):
            item.add_marker(need)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the embedded models' files are assembled, shared by every test server so the
    default model is assembled once per run. A test that uses it runs an embedded model
    (marked ``model``)."""
    return tmp_path_factory.mktemp("models")


def scripted_backend() -> ScriptedBackend:
    """Deterministic models for paths a real model cannot be made to take on demand
    (a failure in the middle of a stream, reasoning, a tool call). Named as such."""
    return ScriptedBackend(
        {
            "scripted-text": text_script("Hello", ", ", "world", "."),
            "scripted-fail": Script(text_script("partial", " answer"), fail_after=2,
                                    error=ModelError("The upstream model went away.", code="upstream_unavailable")),
            "scripted-length": [TextDelta("cut"), TextDelta(" short"), Finish("length", Usage(5, 16))],
            "scripted-reasoning": [
                ReasoningDelta("Think first."),
                TextDelta("Answer."),
                Finish("stop", Usage(4, 3, reasoning_tokens=1)),
            ],
            "scripted-tool": [
                ToolCallDelta(0, name="get_weather", arguments='{"city":'),
                ToolCallDelta(0, arguments=' "Paris"}'),
                Finish("tool_calls", Usage(7, 5)),
            ],
            "scripted-tool-cut": [
                ToolCallDelta(0, name="get_weather", arguments='{"city": "Par'),
                Finish("length", Usage(7, 16)),
            ],
            "scripted-namespaced-tool": [
                ToolCallDelta(0, name="multi_agent_v1__spawn_agent", arguments='{"message": "list files"}'),
                Finish("tool_calls", Usage(9, 6)),
            ],
            "scripted-custom-tool": [
                ToolCallDelta(0, name="apply_patch", arguments='{"input": "*** Begin Patch\\n'),
                ToolCallDelta(0, arguments='*** End Patch\\n"}'),
                Finish("tool_calls", Usage(9, 8)),
            ],
            "scripted-custom-maybe": [
                ToolCallDelta(0, name="answer", arguments='{"input": "maybe"}'),
                Finish("tool_calls", Usage(9, 4)),
            ],
            "scripted-empty": [Finish("stop", Usage(3, 0))],
            "scripted-slow": Script(text_script(*["tick "] * 400), delay=0.05),
            # JSON whose string defeats a backtracking regex such as ^(a+)+$.
            "scripted-redos": text_script('{"code": "', "a" * 5000, '!"}'),
        }
    )


POSTGRES_ADMIN_URL = os.environ.get("ORS_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
"""A database on the PostgreSQL server the tests create their own databases with."""


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database on the real server, dropped at the end. Fails (never
    skips) when PostgreSQL is not reachable: CI must prove the PostgreSQL store."""
    import asyncio
    import uuid

    import asyncpg
    from sqlalchemy.engine import make_url

    name = f"ors_e2e_{uuid.uuid4().hex[:12]}"
    admin_url = make_url(POSTGRES_ADMIN_URL)
    dsn = admin_url.set(drivername="postgresql").render_as_string(hide_password=False)

    async def admin(statement: str) -> None:
        connection = await asyncpg.connect(dsn)
        try:
            await connection.execute(statement)
        finally:
            await connection.close()

    try:
        asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    except (OSError, asyncpg.PostgresError) as error:
        pytest.fail(f"PostgreSQL at {admin_url.render_as_string()} is not reachable ({error!r}); "
                    "the tests marked `postgres` need it (ORS_TEST_POSTGRES_URL names another server).")
    try:
        yield admin_url.set(drivername="postgresql+asyncpg", database=name).render_as_string(hide_password=False)
    finally:
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def scripted() -> ScriptedBackend:
    return scripted_backend()


@pytest.fixture(scope="session")
def server(model_dir: Path, scripted: ScriptedBackend) -> Iterator[LiveServer]:
    """The real server on 127.0.0.1 with SmolLM2 as its default model, plus the
    scripted models."""
    settings = Settings(default_model=SMOL, data_dir=model_dir.parent / "server-data",
                        model_aliases={"gpt-4o-mini": QWEN})
    local = LocalBackend(model_dir, n_threads=2, preload=[SMOL], models=[SMOL, QWEN])
    server = LiveServer(create_app(settings, backends=[local, scripted])).start()
    yield server
    server.stop()


@pytest.fixture()
def client(server: LiveServer) -> Iterator[Client]:
    client = Client(server.url)
    yield client
    client.close()


REDIS_URL = os.environ.get("ORS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture()
def redis_url() -> str:
    """The real Redis server. Fails (never skips) when it is not reachable."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as error:
        pytest.fail(f"Redis at {REDIS_URL} is not reachable ({error!r}); the tests marked `redis` need it "
                    "(ORS_TEST_REDIS_URL names another server).")
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture()
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test's own, so tests never share counts; its keys are
    deleted afterwards."""
    import uuid

    import redis

    prefix = f"ors-test-{uuid.uuid4().hex[:12]}"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
