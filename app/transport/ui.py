"""The playground: a page at ``/`` and its files under ``/ui/`` (``app/ui/``), served by
ors itself (no build step, no external resource: it works offline). ``ORS_UI=false``
leaves both unmounted (404).

The page is a client of the public API and nothing else: it sends the user's key (asked
for once, kept in the browser's session storage) like any client, so the keys, tenants,
Host and Origin guards and rate limits apply to it unchanged. Over WebSocket it offers the
key as a subprotocol (:data:`app.transport.websocket.KEY_PROTOCOL`), since a browser
cannot set a WebSocket's headers; the Origin guard accepts the server's own origin.

Everything a model, a tool or the store returns is put in the page as text
(``textContent``), never as HTML. The page's Content-Security-Policy (:data:`CSP`)
allows scripts, styles, fonts and images from this server only, and connections to it
(``'self'`` covers ``ws:``/``wss:`` to the same host); the one inline style it allows is
the conformance report's own (``compliance.html_report``), shown in a sandboxed frame,
by its hash. No script may be inline, injected, or from anywhere else; no plugin; no
framing of the page by other sites.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import Response
from starlette.staticfiles import StaticFiles

from compliance.html_report import STYLE

FILES = Path(__file__).resolve().parent.parent / "ui"
"""The page's files: ``index.html``, ``app.css`` and the ES modules under ``js/``."""


def _style_hash(style: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(style.encode()).digest()).decode() + "'"


CSP = "; ".join([
    "default-src 'none'",
    "script-src 'self'",
    f"style-src 'self' {_style_hash(STYLE)}",
    "img-src 'self' data: blob:",
    "connect-src 'self'",
    "frame-src 'self' blob: data:",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
])

HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


@router.get("/")
async def page() -> Response:
    """The playground."""
    return Response(PAGE, media_type="text/html; charset=utf-8", headers=HEADERS)


PAGE = (FILES / "index.html").read_bytes()


class _Files(StaticFiles):
    """The page's files with the page's headers (nosniff, no-cache)."""

    def file_response(self, *args: object, **kwargs: object) -> Response:  # type: ignore[override]
        response = super().file_response(*args, **kwargs)  # type: ignore[arg-type]
        response.headers.update(HEADERS)
        return response


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/ui", _Files(directory=FILES), name="ui")
