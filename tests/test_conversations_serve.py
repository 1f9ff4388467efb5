"""Conversations as a new user meets them: two turns through ``chainrun serve`` against
the latency lab recording every request body (a real HTTP server), through ``/chat``
with a conversation id and through the OpenAI-compatible face with the real ``openai``
client sending the history. Turn 2's answer request must hold turn 1's message and
answer, and turn 2's search must be about jackets."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from serve_helpers import chat, serving

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.lab import LabServer
from chainrun.log.store import Store

FIRST, SECOND = "Do you have rain jackets?", "Which of those is cheapest?"


@pytest.fixture(scope="module")
def recording_lab() -> Iterator[LabServer]:
    with LabServer("fast", n_tokens=6, per_token_ms=1, record_bodies=True) as lab:
        yield lab


def _factory(lab: LabServer, store: Store) -> Any:
    cfg = config_from_dict({"providers": {"local": {"base_url": lab.base_url}}})
    return lambda: Chain(cfg, store=store, kind="live", quiet=True)


def _answer_requests(lab: LabServer, message: str) -> list[str]:
    """The user text of every answer (compose) request the lab received for ``message``."""
    records = lab.requests()
    out = []
    for r in records:
        messages = r["messages"] or []
        text = messages[-1]["content"] if messages else ""
        if "Catalogue matches" in text and text.endswith(f"Shopper: {message}\nStylist:"):
            out.append(text)
    return out


def _retrieve_query(store: Store, turn_id: int) -> str:
    """The query turn ``turn_id`` searched the catalogue with (checked cheapest first)."""
    logged = store.turn(turn_id)
    assert logged is not None
    (retrieve,) = [s for s in logged.steps if s.step == "retrieve"]
    detail = retrieve.detail or {}
    prices = [item["price"] for item in detail["results"]]
    assert detail["price_order"] == "price_asc" and prices == sorted(prices) and prices
    return str(detail["standalone_query"])


async def test_chat_with_a_conversation_id_sends_turn_one_to_turn_two(
    recording_lab, tmp_path
) -> None:
    recording_lab.reset()
    store = Store.open(tmp_path / "log.db")
    async with serving(_factory(recording_lab, store)) as (url, _):
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            one = await chat(client, FIRST, conversation_id="shopper-42")
            two = await chat(client, SECOND, conversation_id="shopper-42")
    first, second = one[-1][1], two[-1][1]
    assert first["status"] == "ok" and second["status"] == "ok"
    assert (first["conversation_id"], first["turn_index"]) == ("shopper-42", 1)
    assert (second["conversation_id"], second["turn_index"]) == ("shopper-42", 2)
    (prompt,) = _answer_requests(recording_lab, SECOND)
    assert f"Shopper: {FIRST}\n" in prompt  # turn 1's message ...
    assert f"Stylist: {' '.join(first['output'].split())}\n" in prompt  # ... and its answer
    assert "jacket" in _retrieve_query(store, second["turn_id"]).lower()
    rows = {t.id: t for t in store.turns(second["run_id"])}
    assert rows[second["turn_id"]].turn_index == 2
    store.close()


async def test_openai_face_takes_the_history_from_the_messages(recording_lab, tmp_path) -> None:
    recording_lab.reset()
    store = Store.open(tmp_path / "log.db")
    async with serving(_factory(recording_lab, store)) as (url, _):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        async with client:
            thread: list[Any] = [{"role": "system", "content": "You are a pirate."},
                                 {"role": "user", "content": FIRST}]  # fmt: skip
            one = await client.chat.completions.create(model="chainrun-shop", messages=thread)
            answer = one.choices[0].message.content
            thread += [{"role": "assistant", "content": answer},
                       {"role": "user", "content": SECOND}]  # fmt: skip
            stream = await client.chat.completions.create(
                model="chainrun-shop", messages=thread, stream=True
            )
            chunks = [c async for c in stream]
    summary = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    extra = summary.model_extra["chainrun"]
    # the face's stream ends at the answer (status "answered"); the checks finish on the server
    assert extra["status"] == "answered" and extra["turn_index"] == 2
    (prompt,) = _answer_requests(recording_lab, SECOND)
    assert f"Shopper: {FIRST}\nStylist: {' '.join(answer.split())}\n" in prompt
    assert "pirate" not in str(recording_lab.requests())  # the client's system text: unused
    # the stream ended at the answer: the turn is found in the log by its request id
    # once the server has finished it (serving() waits for the turns it started)
    turn_ids = [store.find_turn_id(r.id, extra["request_id"]) for r in store.list_runs(10)]
    (turn_id,) = [t for t in turn_ids if t is not None]
    assert "jacket" in _retrieve_query(store, turn_id).lower()
    store.close()
