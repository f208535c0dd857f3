"""Model ids, aliases and ``/v1/models`` over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.backends.local import LocalBackend
from app.config import Settings
from app.main import create_app
from tests.client import Client
from tests.conftest import SMOL
from tests.live import LiveServer


@pytest.fixture(scope="module")
def aliased(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    settings = Settings(
        default_model=SMOL,
        data_dir=tmp_path_factory.mktemp("aliases"),
        model_aliases=f"gpt-4o-mini={SMOL}, other-name = {SMOL}",  # type: ignore[arg-type]
    )
    local = LocalBackend(model_dir, n_threads=2, preload=[SMOL], models=[SMOL])
    server = LiveServer(create_app(settings, backends=[local])).start()
    client = Client(server.url)
    yield client
    client.close()
    server.stop()


def test_an_alias_runs_on_its_model_and_is_echoed(aliased: Client) -> None:
    response = aliased.create(model="gpt-4o-mini", input="Say hi.", max_output_tokens=16)
    assert response["model"] == "gpt-4o-mini"
    assert response["status"] in ("completed", "incomplete")
    streamed = aliased.stream(model="gpt-4o-mini", input="Say hi.", max_output_tokens=16)
    assert streamed.final["model"] == "gpt-4o-mini"
    stored = aliased.http.get(f"/v1/responses/{response['id']}").json()
    assert stored["model"] == "gpt-4o-mini"


def test_models_lists_aliases_with_their_context_window(aliased: Client) -> None:
    listed = {model["id"]: model for model in aliased.http.get("/v1/models").json()["data"]}
    assert set(listed) == {SMOL, "gpt-4o-mini", "other-name"}
    assert listed["gpt-4o-mini"]["context_window"] == listed[SMOL]["context_window"] > 0


def test_an_unknown_name_is_still_not_found(aliased: Client) -> None:
    error = aliased.error({"model": "gpt-5", "input": "x"}, 404)
    assert (error["code"], error["param"]) == ("model_not_found", "model")


def test_aliases_setting_parses_and_refuses_junk() -> None:
    assert Settings(model_aliases="a=b,c=d").model_aliases == {"a": "b", "c": "d"}  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="alias=model"):
        Settings(model_aliases="no-equals-sign")  # type: ignore[arg-type]
