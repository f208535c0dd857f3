"""The registry of prompt-cache warm-ups (``app.backends.warm_ups``): who waits for
whom, the same prompt warmed once, failures kept to the log. The evaluation itself is
llama-server's, proven end to end in ``tests/e2e/test_websocket_warm_up.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from app.backends.warm_ups import WarmUps

pytestmark = pytest.mark.anyio


class Evaluations:
    """Evaluations that end when the test says so, and what they were given."""

    def __init__(self) -> None:
        self.started: list[list[int]] = []
        self.release = asyncio.Event()

    async def __call__(self, tokens: list[int]) -> None:
        self.started.append(tokens)
        await self.release.wait()


def prompt_of(tokens: list[int]) -> Callable[[], Awaitable[list[int]]]:
    async def prompt() -> list[int]:
        return tokens
    return prompt


async def test_a_generation_that_begins_with_a_warm_up_waits_for_it() -> None:
    warm_ups, evaluations = WarmUps(), Evaluations()
    warm = list(range(100))
    warm_ups.start("m", prompt_of(warm), evaluations)
    unrelated = asyncio.create_task(warm_ups.settled("m", [7, *range(200)]))
    other_model = asyncio.create_task(warm_ups.settled("n", warm))
    await asyncio.wait_for(asyncio.gather(unrelated, other_model), timeout=10)  # neither waits
    waiting = asyncio.create_task(warm_ups.settled("m", [*warm[:95], 500, 501, 502]))  # 95% of it
    await asyncio.sleep(0)
    assert evaluations.started == [warm] and not waiting.done()
    evaluations.release.set()
    await asyncio.wait_for(waiting, timeout=10)


async def test_one_warm_up_evaluates_at_once_and_failures_stay_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    warm_ups, evaluations = WarmUps(), Evaluations()
    warm_ups.start("m", prompt_of([1, 2, 3]), evaluations)
    warm_ups.start("m", prompt_of([1, 2, 3]), evaluations)
    warm_ups.start("m", prompt_of([4, 5, 6]), evaluations)

    async def broken() -> list[int]:
        raise RuntimeError("no model")

    warm_ups.start("m", broken, evaluations)
    warm_ups.start("n", prompt_of([4, 5, 6]), evaluations)  # another model's
    for _ in range(5):
        await asyncio.sleep(0)
    assert evaluations.started == [[1, 2, 3], [4, 5, 6]]
    assert "warming the prompt cache of m failed" in caplog.text
    await warm_ups.close()  # cancels the one still evaluating
    await asyncio.wait_for(warm_ups.settled("m", [1, 2, 3]), timeout=10)
