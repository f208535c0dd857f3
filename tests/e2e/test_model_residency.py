"""Models loaded on demand, unloaded when idle, within a memory budget: ``ors serve`` as a
real process, serving SmolLM2's file from a models folder under two ids (each its own
llama-server), with ``ORS_MODEL_MEMORY_MIB`` room for one of them."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.backends.model_files import SMOLLM2, locate
from compliance import check_response, check_sse_body, validate_error_body
from tests.e2e.test_cli import _llama_servers_of
from tests.e2e.test_metrics import scrape, value
from tests.live import ServerProcess, wait_for

pytestmark = pytest.mark.model

BUDGET_MIB = 400
"""Room for one SmolLM2 at a 2,048-token window (weights 94 MiB, KV cache 45 MiB, and the
server's own), not for two."""


def folder(tmp_path: Path) -> Path:
    smol = locate(SMOLLM2.source.file)  # type: ignore[union-attr]
    assert smol is not None
    models = tmp_path / "models"
    models.mkdir()
    for name in ("tiny-a", "tiny-b"):
        (models / f"{name}.gguf").symlink_to(smol)
    return models


def serve(tmp_path: Path, **env: str) -> ServerProcess:
    return ServerProcess({"ORS_MODELS_DIR": str(folder(tmp_path)), "ORS_DEFAULT_MODEL": "tiny-a",
                          "ORS_MODEL_CONTEXT": "2048", "ORS_LOG_LEVEL": "info", **env}, tmp_path / "data").start()


def statuses(server: ServerProcess) -> dict[str, str]:
    listed = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]
    return {model["id"]: model["status"] for model in listed if model["id"].startswith("tiny-")}


def ask(server: ServerProcess, model: str, text: str = "Say hi.") -> httpx.Response:
    return httpx.post(f"{server.url}/v1/responses", json={"model": model, "input": text, "max_output_tokens": 16},
                      timeout=300)


def operate(server: ServerProcess, model: str, action: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/models/{model}/{action}", timeout=300)


def test_a_model_is_loaded_on_demand_in_place_of_an_idle_one(tmp_path: Path) -> None:
    server = serve(tmp_path, ORS_MODEL_MEMORY_MIB=str(BUDGET_MIB))
    try:
        assert statuses(server) == {"tiny-a": "loaded", "tiny-b": "unloaded"}, "the default model, at start"
        metrics = scrape(server.url)
        footprint = value(metrics, "ors_model_memory_mib", model="tiny-a")
        assert BUDGET_MIB / 2 < footprint <= BUDGET_MIB, "the estimate leaves room for one, not two"

        reply = ask(server, "tiny-b")
        assert reply.status_code == 200, reply.text
        check_response(reply.json())
        assert statuses(server) == {"tiny-a": "unloaded", "tiny-b": "loaded"}
        assert "unloading model 'tiny-a'" in server.log() and "to make room for 'tiny-b'" in server.log()
        ready = httpx.get(f"{server.url}/readyz", timeout=30).json()
        assert ready["models"] == {"tiny-b": "ok"}, "readiness names the loaded models"
        assert server.process is not None and len(_llama_servers_of(server.process.pid)) == 1

        # while tiny-b serves a stream, it is neither unloaded nor made room for
        body = {"model": "tiny-b", "input": "Write a very long story about the sea.", "max_output_tokens": 2000,
                "stream": True}
        raw = bytearray()
        child = _llama_servers_of(server.process.pid)[0]
        with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=120) as stream:
            chunks = stream.iter_raw()
            for chunk in chunks:
                raw += chunk
                if b"response.output_text.delta" in raw:
                    break
            os.kill(child, signal.SIGSTOP)  # it stays busy, whatever the model would write
            try:
                busy = operate(server, "tiny-b", "unload")
                assert busy.status_code == 409, busy.text
                validate_error_body(busy.json())
                assert busy.json()["error"]["code"] == "model_busy"
                refused = ask(server, "tiny-a")
                assert refused.status_code == 503, refused.text
                validate_error_body(refused.json())
                assert refused.json()["error"]["code"] == "model_unavailable"
                assert "ORS_MODEL_MEMORY_MIB" in refused.json()["error"]["message"]
                assert int(refused.headers["retry-after"]) > 0
            finally:
                os.kill(child, signal.SIGCONT)
            for chunk in chunks:
                raw += chunk
        assert check_sse_body(bytes(raw))["status"] in ("completed", "incomplete")
        assert ask(server, "tiny-a").status_code == 200, "once tiny-b is idle, it makes room"
        assert statuses(server) == {"tiny-a": "loaded", "tiny-b": "unloaded"}
    finally:
        server.kill()


def test_operators_load_and_unload_models(tmp_path: Path) -> None:
    server = serve(tmp_path, ORS_API_KEYS="ops:k1")
    try:
        keyed = {"Authorization": "Bearer k1"}
        assert httpx.post(f"{server.url}/v1/models/tiny-b/load", timeout=30).status_code == 401
        loaded = httpx.post(f"{server.url}/v1/models/tiny-b/load", headers=keyed, timeout=300)
        assert loaded.status_code == 200, loaded.text
        assert loaded.json() | {"created": 0} == {"id": "tiny-b", "object": "model", "created": 0, "owned_by": "ors",
                                                  "context_window": 2048, "status": "loaded"}
        unloaded = httpx.post(f"{server.url}/v1/models/tiny-a/unload", headers=keyed, timeout=300)
        assert unloaded.status_code == 200, unloaded.text
        assert unloaded.json()["status"] == "unloaded"
        listed = httpx.get(f"{server.url}/v1/models", headers=keyed, timeout=30).json()["data"]
        assert {model["id"]: model.get("status") for model in listed if model["id"].startswith("tiny-")} == \
            {"tiny-a": "unloaded", "tiny-b": "loaded"}
        missing = httpx.post(f"{server.url}/v1/models/nothing/load", headers=keyed, timeout=30)
        assert missing.status_code == 404
        validate_error_body(missing.json())
        answer = httpx.post(f"{server.url}/v1/responses", headers=keyed, timeout=300,
                            json={"model": "tiny-a", "input": "Say hi.", "max_output_tokens": 16})
        assert answer.status_code == 200, "an unloaded model loads again for its next request"
    finally:
        server.kill()


def test_an_idle_model_is_unloaded_and_its_prompt_cache_comes_back(tmp_path: Path) -> None:
    server = serve(tmp_path, ORS_MODEL_IDLE_SECONDS="1")
    try:
        prompt = "Here is a list of fruits: apple, banana, cherry, damson, elderberry, fig, grape. Name one."
        first: dict[str, Any] = ask(server, "tiny-a", prompt).json()
        assert first["status"] in ("completed", "incomplete"), first
        assert wait_for(lambda: statuses(server)["tiny-a"] == "unloaded", timeout=120), server.log()[-3000:]
        assert "unloading model 'tiny-a': unused for" in server.log()
        again = ask(server, "tiny-a", prompt).json()
        assert again["status"] in ("completed", "incomplete"), again
        assert again["usage"]["input_tokens_details"]["cached_tokens"] > 0, "its slots were saved and restored"
    finally:
        server.kill()
