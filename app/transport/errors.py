"""Every HTTP error leaves the server as the spec's error object, from here."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from app.errors import InvalidRequest, NotFound, ORSError, PayloadTooLarge, ServerError

log = logging.getLogger("ors.http")

CLIENT_CLOSED_REQUEST = 499
"""The status a request is counted and logged with when its client left before the
answer (nginx's convention); nothing is sent."""


def client_left() -> Response:
    """What a request whose client left while sending its body (``ClientDisconnect``)
    ends with: nothing to answer, and nothing went wrong in the server."""
    return Response(status_code=CLIENT_CLOSED_REQUEST)


def error_response(error: ORSError) -> JSONResponse:
    headers = None
    if error.status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    elif error.status == 408:  # the rest of the body may never come: the connection ends here
        headers = {"Connection": "close"}
    elif error.retry_after is not None:
        headers = {"Retry-After": str(error.retry_after)}
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ORSError)
    async def _ors_error(_: Request, exc: ORSError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = [str(step) for step in first["loc"] if step not in ("body", "query", "path", "header")]
        param = ".".join(where) or None
        return error_response(
            InvalidRequest(f"Invalid value for '{param}': {first['msg']}.", code="invalid_value", param=param)
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            error: ORSError = NotFound(f"No route for {request.method} {request.url.path}.", code="unknown_route")
        elif exc.status_code == 405:
            error = InvalidRequest(
                f"Method {request.method} is not allowed on {request.url.path}.", code="method_not_allowed"
            )
            return JSONResponse(error.body(), status_code=405)
        elif exc.status_code == 413:
            error = PayloadTooLarge("The request body is too large.")
        elif exc.status_code < 500:
            error = InvalidRequest(str(exc.detail))
            return JSONResponse(error.body(), status_code=exc.status_code)
        else:
            error = ServerError(str(exc.detail))
        return error_response(error)

    @app.exception_handler(ClientDisconnect)
    async def _client_left(_: Request, __: ClientDisconnect) -> Response:
        return client_left()

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return error_response(ServerError("The server failed to handle this request."))
