"""The Responses API face (``POST /v1/responses``) with the real ``openai`` client.

Against the lab (a real HTTP server that records each request's messages and
``prompt_cache_key``): ``client.responses.create`` streamed and not, with usage in
integers; a two-turn chat through ``previous_response_id`` in one conversation whose
second prompt begins with the first (one prompt cache); a stateless client sending the
thread as input items; and the refusals, each naming its field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from serve_helpers import serving

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.lab import LabServer
from chainrun.log.store import Store
from chainrun.serve.faces import InvalidRequest
from chainrun.serve.responses_face import (
    conversation_of,
    new_response_id,
    parse_responses_request,
)

MODEL = "chainrun-shop"


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    with LabServer("fast", n_tokens=6, per_token_ms=1, record_bodies=True) as lab:
        yield lab


def _factory(lab: LabServer, store: Store) -> Callable[[], Chain]:
    cfg = config_from_dict({"providers": {"local": {"base_url": lab.base_url,
                                                    "prompt_cache": "key"}}})  # fmt: skip
    return lambda: Chain(cfg, store=store, kind="live", quiet=True)


def _turns(store: Store) -> dict[str, Any]:
    """The logged turns by their message."""
    return {t.input: t for t in store.turns([r.id for r in store.runs_of_kind("live")])}


def _compose(lab: LabServer, message: str) -> str:
    """The one compose prompt (its messages as one text) that asks ``message``."""
    asks = f"Shopper: {message}\nStylist:"
    found = [r for r in lab.requests()
             if str(r["messages"][-1]["content"]).rstrip().endswith(asks)]  # fmt: skip
    assert len(found) == 1, found
    return "\n".join(f"{m['role']}: {m['content']}" for m in found[0]["messages"])


async def test_responses_streamed_and_not_with_usage(lab, tmp_path) -> None:
    lab.reset()
    store = Store.open(tmp_path / "log.db")
    async with serving(_factory(lab, store)) as (url, _):
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as c:
            whole = await c.responses.create(model=MODEL, input="a rain jacket?",
                                             instructions="Be brief.")  # fmt: skip
            stream = await c.responses.create(
                model=MODEL, stream=True,
                input=[{"role": "user", "content": [{"type": "input_text",
                                                     "text": "a wool hat?"}]}],
            )  # fmt: skip
            events = [e async for e in stream]
    # not streamed: one assistant message, its text the logged answer, usage in integers
    extra = whole.model_extra["chainrun"]
    assert whole.object == "response" and whole.status == "completed"
    assert whole.id.startswith("resp_") and whole.instructions == "Be brief."
    assert [o.type for o in whole.output] == ["message"]
    assert whole.output_text == extra["output"] and whole.output_text
    calls = [c for c in store.calls(extra["run_id"]) if c.turn_id == extra["turn_id"]]
    u = whole.usage
    assert u is not None and u.input_tokens == sum(c.input_tokens or 0 for c in calls) > 0
    assert u.output_tokens == sum(c.output_tokens or 0 for c in calls) > 0
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert isinstance(u.input_tokens_details.cached_tokens, int)
    assert isinstance(u.output_tokens_details.reasoning_tokens, int)
    # streamed: the events in OpenAI's order, the deltas make the text, usage at the end
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1].response
    assert text and done.output_text == text == events[-4].text
    assert done.status == "completed" and done.usage is not None
    assert done.usage.input_tokens > 0 and done.usage.output_tokens > 0
    assert done.id == events[0].response.id and events[0].response.status == "in_progress"
    assert _turns(store)["a wool hat?"].output.startswith(text)
    store.close()


async def test_previous_response_id_continues_the_chat_on_its_cache(lab, tmp_path) -> None:
    lab.reset()
    store = Store.open(tmp_path / "log.db")
    async with serving(_factory(lab, store)) as (url, _):
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as c:
            first = await c.responses.create(model=MODEL, input="a rain jacket?")
            stream = await c.responses.create(model=MODEL, input="in blue?", stream=True,
                                              previous_response_id=first.id)  # fmt: skip
            second = [e async for e in stream][-1].response
            with pytest.raises(openai.NotFoundError) as e:
                await c.responses.create(model=MODEL, input="x",
                                         previous_response_id="resp_nothing")  # fmt: skip
    assert e.value.code == "previous_response_not_found"
    assert e.value.param == "previous_response_id"
    assert second.previous_response_id == first.id and second.status == "completed"
    turns = _turns(store)
    t1, t2 = turns["a rain jacket?"], turns["in blue?"]
    assert t1.conversation_id == t2.conversation_id == conversation_of(first.id)
    assert t2.turn_index == 2
    # turn 2's prompt begins with turn 1's prompt and its answer: one prompt cache
    p1, p2 = _compose(lab, "a rain jacket?"), _compose(lab, "in blue?")
    assert p2.startswith(p1) and p2[len(p1):].lstrip().startswith(
        first.output_text.strip().splitlines()[0])  # fmt: skip
    keys = {r["prompt_cache_key"] for r in lab.requests()
            if "in blue?" in str(r["messages"])}  # fmt: skip
    assert keys == {t1.conversation_id}
    store.close()


async def test_a_stateless_client_sends_the_thread_as_input_items(lab, tmp_path) -> None:
    lab.reset()
    store = Store.open(tmp_path / "log.db")
    async with serving(_factory(lab, store)) as (url, _):
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as c:
            first = await c.responses.create(
                model=MODEL, input=[{"role": "user", "content": "boots?"}], store=False)
            second = await c.responses.create(model=MODEL, store=False, input=[
                {"role": "user", "content": "boots?"},
                {"type": "message", "role": "assistant", "id": first.output[0].id,
                 "content": [{"type": "output_text", "text": first.output_text}]},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"role": "user", "content": "in size 40?"},
            ])  # fmt: skip
    assert second.status == "completed"
    turns = _turns(store)
    assert turns["boots?"].conversation_id == turns["in size 40?"].conversation_id
    assert turns["in size 40?"].turn_index == 2
    p1, p2 = _compose(lab, "boots?"), _compose(lab, "in size 40?")
    assert p2.startswith(p1)
    store.close()


@pytest.mark.parametrize(
    ("extra", "param", "status"),
    [
        ({"model": "gpt-4o"}, "model", 404),
        ({"input": []}, "input", 400),
        ({"input": [{"role": "system", "content": "x"}]}, "input", 400),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]},
         "input", 400),
        ({"tools": [{"type": "web_search"}]}, "tools", 400),
        ({"text": {"format": {"type": "json_object"}}}, "text", 400),
        ({"background": True}, "background", 400),
        ({"conversation": "conv_1"}, "conversation", 400),
        ({"stream": "yes"}, "stream", 400),
        ({"instructions": 7}, "instructions", 400),
        ({"previous_response_id": "resp_zz"}, "previous_response_id", 404),
        ({"prompt_cache_key": ""}, "prompt_cache_key", 400),
    ],
)  # fmt: skip
def test_responses_request_refusals(extra: dict, param: str, status: int) -> None:
    body = {"model": "m", "input": "hello", **extra}
    with pytest.raises(InvalidRequest) as e:
        parse_responses_request(body, "m")
    assert e.value.param == param and e.value.status == status


def test_harmless_values_and_ignored_parameters_are_taken() -> None:
    req = parse_responses_request({
        "model": "m", "input": "hello", "tools": [], "tool_choice": "auto",
        "text": {"format": {"type": "text"}, "verbosity": "low"}, "background": False,
        "temperature": 0.2, "max_output_tokens": 50, "store": False, "reasoning": {},
        "truncation": "auto", "include": [], "metadata": {"conversation_id": "c1"},
    }, "m")  # fmt: skip
    assert (req.asked.message, req.asked.conversation_id, req.stream) == ("hello", "c1", False)


def test_a_response_id_names_its_conversation() -> None:
    for cid in ("d" + "0" * 31, "a conversation · ünïcode"):
        rid = new_response_id(cid)
        assert rid.startswith("resp_") and conversation_of(rid) == cid
        assert new_response_id(cid) != rid
    assert conversation_of("resp_" + "0" * 32) is None
    assert conversation_of("chatcmpl-1") is None
