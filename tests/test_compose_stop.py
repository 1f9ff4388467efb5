"""The default compose step stops where its answer's turn ends: at a blank line or at a
line that starts another speaker's turn (a small pre-trained model goes on with
invented "Customer:" and "Stylist:" lines otherwise)."""

from __future__ import annotations

import re

from conftest import reply_by_step

from chainrun.chain import Chain
from chainrun.config import DEFAULT_CHAIN
from chainrun.config.defaults import COMPOSE_STOP
from chainrun.conversations.history import HistorySettings, HistoryTurn, render_history
from chainrun.providers.fake import FakeProvider, FakeReply

INVENTED = "Yes: the Storm Shell, light and dry.\nCustomer: Where is my order?\nStylist: I"


def test_the_stop_list_names_every_speaker_of_the_default_prompts() -> None:
    stop = DEFAULT_CHAIN["steps"]["compose"]["stop"]
    assert stop == list(COMPOSE_STOP)
    # the speakers the default compose prompt and the history transcript write
    prompt = DEFAULT_CHAIN["steps"]["compose"]["prompt"]
    history = render_history([HistoryTurn("Rain jackets?", "Yes.")], HistorySettings())
    speakers = set(re.findall(r"^(\w[\w ]*):", prompt + "\n" + history, re.M))
    assert speakers == {"Shopper", "Stylist"}
    for name in speakers | {"Customer"}:  # "Customer": seen from the embedded model
        assert f"\n{name}:" in stop
    assert "\n\n" in stop
    # the OpenAI Chat Completions API takes at most four stop sequences
    assert len(stop) <= 4


async def test_an_answer_that_goes_on_as_another_speaker_is_cut_there(config, store) -> None:
    fake = FakeProvider(name="local", script=reply_by_step({"compose": FakeReply(INVENTED)}))
    async with Chain(config, store=store, providers={"local": fake}) as chain:
        done = await chain.run_turn("Do you have rain jackets?")
    compose = next(r for r in fake.requests if "Catalogue matches" in r.messages[-1]["content"])
    assert compose.stop == list(COMPOSE_STOP)
    assert done.status == "ok"
    assert done.output == "Yes: the Storm Shell, light and dry."
    call = next(c for c in store.calls(done.run_id) if c.step == "compose")
    assert call.output == done.output and call.finish_reason == "stop"
    assert call.stop == list(COMPOSE_STOP)
