"""The answer step's stream through the hold-back engine, in the chain: a flagged phrase
split across a chunk boundary never reaches the consumer of the chain's events; the
exposure bound is reported per turn (output checks on the stream)."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest
from conftest import reply_by_step

from chainrun.chain import REFUSAL, Chain
from chainrun.config import config_from_dict
from chainrun.errors import ConfigError
from chainrun.events import StepFinished, TokenDelta, TurnFinished
from chainrun.lab import LabServer
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider, FakeReply

PROMO = [{"name": "promo", "regex": r"free\s+money", "action": "block"}]
#: "free " and "money" arrive as two chunks (the fake streams one word per chunk)
FLAGGED = "Our best offer this week is free money for every shopper who asks nicely today"


async def run(
    compose: str | FakeReply, check: dict[str, Any], order: list[str] | None = None
) -> tuple[TurnFinished, list[str], dict[str, StepFinished], FakeProvider, Store]:
    reply = compose if isinstance(compose, FakeReply) else FakeReply(compose, gap_s=0.002)
    # the pattern check's windows alone: the grounding check holds each sentence until
    # it is complete (tests/test_grounding.py), which would hide what the windows release
    cfg = config_from_dict({
        "order": order or ["compose"],
        "steps": {"compose": {"prompt": "{message}", "output_check": check,
                              "grounding": {"enabled": False}}},
    })  # fmt: skip
    fake = FakeProvider(name="local", script=reply_by_step({"compose": reply}))
    store = Store.open(":memory:")
    shown: list[str] = []
    finished: dict[str, StepFinished] = {}
    done: TurnFinished | None = None
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        async for ev in chain.stream_turn("any offers?"):
            if isinstance(ev, TokenDelta):
                shown.append(ev.text)
            elif isinstance(ev, StepFinished):
                finished[ev.step] = ev
            elif isinstance(ev, TurnFinished):
                done = ev
    assert done is not None
    return done, shown, finished, fake, store


@pytest.mark.parametrize("window", [2, 3, 8])
async def test_a_flagged_phrase_split_across_chunks_never_reaches_the_consumer(
    window: int,
) -> None:
    done, shown, finished, fake, store = await run(
        FLAGGED, {"window_tokens": window, "patterns": PROMO}
    )
    seen = "".join(shown)
    assert "money" not in seen  # no token of the phrase was shown...
    if window < 6:  # "free" is the 7th chunk: with small windows the text before it is shown
        assert seen.startswith("Our best")
    assert done.status == "refused" and done.output == REFUSAL
    check = done.verdicts["compose"]["output_check"]
    assert check["status"] == "blocked" and check["reason"] == "pattern: promo"
    assert check["released_before_block_tokens"] == len(seen.split())  # one word per chunk
    assert check["window_tokens"] == window
    # the stream was stopped: the rest of the answer was never generated
    assert fake.closed_early == 1 and fake.finished == 0
    assert finished["compose"].detail["output_check"]["status"] == "blocked"  # type: ignore[index]
    turn = store.turns(done.run_id or 0)[0]
    assert turn.status == "refused" and turn.verdicts["compose"]["output_check"]["checks"] >= 1
    store.close()


async def test_a_passing_answer_is_shown_whole_with_the_exposure_bound() -> None:
    # no price: this test is of the pattern check (an ungrounded price is the grounding
    # check's, tests/test_grounding.py)
    text = "Try the Storm Shell jacket today, it packs small and keeps the rain out well"
    done, shown, finished, _, store = await run(text, {"window_tokens": 4, "patterns": PROMO})
    assert done.status == "ok" and "".join(shown) == text == done.output
    doc = finished["compose"].detail["output_check"]  # type: ignore[index]
    assert doc["status"] == "passed" and doc["tokens_released"] == doc["tokens_in"] == 15
    assert doc["max_held_tokens"] >= 4
    figures = doc["exposure"]
    assert figures["window_tokens"] == 4 and figures["exposure_tokens"] == 0
    assert figures["added_delay_ms"] >= 1000 * 4 / doc["tokens_per_s"]
    steps = store.steps(done.run_id or 0)
    assert steps[0].detail["output_check"]["exposure"] == figures  # logged with the step
    store.close()


async def test_a_card_number_across_four_chunks_is_blocked_by_default() -> None:
    text = "Sure, I will charge 4111 1111 1111 1111 for the coat and ship it on Monday"
    done, shown, _, _, store = await run(text, {"window_tokens": 8})  # card = "block"
    assert "4111" not in "".join(shown)
    assert done.status == "refused"
    assert done.verdicts["compose"]["output_check"]["reason"] == "pattern: card"
    store.close()


async def test_redact_shows_the_name_instead_of_the_match() -> None:
    text = "Write to help@shop.example and we reply within a day or two at most"
    done, shown, _, _, store = await run(text, {"window_tokens": 3, "email": "redact"})
    assert done.status == "ok"
    assert "".join(shown) == done.output == text.replace("help@shop.example", "[email]")
    assert done.verdicts["compose"]["output_check"]["redactions"] == 1
    store.close()


async def test_the_reject_text_is_the_answer_of_a_blocked_turn() -> None:
    check = {"window_tokens": 4, "patterns": PROMO, "reject_text": "Let me find our offers."}
    done, _, _, _, store = await run(FLAGGED, check)
    assert done.status == "refused" and done.output == "Let me find our offers."
    store.close()


def test_only_the_answer_step_takes_an_output_check() -> None:
    """The answer step's, streamed or not (an unstreamed answer is checked whole:
    tests/test_answer_checks.py)."""
    with pytest.raises(ConfigError, match=r"steps\.validate\.output_check: only the answer"):
        config_from_dict({"steps": {"validate": {"output_check": {}}}})
    config_from_dict({"steps": {"compose": {"stream": False, "output_check": {}}}})
    with pytest.raises(ConfigError, match=r"window_tokens"):
        config_from_dict({"steps": {"compose": {"output_check": {"window_tokens": 0}}}})


async def test_lab_a_phrase_split_across_two_streamed_chunks_never_reaches_the_consumer() -> None:
    """On the latency lab over real HTTP: the lab streams one word per SSE chunk (its text
    is fixed by the request), so a pattern on two of its consecutive words is a phrase
    split across a chunk boundary. The consumer never sees it; the lab sees the disconnect
    before the answer's end."""
    with LabServer("fast", n_tokens=60, per_token_ms=30) as lab:
        base = {"order": ["compose"], "providers": {"local": {"base_url": lab.base_url}},
                "steps": {"compose": {"prompt": "{message}", "max_output_tokens": 60}}}  # fmt: skip
        async with Chain(config_from_dict(base), store=None) as chain:
            plain = (await chain.run_turn("what goes with linen?")).output or ""
        words = plain.split(" ")
        assert len(words) == 60
        regex = rf"\b{words[10]}\s+{words[11]}\b"
        check = {"window_tokens": 4, "patterns": [{"name": "phrase", "regex": regex}]}
        compose = {**base["steps"]["compose"], "output_check": check}  # type: ignore[index]
        lab.reset()
        shown: list[str] = []
        done: TurnFinished | None = None
        async with Chain(config_from_dict({**base, "steps": {"compose": compose}})) as chain:
            async for ev in chain.stream_turn("what goes with linen?"):
                if isinstance(ev, TokenDelta):
                    shown.append(ev.text)
                elif isinstance(ev, TurnFinished):
                    done = ev
        seen = "".join(shown)
        assert plain.startswith(seen) and re.search(regex, plain)
        assert re.search(regex, seen) is None  # never shown, though split over two chunks
        assert done is not None and done.status == "refused"
        assert done.verdicts["compose"]["output_check"]["reason"] == "pattern: phrase"
        deadline = time.monotonic() + 5
        records: list[Any] = []
        while time.monotonic() < deadline:
            records = lab.requests()
            if records and records[0]["disconnected"]:
                break
            await asyncio.sleep(0.05)
        assert len(records) == 1 and records[0]["disconnected"] and not records[0]["completed"]
