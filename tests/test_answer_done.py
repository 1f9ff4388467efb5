"""The answer is the shopper's before the checks after it end.

The library yields ``AnswerDone`` as soon as the answer is complete and nothing pending
can take it back; ``/chat`` sends ``answer_done`` then, and a client that leaves after it
does not cancel the turn (its checks finish and are logged on the server); the
OpenAI-compatible face ends its stream at the answer. The checks are made slow (1.5 s)
so that "before" is measurable.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import openai
from conftest import reply_by_step
from serve_helpers import serving, sse

from chainrun.chain import Chain
from chainrun.config import ChainConfig
from chainrun.events import AnswerDone, StepFinished, TurnFinished
from chainrun.providers.fake import FakeProvider, FakeReply
from chainrun.log.store import Store

SLOW_S = 1.5


def slow_checks() -> FakeProvider:
    return FakeProvider(name="local", script=reply_by_step({
        "validate": FakeReply('{"ok": true, "reason": "fine"}', ttft_s=SLOW_S),
        "critique": FakeReply("Mention the price.", ttft_s=SLOW_S),
    }))  # fmt: skip


def factory(config: ChainConfig, store: Store, fake: FakeProvider) -> Callable[[], Chain]:
    return lambda: Chain(config, store=store, providers={"local": fake}, kind="live", quiet=True)


async def _logged_turns(store: Store, n: int) -> list[dict]:
    for _ in range(300):
        rows = list(store.db.table("turns").rows)
        if len(rows) >= n:
            return rows
        await asyncio.sleep(0.02)
    raise AssertionError(f"expected {n} logged turns")


async def test_library_yields_answer_done_before_the_checks_end(config: ChainConfig) -> None:
    async with Chain(config, providers={"local": slow_checks()}, quiet=True) as chain:
        events = [ev async for ev in chain.stream_turn("a rain jacket?")]
    kinds = [type(ev).__name__ for ev in events]
    (done,) = [ev for ev in events if isinstance(ev, AnswerDone)]
    finished = {ev.step: i for i, ev in enumerate(events) if isinstance(ev, StepFinished)}
    at = kinds.index("AnswerDone")
    assert finished["compose"] < at < finished["validate"] and at < finished["critique"]
    assert {"validate", "critique"} <= set(done.pending)
    last = events[-1]
    assert isinstance(last, TurnFinished) and last.status == "ok"
    assert done.text == last.output and done.answer_done_ms == last.answer_done_ms
    assert done.usage.calls >= 1 and done.usage.output_tokens > 0
    assert last.duration_ms - done.answer_done_ms > SLOW_S * 1000 * 0.8


async def test_chat_answer_done_then_the_client_leaves_and_checks_finish(
    config: ChainConfig, store: Store
) -> None:
    async with (
        serving(factory(config, store, slow_checks())) as (url, _),
        httpx.AsyncClient(base_url=url) as client,
    ):
        t0 = time.perf_counter()
        async with client.stream("POST", "/chat", json={"message": "a jacket?"}) as r:
            async for event, data in sse(r):
                assert event != "turn", "answer_done must come before the turn ends"
                if event == "answer_done":
                    answered_s = time.perf_counter() - t0
                    assert data["output"] and "validate" in data["pending"]
                    break  # the page takes the next question: this response is closed
        assert answered_s < SLOW_S
        (turn,) = await _logged_turns(store, 1)
    assert turn["status"] == "ok" and turn["output"] == data["output"]
    steps = {s.step: s for s in store.steps(turn["run_id"])}
    assert steps["validate"].status == "ok" and steps["critique"].status == "ok"


async def test_openai_stream_ends_at_the_answer(config: ChainConfig, store: Store) -> None:
    async with serving(factory(config, store, slow_checks())) as (url, _):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        async with client:
            t0 = time.perf_counter()
            stream = await client.chat.completions.create(
                model="chainrun-shop", messages=[{"role": "user", "content": "a jacket?"}],
                stream=True, stream_options={"include_usage": True},
            )  # fmt: skip
            chunks = [c async for c in stream]
            ended_s = time.perf_counter() - t0
        (turn,) = await _logged_turns(store, 1)
    assert ended_s < SLOW_S
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    (finish,) = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish.choices[0].finish_reason == "stop"
    extra = finish.model_extra["chainrun"]
    assert extra["status"] == "answered" and extra["output"] == text == turn["output"]
    assert {"validate", "critique"} <= set(extra["pending"])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    # the checks went on after the stream ended, and the turn is logged whole
    assert turn["status"] == "ok" and turn["request_id"] == extra["request_id"]
    steps = {s.step: s for s in store.steps(turn["run_id"])}
    assert steps["validate"].status == "ok" and steps["critique"].status == "ok"
