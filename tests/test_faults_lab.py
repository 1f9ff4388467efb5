"""Every provider fault over real HTTP (the lab, through the real ``openai``
client): each with a bounded time, a classified outcome and the exact number of
requests the lab received (no hidden retries, under hedges either); every test on both
transports (``httpx`` and ``aiohttp``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.errors import (
    ContextLengthExceeded,
    FirstTokenTimeout,
    IdleTimeout,
    MalformedStream,
    ProviderError,
    ProviderStatusError,
    RequestRejected,
    StepConfigError,
    StreamError,
    StreamTruncated,
)
from chainrun.events import TokenDelta
from chainrun.lab import LabServer, Scenario
from chainrun.lab.scenarios import Faults
from chainrun.log.store import Store
from chainrun.providers.base import ChatRequest, ChatStream
from chainrun.providers.config import Transport
from chainrun.providers.openai_compat import OpenAICompatProvider
from chainrun.replay.run import ReplayRequest, run_requests

MESSAGES = [{"role": "user", "content": "Does the linen shirt run small?"}]


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    with LabServer("fast") as lab:
        yield lab


#: the transport of this module's calls (every test runs on both)
TRANSPORT: list[Transport] = ["httpx"]


@pytest.fixture(autouse=True, params=["httpx", "aiohttp"])
def transport(request: pytest.FixtureRequest) -> Iterator[Transport]:
    TRANSPORT[0] = request.param
    yield request.param
    TRANSPORT[0] = "httpx"


def use(lab: LabServer, n_tokens: int = 6, per_token_ms: float = 1, **faults: Any) -> None:
    lab.set_scenario(
        Scenario(name="fault", n_tokens=n_tokens, per_token_ms=per_token_ms,
                 faults=Faults(**faults))
    )  # fmt: skip


async def call(
    lab: LabServer,
    *,
    first_token_timeout_s: float | None = None,
    idle_timeout_s: float | None = None,
    bound_s: float = 5.0,
    **request: Any,
) -> tuple[ChatStream, ProviderError | None, float]:
    """One streamed call through the adapter; returns the stream, its error, elapsed s."""
    provider = OpenAICompatProvider("lab", lab.base_url, transport=TRANSPORT[0])
    err: ProviderError | None = None
    t0 = time.perf_counter()
    try:
        s = ChatStream(
            provider, ChatRequest(model="m", messages=MESSAGES, **request),
            first_token_timeout_s=first_token_timeout_s, idle_timeout_s=idle_timeout_s,
        )  # fmt: skip
        try:
            async with asyncio.timeout(bound_s):
                await s.collect()
        except ProviderError as e:
            err = e
        finally:
            await s.aclose()
    finally:
        await provider.aclose()
    return s, err, time.perf_counter() - t0


async def settled(lab: LabServer, n: int, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """The lab's records once ``n`` requests have finished (disconnects settle late)."""
    deadline = time.monotonic() + timeout_s
    while True:
        recs = lab.requests()
        if len(recs) >= n and all(r["finished_at"] is not None for r in recs):
            return recs
        if time.monotonic() > deadline:
            return recs
        await asyncio.sleep(0.05)


# -- HTTP statuses ----------------------------------------------------------------------


async def test_429_with_retry_after(lab: LabServer) -> None:
    use(lab, rate_limit=1.0, retry_after_s=2)
    _, err, _ = await call(lab)
    assert isinstance(err, ProviderStatusError) and err.error_type == "http_429"
    assert err.retry_after_s == 2.0
    assert len(lab.requests()) == 1  # handed back at once: no SDK retry after the 2 s


async def test_429_without_retry_after(lab: LabServer) -> None:
    use(lab, rate_limit=1.0, retry_after=False)
    _, err, _ = await call(lab)
    assert isinstance(err, ProviderStatusError) and err.error_type == "http_429"
    assert err.retry_after_s is None
    assert len(lab.requests()) == 1  # no SDK retry


async def test_500(lab: LabServer) -> None:
    use(lab, server_error=1.0)
    _, err, _ = await call(lab)
    assert isinstance(err, ProviderStatusError) and err.error_type == "http_500"
    assert not isinstance(err, RequestRejected)
    assert len(lab.requests()) == 1  # no SDK retry


async def test_503_in_the_middle_of_a_stream(lab: LabServer) -> None:
    use(lab, stream_error={"p": 1.0, "after_tokens": 2, "style": "data", "code": 503,
                           "message": "lab: overloaded"})  # fmt: skip
    s, err, _ = await call(lab)
    assert type(err) is StreamError and err.error_type == "provider_error"
    assert "503" in str(err) and "lab: overloaded" in str(err) and err.code == 503
    assert s.timer.text == "".join(s.timer.text) and s.timer.ttft_ms is not None
    assert len(lab.requests()) == 1


@pytest.mark.parametrize("status", [400, 401, 403, 404])
async def test_refusals_are_request_rejected(lab: LabServer, status: int) -> None:
    param = "reasoning_effort" if status == 400 else None
    use(lab, reject={"p": 1.0, "status": status, "param": param})
    _, err, _ = await call(lab, reasoning_effort="minimal")
    assert isinstance(err, RequestRejected) and err.status == status
    if status == 400:
        assert (err.param, err.value, err.code) == ("reasoning_effort", "minimal",
                                                    "unsupported_value")  # fmt: skip
        assert err.accepted == ("none", "low", "medium", "high")
    assert len(lab.requests()) == 1


# -- silence: the timers ----------------------------------------------------------------


async def test_no_headers_is_caught_by_the_first_token_timeout(lab: LabServer) -> None:
    use(lab, hang=1.0)
    # 1 s: long enough for a loaded machine's lab to have read the request
    _, err, elapsed = await call(lab, first_token_timeout_s=1.0)
    assert isinstance(err, FirstTokenTimeout) and err.error_type == "first_token_timeout"
    assert "no chunk arrived" in str(err)
    assert elapsed >= 1.0  # not before its timeout (the error type says the timer fired)
    recs = await settled(lab, 1)
    assert len(recs) == 1 and recs[0]["disconnected"]  # the call was really closed


async def test_headers_but_no_first_chunk(lab: LabServer) -> None:
    use(lab, headers_only=1.0)
    s, err, elapsed = await call(lab, first_token_timeout_s=0.3)
    assert isinstance(err, FirstTokenTimeout) and "1 event(s) without a token" in str(err)
    # the role-only frame: an event, no chunk
    assert s.timer.n_events == 1 and s.timer.n_chunks == 0 and s.timer.ttft_ms is None
    assert elapsed >= 0.3  # not before its timeout (the error type says the timer fired)
    recs = await settled(lab, 1)
    assert len(recs) == 1 and recs[0]["disconnected"]


async def test_a_long_pause_after_the_first_token_is_not_a_first_token_timeout(
    lab: LabServer,
) -> None:
    """a healthy stream with a 3 s pause after its first token is not killed."""
    use(lab, pause={"after_tokens": 1, "ms": 3000})
    s, err, elapsed = await call(lab, first_token_timeout_s=1.0, bound_s=8.0)
    assert err is None and s.timer.finish_reason == "stop"
    assert max(s.timer.chunk_gaps_ms) >= 2900 and s.timer.ttft_ms is not None
    assert elapsed >= 3.0 and len(lab.requests()) == 1  # waited the whole pause out


async def test_a_long_pause_after_the_first_token_trips_the_idle_timeout(
    lab: LabServer,
) -> None:
    use(lab, pause={"after_tokens": 1, "ms": 3000})
    s, err, elapsed = await call(lab, first_token_timeout_s=1.0, idle_timeout_s=0.3)
    assert isinstance(err, IdleTimeout) and err.error_type == "idle_timeout"
    assert s.timer.ttft_ms is not None and s.timer.text  # the first token arrived
    assert elapsed >= 0.3  # not before its timeout (the error type says the timer fired)
    recs = await settled(lab, 1)
    assert len(recs) == 1 and recs[0]["disconnected"] and recs[0]["tokens_sent"] == 1


# -- stream shapes ----------------------------------------------------------------------


async def test_cut_stream_without_finish_reason(lab: LabServer) -> None:
    use(lab, cut_after_tokens={"k": 3, "p": 1.0})
    s, err, _ = await call(lab)
    assert isinstance(err, StreamTruncated) and err.error_type == "truncated"
    assert s.timer.finish_reason is None and len(lab.requests()) == 1


async def test_no_usage_chunk_means_tokens_unknown(lab: LabServer) -> None:
    use(lab, no_usage=1.0)
    s, err, _ = await call(lab)
    assert err is None and s.timer.finish_reason == "stop"
    assert s.timer.usage is None  # unknown, not 0
    assert len(lab.requests()) == 1


async def test_usage_on_the_finish_chunk(lab: LabServer) -> None:
    use(lab, usage_on_finish=True)
    s, err, _ = await call(lab)
    assert err is None and s.timer.usage is not None and s.timer.usage.output_tokens == 6
    assert len(lab.requests()) == 1


async def test_usage_only_chunk_with_empty_choices(lab: LabServer) -> None:
    use(lab)
    s, err, _ = await call(lab)
    assert err is None and s.timer.usage is not None and s.timer.usage.output_tokens == 6
    assert s.timer.n_chunks == 7  # 6 tokens, the usage-only chunk (the role frame is none)
    assert s.timer.n_events == 8
    assert len(lab.requests()) == 1


async def test_malformed_sse_line(lab: LabServer) -> None:
    use(lab, malformed_sse=1.0)
    _, err, _ = await call(lab)
    assert isinstance(err, MalformedStream) and err.error_type == "malformed_stream"
    assert len(lab.requests()) == 1


async def test_sse_error_event_keeps_the_servers_message(lab: LabServer) -> None:
    """llama-server's `error: {"code": 400, "message": "the request exceeds the
    available context size"}` then `data: [DONE]` was logged as truncated after 0 chunks."""
    use(lab, stream_error={"p": 1.0, "style": "event", "code": 400})
    _, err, _ = await call(lab)
    assert isinstance(err, ContextLengthExceeded) and err.error_type == "context_length"
    assert "the request exceeds the available context size" in str(err)
    assert len(lab.requests()) == 1


async def test_sse_error_event_of_another_kind_is_a_provider_error(lab: LabServer) -> None:
    use(lab, stream_error={"p": 1.0, "style": "event", "code": 500, "message": "lab: boom"})
    _, err, _ = await call(lab)
    assert type(err) is StreamError and err.error_type == "provider_error"
    assert "lab: boom" in str(err)


async def test_data_error_line_is_still_handled(lab: LabServer) -> None:
    use(lab, stream_error={"p": 1.0, "style": "data", "code": 400, "message": "lab: bad"})
    _, err, _ = await call(lab)
    assert type(err) is StreamError and "lab: bad" in str(err)


async def test_slow_consumer_timings_are_taken_at_arrival(lab: LabServer) -> None:
    use(lab, n_tokens=10, per_token_ms=1)
    provider = OpenAICompatProvider("lab", lab.base_url, transport=TRANSPORT[0])
    try:
        s = ChatStream(provider, ChatRequest(model="m", messages=MESSAGES))
        t0 = time.perf_counter()
        try:
            await s.first_token()
            async for _ in s.deltas():
                await asyncio.sleep(0.05)  # a consumer slower than the stream
        finally:
            await s.aclose()
        consumer_ms = (time.perf_counter() - t0) * 1000.0
    finally:
        await provider.aclose()
    assert s.timer.duration_ms is not None and consumer_ms >= 450
    # measured as the bytes came, not as read: read, every gap would be at least the
    # consumer's 50 ms (a bound a loaded machine cannot break); as they came, not all are
    assert len(s.timer.chunk_gaps_ms) >= 9 and min(s.timer.chunk_gaps_ms) < 50
    assert len(lab.requests()) == 1


# -- through the chain: hedges, cancellation, config mistakes ----------------------------


def chain_config(lab: LabServer, **step: Any) -> Any:
    answer = {"provider": "lab", "prompt": "{message}", "stream": True,
              "max_output_tokens": 20, "deadline_s": 10.0, "on_failure": "closed", **step}
    return config_from_dict({
        "order": ["answer"], "answer_step": "answer",
        "providers": {"lab": {"base_url": lab.base_url, "transport": TRANSPORT[0]}},
        "steps": {"answer": answer},
    })  # fmt: skip


async def test_hedged_step_starts_its_next_copy_at_once_on_first_token_timeout(
    lab: LabServer,
) -> None:
    use(lab, hang=1.0, attempts=[1])  # only the first copy hangs
    cfg = chain_config(lab, first_token_timeout_s=0.3,
                       hedge={"delay_ms": 5000, "max_attempts": 2, "max_extra_load": 1.0})
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store) as chain:
            done = await chain.run_turn("hedge me")
            calls = {c.attempt: c for c in store.calls(chain.run_id)}
    assert done.status == "ok" and done.output
    assert calls[1].error_type == "first_token_timeout"
    assert calls[2].outcome in ("primary", "duplicate") and calls[2].error_type is None
    # sent when the first copy's 0.3 s timer fired, not at the 5 s hedge delay
    assert 250 <= calls[2].started_offset_ms < 5000
    recs = await settled(lab, 2)
    assert len(recs) == 2  # exactly the two copies: no hidden retries


async def test_errors_under_a_hedge_are_not_multiplied(lab: LabServer) -> None:
    use(lab, server_error=1.0)
    # the copies are due at 1 s and 2 s, long after the 500 even on a loaded machine
    cfg = chain_config(lab, hedge={"delay_ms": 1000, "max_attempts": 3, "max_extra_load": 1.0})
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store) as chain:
            done = await chain.run_turn("fail fast")
    assert done.status == "refused"
    assert len(lab.requests()) == 1  # a 500 is fatal by default: no copies, no SDK retries


async def test_caller_cancelling_mid_stream_closes_every_call(lab: LabServer) -> None:
    use(lab, n_tokens=200, per_token_ms=10)
    cfg = chain_config(lab, hedge={"delay_ms": 1, "max_attempts": 2, "max_extra_load": 1.0},
                       max_output_tokens=200)  # fmt: skip
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store) as chain:
            async with contextlib.aclosing(chain.stream_turn("cancel me")) as events:
                async for ev in events:
                    if isinstance(ev, TokenDelta):
                        break  # the caller goes away mid-stream
            turn = store.turns(chain.run_id)[0]
        assert turn.status == "cancelled"
    recs = await settled(lab, 1)
    assert 1 <= len(recs) <= 2 and all(r["disconnected"] or r["completed"] for r in recs)
    assert any(r["disconnected"] for r in recs)
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert pending == []


async def test_replay_stops_at_the_first_parameter_refusal(lab: LabServer) -> None:
    """a server answering every call with HTTP 400 invalid_request_error,
    param reasoning_effort, code unsupported_value made replay log http_400 on every turn
    and exit 0. Now the replay stops at the first with one line naming it all."""
    use(lab, reject={"p": 1.0})
    cfg = chain_config(lab, reasoning_effort="minimal")
    reqs = [ReplayRequest(f"r{i}", f"message {i}") for i in range(5)]
    with Store.open(":memory:") as store:
        with pytest.raises(StepConfigError) as info:
            await run_requests(cfg, reqs, store, quiet=True)
        run = store.list_runs()[0]
        turns = store.turns(run.id)
    assert str(info.value) == (
        "steps.answer: provider 'lab' refused reasoning_effort = 'minimal' "
        "(HTTP 400 unsupported_value); it accepts 'none', 'low', 'medium', 'high'"
    )
    assert "\n" not in str(info.value)
    assert len(lab.requests()) == 1  # stopped at the first
    assert run.status == "failed"
    assert [t.status for t in turns] == ["error"] and turns[0].error_type == "http_400"


@pytest.mark.parametrize("status", [401, 403, 404])
async def test_auth_and_not_found_on_the_first_call_stop_a_live_chain(
    lab: LabServer, status: int
) -> None:
    use(lab, reject={"p": 1.0, "status": status, "param": None, "code": None,
                     "message": "lab: no"})  # fmt: skip
    cfg = chain_config(lab)
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store) as chain:
            with pytest.raises(StepConfigError, match=rf"steps\.answer: .*HTTP {status}"):
                await chain.run_turn("hello")
            turns = store.turns(chain.run_id)
    assert [t.status for t in turns] == ["error"]  # logged, then raised
    assert len(lab.requests()) == 1


async def test_a_401_after_the_step_has_answered_is_not_a_config_stop(lab: LabServer) -> None:
    use(lab)
    cfg = chain_config(lab)
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store) as chain:
            assert (await chain.run_turn("first")).status == "ok"
            use(lab, reject={"p": 1.0, "status": 401, "param": None})
            done = await chain.run_turn("second")
    assert done.status == "refused" and done.error_type == "http_401"
