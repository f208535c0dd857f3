"""Rate limits per tenant: requests per minute, and responses in flight.

The contract of :meth:`RateLimiter.acquire` (called once per request that generates:
``POST /v1/responses``, ``POST /v1/responses/compact``, a WebSocket ``response.create``):

* It refuses with :class:`~app.errors.TooManyRequests` (code ``rate_limit_exceeded``),
  and then nothing is counted: a refused request uses none of the budget.
* Otherwise the request is counted in its tenant's minute, and the returned
  :class:`Lease` holds one of the tenant's places for responses in flight until
  :meth:`Lease.release`. The caller releases it when the response ends, however it ends;
  releasing is idempotent and shielded from cancellation, so it can sit in every
  ``finally`` that might run.
* Requests per minute is a sliding window: at most ``rpm`` accepted requests in any 60
  seconds. ``Retry-After`` says when the oldest of them leaves the window (whole seconds,
  at least 1). A concurrency refusal says 1: a place frees when a response ends.

Two implementations. :class:`MemoryRateLimiter` counts in this process. :class:`RedisRateLimiter`
counts in Redis, so replicas share each tenant's budget: one Lua script checks and counts
both limits atomically, on the Redis server's clock. A lease is a member of a sorted set
scored by its expiry; the process that holds it pushes the expiry forward every third of
:data:`LEASE_SECONDS` with one background task for all its leases, so the lease of a
replica that died frees itself within :data:`LEASE_SECONDS`. A lease that expired anyway
(Redis unreachable longer than that) is not brought back.

If Redis cannot be reached when a request arrives (within :data:`REDIS_TIMEOUT_SECONDS`),
the request is let through (fail open: availability over strictness) and a warning is
logged once per outage; releasing a lease Redis did not record is harmless.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Awaitable, Callable
from types import TracebackType

import anyio

from app.errors import TooManyRequests

log = logging.getLogger("ors.ratelimit")

WINDOW_SECONDS = 60
LEASE_SECONDS = 30.0
REDIS_TIMEOUT_SECONDS = 1.0
CODE = "rate_limit_exceeded"


class Lease:
    """A place among a tenant's responses in flight, held until :meth:`release`."""

    def __init__(self, on_release: Callable[[], Awaitable[None]] | None = None) -> None:
        self._on_release = on_release
        self.released = False

    async def release(self) -> None:
        if self.released:
            return
        self.released = True
        if self._on_release is not None:
            with anyio.CancelScope(shield=True):
                await self._on_release()

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.release()


class RateLimiter(ABC):
    """Both limits of every tenant; ``None`` means that limit is off."""

    def __init__(self, *, rpm: int | None, concurrent: int | None) -> None:
        self.rpm = rpm
        self.concurrent = concurrent

    @abstractmethod
    async def acquire(self, tenant: str) -> Lease:
        """Count one request of ``tenant`` and hold a place for its response, or raise
        ``TooManyRequests`` (see the module docstring)."""

    async def start(self) -> None:
        """Called once the event loop runs (the server's start)."""

    async def aclose(self) -> None:
        """Called at the server's stop, after the responses in flight have ended."""

    def _rpm_refusal(self, wait_seconds: float) -> TooManyRequests:
        retry_after = max(1, math.ceil(wait_seconds))
        return TooManyRequests(
            f"Rate limit reached for this API key: {_count(self.rpm, 'request')} per minute. "
            f"Retry after {retry_after} s.",
            code=CODE,
            retry_after=retry_after,
        )

    def _concurrency_refusal(self) -> TooManyRequests:
        return TooManyRequests(
            f"Rate limit reached for this API key: {_count(self.concurrent, 'response')} in flight at once. "
            "Retry when one of them has ended.",
            code=CODE,
            retry_after=1,
        )


class NoLimits(RateLimiter):
    def __init__(self) -> None:
        super().__init__(rpm=None, concurrent=None)

    async def acquire(self, tenant: str) -> Lease:
        return Lease()


class MemoryRateLimiter(RateLimiter):
    """Counts in this process; ``clock`` is monotonic seconds."""

    def __init__(self, *, rpm: int | None, concurrent: int | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(rpm=rpm, concurrent=concurrent)
        self._clock = clock
        self._accepted: dict[str, deque[float]] = {}
        self._in_flight: dict[str, int] = {}

    async def acquire(self, tenant: str) -> Lease:
        # no await before the counts change: atomic on the event loop
        now = self._clock()
        accepted = self._accepted.setdefault(tenant, deque()) if self.rpm is not None else deque()
        while accepted and accepted[0] <= now - WINDOW_SECONDS:
            accepted.popleft()
        if self.rpm is not None and len(accepted) >= self.rpm:
            raise self._rpm_refusal(accepted[len(accepted) - self.rpm] + WINDOW_SECONDS - now)
        in_flight = self._in_flight.get(tenant, 0)
        if self.concurrent is not None and in_flight >= self.concurrent:
            raise self._concurrency_refusal()
        if self.rpm is not None:
            accepted.append(now)
        if self.concurrent is None:
            return Lease()
        self._in_flight[tenant] = in_flight + 1

        async def release() -> None:
            left = self._in_flight[tenant] - 1
            if left:
                self._in_flight[tenant] = left
            else:
                del self._in_flight[tenant]

        return Lease(release)

    def in_flight(self, tenant: str) -> int:
        return self._in_flight.get(tenant, 0)


# KEYS[1]: the tenant's accepted requests (member: id, score: ms); KEYS[2]: its leases
# (member: lease id, score: expiry ms). ARGV: rpm (0: off), concurrent (0: off), id, lease ms.
# Returns {0, 0} accepted, {1, ms until a place in the window frees}, or {2, 0} all in flight.
ACQUIRE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local window = 60000
local rpm = tonumber(ARGV[1])
local concurrent = tonumber(ARGV[2])
local ttl = tonumber(ARGV[4])
if rpm > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
  local count = redis.call('ZCARD', KEYS[1])
  if count >= rpm then
    local oldest = redis.call('ZRANGE', KEYS[1], count - rpm, count - rpm, 'WITHSCORES')
    return {1, tonumber(oldest[2]) + window - now}
  end
end
if concurrent > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) >= concurrent then
    return {2, 0}
  end
  redis.call('ZADD', KEYS[2], now + ttl, ARGV[3])
  redis.call('PEXPIRE', KEYS[2], ttl)
end
if rpm > 0 then
  redis.call('ZADD', KEYS[1], now, ARGV[3])
  redis.call('PEXPIRE', KEYS[1], window)
end
return {0, 0}
"""

# KEYS[1]: a tenant's leases. ARGV: lease ms, then the ids this process holds. Only leases
# still present are extended (XX): one that expired stays expired.
REFRESH = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local expiry = now + tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 0
"""


class RedisRateLimiter(RateLimiter):
    """Counts in Redis (see the module docstring). ``prefix`` starts every key:
    ``<prefix>:ratelimit:{<tenant>}:requests`` and ``…:leases`` (one hash slot per
    tenant, so the script also runs on a cluster)."""

    def __init__(self, url: str, *, rpm: int | None, concurrent: int | None, prefix: str = "ors",
                 lease_seconds: float = LEASE_SECONDS, timeout: float = REDIS_TIMEOUT_SECONDS) -> None:
        from redis.asyncio import Redis

        super().__init__(rpm=rpm, concurrent=concurrent)
        self.prefix = prefix
        self.lease_seconds = lease_seconds
        self.redis = Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        self._acquire = self.redis.register_script(ACQUIRE)
        self._refresh = self.redis.register_script(REFRESH)
        self._held: dict[str, set[str]] = {}
        self._holding = asyncio.Event()
        self._keeper: asyncio.Task[None] | None = None
        self._unreachable = False

    def keys(self, tenant: str) -> tuple[str, str]:
        base = f"{self.prefix}:ratelimit:{{{tenant}}}"
        return f"{base}:requests", f"{base}:leases"

    async def start(self) -> None:
        self._keeper = asyncio.create_task(self._keep_leases(), name="ratelimit-leases")
        try:
            await self.redis.ping()
        except _redis_errors() as error:
            self._outage(error)

    async def aclose(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(self._keeper, return_exceptions=True)
        for key, ids in list(self._held.items()):
            for lease_id in list(ids):
                await self._release(key, lease_id)
        await self.redis.aclose()

    async def acquire(self, tenant: str) -> Lease:
        requests, leases = self.keys(tenant)
        lease_id = uuid.uuid4().hex
        try:
            verdict, wait_ms = await self._acquire(
                keys=[requests, leases],
                args=[self.rpm or 0, self.concurrent or 0, lease_id, int(self.lease_seconds * 1000)],
            )
        except _redis_errors() as error:
            self._outage(error)
            return Lease()
        if self._unreachable:
            self._unreachable = False
            log.info("Redis is reachable again: rate limits are enforced")
        if verdict == 1:
            raise self._rpm_refusal(int(wait_ms) / 1000)
        if verdict == 2:
            raise self._concurrency_refusal()
        if self.concurrent is None:
            return Lease()
        self._held.setdefault(leases, set()).add(lease_id)
        self._holding.set()
        return Lease(lambda: self._release(leases, lease_id))

    async def refresh(self) -> None:
        """Push the expiry of every lease this process holds forward."""
        ttl = int(self.lease_seconds * 1000)
        for key, ids in list(self._held.items()):
            if not ids:
                continue
            try:
                await self._refresh(keys=[key], args=[ttl, *ids])
            except _redis_errors() as error:
                self._outage(error)

    def held(self) -> int:
        return sum(len(ids) for ids in self._held.values())

    async def _release(self, key: str, lease_id: str) -> None:
        ids = self._held.get(key)
        if ids is not None:
            ids.discard(lease_id)
            if not ids:
                del self._held[key]
        if not self._held:
            self._holding.clear()
        try:
            await self.redis.zrem(key, lease_id)
        except _redis_errors() as error:
            self._outage(error)

    async def _keep_leases(self) -> None:
        """The one task that keeps this process's leases alive; idle while none is held."""
        while True:
            await self._holding.wait()
            await asyncio.sleep(self.lease_seconds / 3)
            await self.refresh()

    def _outage(self, error: BaseException) -> None:
        if not self._unreachable:
            self._unreachable = True
            log.warning("Redis is unreachable (%r): requests are let through without rate limits "
                        "until it is back", error)


def _count(number: int | None, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _redis_errors() -> tuple[type[BaseException], ...]:
    from redis.exceptions import RedisError

    return (RedisError, OSError, asyncio.TimeoutError)


def rate_limiter(*, rpm: int | None, concurrent: int | None, redis_url: str | None,
                 redis_prefix: str = "ors") -> RateLimiter:
    """The limiter for these settings: none when both limits are off, in Redis when a URL
    is given, in memory otherwise."""
    if rpm is None and concurrent is None:
        return NoLimits()
    if redis_url:
        return RedisRateLimiter(redis_url, rpm=rpm, concurrent=concurrent, prefix=redis_prefix)
    return MemoryRateLimiter(rpm=rpm, concurrent=concurrent)
