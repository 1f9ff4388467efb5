"""Hedged steps against the latency lab over real HTTP, through the real ``openai`` client.

Each test runs the chain with one hedged step on lab servers whose latency is known,
and uses the lab's own per-request records to prove what happened on the server side
(a copy was or was not sent; a loser's connection was closed; generation stopped).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator
from typing import Any

import pytest

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.lab import LabServer
from chainrun.log.store import Store
from chainrun.log.writer import LogWriteLost


@pytest.fixture(scope="module")
def fast_lab() -> Iterator[LabServer]:
    with LabServer("fast", n_tokens=20, per_token_ms=2) as lab:
        yield lab


@pytest.fixture(scope="module")
def slow_lab() -> Iterator[LabServer]:
    # time to first token 1.5 s (sigma tiny: every request is slow)
    with LabServer("lognormal", median_ms=1500, sigma=0.01, n_tokens=20) as lab:
        yield lab


@pytest.fixture(scope="module")
def error_lab() -> Iterator[LabServer]:
    with LabServer("fast", server_error=1.0) as lab:
        yield lab


def one_step_config(primary: str, backup: str | None, hedge: dict[str, Any] | None,
                    *, stream: bool = True, max_connections: int = 100,
                    deadline_s: float = 10.0) -> Any:  # fmt: skip
    providers = {"primary": {"base_url": primary, "max_connections": max_connections}}
    if backup:
        providers["backup"] = {"base_url": backup, "max_connections": max_connections}
    step: dict[str, Any] = {
        "provider": "primary", "prompt": "{message}", "stream": stream,
        "max_output_tokens": 20, "deadline_s": deadline_s, "on_failure": "closed",
    }  # fmt: skip
    if hedge is not None:
        step["hedge"] = {**hedge, "targets": ["backup"] if backup else []}
    return config_from_dict(
        {"order": ["answer"], "answer_step": "answer", "providers": providers,
         "steps": {"answer": step}}
    )  # fmt: skip


def requests_for(lab: LabServer, message: str) -> list[dict[str, Any]]:
    return [r for r in lab.requests() if message in str(r.get("metadata") or "")
            or r.get("request_id") == message]  # fmt: skip


async def wait_for(predicate: Any, timeout_s: float = 5.0) -> None:
    """Poll the lab (its records settle a moment after the client closed a stream)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


async def test_fast_primary_never_starts_a_copy(fast_lab: LabServer, slow_lab: LabServer) -> None:
    fast_lab.reset()
    slow_lab.reset()
    cfg = one_step_config(fast_lab.base_url, slow_lab.base_url,
                          {"delay_ms": 500, "max_attempts": 2, "max_extra_load": 1.0})  # fmt: skip
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store) as chain:
            for i in range(5):
                done = await chain.run_turn(f"fast {i}")
                assert done.status == "ok"
            calls = store.calls(chain.run_id)
    assert len(fast_lab.requests()) == 5
    assert slow_lab.requests() == []  # the backup never saw a copy
    assert {c.outcome for c in calls} == {"not_fired"}


async def test_slow_primary_gets_a_copy_at_d_and_the_first_token_wins(
    fast_lab: LabServer, slow_lab: LabServer
) -> None:
    fast_lab.reset()
    slow_lab.reset()
    cfg = one_step_config(slow_lab.base_url, fast_lab.base_url,
                          {"delay_ms": 100, "max_attempts": 2, "max_extra_load": 1.0})  # fmt: skip
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store) as chain:
            done = await chain.run_turn("slow one")
            calls = {c.attempt: c for c in store.calls(chain.run_id)}
    assert done.status == "ok" and done.output
    # did not wait for the 1.5 s primary: it was cancelled, unanswered
    assert calls[1].outcome == "cancelled" and calls[1].target == "primary"
    assert calls[1].ttft_ms is None
    assert calls[2].outcome == "duplicate" and calls[2].target == "backup"
    assert calls[2].started_offset_ms >= 95  # sent at its delay, not before
    assert calls[1].output_tokens is None  # a loser's cost is unknown, never 0
    # the lab saw the loser's client disconnect before it generated anything
    await wait_for(lambda: any(r["disconnected"] for r in slow_lab.requests()))
    loser = slow_lab.requests()[0]
    assert loser["disconnected"] and loser["tokens_sent"] == 0 and not loser["completed"]
    winner = fast_lab.requests()[0]
    assert winner["completed"] and winner["tokens_sent"] == winner["planned_tokens"]


async def test_loser_stream_closed_mid_generation_stops_the_server(
    fast_lab: LabServer, slow_lab: LabServer
) -> None:
    """A streamed loser that already started generating is closed when the winner settles."""
    with LabServer(
        "lognormal", median_ms=30, sigma=0.01, n_tokens=400, per_token_ms=20
    ) as long_lab:
        cfg = one_step_config(long_lab.base_url, fast_lab.base_url,
                              {"delay_ms": 80, "max_attempts": 2, "max_extra_load": 1.0},
                              stream=False)  # fmt: skip
        # non-streamed settle: the copy (fast, 20 tokens) finishes while the primary streams
        with Store.open(":memory:") as store:
            async with Chain(cfg, store=store) as chain:
                done = await chain.run_turn("long answer")
        assert done.status == "ok"
        await wait_for(lambda: long_lab.requests()[0]["disconnected"])
        rec = long_lab.requests()[0]
        assert 0 < rec["tokens_sent"] < rec["planned_tokens"] and not rec["completed"]


async def test_an_error_ends_the_race_without_a_copy(
    error_lab: LabServer, fast_lab: LabServer
) -> None:
    fast_lab.reset()
    error_lab.reset()
    # d well above a loaded machine's first-request time: the 500 must come back first
    cfg = one_step_config(error_lab.base_url, fast_lab.base_url,
                          {"delay_ms": 1000, "max_attempts": 3, "max_extra_load": 1.0})  # fmt: skip
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store) as chain:
            done = await chain.run_turn("will fail")
            calls = store.calls(chain.run_id)
    assert done.status == "refused" and done.error_type == "http_500"
    assert [c.outcome for c in calls] == ["error"]
    await asyncio.sleep(0.2)
    assert fast_lab.requests() == []  # no copy of a failure


async def test_no_leak_with_two_connections_over_100_hedged_races(
    fast_lab: LabServer,
) -> None:
    with LabServer("lognormal", median_ms=80, sigma=0.01, n_tokens=5) as slowish:
        cfg = one_step_config(slowish.base_url, fast_lab.base_url,
                              {"delay_ms": 5, "max_attempts": 2, "max_extra_load": 2.0},
                              max_connections=2, deadline_s=5.0)  # fmt: skip
        with Store.open(":memory:") as store:
            async with Chain(cfg, store=store) as chain:
                before = len(asyncio.all_tasks())
                for i in range(100):
                    done = await chain.run_turn(f"race {i}")
                    assert done.status == "ok", (i, done)
                # every loser's task and stream is gone once its race is over (openai's
                # internal generators of a closed stream are finalized by asyncio a few
                # loop iterations later: give those finalizer tasks a moment)
                await asyncio.sleep(0.05)
                assert len(asyncio.all_tasks()) <= before
                steps = store.steps(chain.run_id)
        assert sum(s.hedge_won for s in steps) >= 90  # the copy won nearly every race
        await wait_for(lambda: sum(r["disconnected"] for r in slowish.requests()) >= 90)


async def test_budget_caps_extra_load_under_an_all_slow_backend() -> None:
    with LabServer("lognormal", median_ms=120, sigma=0.01, n_tokens=3) as slow:
        hedge = {"delay_ms": 10, "max_attempts": 2, "max_extra_load": 0.1}
        cfg = one_step_config(slow.base_url, None, hedge)
        n = 60
        with Store.open(":memory:") as store:
            async with Chain(cfg, store=store) as chain:
                sem = asyncio.Semaphore(6)

                async def one(i: int) -> None:
                    async with sem:
                        await chain.run_turn(f"budget {i}")

                await asyncio.gather(*(one(i) for i in range(n)))
                calls = store.calls(chain.run_id)
        copies = [c for c in calls if c.attempt > 1 and c.outcome != "budget_exhausted"]
        refused = [c for c in calls if c.outcome == "budget_exhausted"]
        # a copy never sent has no start offset (it was logged as 0.0: unknown is never 0)
        assert refused and all(c.started_offset_ms is None for c in refused)
        # every primary is slow, so every turn wants a copy; the bucket allows ~10% (+1 reserve)
        assert len(copies) <= 0.1 * n + 2
        assert len(refused) >= n - len(copies) - 2
        # a copy that waited for the budget may start just before its primary answers and
        # be cancelled before its request reaches the lab: never more requests than calls
        assert n < len(slow.requests()) <= n + len(copies)


async def test_shadow_losers_finish_and_their_times_are_logged(fast_lab: LabServer) -> None:
    with LabServer("lognormal", median_ms=400, sigma=0.01, n_tokens=5) as slow:
        cfg = one_step_config(slow.base_url, fast_lab.base_url,
                              {"delay_ms": 50, "max_attempts": 2, "max_extra_load": 1.0,
                               "shadow_fraction": 1.0})  # fmt: skip
        with Store.open(":memory:") as store:
            async with Chain(cfg, store=store) as chain:
                done = await chain.run_turn("shadow me")
            # closing the chain waited for the shadow loser and updated its rows
            calls = {c.attempt: c for c in store.calls(chain.run_id)}
            step = store.steps(chain.run_id)[0]
        assert done.status == "ok"
        assert calls[1].outcome == "shadow_finished" and calls[1].ttft_ms >= 350
        assert calls[2].outcome == "duplicate"
        first_token = {n: c.started_offset_ms + c.ttft_ms for n, c in calls.items()}
        # the turn did not wait for the 400 ms shadow primary: it ended before its first token
        assert done.duration_ms < first_token[1]
        # time saved = the primary's first token minus the copy's, both from the step start
        assert step.hedge_won == 1 and step.time_saved_ms is not None
        # (on the engine's clock, so within the primary's first-token offset, not equal to
        # the rows' difference to the microsecond)
        assert 0 < step.time_saved_ms < first_token[1]
        await wait_for(lambda: len(slow.requests()) == 1 and slow.requests()[0]["tokens_sent"] > 0)


async def test_a_shadow_losers_late_log_update_that_fails_is_no_unretrieved_task_error(
    fast_lab: LabServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database away (PostgreSQL stopped) when a shadow loser ends: its rows' update
    gives up (LogWriteLost, the writer counts and says what is lost). That failure is in a
    task nobody awaits; it printed "Task exception was never retrieved" and a traceback."""
    unretrieved: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))
    with LabServer("lognormal", median_ms=400, sigma=0.01, n_tokens=5) as slow:
        cfg = one_step_config(slow.base_url, fast_lab.base_url,
                              {"delay_ms": 50, "max_attempts": 2, "max_extra_load": 1.0,
                               "shadow_fraction": 1.0})  # fmt: skip
        with Store.open(":memory:") as store:
            tried: list[int | None] = []

            async def away(turn_id: int | None, *args: Any, **kwargs: Any) -> None:
                tried.append(turn_id)
                raise LogWriteLost("run log: the database has been unreachable for 14 s")

            monkeypatch.setattr(store, "aupdate_step_calls", away)
            async with Chain(cfg, store=store) as chain:
                done = await chain.run_turn("shadow me")
                # the 400 ms shadow primary ends, its update fails, its task is done and
                # dropped while the chain runs on (a serve process)
                await wait_for(lambda: bool(tried))
                await asyncio.sleep(0.05)
                gc.collect()  # an unretrieved task exception is said when it is collected
                await asyncio.sleep(0)
    loop.set_exception_handler(None)
    assert done.status == "ok" and tried == [done.turn_id]
    assert unretrieved == [], [c.get("message") for c in unretrieved]
