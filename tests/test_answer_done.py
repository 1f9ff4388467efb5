"""The answer is the shopper's before the checks after it end.

The library yields ``AnswerDone`` as soon as the answer is complete and nothing pending
can take it back; ``/chat`` sends ``answer_done`` then, and a client that leaves after it
does not cancel the turn (its checks finish and are logged on the server); the
OpenAI-compatible face ends its stream at the answer. The checks are held until the
test lets them go, so "before" does not depend on the machine's speed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
from conftest import reply_by_step
from serve_helpers import serving, sse

from chainrun.chain import Chain
from chainrun.config import ChainConfig
from chainrun.events import AnswerDone, StepFinished, TurnFinished
from chainrun.log.store import Store
from chainrun.providers.base import ChatRequest
from chainrun.providers.fake import FakeProvider
from chainrun.timing import Chunk

#: how long the test waits for what must happen while the checks are held, in s
WAIT_S = 30


@dataclass
class GatedChecks(FakeProvider):
    """The fake provider, with the checks after the answer (validate, critique) held until
    ``gate`` is set: what must happen before they end is then seen to happen before."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)

    async def chunks(self, request: ChatRequest) -> AsyncIterator[Chunk]:
        prompt = request.messages[-1]["content"]
        if "Review as JSON" in prompt or "more helpful" in prompt:
            await self.gate.wait()
        async for chunk in super().chunks(request):
            yield chunk


def gated() -> GatedChecks:
    return GatedChecks(name="local", script=reply_by_step())


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
    fake = gated()
    events: list[Any] = []
    async with Chain(config, providers={"local": fake}, quiet=True) as chain:
        async with asyncio.timeout(WAIT_S):  # the checks are held: AnswerDone comes anyway
            async for ev in chain.stream_turn("a rain jacket?"):
                events.append(ev)
                if isinstance(ev, AnswerDone):
                    fake.gate.set()
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


async def test_chat_answer_done_then_the_client_leaves_and_checks_finish(
    config: ChainConfig, store: Store
) -> None:
    fake = gated()
    async with (
        serving(factory(config, store, fake)) as (url, _),
        httpx.AsyncClient(base_url=url) as client,
    ):
        async with (
            asyncio.timeout(WAIT_S),  # the checks are held: answer_done comes anyway
            client.stream("POST", "/chat", json={"message": "a jacket?"}) as r,
        ):
            async for event, data in sse(r):
                assert event != "turn", "answer_done must come before the turn ends"
                if event == "answer_done":
                    assert data["output"] and "validate" in data["pending"]
                    break  # the page takes the next question: this response is closed
        await asyncio.sleep(0.2)  # the server sees the closed response
        fake.gate.set()  # the checks go on with no client listening
        (turn,) = await _logged_turns(store, 1)
    assert turn["status"] == "ok" and turn["output"] == data["output"]
    steps = {s.step: s for s in store.steps(turn["run_id"])}
    assert steps["validate"].status == "ok" and steps["critique"].status == "ok"


async def test_openai_stream_ends_at_the_answer(config: ChainConfig, store: Store) -> None:
    fake = gated()
    async with serving(factory(config, store, fake)) as (url, _):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        async with client, asyncio.timeout(WAIT_S):  # the checks are held: it ends anyway
            stream = await client.chat.completions.create(
                model="chainrun-shop", messages=[{"role": "user", "content": "a jacket?"}],
                stream=True, stream_options={"include_usage": True},
            )  # fmt: skip
            chunks = [c async for c in stream]
        assert not list(store.db.table("turns").rows)  # the turn is still running
        fake.gate.set()
        (turn,) = await _logged_turns(store, 1)
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
