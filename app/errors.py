"""The server's error taxonomy, mapped to the Open Responses error object in one place.

    ORSError                      (abstract; status, type, code, param, message)
     ├── InvalidRequest           400  invalid_request
     │    ├── ContextLengthExceeded      code context_length_exceeded
     │    └── PreviousResponseNotFound   code previous_response_not_found
     ├── Unauthorized             401  invalid_request, code invalid_api_key
     ├── Forbidden                403  invalid_request   (host_not_allowed, origin_not_allowed)
     ├── NotFound                 404  not_found
     │    └── ModelNotFound              code model_not_found
     ├── RequestTimeout           408  invalid_request, code request_timeout
     ├── PayloadTooLarge          413  invalid_request, code request_too_large
     ├── UnsupportedMediaType     415  invalid_request, code unsupported_media_type
     ├── TooManyRequests          429  too_many_requests
     ├── ServerError              500  server_error
     │    └── StoreUnavailable    503  server_error, code store_unavailable (Retry-After)
     └── ModelError               500  model_error   (the model or its upstream failed)
          └── ModelUnavailable    503  model_error, code model_unavailable (Retry-After)

Every layer raises these; the transports turn them into the HTTP error body, the SSE
``error`` event plus ``response.failed``, or the WebSocket error envelope, using the
methods below and nothing else. Upstream failures are translated into this taxonomy
inside each backend, at exactly one boundary.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ORSError(Exception):
    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    default_code: ClassVar[str | None] = None
    retry_after: int | None = None
    """Seconds after which a retry may succeed (the ``Retry-After`` header), if known."""

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.default_code
        self.param = param

    def body(self) -> dict[str, Any]:
        """The HTTP error body ``{"error": {type, code, param, message}}``."""
        return {"error": self.payload()}

    def payload(self) -> dict[str, Any]:
        """The inner error object, as used by the SSE ``error`` event."""
        return {"type": self.type, "code": self.code, "param": self.param, "message": self.message}

    def response_error(self) -> dict[str, str]:
        """``ResponseResource.error`` for a failed response: ``{code, message}``."""
        return {"code": self.code or self.type, "message": self.message}

    def websocket_envelope(self) -> dict[str, Any]:
        """The WebSocket ``WebSocketErrorEvent`` (its ``code`` is required)."""
        return {"type": "error", "status": self.status, "error": {**self.payload(), "code": self.code or self.type}}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code!r}, param={self.param!r})"


class InvalidRequest(ORSError):
    status = 400
    type = "invalid_request"


class ContextLengthExceeded(InvalidRequest):
    default_code = "context_length_exceeded"


class PreviousResponseNotFound(InvalidRequest):
    default_code = "previous_response_not_found"


class Unauthorized(ORSError):
    status = 401
    type = "invalid_request"
    default_code = "invalid_api_key"


class Forbidden(ORSError):
    """Refused by the server's exposure policy (a Host or an Origin it does not serve)."""

    status = 403
    type = "invalid_request"


class RequestTimeout(ORSError):
    """The client went silent while sending its request's body."""

    status = 408
    type = "invalid_request"
    default_code = "request_timeout"


class PayloadTooLarge(ORSError):
    status = 413
    type = "invalid_request"
    default_code = "request_too_large"


class UnsupportedMediaType(ORSError):
    status = 415
    type = "invalid_request"
    default_code = "unsupported_media_type"


class NotFound(ORSError):
    status = 404
    type = "not_found"


class ModelNotFound(NotFound):
    default_code = "model_not_found"


class Conflict(ORSError):
    """The request is fine, but what it names is in a state that refuses it now (a model
    unloaded while it serves): 409."""

    status = 409
    type = "invalid_request"


class TooManyRequests(ORSError):
    status = 429
    type = "too_many_requests"

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None,
                 retry_after: int = 1) -> None:
        super().__init__(message, code=code, param=param)
        self.retry_after = retry_after


class ServerError(ORSError):
    status = 500
    type = "server_error"


class StoreUnavailable(ServerError):
    """The response store cannot be reached (its database is down, restarting, or out
    of connections): 503, worth a retry. A response whose end could not be recorded is
    not answered as if it had been: it fails with this error."""

    status = 503
    default_code = "store_unavailable"
    retry_after = 1


class ModelError(ORSError):
    status = 500
    type = "model_error"


class ModelUnavailable(ModelError):
    """An embedded model's server is not there for a while (it exited and is being
    started again): 503, worth a retry after ``retry_after`` seconds."""

    status = 503
    default_code = "model_unavailable"

    def __init__(self, message: str, *, retry_after: int = 1, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.retry_after = retry_after
