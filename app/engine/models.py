"""Which backend serves a model id: the routing table.

Backends that know their own models (the embedded ones, or any backend passed to the
app) claim ids through :meth:`Backend.serves`. Upstreams are reached through
:class:`Route` entries (from the configuration file, or the ``ORS_UPSTREAM_*``
shortcut), which name exact ids and id prefixes. Precedence, first match wins:

1. an exact id of a route (an operator's explicit choice wins even over an embedded
   model of the same name);
2. a backend that serves the id (the embedded models, in the order given);
3. the route with the longest prefix of the id (the empty prefix matches every id: a
   catch-all that only ever gets what nothing else claims);
4. otherwise 404 ``model_not_found``.

A route strips the matched prefix before the upstream sees the id unless it says
otherwise (``alpha/llama3`` → ``llama3``); the response still echoes the id the client
asked for. An id that is only the prefix (``alpha/``) names no model. Two routes may not
share an exact id or a prefix: the table is refused when it is built.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from app.backends.base import Backend, ModelInfo
from app.errors import ModelNotFound


@dataclass(frozen=True)
class Route:
    """Model ids sent to one upstream backend."""

    name: str
    """The upstream's name (the configuration file's table name), for listings and errors."""
    backend: Backend
    models: tuple[str, ...] = ()
    """Exact ids routed here, passed on as they are."""
    prefixes: tuple[str, ...] = ()
    """Ids starting with one of these are routed here (the longest prefix of any route wins)."""
    strip_prefix: bool = True
    """Whether the matched prefix is removed from the id the upstream sees."""
    list_models: bool = False
    """Whether ``/v1/models`` also asks the upstream what it serves (each id it lists
    appears under this route's first prefix, if it routes back here)."""

    def info(self, name: str) -> ModelInfo:
        """One of :attr:`models`, as listed: with what its upstream declares it takes."""
        return ModelInfo(id=name, owned_by=self.name, images=self.backend.takes_images(name))

    def candidates(self, listed: Iterable[ModelInfo]) -> list[ModelInfo]:
        """The ids a client would use for the upstream's own ids ``listed``."""
        prefix = self.prefixes[0] if self.prefixes and self.strip_prefix else ""
        return [replace(info, id=prefix + info.id) for info in listed]


class ModelRouter:
    """Routes a model id to a backend (see the module docstring for the precedence).

    ``aliases`` map other names onto served ids (``gpt-4o-mini`` → the default local
    model): a request for an alias runs on its target, and the response echoes the name
    the client asked for; ``/v1/models`` lists the aliases beside their targets."""

    def __init__(
        self,
        backends: Sequence[Backend],
        default_model: str,
        aliases: Mapping[str, str] | None = None,
        routes: Sequence[Route] = (),
    ) -> None:
        self.backends = list(backends)
        self.default_model = default_model
        self.aliases = dict(aliases or {})
        self.routes = list(routes)
        self._exact: dict[str, Route] = {}
        self._prefixes: dict[str, Route] = {}
        for route in self.routes:
            for table, keys, what in ((self._exact, route.models, "model id"),
                                      (self._prefixes, route.prefixes, "prefix")):
                for key in keys:
                    other = table.setdefault(key, route)
                    if other is not route:
                        raise ValueError(f"the {what} {key!r} is routed to two upstreams, "
                                         f"{other.name!r} and {route.name!r}")
        self._by_length = sorted(self._prefixes, key=len, reverse=True)
        self._named = frozenset(info.id for info in self.models()) | frozenset(self.aliases)

    def names(self, model: str) -> bool:
        """Whether ``model`` is an id this server names itself (an exact route's, an
        alias, a model a backend lists), as opposed to one an open route (a prefix, an
        upstream without a model list) passes on whatever it is."""
        return model in self._named

    def resolve(self, model: str | None) -> tuple[str, Backend]:
        """The id to send (an alias's target, a route's prefix stripped) and its backend,
        or 404 ``model_not_found``."""
        name = model or self.default_model
        name = self.aliases.get(name, name)
        found = self._find(name)
        if found is not None:
            return found
        known = ", ".join(info.id for info in self.models()) or "none"
        prefixes = ", ".join(f"'{prefix}'" for prefix in self._by_length if prefix)
        also = f" Ids starting with {prefixes} are sent upstream." if prefixes else ""
        raise ModelNotFound(
            f"The model '{name}' does not exist or is not served here. Models served: {known}.{also}",
            param="model",
        )

    def _find(self, name: str) -> tuple[str, Backend] | None:
        route = self._exact.get(name)
        if route is not None:
            return name, route.backend
        for backend in self.backends:
            if backend.serves(name):
                return name, backend
        for prefix in self._by_length:
            if name.startswith(prefix):
                route = self._prefixes[prefix]
                sent = name[len(prefix):] if route.strip_prefix else name
                return (sent, route.backend) if sent else None
        return None

    def _routes_to(self, name: str, route: Route) -> bool:
        found = self._find(name)
        return found is not None and found[1] is route.backend

    def models(self) -> list[ModelInfo]:
        """The models known without asking anyone (for error messages)."""
        routed = (route.info(name) for route in self.routes for name in route.models)
        own = (info for backend in self.backends for info in backend.models())
        return _unique([*routed, *own])

    async def available_models(self) -> list[ModelInfo]:
        """Every model served, then the aliases (for ``/v1/models``): each route's exact
        ids, the backends' own models, and for a route with ``list_models`` the ids its
        upstream lists, as a client would name them, when they route back to it."""
        found = [route.info(name) for route in self.routes for name in route.models]
        for backend in self.backends:
            found += await backend.available_models()
        for route in self.routes:
            if route.list_models:
                listed = route.candidates(await route.backend.available_models())
                found += [info for info in listed if self._routes_to(info.id, route)]
        served = {info.id: info for info in found}
        for alias, target in self.aliases.items():
            if target in served:
                found.append(replace(served[target], id=alias))
        return _unique(found)


def _unique(infos: Iterable[ModelInfo]) -> list[ModelInfo]:
    seen: dict[str, ModelInfo] = {}
    for info in infos:
        seen.setdefault(info.id, info)
    return list(seen.values())
