"""The routing table: exact ids, prefixes (the longest wins, stripped or not), the
embedded models, aliases, and what ``/v1/models`` lists."""

from __future__ import annotations

import pytest

from app.backends.base import ModelInfo
from app.backends.scripted import ScriptedBackend, text_script
from app.engine.models import ModelRouter, Route
from app.errors import ModelNotFound

pytestmark = pytest.mark.anyio


class Listing(ScriptedBackend):
    """A scripted backend standing in for an upstream whose ``GET /models`` lists ``listed``."""

    def __init__(self, listed: list[str]) -> None:
        super().__init__({})
        self.listed = listed

    def serves(self, model: str) -> bool:
        return True

    async def available_models(self) -> list[ModelInfo]:
        return [ModelInfo(id=name, owned_by="far") for name in self.listed]


LOCAL = ScriptedBackend({"local-model": text_script("hi")})
ALPHA = Listing(["llama3", "qwen"])
BETA = Listing([])
DEEP = Listing([])
CATCH = Listing(["anything"])


def router(**kwargs: object) -> ModelRouter:
    routes = [
        Route("alpha", ALPHA, models=("alpha-model", "local-model"), prefixes=("alpha/",), list_models=True),
        Route("beta", BETA, prefixes=("beta/",), strip_prefix=False),
        Route("deep", DEEP, prefixes=("alpha/deep/",)),
    ]
    return ModelRouter([LOCAL], "local-model", routes=routes, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("model", "sent", "backend"), [
    ("alpha-model", "alpha-model", ALPHA),       # exact id
    ("local-model", "local-model", ALPHA),       # an exact id of a route wins over an embedded model
    ("alpha/llama3", "llama3", ALPHA),           # prefix, stripped
    ("alpha/deep/r1", "r1", DEEP),               # the longest prefix wins
    ("beta/x", "beta/x", BETA),                  # strip_prefix = false
])
def test_resolve(model: str, sent: str, backend: object) -> None:
    assert router().resolve(model) == (sent, backend)


def test_embedded_models_come_before_prefixes() -> None:
    catch_all = ModelRouter([LOCAL], "local-model", routes=[Route("any", CATCH, prefixes=("",))])
    assert catch_all.resolve("local-model") == ("local-model", LOCAL)
    assert catch_all.resolve("other") == ("other", CATCH)
    assert catch_all.resolve(None) == ("local-model", LOCAL)


@pytest.mark.parametrize("model", ["alpha/", "gamma/x", "alpha-modelx"])
def test_unrouted_ids_are_404(model: str) -> None:
    with pytest.raises(ModelNotFound) as caught:
        router().resolve(model)
    assert caught.value.param == "model"
    assert "Ids starting with 'alpha/deep/', 'alpha/', 'beta/' are sent upstream." in caught.value.message


def test_aliases_resolve_through_routes() -> None:
    assert router(aliases={"gpt-4o-mini": "alpha/qwen"}).resolve("gpt-4o-mini") == ("qwen", ALPHA)


async def test_models_lists_configured_ids_and_what_listing_upstreams_serve() -> None:
    listed = await router(aliases={"fast": "alpha-model"}).available_models()
    owners = {info.id: info.owned_by for info in listed}
    assert owners == {
        "alpha-model": "alpha",
        "local-model": "alpha",  # listed by who serves it
        "alpha/llama3": "far",
        "alpha/qwen": "far",
        "fast": "alpha",
    }


async def test_listed_ids_that_would_not_route_back_are_left_out() -> None:
    unstripped = Route("u", Listing(["u/a", "b"]), prefixes=("u/",), strip_prefix=False, list_models=True)
    assert [info.id for info in await ModelRouter([], "x", routes=[unstripped]).available_models()] == ["u/a"]


def test_the_ids_the_server_names_itself() -> None:
    routed = router(aliases={"gpt-4o-mini": "local-model"})
    assert all(routed.names(model) for model in ("alpha-model", "local-model", "gpt-4o-mini"))
    # passed on by a prefix (resolvable, but the client's string): not named
    assert routed.resolve("alpha/made-up")[1] is ALPHA and not routed.names("alpha/made-up")
    assert not routed.names("beta/x")
