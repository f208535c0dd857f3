"""The limiter, in memory and in the real Redis: both limits, what a refusal counts,
leases that free themselves, replicas sharing one budget, Redis going away."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio as aioredis

from app.errors import TooManyRequests
from app.transport.ratelimit import (
    CODE,
    MemoryRateLimiter,
    NoLimits,
    RateLimiter,
    RedisRateLimiter,
    rate_limiter,
)
from tests.live import free_port

pytestmark = pytest.mark.anyio

MakeLimiter = Callable[..., Awaitable[RateLimiter]]


@pytest.fixture(params=["memory", "redis"])
async def make_limiter(request: pytest.FixtureRequest) -> AsyncIterator[MakeLimiter]:
    """Limiters of one kind; the Redis ones share this test's key prefix (two of them
    are two replicas)."""
    made: list[RateLimiter] = []
    prefix = request.getfixturevalue("redis_prefix") if request.param == "redis" else ""
    url = request.getfixturevalue("redis_url") if request.param == "redis" else ""

    async def make(*, rpm: int | None = None, concurrent: int | None = None) -> RateLimiter:
        limiter: RateLimiter
        if request.param == "redis":
            limiter = RedisRateLimiter(url, rpm=rpm, concurrent=concurrent, prefix=prefix)
        else:
            limiter = MemoryRateLimiter(rpm=rpm, concurrent=concurrent)
        await limiter.start()
        made.append(limiter)
        return limiter

    yield make
    for limiter in made:
        await limiter.aclose()


async def refused(limiter: RateLimiter, tenant: str) -> TooManyRequests:
    with pytest.raises(TooManyRequests) as caught:
        await limiter.acquire(tenant)
    error = caught.value
    assert error.status == 429 and error.type == "too_many_requests" and error.code == CODE
    return error


async def test_requests_per_minute(make_limiter: MakeLimiter) -> None:
    limiter = await make_limiter(rpm=2)
    for _ in range(2):
        await (await limiter.acquire("alice")).release()
    error = await refused(limiter, "alice")
    assert "2 requests per minute" in error.message
    assert 1 <= error.retry_after <= 60
    await (await limiter.acquire("bob")).release()  # another tenant has its own budget


async def test_responses_in_flight(make_limiter: MakeLimiter) -> None:
    limiter = await make_limiter(concurrent=2)
    first = await limiter.acquire("alice")
    second = await limiter.acquire("alice")
    error = await refused(limiter, "alice")
    assert "2 responses in flight" in error.message and error.retry_after == 1
    await (await limiter.acquire("bob")).release()
    await first.release()
    await first.release()  # idempotent: frees one place, not two
    third = await limiter.acquire("alice")
    await refused(limiter, "alice")
    for lease in (second, third):
        await lease.release()
    async with await limiter.acquire("alice"):
        pass
    async with await limiter.acquire("alice"):
        pass


async def test_a_refused_request_counts_nothing(make_limiter: MakeLimiter) -> None:
    limiter = await make_limiter(rpm=2, concurrent=1)
    first = await limiter.acquire("alice")
    await refused(limiter, "alice")  # all in flight: not counted in the minute
    await first.release()
    await (await limiter.acquire("alice")).release()  # the second request of the minute
    error = await refused(limiter, "alice")
    assert "requests per minute" in error.message


async def test_replicas_share_one_budget(redis_url: str, redis_prefix: str) -> None:
    one = RedisRateLimiter(redis_url, rpm=3, concurrent=1, prefix=redis_prefix)
    two = RedisRateLimiter(redis_url, rpm=3, concurrent=1, prefix=redis_prefix)
    try:
        lease = await one.acquire("alice")
        await refused(two, "alice")
        await lease.release()
        await (await two.acquire("alice")).release()
        await (await one.acquire("alice")).release()
        error = await refused(two, "alice")
        assert "3 requests per minute" in error.message
        await refused(one, "alice")
    finally:
        await one.aclose()
        await two.aclose()


async def test_a_dead_replicas_lease_expires_and_a_live_one_holds(redis_url: str, redis_prefix: str) -> None:
    limiter = RedisRateLimiter(redis_url, rpm=None, concurrent=1, prefix=redis_prefix)
    _, leases = limiter.keys("alice")
    try:
        server_now_ms = int((await limiter.redis.time())[0]) * 1000
        await limiter.redis.zadd(leases, {"replica-that-is-alive": server_now_ms + 600_000})
        await refused(limiter, "alice")
        await limiter.redis.zadd(leases, {"replica-that-is-alive": server_now_ms - 1})  # its refresh stopped
        lease = await limiter.acquire("alice")
        members = await limiter.redis.zrange(leases, 0, -1)
        assert len(members) == 1 and members != [b"replica-that-is-alive"]
        await lease.release()
        assert await limiter.redis.zcard(leases) == 0
    finally:
        await limiter.aclose()


async def test_refresh_extends_held_leases_and_never_revives_expired_ones(
    redis_url: str, redis_prefix: str
) -> None:
    limiter = RedisRateLimiter(redis_url, rpm=None, concurrent=5, prefix=redis_prefix)
    _, leases = limiter.keys("alice")
    try:
        kept = await limiter.acquire("alice")
        lost = await limiter.acquire("alice")
        ids = [member.decode() for member in await limiter.redis.zrange(leases, 0, -1)]
        assert len(ids) == 2 and limiter.held() == 2
        await limiter.redis.zadd(leases, {ids[0]: 1})  # as if not refreshed for a long time
        await limiter.redis.zrem(leases, ids[1])  # as if expired and purged
        await limiter.refresh()
        server_now_ms = int((await limiter.redis.time())[0]) * 1000
        assert await limiter.redis.zrange(leases, 0, -1) == [ids[0].encode()]
        assert (await limiter.redis.zscore(leases, ids[0])) >= server_now_ms
        assert 0 < await limiter.redis.pttl(leases) <= limiter.lease_seconds * 1000
        for lease in (kept, lost):
            await lease.release()
        assert limiter.held() == 0
    finally:
        await limiter.aclose()


async def test_closing_releases_what_the_process_holds(redis_url: str, redis_prefix: str) -> None:
    limiter = RedisRateLimiter(redis_url, rpm=None, concurrent=3, prefix=redis_prefix)
    _, leases = limiter.keys("alice")
    await limiter.start()
    await limiter.acquire("alice")
    await limiter.acquire("alice")
    check = aioredis.Redis.from_url(redis_url)
    try:
        assert await check.zcard(leases) == 2
        await limiter.aclose()
        assert await check.zcard(leases) == 0
    finally:
        await check.aclose()


async def test_unreachable_redis_lets_requests_through_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ors.ratelimit")
    limiter = RedisRateLimiter(f"redis://127.0.0.1:{free_port()}/0", rpm=1, concurrent=1, prefix="nowhere")
    try:
        await limiter.start()
        leases = [await limiter.acquire("alice") for _ in range(3)]
        for lease in leases:
            await lease.release()
    finally:
        await limiter.aclose()
    warnings = [record for record in caplog.records if "unreachable" in record.getMessage()]
    assert len(warnings) == 1  # once per outage, not once per request


async def test_the_minute_slides() -> None:
    now = [1000.0]
    limiter = MemoryRateLimiter(rpm=2, concurrent=None, clock=lambda: now[0])
    await limiter.acquire("alice")
    now[0] += 20
    await limiter.acquire("alice")
    now[0] += 30
    assert (await refused(limiter, "alice")).retry_after == 10  # the first leaves at +60
    now[0] += 9.5
    assert (await refused(limiter, "alice")).retry_after == 1  # rounded up, never 0
    now[0] += 0.5
    await limiter.acquire("alice")
    assert (await refused(limiter, "alice")).retry_after == 20  # now the second is oldest


async def test_the_settings_choose_the_limiter(redis_url: str) -> None:
    assert isinstance(rate_limiter(rpm=None, concurrent=None, redis_url=redis_url), NoLimits)
    assert isinstance(rate_limiter(rpm=5, concurrent=None, redis_url=None), MemoryRateLimiter)
    chosen = rate_limiter(rpm=None, concurrent=2, redis_url=redis_url)
    assert isinstance(chosen, RedisRateLimiter)
    await chosen.aclose()
    unlimited = NoLimits()
    for _ in range(100):
        await unlimited.acquire("alice")


def test_the_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from app.config import Settings

    defaults = Settings()
    assert (defaults.rate_limit_rpm, defaults.rate_limit_concurrent, defaults.redis_url) == (None, None, None)
    assert defaults.redis_prefix == "ors"
    monkeypatch.setenv("ORS_RATE_LIMIT_RPM", "60")
    monkeypatch.setenv("ORS_RATE_LIMIT_CONCURRENT", "4")
    monkeypatch.setenv("ORS_REDIS_URL", "redis://127.0.0.1:6379/0")
    settings = Settings()
    assert (settings.rate_limit_rpm, settings.rate_limit_concurrent) == (60, 4)
    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    monkeypatch.setenv("ORS_RATE_LIMIT_RPM", "0")
    with pytest.raises(ValidationError):
        Settings()
