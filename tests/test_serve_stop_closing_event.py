"""A turn the server cancels as it stops (its stop's deadline, a second Ctrl-C) ends its
``/chat`` stream with the turn's closing ``turn`` event, status ``cancelled``, as logged;
the OpenAI-compatible face answers an error with code ``cancelled``.

Before: the stream just ended after ``step started compose``: the client could not tell
a server that stopped from a connection that broke.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from conftest import reply_by_step
from serve_helpers import serving, sse

from chainrun.chain import Chain
from chainrun.config import ChainConfig
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider, FakeReply

SLOW = FakeReply("Try the Storm Shell.", ttft_s=60.0)  # an answer that never comes in time


def _factory(config: ChainConfig, store: Store) -> Any:
    fake = FakeProvider(name="local", script=reply_by_step({"compose": SLOW}))
    return lambda: Chain(config, store=store, providers={"local": fake}, kind="live", quiet=True)


async def _cancel_when_compose_starts(events: Any, state: Any) -> list[tuple[str, Any]]:
    seen = []
    async for ev in events:
        seen.append(ev)
        if ev[0] == "step" and ev[1].get("step") == "compose" and ev[1]["phase"] == "started":
            state.request_stop(now=True)  # the server cancels its turns (the stop's path)
    return seen


async def test_a_turn_cancelled_by_the_servers_stop_ends_with_its_turn_event(
    config: ChainConfig, tmp_path
) -> None:
    store = Store.open(tmp_path / "log.db")
    try:
        async with (
            serving(_factory(config, store)) as (url, state),
            httpx.AsyncClient(base_url=url, timeout=30) as client,
            client.stream("POST", "/chat", json={"message": "rain jacket?"}) as r,
        ):
            assert r.status_code == 200
            events = await asyncio.wait_for(_cancel_when_compose_starts(sse(r), state), 30)
        name, last = events[-1]
        assert name == "turn", events
        assert last["status"] == "cancelled" and last["turn_id"] is not None
        logged = store.turns(last["run_id"])
        assert [(t.id, t.status) for t in logged] == [(last["turn_id"], "cancelled")]
        assert {s["step"]: s["status"] for s in last["steps"]}["compose"] == "cancelled"
    finally:
        store.close()


async def test_the_openai_face_says_the_turn_was_cancelled(config: ChainConfig, tmp_path) -> None:
    store = Store.open(tmp_path / "log.db")
    body = {"model": "chainrun", "stream": True,
            "messages": [{"role": "user", "content": "rain jacket?"}]}  # fmt: skip
    try:
        async with (
            serving(_factory(config, store)) as (url, state),
            httpx.AsyncClient(base_url=url, timeout=30) as client,
        ):
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
            async with client.stream("POST", "/v1/chat/completions",
                                     json={**body, "model": model}) as r:  # fmt: skip
                assert r.status_code == 200
                chunks = []
                async for _, data in sse(r):
                    chunks.append(data)
                    if len(chunks) == 1:  # the role chunk: the turn is under way
                        await asyncio.sleep(0.5)
                        state.request_stop(now=True)
        error = next(c for c in chunks if isinstance(c, dict) and "error" in c)
        assert error["error"]["code"] == "cancelled", chunks
        assert error["chainrun"]["status"] == "cancelled"
        assert chunks[-1] == "[DONE]"
    finally:
        store.close()
