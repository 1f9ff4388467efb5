"""The default compose step stops where its one clause ends: at the end of its line (so
no invented "Customer:" or "Stylist:" line and no copied catalogue line follows), at the
end of its first sentence, at a colon (an invented quotation followed) or at an aside
in brackets; the facts come after it, from data."""

from __future__ import annotations

from conftest import reply_by_step

from chainrun.chain import Chain
from chainrun.config import DEFAULT_CHAIN
from chainrun.config.defaults import COMPOSE_STOP
from chainrun.providers.fake import FakeProvider, FakeReply

INVENTED = "Yes, the Storm Shell is light and dry\nCustomer: Where is my order?\nStylist: I"


def test_the_stop_list_ends_the_answer_at_its_line_sentence_colon_or_aside() -> None:
    stop = DEFAULT_CHAIN["steps"]["compose"]["stop"]
    assert stop == list(COMPOSE_STOP)
    assert "\n" in stop  # every other speaker's line starts on a new line
    assert ". " in stop and ":" in stop and " (" in stop
    # the OpenAI Chat Completions API takes at most four stop sequences
    assert len(stop) <= 4


async def test_an_answer_that_goes_on_as_another_speaker_is_cut_there(config, store) -> None:
    fake = FakeProvider(name="local", script=reply_by_step({"compose": FakeReply(INVENTED)}))
    async with Chain(config, store=store, providers={"local": fake}) as chain:
        done = await chain.run_turn("Do you have rain jackets?")
    compose = next(r for r in fake.requests if "Catalogue matches" in r.messages[-1]["content"])
    assert compose.stop == list(COMPOSE_STOP)
    assert done.status == "ok"
    assert done.output == "Yes, the Storm Shell is light and dry"
    call = next(c for c in store.calls(done.run_id) if c.step == "compose")
    assert call.output == done.output and call.finish_reason == "stop"
    assert call.stop == list(COMPOSE_STOP)
