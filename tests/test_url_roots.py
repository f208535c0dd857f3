"""URL roots and allow-lists (``app.url_roots``): segment boundaries, bare hosts, no resolving."""

from __future__ import annotations

import pytest

from app.url_roots import AllowList, UrlRoot

LIST = AllowList.parse(["https://mcp.example.com/tools", "10.0.0.5:8000", "internal.test"])


@pytest.mark.parametrize("url", [
    "https://mcp.example.com/tools", "https://mcp.example.com/tools/", "https://mcp.example.com:443/tools/x/sse",
    "http://10.0.0.5:8000/mcp", "https://10.0.0.5:8000/", "http://internal.test:1234/a", "https://INTERNAL.test/b",
])
def test_listed(url: str) -> None:
    assert LIST.covers(UrlRoot.parse(url))


@pytest.mark.parametrize("url", [
    "https://mcp.example.com/toolset", "https://mcp.example.com/", "http://mcp.example.com/tools",
    "https://mcp.example.com:8443/tools", "http://10.0.0.5:8001/mcp", "http://10.0.0.5/mcp",
    "http://127.0.0.1:8000/mcp", "http://internal.test.evil.test/", "http://sub.internal.test/",
])
def test_not_listed(url: str) -> None:
    assert not LIST.covers(UrlRoot.parse(url))


@pytest.mark.parametrize("url", ["ftp://x/y", "/relative", "http://u:p@x/", "http://x/?q=1", "http://x/a/%2e%2e/b",
                                 "http://x/a%2fb"])
def test_refused_urls(url: str) -> None:
    with pytest.raises(ValueError):
        UrlRoot.parse(url)


def test_empty_list_allows_nothing_and_a_bad_entry_is_named() -> None:
    assert not AllowList.parse([])
    with pytest.raises(ValueError, match="'x/y'"):
        AllowList.parse(["x/y"])
