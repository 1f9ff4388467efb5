"""A reasoning model's thought inside ``content`` (MiniMax; llama-server with
``reasoning_format: none``) is moved out of the answer: logged as reasoning, kept from
the shopper's stream, the answer and the next turn's history; stops apply to the answer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomli_w
from cli_runner import chainrun
from serve_helpers import chat, serving

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.events import TokenDelta
from chainrun.lab import LabServer
from chainrun.lab.scenarios import Scenario, WireFrame
from chainrun.log.store import Store
from chainrun.providers.think import ThinkSplitter
from chainrun.timing import make_chunk


def _feed(splitter: ThinkSplitter, *pieces: str) -> tuple[str, str, str | None]:
    reasoning, content, finish = [], [], None
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        out = splitter.apply(make_chunk(piece, None, None, "stop" if last else None, None,
                                        None, None, None, 0))  # fmt: skip
        reasoning.append(out.reasoning or "")
        content.append(out.content or "")
        finish = out.finish_reason
        if splitter.stopped:
            break
    return "".join(reasoning), "".join(content), finish


def test_auto_splits_a_leading_think_even_when_its_tags_are_cut_across_chunks() -> None:
    got = _feed(ThinkSplitter("auto"), "  <thi", "nk>The shopper wants", " a jacket.</th",
                "ink>\n\nThe Storm Shell", " jacket.")  # fmt: skip
    assert got == ("The shopper wants a jacket.", "The Storm Shell jacket.", "stop")


def test_auto_leaves_an_answer_without_a_thought_alone() -> None:
    splitter = ThinkSplitter("auto")
    assert _feed(splitter, "<b>Storm", " Shell</b> at €89") == ("", "<b>Storm Shell</b> at €89",
                                                                 "stop")  # fmt: skip
    assert not splitter.found


def test_think_tags_reads_a_lone_closing_tag_and_applies_stops_to_the_answer_only() -> None:
    """llama-server with ``reasoning_format: none``: the opener is missing; the default
    compose stop ``"\\n\\n"`` inside the thought must not end the answer."""
    splitter = ThinkSplitter("think_tags", stops=["\n\n"])
    got = _feed(splitter, "First, the budget.\n\nThen", " colour.</think>\n\nTry the", " Storm",
                " Shell.\n\nAlso a hat", " nobody asked for")  # fmt: skip
    assert got == ("First, the budget.\n\nThen colour.", "Try the Storm Shell.", "stop")
    assert splitter.stopped


def _frames(*contents: str) -> list[WireFrame]:
    head = {"id": "chatcmpl-m1", "object": "chat.completion.chunk", "created": 1733040000,
            "model": "minimax-m2"}  # fmt: skip

    def frame(**fields: Any) -> WireFrame:
        return WireFrame(after_ms=5, data=f"data: {json.dumps({**head, **fields})}\n\n")

    return [
        frame(choices=[{"index": 0, "delta": {"role": "assistant", "content": None},
                        "finish_reason": None}]),
        *(frame(choices=[{"index": 0, "delta": {"content": c}, "finish_reason": None}])
          for c in contents),
        frame(choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]),
        frame(choices=[], usage={"prompt_tokens": 30, "completion_tokens": 12}),
        WireFrame(data="data: [DONE]\n\n"),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def thinking_lab() -> Iterator[LabServer]:
    """A server that thinks in content, MiniMax-style (the real ``openai`` client reads it)."""
    frames = _frames("<think>Budget under", " 100, rain.</think>", "\n\nThe Storm",
                     " Shell jacket.")  # fmt: skip
    with LabServer(Scenario(name="think", wire=frames)) as lab:
        yield lab


@pytest.mark.parametrize("mode", ["auto", "think_tags"])
async def test_through_the_chain_the_thought_is_reasoning_not_the_answer(
    thinking_lab: LabServer, mode: str
) -> None:
    cfg = config_from_dict({
        "order": ["compose"],
        "providers": {"local": {"base_url": thinking_lab.base_url,
                                "reasoning_in_content": mode}},
        "steps": {"compose": {"prompt": "{message}", "stream": True}},
    })  # fmt: skip
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store) as chain:
            shown = [ev.text async for ev in chain.stream_turn("a rain jacket?")
                     if isinstance(ev, TokenDelta)]  # fmt: skip
            turn_id = store.turns(store.latest_run_id() or 0)[-1].id
            logged = store.turn(turn_id)
    assert "".join(shown) == "The Storm Shell jacket."
    assert logged is not None and logged.turn.output == "The Storm Shell jacket."
    (call,) = [c for c in logged.calls if c.step == "compose"]
    assert call.reasoning == "Budget under 100, rain."  # logged as reasoning
    assert call.ttft_ms is not None  # the thought's first token: a reasoning token


async def test_off_keeps_content_as_the_server_sent_it(thinking_lab: LabServer) -> None:
    cfg = config_from_dict({
        "order": ["compose"],
        "providers": {"local": {"base_url": thinking_lab.base_url, "reasoning_in_content": "off"}},
        "steps": {"compose": {"prompt": "{message}", "stream": True}},
    })  # fmt: skip
    with Store.open(":memory:") as store:
        async with Chain(cfg, store=store) as chain:
            done = await chain.run_turn("a rain jacket?")
    assert done.output is not None and done.output.startswith("<think>")


def test_through_replay_and_serve_the_shopper_never_sees_the_thought(
    thinking_lab: LabServer, tmp_path: Path
) -> None:
    """The same server through ``chainrun replay`` (the logged answer) and ``chainrun
    serve``'s ``/chat`` (the token events the shopper's client receives)."""
    cfg = {"order": ["compose"], "answer_step": "compose",
           "providers": {"local": {"base_url": thinking_lab.base_url}},
           "steps": {"compose": {"prompt": "{message}", "stream": True}}}  # fmt: skip
    path = tmp_path / "chainrun.toml"
    path.write_text(tomli_w.dumps(cfg))
    requests = tmp_path / "r.jsonl"
    requests.write_text(json.dumps({"id": "r1", "message": "a rain jacket?"}) + "\n")
    db = tmp_path / "log.db"
    assert chainrun("replay", str(requests), "--config", str(path), "--db", str(db)).returncode == 0
    with Store.open(db, create=False) as store:
        (turn,) = store.turns(1)
    assert turn.output == "The Storm Shell jacket."

    async def served() -> list[tuple[str, Any]]:
        store = Store.open(tmp_path / "serve.db")
        try:
            chain_cfg = config_from_dict(cfg)
            async with (
                serving(lambda: Chain(chain_cfg, store=store, kind="live", quiet=True)) as (url, _),
                httpx.AsyncClient(base_url=url, timeout=30) as client,
            ):
                return await chat(client, "a rain jacket?")
        finally:
            store.close()

    events = asyncio.run(served())
    shown = "".join(d["text"] for e, d in events if e == "token")
    assert shown == "The Storm Shell jacket." and "think" not in shown
