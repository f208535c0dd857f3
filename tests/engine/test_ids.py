"""Ids: the format, uniqueness across draws and threads, and none shared with a forked child."""

from __future__ import annotations

import os
import re
import threading
import time

from app.engine import ids


def test_format_and_uniqueness_across_several_draws() -> None:
    made = [ids.message_id() for _ in range(3 * ids._IDS_PER_DRAW + 7)]
    assert all(re.fullmatch(r"msg_[0-9a-f]{36}", made_id) for made_id in made)
    assert len(set(made)) == len(made)


def test_threads_never_take_the_same_id() -> None:
    taken: list[list[str]] = [[] for _ in range(4)]

    def take(into: list[str]) -> None:
        for _ in range(5 * ids._IDS_PER_DRAW):
            into.append(ids.random_hex())

    threads = [threading.Thread(target=take, args=(into,)) for into in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [made_id for into in taken for made_id in into]
    assert len(set(every)) == len(every) == 20 * ids._IDS_PER_DRAW


def test_a_forked_child_draws_its_own() -> None:
    ids.random_hex()  # ids are waiting in this process
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        os.write(writing, "".join(ids.random_hex() for _ in range(8)).encode())
        os._exit(0)
    os.close(writing)
    os.waitpid(child, 0)
    with os.fdopen(reading) as pipe:
        theirs = pipe.read()
    ours = "".join(ids.random_hex() for _ in range(8))
    assert len(theirs) == len(ours) == 8 * 24
    assert theirs != ours


def test_ids_are_ordered_by_the_millisecond_they_were_made() -> None:
    before = time.time_ns() // 1_000_000
    first = ids.response_id()
    time.sleep(0.002)
    second = ids.response_id()
    after = time.time_ns() // 1_000_000
    assert first < second
    assert before <= int(first.removeprefix("resp_")[:12], 16) <= int(second.removeprefix("resp_")[:12], 16) <= after
