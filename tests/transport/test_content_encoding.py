"""Compressed request bodies against the real server on 127.0.0.1: ``zstd``, ``gzip`` and
``deflate`` bodies are answered as the same body sent plain, on every POST endpoint; the
body-size limit holds for the decoded size (413, as a plain body past it), a body that
would inflate far past it is refused without inflating it in memory, corrupt or cut data
is 400, and any other coding 415. Every refusal is the spec's error object."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import zstandard

from app.backends.scripted import ScriptedBackend, text_script
from app.config import Settings
from app.main import create_app
from compliance import check_compact, check_response, validate_error_body
from tests.client import output_text
from tests.live import LiveServer

LIMIT = 4096
MODEL = "scripted-text"
BODY = json.dumps({"model": MODEL, "input": "x"}).encode()
JSON = {"Content-Type": "application/json"}


def _zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


def _deflate(data: bytes) -> bytes:
    return zlib.compress(data)


CODERS: dict[str, Callable[[bytes], bytes]] = {"zstd": _zstd, "gzip": gzip.compress, "deflate": _deflate}


def _server(tmp: Path, **settings: Any) -> LiveServer:
    backend = ScriptedBackend({MODEL: text_script("Hello", ", world.")})
    return LiveServer(create_app(Settings(data_dir=tmp, **settings), backends=[backend])).start()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = _server(tmp_path_factory.mktemp("encoded"), max_body_bytes=LIMIT)
    yield live
    live.stop()


def _post(server: LiveServer, path: str, body: bytes, coding: str | None, **headers: str) -> httpx.Response:
    if coding is not None:
        headers["Content-Encoding"] = coding
    return httpx.post(server.url + path, content=body, headers={**JSON, **headers}, timeout=60)


def _error(reply: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    body = reply.json()
    validate_error_body(body)
    assert body["error"]["code"] == code, body
    return body["error"]  # type: ignore[no-any-return]


def _padded(size: int) -> bytes:
    """``BODY`` padded with spaces to ``size`` bytes: still the same request."""
    return BODY[:-1] + b" " * (size - len(BODY)) + b"}"


@pytest.mark.parametrize("coding", CODERS)
def test_a_compressed_response_request_is_answered_as_the_plain_one(server: LiveServer, coding: str) -> None:
    plain = _post(server, "/v1/responses", BODY, None)
    packed = _post(server, "/v1/responses", CODERS[coding](BODY), coding)
    assert plain.status_code == packed.status_code == 200, packed.text
    assert output_text(check_response(packed.json())) == output_text(check_response(plain.json())) \
        == "Hello, world."
    streamed = _post(server, "/v1/responses", CODERS[coding](json.dumps(
        {"model": MODEL, "input": "x", "stream": True}).encode()), coding)
    assert streamed.status_code == 200 and "event: response.completed" in streamed.text


@pytest.mark.parametrize("coding", CODERS)
def test_the_other_post_endpoints_read_compressed_bodies(server: LiveServer, coding: str) -> None:
    compact_body = json.dumps({"model": MODEL, "input": [{"role": "user", "content": "Remember PELICAN."}]}).encode()
    compacted = _post(server, "/v1/responses/compact", CODERS[coding](compact_body), coding)
    assert compacted.status_code == 200, compacted.text
    assert check_compact(compacted.json())["output"][0]["type"] == "compaction"
    # the scripted model cannot count tokens: the same answer either way, about the model
    plain = _post(server, "/v1/responses/input_tokens", BODY, None)
    packed = _post(server, "/v1/responses/input_tokens", CODERS[coding](BODY), coding)
    assert (packed.status_code, packed.json()) == (plain.status_code, plain.json())
    assert packed.json()["error"]["param"] == "model"


def test_codings_are_read_whatever_their_case_and_x_gzip_is_gzip(server: LiveServer) -> None:
    for coding, data in (("ZSTD", _zstd(BODY)), ("x-gzip", gzip.compress(BODY)), ("Gzip", gzip.compress(BODY))):
        reply = _post(server, "/v1/responses", data, coding)
        assert reply.status_code == 200, (coding, reply.text)


def test_a_chunked_compressed_body_is_read(server: LiveServer) -> None:
    data = _zstd(BODY)
    reply = httpx.post(server.url + "/v1/responses", content=iter([data[:5], data[5:]]),
                       headers={**JSON, "Content-Encoding": "zstd"})
    assert reply.request.headers.get("transfer-encoding") == "chunked"
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("coding", CODERS)
def test_the_limit_is_the_decoded_size(server: LiveServer, coding: str) -> None:
    """A body that decodes to the limit passes; one byte more is 413, as it is plain,
    though the compressed bodies are a fraction of the limit."""
    at_limit, past_limit = CODERS[coding](_padded(LIMIT)), CODERS[coding](_padded(LIMIT + 1))
    assert len(past_limit) < LIMIT // 10
    assert _post(server, "/v1/responses", at_limit, coding).status_code == 200
    message = _error(_post(server, "/v1/responses", past_limit, coding), 413, "request_too_large")["message"]
    assert message == _error(_post(server, "/v1/responses", _padded(LIMIT + 1), None), 413,
                             "request_too_large")["message"]


@pytest.mark.parametrize("coding", CODERS)
def test_corrupt_or_cut_data_is_a_400(server: LiveServer, coding: str) -> None:
    error = _error(_post(server, "/v1/responses", b"this is not compressed" * 3, coding), 400, "invalid_body")
    assert coding in error["message"] and error["param"] is None
    whole = CODERS[coding](BODY)
    # a zstd body cut short decodes to as much as it holds: JSON cut short
    cut = _error(_post(server, "/v1/responses", whole[: len(whole) // 2], coding), 400,
                 "invalid_json" if coding == "zstd" else "invalid_body")
    assert cut["param"] is None


def test_data_after_the_end_of_a_deflate_stream_is_a_400(server: LiveServer) -> None:
    _error(_post(server, "/v1/responses", _deflate(BODY) + b"more", "deflate"), 400, "invalid_body")


@pytest.mark.parametrize("coding", ["br", "compress", "gzip, zstd", "zstd;q=1"])
def test_other_codings_are_415(server: LiveServer, coding: str) -> None:
    error = _error(_post(server, "/v1/responses", BODY, coding), 415, "unsupported_media_type")
    assert coding in error["message"] and "zstd" in error["message"] and error["param"] is None
    assert _post(server, "/v1/responses", BODY, "identity").status_code == 200


# -- a body that inflates far past the limit ------------------------------------------

BOMB_LIMIT = 1 << 20
MIB = 1 << 20


def _bomb(coding: str, mebibytes: int) -> bytes:
    """``mebibytes`` MiB of spaces after a JSON opening, compressed without ever holding
    them whole."""
    zero = b" " * MIB
    if coding == "zstd":
        zstd = zstandard.ZstdCompressor(level=1).compressobj()
        parts = [zstd.compress(b'{"input": "')] + [zstd.compress(zero) for _ in range(mebibytes)]
        return b"".join([*parts, zstd.flush()])
    gz = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [gz.compress(b'{"input": "')] + [gz.compress(zero) for _ in range(mebibytes)]
    return b"".join([*parts, gz.flush()])


@pytest.fixture(scope="module")
def roomy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = _server(tmp_path_factory.mktemp("bombs"), max_body_bytes=BOMB_LIMIT)
    yield live
    live.stop()


@pytest.mark.parametrize(("coding", "mebibytes"), [("zstd", 1024), ("gzip", 256)])
def test_a_bomb_is_refused_without_inflating_it(roomy: LiveServer, coding: str, mebibytes: int) -> None:
    """A body of kilobytes that decodes to gigabytes: 413 once its decoded size passes
    the limit, and the process (server and client share it here) never allocated more
    than a few times the limit meanwhile."""
    bomb = _bomb(coding, mebibytes)
    assert len(bomb) < BOMB_LIMIT
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        reply = _post(roomy, "/v1/responses", bomb, coding)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    _error(reply, 413, "request_too_large")
    assert peak - before < 16 * MIB, f"{(peak - before) / MIB:.1f} MiB held while refusing the body"
