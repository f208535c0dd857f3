"""URL roots and allow-lists of them: where this server may send requests of its own.

A :class:`UrlRoot` is a URL rebuilt from its parts (scheme, host, port, path segments), so
what is checked against a list is exactly what is requested. An allow-list
(:class:`AllowList`) holds roots (``https://mcp.example.com/tools``: that URL and any path
below it, on segment boundaries, with the same scheme, host and port) and bare hosts
(``host``: any scheme and port of it; ``host:port``: that port, either scheme). Host names
are compared as written, never resolved: a listed name is trusted as the operator's, and an
unlisted one is refused whatever it resolves to, so loopback and private addresses are
reached only when listed. Shared by every room (like :mod:`app.errors`); needs ``httpx``
only to parse.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote

import httpx

DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class UrlRoot:
    """An absolute ``http``/``https`` URL without credentials, query or fragment."""

    scheme: str
    host: str
    """ASCII (IDNA), lower case; an IPv6 address without brackets."""
    port: int
    segments: tuple[str, ...]
    """The path's segments, percent-encoded as sent, none empty."""

    @classmethod
    def parse(cls, text: str) -> UrlRoot:
        """Raises ``ValueError`` saying what is wrong."""
        try:
            url = httpx.URL(text)
        except (httpx.InvalidURL, TypeError) as error:
            raise ValueError(f"it is not a URL ({error})") from None
        if url.scheme not in DEFAULT_PORTS or not url.raw_host:
            raise ValueError("it must be an absolute http:// or https:// URL")
        if url.userinfo or url.query or url.fragment:
            raise ValueError("it may not hold credentials, a query or a fragment")
        segments = tuple(part for part in url.raw_path.split(b"?")[0].decode("ascii").split("/") if part)
        if any(unquote(part) in (".", "..") or any(c in unquote(part) for c in "/\\") for part in segments):
            raise ValueError("its path may not hold '.' or '..' segments or encoded slashes")
        return cls(url.scheme, url.raw_host.decode("ascii").lower(), url.port or DEFAULT_PORTS[url.scheme], segments)

    def covers(self, other: UrlRoot) -> bool:
        """Whether ``other`` is this root or below it."""
        return ((self.scheme, self.host, self.port) == (other.scheme, other.host, other.port)
                and other.segments[:len(self.segments)] == self.segments)

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = "" if DEFAULT_PORTS[self.scheme] == self.port else f":{self.port}"
        return f"{self.scheme}://{host}{port}/" + "/".join(self.segments)


@dataclass(frozen=True)
class BareHost:
    """A host allowed with any path: any port of it when ``port`` is ``None``."""

    host: str
    port: int | None

    @classmethod
    def parse(cls, text: str) -> BareHost:
        root = UrlRoot.parse(f"http://{text}")
        explicit = httpx.URL(f"http://{text}").port is not None
        if root.segments:
            raise ValueError("a bare host has no path")
        return cls(root.host, root.port if explicit else None)

    def covers(self, other: UrlRoot) -> bool:
        return self.host == other.host and (self.port is None or self.port == other.port)


@dataclass(frozen=True)
class AllowList:
    """Roots and bare hosts; empty allows nothing."""

    entries: tuple[UrlRoot | BareHost, ...]

    @classmethod
    def parse(cls, texts: Iterable[str]) -> AllowList:
        """Raises ``ValueError`` naming the entry that is not a root nor a host."""
        entries: list[UrlRoot | BareHost] = []
        for text in texts:
            try:
                entries.append(UrlRoot.parse(text) if "://" in text else BareHost.parse(text))
            except ValueError as error:
                raise ValueError(f"{text!r}: {error}") from None
        return cls(tuple(entries))

    def __bool__(self) -> bool:
        return bool(self.entries)

    def covers(self, url: UrlRoot) -> bool:
        return any(entry.covers(url) for entry in self.entries)
