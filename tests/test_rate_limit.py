"""A provider's rate limits in one process (``[providers.NAME] requests_per_minute`` and
``tokens_per_minute``): primaries wait, copies never do, a 429's ``Retry-After`` holds.

The limiter's arithmetic runs on the virtual-time loop (a minute of load in no time);
the chain against the lab, which answers 429 with ``Retry-After``, over real HTTP.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from virtual_time import run_virtual, vloop

from chainrun.analysis.summary import hedge_stats
from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.errors import ConfigError
from chainrun.lab import LabServer
from chainrun.lab.scenarios import load_scenario
from chainrun.log.store import Store
from chainrun.providers.base import ChatRequest
from chainrun.providers.rate_limit import RateLimited, RateLimiter, request_tokens


def test_a_requests_per_minute_limit_holds_over_a_minute_of_load() -> None:
    """Three times the limit arrives over two minutes (primaries that wait up to 30 s,
    and copies that never wait): no 60 s window ever holds more than the limit, and the
    first minute is granted within 5% of it (the limit is used, not undershot)."""
    limit = 120

    async def main() -> tuple[list[float], int, list[float], float]:
        limiter = RateLimiter(requests=limit)
        loop = vloop()
        rng = random.Random(7)
        granted: list[float] = []
        copies: list[float] = []
        waited_from: list[float] = []  # when each primary that had to wait arrived
        refused = 0

        async def primary(at: float) -> None:
            nonlocal refused
            await asyncio.sleep(at)
            try:
                grant = await limiter.acquire(1, deadline=loop.time() + 30)
            except RateLimited:
                refused += 1
                waited_from.append(at)
                return
            if grant.waited_s > 0:
                waited_from.append(at)
            granted.append(loop.time())

        async def copy(at: float) -> None:
            await asyncio.sleep(at)
            if limiter.try_acquire(1) is not None:
                copies.append(loop.time())
                granted.append(loop.time())

        arrivals = sorted(rng.uniform(0, 120) for _ in range(3 * limit * 2))
        await asyncio.gather(*(primary(t) for t in arrivals),
                             *(copy(rng.uniform(0, 120)) for _ in range(200)))  # fmt: skip
        return sorted(granted), refused, copies, min(waited_from)

    granted, refused, copies, first_wait = run_virtual(main)
    worst = max(sum(1 for g in granted if t <= g < t + 60) for t in granted)
    assert worst <= limit
    first_minute = sum(1 for g in granted if g < 60)
    assert first_minute >= 0.95 * limit
    assert refused > 0  # past the deadline the primaries gave up, as they must
    # a copy found room only before the limit filled: once a primary waits, none does
    assert copies and max(copies) < first_wait


def test_a_primary_that_cannot_get_room_by_its_deadline_fails_at_once() -> None:
    async def main() -> tuple[float, str]:
        limiter = RateLimiter(requests=2)
        loop = vloop()
        await limiter.acquire(1)
        await limiter.acquire(1)
        start = loop.time()
        with pytest.raises(RateLimited) as e:
            await limiter.acquire(1, deadline=start + 10)  # room only at 60 s
        return loop.time() - start, str(e.value)

    waited, said = run_virtual(main)
    assert waited == 0.0  # not at the deadline: at once
    assert "past the step's deadline" in said and "2 requests per 60 s" in said


def test_tokens_are_counted_as_estimated_then_as_reported() -> None:
    """A token limit of 1,000: three requests estimated at 400 fit two at a time; once
    the first two report 100 each, the third goes at once instead of a minute later."""

    async def main() -> tuple[float, float]:
        limiter = RateLimiter(tokens=1000)
        loop = vloop()
        a = await limiter.acquire(400)
        b = await limiter.acquire(400)
        assert limiter.try_acquire(400) is None  # 1,200 would not fit
        third = asyncio.ensure_future(limiter.acquire(400))
        await asyncio.sleep(1)
        assert not third.done()
        a.correct(100)
        b.correct(100)
        grant = await third
        return grant.waited_s, loop.time()

    waited, now = run_virtual(main)
    assert waited == 1.0 and now == 1.0


def test_a_hold_stops_every_grant_until_it_ends_first_come_first_served() -> None:
    async def main() -> list[tuple[str, float]]:
        limiter = RateLimiter(requests=100)
        loop = vloop()
        limiter.hold(5)
        order: list[tuple[str, float]] = []

        async def ask(name: str, delay: float) -> None:
            await asyncio.sleep(delay)
            await limiter.acquire(1)
            order.append((name, loop.time()))

        assert limiter.try_acquire(1) is None  # a copy: not while held
        await asyncio.gather(ask("first", 0.0), ask("second", 1.0), ask("third", 2.0))
        assert limiter.try_acquire(1) is not None  # free again, nobody waiting
        return order

    assert run_virtual(main) == [("first", 5.0), ("second", 5.0), ("third", 5.0)]


def test_a_request_counts_its_prompt_estimate_and_its_token_cap() -> None:
    req = ChatRequest(model="m", messages=[{"role": "user", "content": "a" * 400}],
                      max_output_tokens=50)  # fmt: skip
    assert request_tokens(req) == 100 + 50


@pytest.mark.parametrize("key", ["requests_per_minute", "tokens_per_minute"])
def test_a_limit_below_one_is_a_config_error(key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        config_from_dict({"providers": {"local": {"base_url": "http://127.0.0.1:9/v1",
                                                  key: 0}}})  # fmt: skip


# -- the chain against the lab -----------------------------------------------------------
def _config(lab: LabServer) -> Any:
    return config_from_dict({
        "order": ["answer"], "answer_step": "answer",
        "providers": {"local": {"base_url": lab.base_url, "requests_per_minute": 2}},
        "steps": {"answer": {
            "provider": "local", "prompt": "{message}", "stream": True,
            "max_output_tokens": 20, "deadline_s": 20.0, "on_failure": "closed",
            "hedge": {"delay_ms": 200, "max_attempts": 2, "targets": []},
        }},
    })  # fmt: skip


async def test_after_a_429_the_next_primary_waits_and_its_copy_is_not_sent(
    tmp_path: Path,
) -> None:
    """The lab answers 429 with ``Retry-After: 2``: the next turn's primary waits out the
    hold (its wait logged), is sent, and its hedge copy, due while the limit (2 a minute)
    is full, is not sent: ``rate_limited`` in the hedge statistics."""
    refusing = load_scenario("fast", n_tokens=4, rate_limit=1.0, retry_after_s=2.0,
                             record_bodies=True)  # fmt: skip
    slow = load_scenario("lognormal", median_ms=1500, sigma=0.01, n_tokens=4,
                         record_bodies=True)  # fmt: skip
    store = Store.open(tmp_path / "log.db")
    try:
        with LabServer(refusing) as lab:
            async with Chain(_config(lab), store=store) as chain:
                first = await chain.run_turn("first: any rain jackets?", request_id="t1")
                lab.set_scenario(slow)
                second = await chain.run_turn("second: any rain jackets?", request_id="t2")
                run_id = chain.run_id
            sent = [r for r in lab.requests() if "second:" in str(r.get("messages"))]
        assert first.status == "refused"
        assert second.status == "ok", second
        assert len(sent) == 1  # the primary only: the copy was never sent
        logged = store.calls(run_id or 0)
        calls = {c.attempt: c for c in logged if c.turn_id == second.turn_id}
        assert calls[1].rate_limit_wait_ms is not None and calls[1].rate_limit_wait_ms > 0
        assert calls[2].outcome == "suppressed" and calls[2].error_type == "rate_limited"
        (refused,) = [c for c in logged if c.turn_id == first.turn_id]
        assert refused.error_type == "http_429"
        stats = hedge_stats(store, run_id or 0)
        answer = stats["steps"]["answer"]
        assert answer["unsent"]["rate_limited"] == 1
        assert answer["n_fired_no_copy_sent"] == 1
    finally:
        store.close()
