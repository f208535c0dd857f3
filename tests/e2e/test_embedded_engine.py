"""The embedded engine under several users, over HTTP against the real server: streams
decoded together, grammars per sequence, the bounded queue, slots freed by a client
that goes away, and the prompt cache reported in ``usage``."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from app.backends.local import LocalBackend
from app.config import Settings
from app.main import create_app
from tests.client import Client
from tests.conftest import SMOL
from tests.e2e.test_metrics import scrape, value
from tests.live import LiveServer

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
LONG = "Write a very long essay about the history of Rome, at least 5000 words."  # ~600 tokens, greedy
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_concurrent_streams_are_decoded_together(client: Client) -> None:
    """Four streams at once: each gets its first text before any of them has ended."""
    happened: list[str] = []  # "first" and "end" of each stream, in the order they happened
    lock = threading.Lock()

    def one(number: int) -> None:
        body = {"model": SMOL, "input": f"{LONG} ({number})", "max_output_tokens": 64, "temperature": 0,
                "stream": True, "store": False}
        first = False
        with client.http.stream("POST", "/v1/responses", json=body) as reply:
            for line in reply.iter_lines():
                if not first and line.startswith("event: response.output_text.delta"):
                    first = True
                    with lock:
                        happened.append("first")
        with lock:
            if not first:
                happened.append("first")
            happened.append("end")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(4)))
    assert happened == ["first"] * 4 + ["end"] * 4, happened


def test_grammars_hold_per_sequence_when_generated_together(client: Client) -> None:
    """A forced call, a strict schema and free text, in one batch: each keeps its own."""
    requests: list[dict[str, Any]] = [
        {"model": SMOL, "input": "Weather in Paris?", "tools": [WEATHER], "tool_choice": "required",
         "max_output_tokens": 64},
        {"model": SMOL, "input": "Invent a person.", "max_output_tokens": 64,
         "text": {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}},
        {"model": SMOL, "input": "Say something nice.", "max_output_tokens": 32},
    ]
    with ThreadPoolExecutor(len(requests)) as pool:
        call, person, text = pool.map(lambda body: client.stream(**body).final, requests)
    calls = [item for item in call["output"] if item["type"] == "function_call"]
    assert calls and calls[0]["name"] == "get_weather" and "city" in json.loads(calls[0]["arguments"])
    if person["status"] == "completed":
        jsonschema.validate(json.loads(person["output"][0]["content"][0]["text"]), PERSON)
    assert text["status"] in ("completed", "incomplete") and not [
        item for item in text["output"] if item["type"] == "function_call"
    ]


def test_the_shared_prefix_of_a_new_conversation_is_reported_cached(client: Client) -> None:
    instructions = "You are a meticulous assistant for a hardware store. " * 40
    first = client.create(model=SMOL, instructions=instructions, input="Do you sell hammers?", max_output_tokens=16,
                          prompt_cache_key="store-assistant")
    second = client.create(model=SMOL, instructions=instructions, input="Do you sell nails?", max_output_tokens=16,
                           prompt_cache_key="store-assistant")
    cached = second["usage"]["input_tokens_details"]["cached_tokens"]
    assert cached > 300 and cached >= first["usage"]["input_tokens"] - 20
    assert cached < second["usage"]["input_tokens"]


def test_conversations_continued_at_once_each_find_their_prefix_cached(client: Client) -> None:
    """Four conversations, each with instructions of its own, run at once; then each is
    continued, again all at once. Every continuation finds its instructions in the cache.
    (When requests were pinned to slots, the first continuation to start moved the other
    slots into the host cache and emptied them, and a request pinned to an emptied slot
    does not look there: the other three evaluated their whole prompt again.)"""
    nonce = random.randrange(10**9)
    instructions = [f"Conversation {nonce}-{k}. You are assistant number {k} of a help desk. " * 30
                    for k in range(4)]

    def one(k: int, question: str) -> dict[str, Any]:
        return client.create(model=SMOL, instructions=instructions[k], input=question, max_output_tokens=16,
                             temperature=0, store=False)

    with ThreadPoolExecutor(4) as pool:
        first = list(pool.map(lambda k: one(k, "Hello."), range(4)))
        again = list(pool.map(lambda k: one(k, "What can you do?"), range(4)))
    for before, after in zip(first, again, strict=False):
        cached = after["usage"]["input_tokens_details"]["cached_tokens"]
        # the instructions (about 600 tokens) and the template before them are shared
        assert cached >= before["usage"]["input_tokens"] - 20, (cached, before["usage"], after["usage"])


def test_a_long_prompt_is_evaluated_in_chunks_between_a_running_streams_tokens(client: Client) -> None:
    """A new prompt of about 2,500 tokens arrives beside a running stream. It is evaluated
    in chunks (``ORS_MODEL_CHUNK``, 128 tokens by default), each a step of the shared batch
    that also decodes the running stream, so the running stream keeps receiving text while
    the new prompt is evaluated, instead of waiting for all of it."""
    running_times: list[float] = []
    stop = threading.Event()
    started = threading.Event()

    def running() -> None:
        body = {"model": SMOL, "input": LONG, "max_output_tokens": 4000, "temperature": 0,
                "stream": True, "store": False}
        with client.http.stream("POST", "/v1/responses", json=body) as reply:
            for line in reply.iter_lines():
                if line.startswith("event: response.output_text.delta"):
                    running_times.append(time.monotonic())
                    if len(running_times) >= 5:
                        started.set()
                if stop.is_set():
                    break
        started.set()

    words = " ".join(random.choice(["alpha", "beta", "gamma", "delta", "kappa", "omega"]) for _ in range(2500))
    with ThreadPoolExecutor(1) as pool:
        stream = pool.submit(running)
        assert started.wait(60)
        arrived = time.monotonic()
        body = {"model": SMOL, "input": f"{words}\nSay yes.", "max_output_tokens": 16, "temperature": 0,
                "stream": True, "store": False}
        evaluated = None
        with client.http.stream("POST", "/v1/responses", json=body) as reply:
            for line in reply.iter_lines():
                if evaluated is None and line.startswith(("event: response.output_text.delta",
                                                          "event: response.completed",
                                                          "event: response.incomplete")):
                    evaluated = time.monotonic()
        stop.set()
        stream.result()
    assert evaluated is not None
    # the middle of the evaluation (tokens already on their way when the prompt arrived,
    # or made once it was done, are not counted): about 20 chunks, one token of the
    # running stream after each; a prompt evaluated whole lets none through
    margin = (evaluated - arrived) / 10
    meanwhile = [t for t in running_times if arrived + margin < t < evaluated - margin]
    assert len(meanwhile) >= 5, (len(meanwhile), evaluated - arrived)


@pytest.fixture(scope="module")
def one_slot(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    """A server whose model has one slot and no queue."""
    local = LocalBackend(model_dir, n_threads=2, preload=[SMOL], models=[SMOL], parallel=1, queue=0)
    settings = Settings(default_model=SMOL, data_dir=tmp_path_factory.mktemp("one-slot"))
    server = LiveServer(create_app(settings, backends=[local])).start()
    client = Client(server.url)
    yield client
    client.close()
    server.stop()


def test_beyond_the_queue_a_request_is_a_429_before_its_response_starts(one_slot: Client) -> None:
    # a long new prompt keeps the only slot busy for seconds (its evaluation), whatever
    # the model then writes
    words = " ".join(random.choice(["alpha", "beta", "gamma", "delta", "kappa", "omega"]) for _ in range(2500))
    body = {"model": SMOL, "input": f"{words}\n{LONG}", "max_output_tokens": 4000, "temperature": 0,
            "stream": True, "store": False}
    with one_slot.http.stream("POST", "/v1/responses", json=body) as reply:
        assert reply.status_code == 200
        lines = reply.iter_lines()  # kept: an abandoned iterator would close the response
        while not next(lines).startswith("event: response.in_progress"):
            pass
        deadline = time.monotonic() + 60  # a bound, not a measurement
        while value(scrape(str(one_slot.http.base_url).rstrip("/")), "ors_model_slots_busy", model=SMOL) < 1:
            assert time.monotonic() < deadline, "the stream never took the slot"
            time.sleep(0.05)
        error = one_slot.error({"model": SMOL, "input": "Hi"}, 429)
        assert error["type"] == "too_many_requests"
        refused = one_slot.http.post("/v1/responses", json={"model": SMOL, "input": "Hi"})
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    # the client went away: its slot is free again at once
    deadline = time.monotonic() + 10
    while True:
        reply = one_slot.http.post("/v1/responses", json={"model": SMOL, "input": "Hi", "max_output_tokens": 16})
        if reply.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert reply.status_code == 200, reply.text
