"""The sentence limit (chainrun.checks.sentences): the model's part of a facts answer
ends after its sentence, "!" and "?" included, on the stream."""

from __future__ import annotations

import pytest
from conftest import reply_by_step

from chainrun.chain import Chain
from chainrun.checks.sentences import SentenceLimit
from chainrun.checks.stream import apply_redactions
from chainrun.config import config_from_dict
from chainrun.events import TurnFinished
from chainrun.providers.fake import FakeProvider, FakeReply

pytestmark = pytest.mark.facts  # the default chain as it ships: with its answer's facts


async def test_the_text_after_the_first_sentence_is_dropped_and_the_stream_stopped() -> None:
    check = SentenceLimit(1)
    text = " for your commute! They are made of gold."
    verdict = await check.check(text, final=False)
    assert verdict.ok and verdict.stop
    assert apply_redactions(text, verdict.redactions) == " for your commute!"
    assert check.finish(None) == {"max_sentences": 1, "dropped_chars": 23}  # type: ignore[arg-type]


async def test_a_sentence_still_open_passes_and_one_begun_after_a_released_end_is_cut() -> None:
    check = SentenceLimit(1)
    assert not (await check.check(" for you", final=False)).stop
    check.released(" for you!")
    verdict = await check.check(" They are", final=False)
    assert verdict.stop and apply_redactions(" They are", verdict.redactions) == ""


async def test_prices_and_two_allowed_sentences_are_no_end() -> None:
    check = SentenceLimit(2)
    assert not (await check.check(" at €44.95 each. Light and dry", final=True)).stop
    assert check.finish(None) is None  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_sentences"):
        SentenceLimit(0)


async def test_the_default_answer_keeps_the_models_first_sentence(store) -> None:
    fake = FakeProvider(name="local", script=reply_by_step({"compose": FakeReply(
        "for your commute! I'm looking to buy 2 more of these.", ttft_s=0.001)}))
    async with Chain(config_from_dict({}), store=store, providers={"local": fake},
                     quiet=True) as chain:  # fmt: skip
        done = await chain.run_turn("a waterproof rain jacket under 100?")
    assert isinstance(done, TurnFinished)
    assert done.output.startswith("Here are our waterproof rain jackets for your commute!\n\n- ")
    assert "looking to buy" not in done.output
    row = next(s for s in store.steps(done.run_id) if s.step == "compose")
    assert row.detail["checks"][-1] == "sentences"
