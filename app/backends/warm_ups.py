"""Warm-ups of an embedded model's prompt cache: a prompt evaluated, nothing generated.

A WebSocket ``response.create`` with ``generate: false`` announces the instructions,
tools and input of a turn to come (:meth:`app.backends.base.Backend.warm`). The embedded
backend evaluates that prompt into llama-server's prompt cache in the background (one
``POST /completion`` with ``n_predict: 0`` and ``cache_prompt``, in one of the model's
slots), so the turn that follows finds its prefix cached instead of evaluating it (an
agent's instructions and tools are thousands of tokens: minutes on two cores).

Contract of :class:`WarmUps`:

* :meth:`WarmUps.start` returns at once. A warm-up is best effort, and yields to real
  work: it runs only in a slot that is free at once (it never waits in the model's queue,
  ahead of a request), and only while no other warm-up of the model evaluates; else it is
  skipped, as it is when the model cannot start or the prompt does not fit the window
  (logged). It never fails a response.
* A generation whose prompt begins with most of a running warm-up's prompt (its first
  :data:`SHARED` part, token for token) waits for that warm-up to end before it takes a
  slot (:meth:`WarmUps.settled`): the same prefix evaluated twice at once, in two slots,
  would cost the CPU twice and be cached no sooner. Once the warm-up's slot is idle,
  llama-server gives the generation the slot (or the host-memory cache entry) holding
  the longest matching prefix.
* :meth:`WarmUps.close` cancels the warm-ups in progress (at shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Sequence

log = logging.getLogger("ors.local")

SHARED = 0.9
"""How much of a warm-up's prompt a generation's prompt must begin with to wait for it:
all of it but the last few tokens (the template's opening of the assistant's turn, which
the next turn's prompt replaces with its new input)."""


class _WarmUp:
    __slots__ = ("model", "prompt", "task")

    def __init__(self, model: str, prompt: asyncio.Future[list[int]]) -> None:
        self.model = model
        self.prompt = prompt
        """The prompt's tokens once known (an empty list for a warm-up that ended first)."""
        self.task: asyncio.Task[None] | None = None


class WarmUps:
    """The warm-ups in progress of one backend's models (see the module docstring)."""

    def __init__(self) -> None:
        self._running: set[_WarmUp] = set()

    def start(self, model: str, prompt: Callable[[], Awaitable[list[int]]],
              evaluate: Callable[[list[int]], Awaitable[None]]) -> None:
        """Warm ``model`` with the tokens ``prompt()`` makes, by ``evaluate``, in a task
        of its own."""
        warm_up = _WarmUp(model, asyncio.get_running_loop().create_future())
        warm_up.task = asyncio.create_task(self._run(warm_up, prompt, evaluate), name=f"warm-up-{model}")
        self._running.add(warm_up)

    async def settled(self, model: str, tokens: Sequence[int]) -> None:
        """Until every warm-up of ``model`` whose prompt ``tokens`` begin with has ended."""
        for warm_up in list(self._running):
            if warm_up.model != model or warm_up.task is None:
                continue
            await asyncio.wait({warm_up.prompt})  # never raises: the waiter's own cancel does
            prompt = warm_up.prompt.result() if not warm_up.prompt.cancelled() else []
            if prompt and _begins_with(tokens, prompt):
                await asyncio.wait({warm_up.task})

    async def close(self) -> None:
        """Cancel the warm-ups in progress and wait until they have stopped."""
        tasks = [warm_up.task for warm_up in self._running if warm_up.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, warm_up: _WarmUp, prompt: Callable[[], Awaitable[list[int]]],
                   evaluate: Callable[[list[int]], Awaitable[None]]) -> None:
        try:
            tokens = await prompt()
            if any(other.model == warm_up.model and other.prompt.done() and not other.prompt.cancelled()
                   and other.prompt.result() for other in self._running):
                log.info("warm-up of %s skipped: another one is evaluating", warm_up.model)
                return
            warm_up.prompt.set_result(tokens)
            await evaluate(tokens)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - best effort: logged, never raised
            log.warning("warming the prompt cache of %s failed: %r", warm_up.model, exc)
        finally:
            if not warm_up.prompt.done():
                warm_up.prompt.set_result([])
            self._running.discard(warm_up)


def _begins_with(tokens: Sequence[int], prompt: Sequence[int]) -> bool:
    """Whether ``tokens`` begin with the first :data:`SHARED` part of ``prompt``."""
    shared = math.ceil(SHARED * len(prompt))
    return len(tokens) >= shared and list(tokens[:shared]) == list(prompt[:shared])
