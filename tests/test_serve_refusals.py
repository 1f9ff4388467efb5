"""A request the chain refuses before its turn runs is answered with its HTTP status on
both faces, not a stream: ``chainrun.serve.turns.opened`` reads a turn's stream up to the
chain's first event (at most ``REFUSAL_WAIT_S``) before the response starts.

Before: ``/chat`` and the streamed OpenAI face answered 200 ``text/event-stream`` with
one ``error`` event (``/chat``) or error chunk (``/v1``) for a key reused with another
body, which a client reading the status took for a turn.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from pathlib import Path

import httpx
import pytest
from serve_helpers import serving, sse
from test_confirm_actions import cart_fake, confirm_config

from chainrun.chain import Chain
from chainrun.log.store import Store
from chainrun.serve.turns import WireEvent, opened

STARTED = WireEvent("turn_started", {"conversation_id": "c"})


async def _stream(*events: tuple[float, WireEvent], closed: list[bool]) -> AsyncGenerator[
        WireEvent, None]:  # fmt: skip
    try:
        for delay, ev in events:
            await asyncio.sleep(delay)
            yield ev
    finally:
        closed.append(True)


async def test_a_refusal_after_turn_started_is_returned_and_the_stream_closed() -> None:
    closed: list[bool] = []
    refused = WireEvent("error", {"status": 422, "message": "reused",
                                  "type": "IdempotencyKeyReused"})  # fmt: skip
    events, refusal = await opened(_stream((0, STARTED), (0.01, refused), closed=closed))
    assert refusal == refused.data and closed == [True]
    assert [ev async for ev in events] == []


async def test_a_turn_is_replayed_whole_and_a_slow_one_starts_within_the_wait() -> None:
    step = WireEvent("step", {"phase": "started"})
    token = WireEvent("token", {"text": "hi"})
    closed: list[bool] = []
    events, refusal = await opened(_stream((0, STARTED), (0, step), (0, token), closed=closed))
    assert refusal is None and [ev async for ev in events] == [STARTED, step, token]
    assert closed == [True]
    # the chain's first event comes after the wait (a key's repeat waiting for its turn):
    # the response starts at the wait's end; the events follow in order, a late error too
    late = WireEvent("error", {"status": 409, "message": "in progress", "type": "x"})
    t0 = time.monotonic()
    events, refusal = await opened(_stream((0, STARTED), (0.5, late), closed=closed),
                                   wait_s=0.1)  # fmt: skip
    assert refusal is None and time.monotonic() - t0 < 0.4
    assert [ev async for ev in events] == [STARTED, late]
    # closed while the event is still awaited: the stream is closed too
    events, _ = await opened(_stream((0, STARTED), (5, step), closed=closed), wait_s=0.05)
    assert await anext(events) == STARTED
    await events.aclose()
    assert closed == [True, True, True]


async def test_both_faces_answer_a_reused_key_with_422(tmp_path: Path) -> None:
    import openai

    store = Store.open(tmp_path / "log.db")
    try:
        async with serving(lambda: Chain(confirm_config(), store=store,
                                         providers={"local": cart_fake()},
                                         quiet=True)) as (url, _):  # fmt: skip
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                key = {"Idempotency-Key": "k-1"}
                hello = {"message": "hello", "conversation_id": "c1"}
                async with client.stream("POST", "/chat", json=hello, headers=key) as first:
                    assert first.status_code == 200
                    events = [e async for e, _ in sse(first)]
                again = await client.post("/chat", json={"message": "hello",
                                                         "conversation_id": "c1"}, headers=key)
                other = await client.post("/chat", json={"message": "bye",
                                                         "conversation_id": "c1"}, headers=key)
            v1 = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
            try:
                await v1.chat.completions.create(
                    model="chainrun-shop", messages=[{"role": "user", "content": "hi"}],
                    user="v1-conv", extra_headers={"Idempotency-Key": "k-2"})
                for stream in (False, True):
                    with pytest.raises(openai.UnprocessableEntityError) as caught:
                        await v1.chat.completions.create(
                            model="chainrun-shop", stream=stream, user="v1-conv",
                            messages=[{"role": "user", "content": "another question"}],
                            extra_headers={"Idempotency-Key": "k-2"})  # fmt: skip
                    err = caught.value.body
                    assert isinstance(err, dict) and err["code"] == "idempotency_key_reused"
                    assert err["param"] == "Idempotency-Key" and "'k-2'" in err["message"]
            finally:
                await v1.close()
    finally:
        store.close()
    assert events[0] == "turn_started" and events[-1] == "turn"
    assert again.status_code == 200 and "event: turn" in again.text  # the same: its turn
    assert other.status_code == 422 and other.headers["content-type"] == "application/json"
    assert set(other.json()["error"]) == {"message", "type", "param", "code"}
    assert other.json()["error"]["code"] == "idempotency_key_reused"
