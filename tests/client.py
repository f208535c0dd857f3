"""A test client that checks everything the server says against the spec.

Every JSON response is validated against the vendored OpenAPI schemas, every stream is
parsed strictly and run through the stream checker from ``compliance/``, and every error
body must be the spec's error object. Tests get plain dicts back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from compliance import ConformanceError, SSEParser, StreamChecker, check_response, validate_error_body
from compliance.schemas import Spec


@dataclass
class StreamResult:
    events: list[dict[str, Any]]
    final: dict[str, Any]
    raw: bytes

    def types(self) -> list[str]:
        return [event["type"] for event in self.events]

    def text(self) -> str:
        return output_text(self.final)


def output_text(response: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "")
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )


class Client:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 300,
                 spec: Spec | None = None) -> None:
        """``spec``: what responses and events are judged by, the vendored spec unless a
        test of a documented superset feature extends it (``compliance.with_items``)."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout)
        self.spec = spec

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def create(self, **body: Any) -> dict[str, Any]:
        """POST /v1/responses (JSON); the response must be a valid ResponseResource."""
        reply = self.http.post("/v1/responses", json=body)
        assert reply.status_code == 200, reply.text
        assert reply.headers["content-type"].startswith("application/json")
        return check_response(reply.json(), spec=self.spec)

    def error(self, body: Any, status: int, *, path: str = "/v1/responses", raw: bytes | None = None) -> dict[str, Any]:
        """A request that must fail with ``status`` and the spec's error object."""
        if raw is not None:
            reply = self.http.post(path, content=raw, headers={"Content-Type": "application/json"})
        else:
            reply = self.http.post(path, json=body)
        assert reply.status_code == status, reply.text
        assert reply.headers["content-type"].startswith("application/json")
        payload = reply.json()
        validate_error_body(payload)
        return payload["error"]  # type: ignore[no-any-return]

    def stream(self, **body: Any) -> StreamResult:
        """POST /v1/responses with ``stream: true``, checked as it arrives."""
        parser = SSEParser(require_done=True)
        checker = StreamChecker(transport="sse", spec=self.spec)
        events: list[dict[str, Any]] = []
        raw = bytearray()
        with self.http.stream("POST", "/v1/responses", json={**body, "stream": True}) as reply:
            if reply.status_code != 200:
                reply.read()
                raise AssertionError(f"stream refused: {reply.status_code} {reply.text}")
            assert reply.headers["content-type"].startswith("text/event-stream")
            for chunk in reply.iter_raw():
                raw += chunk
                for event in parser.feed(chunk):
                    checker.feed(event)
                    events.append(event)
        parser.close()
        final = checker.finish()
        return StreamResult(events=events, final=final, raw=bytes(raw))


__all__ = ["Client", "ConformanceError", "StreamResult", "output_text"]
