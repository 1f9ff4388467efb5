"""Actions that wait for the shopper's yes through ``/chat``: the ``action`` event, a
confirmation as ``{"confirm": ID}``, and an ``Idempotency-Key`` sent again running nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve_helpers import n_turns, serving, sse
from test_confirm_actions import cart_fake, confirm_config
from test_tool_steps import RUNS

from chainrun.chain import Chain
from chainrun.log.store import Store


@pytest.fixture(autouse=True)
def _fresh_runs() -> Iterator[None]:
    RUNS.clear()
    yield
    RUNS.clear()


async def post(client: httpx.AsyncClient, body: dict[str, Any],
               key: str | None = None) -> list[tuple[str, Any]]:  # fmt: skip
    headers = {"Idempotency-Key": key} if key else {}
    async with client.stream("POST", "/chat", json=body, headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        return [ev async for ev in sse(r)]


async def test_chat_sends_the_action_and_takes_a_confirmation_once(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "log.db")
    fake = cart_fake()
    try:
        async with serving(lambda: Chain(confirm_config(), store=store,
                                         providers={"local": fake}, quiet=True)) as (url, _):
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                asked = await post(client, {"message": "put 2 of JKT-12 in my cart",
                                            "conversation_id": "w1"})  # fmt: skip
                (action,) = [d for e, d in asked if e == "action"]
                assert action["question"] == "Add 2 x JKT-12 to your cart?"
                assert action["arguments"] == {"sku": "JKT-12", "qty": 2}
                assert asked[-1][1]["output"] == "Add 2 x JKT-12 to your cart?"
                assert RUNS == []
                body = {"conversation_id": "w1", "confirm": action["id"]}
                yes = await post(client, body, key="click-1")
                again = await post(client, body, key="click-1")
                reused = await client.post("/chat", json={"conversation_id": "w1",
                                                          "deny": action["id"]},
                                           headers={"Idempotency-Key": "click-1"})  # fmt: skip
                unknown = await client.post("/chat", json={"conversation_id": "w1",
                                                           "confirm": "no-such-action"})
    finally:
        store.close()
    assert len(RUNS) == 1 and (RUNS[0]["sku"], RUNS[0]["qty"]) == ("JKT-12", 2)
    assert yes[-1][1]["output"] == "Done: two JKT-12 are in your cart."
    assert again[-1][0] == "turn" and again[-1][1]["turn_id"] == yes[-1][1]["turn_id"]
    assert again[-1][1]["output"] == yes[-1][1]["output"]
    # refused before its turn ran: the HTTP status and the one error shape, not a stream
    # (it was a 200 text/event-stream with one error event)
    assert reused.status_code == 422, reused.text
    assert reused.headers["content-type"] == "application/json"
    error = reused.json()["error"]
    assert "'click-1'" in error["message"] and error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == ("Idempotency-Key", "idempotency_key_reused")
    assert unknown.status_code == 400 and unknown.headers["content-type"] == "application/json"
    assert unknown.json()["error"]["message"] == (
        "confirm: no action 'no-such-action' waits in conversation 'w1'"), unknown.text


async def test_the_openai_client_retrying_a_timed_out_request_runs_the_tool_once(
    tmp_path: Path,
) -> None:
    """The real ``openai`` client, its timeout shorter than the answer, ``max_retries=2``,
    the key in ``extra_headers`` (kept across its retries): one tool run, one answer."""
    import openai
    from test_tool_steps import cart_call, rounds_script, tool_config

    from chainrun.providers.fake import FakeProvider, FakeReply

    store = Store.open(tmp_path / "log.db")
    fake = FakeProvider(name="local", script=rounds_script(
        cart_call({"sku": "JKT-12", "qty": 2}),
        FakeReply("Two JKT-12 are in your cart.", ttft_s=1.2, gap_s=0.001)))  # fmt: skip
    try:
        async with serving(lambda: Chain(tool_config(), store=store, providers={"local": fake},
                                         quiet=True)) as (url, _):  # fmt: skip
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", timeout=0.5,
                                        max_retries=2)  # fmt: skip
            got = await client.chat.completions.create(
                model="chainrun-shop", messages=[{"role": "user", "content": "2 of JKT-12"}],
                user="retry-conv", extra_headers={"Idempotency-Key": "order-77"},
            )  # fmt: skip
            await client.close()
    finally:
        store.close()
    assert len(RUNS) == 1
    assert got.choices[0].message.content == "Two JKT-12 are in your cart."


async def test_the_openai_face_asks_in_text_and_takes_the_next_user_message_as_the_reply(
    tmp_path: Path,
) -> None:
    """The real ``openai`` client on ``/v1/chat/completions``: the ask runs nothing and its
    answer is the question; "yes" as the next user message runs the pending arguments
    once; a "no" runs nothing; a yes after the action expired runs nothing and says so."""
    import openai

    store = Store.open(tmp_path / "log.db")
    ask = ("user", "put 2 of JKT-12 in my cart")

    async def say(client: openai.AsyncOpenAI, conv: str, *thread: tuple[str, str]) -> str:
        got = await client.chat.completions.create(
            model="chainrun-shop", user=conv,
            messages=[{"role": role, "content": text} for role, text in thread],  # type: ignore[misc]
        )  # fmt: skip
        return got.choices[0].message.content or ""

    try:
        async with serving(lambda: Chain(confirm_config(confirm_turns=1), store=store,
                                         providers={"local": cart_fake()},
                                         quiet=True)) as (url, _):  # fmt: skip
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
            try:
                asked = await say(client, "v1-yes", ask)
                runs_after_ask = len(RUNS)
                q = ("assistant", asked)
                yes = await say(client, "v1-yes", ask, q, ("user", "yes"))
                runs_after_yes = list(RUNS)
                no = await say(client, "v1-no", ask, q, ("user", "no"))
                runs_after_no = len(RUNS)
                await say(client, "v1-late", ask)
                unclear = await say(client, "v1-late", ask, q, ("user", "hm?"))
                late = await say(client, "v1-late", ask, q, ("user", "hm?"),
                                 ("assistant", unclear), ("user", "yes"))  # fmt: skip
            finally:
                await client.close()
    finally:
        store.close()
    assert asked == "Add 2 x JKT-12 to your cart?" and runs_after_ask == 0
    assert yes == "Done: two JKT-12 are in your cart."
    assert [(r["sku"], r["qty"]) for r in runs_after_yes] == [("JKT-12", 2)]
    assert runs_after_no == 1 and "Add 2 x JKT-12 to your cart?" in no
    assert unclear == "Please answer yes or no: Add 2 x JKT-12 to your cart?"
    assert late.startswith("That request has expired") and len(RUNS) == 1


async def test_a_keyed_request_without_a_conversation_sent_again_is_the_first_one(
    tmp_path: Path,
) -> None:
    """Without a conversation_id the key alone names the request: the retry gets the
    first request's turn and conversation (each request had been given a new
    conversation id before its key was looked up, so every retry ran again)."""
    store = Store.open(tmp_path / "log.db")
    try:
        async with serving(lambda: Chain(confirm_config(), store=store,
                                         providers={"local": cart_fake()}, quiet=True)) as (
                url, _):  # fmt: skip
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                body = {"message": "put 2 of JKT-12 in my cart"}
                first = await post(client, body, key="retry-7")
                again = await post(client, body, key="retry-7")
                other = await post(client, body, key="retry-8")
        n_turns = len(store.turns(1))
    finally:
        store.close()
    turn, turn_again, turn_other = first[-1][1], again[-1][1], other[-1][1]
    assert turn_again["turn_id"] == turn["turn_id"]
    assert turn_again["conversation_id"] == turn["conversation_id"]
    assert turn_other["conversation_id"] != turn["conversation_id"]  # another request
    assert n_turns == 2


async def test_a_confirm_to_a_chain_without_tools_is_a_400_and_runs_no_turn(
    tmp_path: Path,
) -> None:
    """The default chain asks for no confirmation: an action id is unknown to it, refused
    400 as an unknown id is where there are tools (it was answered as a turn, 200)."""
    from chainrun.config import config_from_dict
    from chainrun.providers.fake import FakeProvider

    store = Store.open(tmp_path / "log.db")
    try:
        async with serving(lambda: Chain(config_from_dict({}), store=store,
                                         providers={"local": FakeProvider(name="local")},
                                         quiet=True)) as (url, _):  # fmt: skip
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                unknown = await client.post("/chat", json={"message": "hi",
                                                           "conversation_id": "c1",
                                                           "confirm": "nonexistent-action"})
        assert unknown.status_code == 400 and unknown.headers["content-type"] == (
            "application/json"), unknown.text
        assert "no action 'nonexistent-action' waits" in unknown.json()["error"]["message"]
        assert n_turns(store) == 0
    finally:
        store.close()
