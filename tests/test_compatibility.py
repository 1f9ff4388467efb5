"""Compatibility with the real client libraries shops use, through ``chainrun serve``.

Each client installed on this machine is run against the serve app on loopback (the
latency lab as the model server, a real HTTP server in a subprocess): streamed and not,
its usage, an error, a cancel and a two-turn chat with its prompt-cache state, on the
Chat Completions face and the Responses face. The tests install no client: a case runs
with what the test environment has (today openai-python).

The client section of ``docs/reference/compatibility.md`` is made from this module
(:func:`section`): the last test fails while the committed section differs;
``CHAINRUN_WRITE_COMPATIBILITY=1`` makes it write the section instead.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from serve_helpers import serving

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.lab import LabServer
from chainrun.log.store import Store

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "compatibility.md"
MODEL = "chainrun-shop"


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    """Answers in a few ms; records each request's messages and prompt_cache_key."""
    with LabServer("fast", n_tokens=6, per_token_ms=1, record_bodies=True) as lab:
        yield lab


@pytest.fixture(scope="module")
def slow_lab() -> Iterator[LabServer]:
    """40 tokens 25 ms apart: long enough to leave mid-answer."""
    with LabServer("fast", n_tokens=40, per_token_ms=25) as lab:
        yield lab


class Served:
    """One case's server: its base URL, its log and the lab behind it."""

    def __init__(self, url: str, store: Store, lab: LabServer) -> None:
        self.url, self.store, self.lab = url, store, lab
        self.client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)

    def turns(self) -> list[Any]:
        return self.store.turns([r.id for r in self.store.runs_of_kind("live")])

    async def logged(self, n: int) -> list[Any]:
        """The log's turns once ``n`` are there (a streamed turn is logged after its end)."""
        for _ in range(300):
            turns = self.turns()
            if len(turns) >= n:
                return turns
            await asyncio.sleep(0.02)
        raise AssertionError(f"expected {n} logged turns")


Case = Callable[[Served], Awaitable[None]]
#: (client, API, what is tried) -> the case
CASES: dict[tuple[str, str, str], Case] = {}


def case(client: str, api: str, what: str) -> Callable[[Case], Case]:
    def register(fn: Case) -> Case:
        CASES[(client, api, what)] = fn
        return fn
    return register


USER = [{"role": "user", "content": "a rain jacket?"}]


@case("openai-python", "Chat Completions", "not streamed, usage")
async def _chat_whole(s: Served) -> None:
    done = await s.client.chat.completions.create(model=MODEL, messages=USER)  # type: ignore[arg-type]
    assert done.choices[0].message.content and done.choices[0].finish_reason == "stop"
    assert done.usage is not None and done.usage.prompt_tokens > 0
    assert done.usage.completion_tokens > 0


@case("openai-python", "Chat Completions", "streamed, usage")
async def _chat_stream(s: Served) -> None:
    stream = await s.client.chat.completions.create(
        model=MODEL, messages=USER, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True})  # fmt: skip
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0


@case("openai-python", "Chat Completions", "an error (unknown model)")
async def _chat_error(s: Served) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        await s.client.chat.completions.create(model="gpt-4o", messages=USER)  # type: ignore[arg-type]
    assert e.value.code == "model_not_found"


@case("openai-python", "Chat Completions", "a cancel (the stream closed mid-answer)")
async def _chat_cancel(s: Served) -> None:
    stream = await s.client.chat.completions.create(model=MODEL, messages=USER,  # type: ignore[arg-type]
                                                    stream=True)  # fmt: skip
    async for c in stream:
        if c.choices and c.choices[0].delta.content:
            break
    await stream.close()
    (turn,) = await s.logged(1)
    assert turn.status == "cancelled"


@case("openai-python", "Chat Completions", "two turns, one prompt cache")
async def _chat_two_turns(s: Served) -> None:
    thread: list[dict[str, str]] = [*USER]
    done = await s.client.chat.completions.create(model=MODEL, messages=thread)  # type: ignore[arg-type]
    thread += [{"role": "assistant", "content": done.choices[0].message.content or ""},
               {"role": "user", "content": "in blue?"}]  # fmt: skip
    await s.client.chat.completions.create(model=MODEL, messages=thread)  # type: ignore[arg-type]
    keys = {r["prompt_cache_key"] for r in s.lab.requests()}
    assert len(keys) == 1 and None not in keys
    t1, t2 = await s.logged(2)
    assert t1.conversation_id == t2.conversation_id and t2.turn_index == 2


@case("openai-python", "Responses", "not streamed, usage")
async def _responses_whole(s: Served) -> None:
    done = await s.client.responses.create(model=MODEL, input="a rain jacket?")
    assert done.status == "completed" and done.output_text
    assert done.usage is not None and done.usage.input_tokens > 0
    assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens


@case("openai-python", "Responses", "streamed, usage")
async def _responses_stream(s: Served) -> None:
    stream = await s.client.responses.create(model=MODEL, input="a rain jacket?", stream=True)
    events = [e async for e in stream]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and events[-1].type == "response.completed"
    assert events[-1].response.output_text == text
    assert events[-1].response.usage is not None
    assert events[-1].response.usage.input_tokens > 0


@case("openai-python", "Responses", "an error (unknown previous_response_id)")
async def _responses_error(s: Served) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        await s.client.responses.create(model=MODEL, input="x", previous_response_id="resp_x")
    assert e.value.code == "previous_response_not_found"


@case("openai-python", "Responses", "a cancel (the stream closed mid-answer)")
async def _responses_cancel(s: Served) -> None:
    stream = await s.client.responses.create(model=MODEL, input="a rain jacket?", stream=True)
    async for e in stream:
        if e.type == "response.output_text.delta":
            break
    await stream.close()
    (turn,) = await s.logged(1)
    assert turn.status == "cancelled"


@case("openai-python", "Responses", "two turns (previous_response_id), one prompt cache")
async def _responses_two_turns(s: Served) -> None:
    first = await s.client.responses.create(model=MODEL, input="a rain jacket?")
    await s.client.responses.create(model=MODEL, input="in blue?", previous_response_id=first.id)
    keys = {r["prompt_cache_key"] for r in s.lab.requests()}
    assert len(keys) == 1 and None not in keys
    t1, t2 = await s.logged(2)
    assert t1.conversation_id == t2.conversation_id and t2.turn_index == 2


@pytest.mark.parametrize("key", list(CASES), ids=[" / ".join(k) for k in CASES])
async def test_client(key: tuple[str, str, str], lab, slow_lab, tmp_path) -> None:
    cancel = key[2].startswith("a cancel")
    used = slow_lab if cancel else lab
    used.reset()
    # a cancel needs the answer token by token (the grounding check releases sentences)
    steps = {"compose": {"grounding": {"enabled": False}}} if cancel else {}
    cfg = config_from_dict({"providers": {"local": {"base_url": used.base_url,
                                                    "prompt_cache": "key"}},
                            "steps": steps})  # fmt: skip
    store = Store.open(tmp_path / "log.db")
    async with serving(lambda: Chain(cfg, store=store, kind="live", quiet=True)) as (url, _):
        served = Served(url, store, used)
        async with served.client:
            await CASES[key](served)
    store.close()


START, END = "<!-- clients: generated -->\n", "\n<!-- end of clients -->"


def section() -> str:
    """The client section of ``docs/reference/compatibility.md`` as this module makes it
    (between :data:`START` and :data:`END`)."""
    lines = [
        "| client | API | tried |",
        "|---|---|---|",
    ]
    for client, api, what in CASES:
        lines.append(f"| {client} | {api} | {what} |")
    return "\n".join(lines)


def test_the_compatibility_page_is_current() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert START in text and END in text, f"{PAGE} has no client section"
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    made = head + START + section() + END + tail
    if os.environ.get("CHAINRUN_WRITE_COMPATIBILITY") == "1":
        PAGE.write_text(made, encoding="utf-8")
        return
    assert text == made, (
        "run: CHAINRUN_WRITE_COMPATIBILITY=1 python -m pytest tests/test_compatibility.py")
