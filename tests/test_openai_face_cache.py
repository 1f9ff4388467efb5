"""The prompt cache of a stateless chat through the OpenAI-compatible face.

A client of the Chat Completions API names no conversation: it sends the whole thread
with every request. Against the lab (a real HTTP server that records each request's
``prompt_cache_key``, ``id_slot`` and messages), driven by the real ``openai`` client:
a chat's turns carry one cache key and keep one llama-server slot, turn 2's answer
prompt begins with turn 1's prompt and answer (the prefix the server has cached), two
chats carry two keys, and the request's ``prompt_cache_key`` keys the cache as the hint
it is at OpenAI (scoped by the caller, naming no conversation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from serve_helpers import serving

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.conversations.history import HistoryTurn
from chainrun.conversations.threads import CallerThreads
from chainrun.desk.conversations import hinted_cache_key
from chainrun.lab import LabServer
from chainrun.log.store import Store

MODEL = "chainrun-shop"


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    with LabServer("fast", n_tokens=6, per_token_ms=1, record_bodies=True) as lab:
        yield lab


def _factory(lab: LabServer, store: Store, **provider: Any) -> Callable[[], Chain]:
    cfg = config_from_dict({"providers": {"local": {"base_url": lab.base_url, **provider}}})
    return lambda: Chain(cfg, store=store, kind="live", quiet=True)


def _turns(store: Store) -> list[Any]:
    """Every turn the serve's run logged."""
    return store.turns([r.id for r in store.runs_of_kind("live")])


def _text(messages: list[dict[str, Any]]) -> str:
    """A request's messages as one text, in order (a prefix cache's view of them)."""
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


def _answer_calls(lab: LabServer, message: str) -> list[dict[str, Any]]:
    """The lab's compose requests whose last message asks ``message``."""
    asks = f"Shopper: {message}\nStylist:"
    return [r for r in lab.requests() if str(r["messages"][-1]["content"]).rstrip().endswith(asks)]


async def _chat(client: openai.AsyncOpenAI, turns: list[str], *, stream: bool,
                **extra: Any) -> list[str]:  # fmt: skip
    """A chat as a stateless client has it: each request sends the thread so far."""
    thread: list[dict[str, str]] = [{"role": "system", "content": "Be brief."}]
    answers = []
    for text in turns:
        thread.append({"role": "user", "content": text})
        if stream:
            chunks = await client.chat.completions.create(
                model=MODEL, messages=thread, stream=True, **extra)  # type: ignore[arg-type]
            answer = "".join([c.choices[0].delta.content or "" async for c in chunks
                              if c.choices])  # fmt: skip
        else:
            done = await client.chat.completions.create(model=MODEL, messages=thread,  # type: ignore[arg-type]
                                                        **extra)  # fmt: skip
            answer = done.choices[0].message.content or ""
        assert answer
        thread.append({"role": "assistant", "content": answer})
        answers.append(answer)
    return answers


@pytest.mark.parametrize("stream", [True, False])
async def test_a_stateless_chat_keeps_one_cache_key_and_its_prefix(lab, tmp_path, stream) -> None:
    lab.reset()
    store = Store.open(tmp_path / "log.db")
    async with serving(_factory(lab, store, prompt_cache="key")) as (url, _):
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as c:
            await _chat(c, ["a rain jacket?", "in blue?"], stream=stream)
            await _chat(c, ["a wool hat?", "in red?"], stream=stream)
    first, second = _answer_calls(lab, "a rain jacket?"), _answer_calls(lab, "in blue?")
    assert len(first) == 1 and len(second) == 1
    # one key for the chat's two turns, every call of both (the checks' too)
    chat_a = {r["prompt_cache_key"] for r in lab.requests()
              if "rain jacket" in str(r["messages"])}  # fmt: skip
    chat_b = {r["prompt_cache_key"] for r in lab.requests() if "wool hat" in str(r["messages"])}
    assert len(chat_a) == 1 and None not in chat_a
    assert len(chat_b) == 1 and chat_a != chat_b
    # turn 2's answer prompt begins with turn 1's whole prompt, then its answer: the
    # thread the client sent back is rendered as the chain's own prompt had it
    p1, p2 = _text(first[0]["messages"]), _text(second[0]["messages"])
    assert p2.startswith(p1), (p1, p2)
    logged = [t for t in _turns(store) if t.input == "a rain jacket?"]
    answer = logged[0].output.strip()
    assert answer and p2[len(p1):].lstrip().startswith(answer.splitlines()[0])
    # both turns in the one derived conversation
    turns = _turns(store)
    by_input = {t.input: t for t in turns}
    assert by_input["a rain jacket?"].conversation_id == by_input["in blue?"].conversation_id
    assert by_input["in blue?"].turn_index == 2
    store.close()


async def test_a_stateless_chat_keeps_its_answer_slot(lab, tmp_path) -> None:
    lab.reset()
    store = Store.open(tmp_path / "log.db")
    async with serving(_factory(lab, store, prompt_cache="slot", slots=4)) as (url, _):
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as c:
            await _chat(c, ["boots?", "in size 40?", "and 41?"], stream=True)
            await _chat(c, ["a scarf?", "in wool?"], stream=True)
    slots_a = {r["id_slot"] for m in ("boots?", "in size 40?", "and 41?")
               for r in _answer_calls(lab, m)}  # fmt: skip
    slots_b = {r["id_slot"] for m in ("a scarf?", "in wool?") for r in _answer_calls(lab, m)}
    assert len(slots_a) == 1 and None not in slots_a
    assert len(slots_b) == 1 and slots_a != slots_b
    store.close()


async def test_prompt_cache_key_is_the_callers_hint(lab, tmp_path) -> None:
    lab.reset()
    store = Store.open(tmp_path / "log.db")
    async with serving(_factory(lab, store, prompt_cache="key")) as (url, _):
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as c:
            # two chats of one caller with one hint share a cache; another caller's
            # equal hint is another key; the hint names no conversation
            await _chat(c, ["gloves?"], stream=False, prompt_cache_key="shop-a", user="u1")
            await _chat(c, ["belts?"], stream=True, prompt_cache_key="shop-a", user="u1")
            await _chat(c, ["socks?"], stream=False, prompt_cache_key="shop-a", user="u2")
    def keys(word: str) -> set[str | None]:
        return {r["prompt_cache_key"] for r in lab.requests() if word in str(r["messages"])}
    assert keys("gloves?") == keys("belts?") == {hinted_cache_key("~u1", "shop-a")}
    assert keys("socks?") == {hinted_cache_key("~u2", "shop-a")}
    turns = {t.input: t for t in _turns(store)}
    assert turns["gloves?"].conversation_id != turns["belts?"].conversation_id
    store.close()


def test_a_bad_prompt_cache_key_is_refused_naming_it() -> None:
    from chainrun.serve.openai_face import InvalidRequest, parse_completion_request

    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    for bad in ("", 7, "k" * 1025):
        with pytest.raises(InvalidRequest) as e:
            parse_completion_request({**body, "prompt_cache_key": bad}, "m")
        assert e.value.param == "prompt_cache_key"
    ok = parse_completion_request({**body, "prompt_cache_key": "k" * 1024}, "m")
    assert ok.asked.cache_hint == "k" * 1024


def test_caller_threads_stand_in_only_for_the_turn_they_equal() -> None:
    threads = CallerThreads(max_turns=2)
    shown = HistoryTurn("boots?", "We have boots A.", ("B1",), context="Matches: B1\nboots?")
    threads.record("c", 1, shown)
    threads.record("c", 1, HistoryTurn("no context", "x"))  # adds nothing: not kept
    assert len(threads) == 1
    sent = HistoryTurn("boots?", "  We have boots A.\n")
    # the same turn at the same place: the recorded one; anywhere else, or changed, as sent
    assert threads.fill("c", [sent]) == (shown,)
    assert threads.fill("other", [sent]) == (sent,)
    assert threads.fill("c", [HistoryTurn("x", "y"), sent]) == (HistoryTurn("x", "y"), sent)
    edited = HistoryTurn("boots?", "We have boots B.")
    assert threads.fill("c", [edited]) == (edited,)
    # the least recently used turn goes first
    threads.record("c", 2, HistoryTurn("m2", "a2", context="k2"))
    threads.fill("c", [sent])
    threads.record("c", 3, HistoryTurn("m3", "a3", context="k3"))
    assert threads.fill("c", [sent])[0] == shown
    assert threads.fill("c", [sent, HistoryTurn("m2", "a2")])[1].context is None


async def test_a_message_sent_at_answer_done_finds_the_answer_in_its_history(tmp_path) -> None:
    """``answer_done`` tells a client it may send the next message while the checks after
    the answer still run: that message's turn has the answered turn in its history (the
    turn is recorded in its conversation at ``answer_done``, not only at its end), on
    ``/chat`` and through the OpenAI face alike."""
    import httpx
    from conftest import reply_by_step
    from serve_helpers import sse

    from chainrun.providers.fake import FakeProvider, FakeReply

    slow = {"validate": FakeReply('{"ok": true, "reason": "fine"}', ttft_s=1.5),
            "critique": FakeReply("Mention the price.", ttft_s=1.5)}  # fmt: skip
    fake = FakeProvider(name="local", script=reply_by_step(slow))
    store = Store.open(tmp_path / "log.db")
    cfg = config_from_dict({})

    def factory() -> Chain:
        return Chain(cfg, store=store, providers={"local": fake}, kind="live", quiet=True)

    async with serving(factory) as (url, _), httpx.AsyncClient(base_url=url) as client:
        for message in ("a rain jacket?", "in blue?"):
            body = {"message": message, "conversation_id": "c-at-done"}
            async with client.stream("POST", "/chat", json=body) as r:
                async for event, _ in sse(r):
                    if event == "answer_done":
                        break  # the checks after the answer still run
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as c:
            await _chat(c, ["wool hats?", "in red?"], stream=True)
    def compose(message: str) -> str:
        asks = f"Shopper: {message}\nStylist:"
        (found,) = [r.messages[-1]["content"] for r in fake.requests
                    if r.messages[-1]["content"].rstrip().endswith(asks)]  # fmt: skip
        return str(found)

    assert "a rain jacket?" in compose("in blue?")
    assert compose("in red?").startswith(compose("wool hats?"))
    store.close()
