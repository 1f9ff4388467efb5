"""Prompt-cache affinity: a conversation's requests carry what keeps them on one cache.

Against the lab (a real HTTP server driven through the real ``openai`` client), which
records each request's ``prompt_cache_key`` and ``id_slot``: in mode ``key`` every
call of a conversation sends its conversation id (or the configured key); in mode
``slot`` the answer step of a conversation names one llama-server slot turn after
turn, and the checks after it name other slots. The history's layout makes a turn's
prompt begin with the previous turn's prompt and answer (what a prefix cache reuses).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from chainrun import Chain
from chainrun.config import config_from_dict
from chainrun.conversations.history import (
    HistorySettings,
    HistoryTurn,
    continuation,
    prose,
    render_history,
    turn_context,
)
from chainrun.lab import LabServer
from chainrun.log.store import Store
from chainrun.providers.affinity import SlotTable, resolve_mode
from chainrun.replay.run import ReplayRequest, run_requests


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    with LabServer("fast", n_tokens=4, per_token_ms=1, record_bodies=True) as lab:
        yield lab


def _config(lab: LabServer, **provider: Any) -> Any:
    return config_from_dict({
        "order": ["compose", "validate"], "answer_step": "compose",
        "providers": {"lab": {"base_url": lab.base_url, **provider}},
        "steps": {
            "compose": {"provider": "lab", "system": "You sell shoes.",
                        "prompt": "{history}Shopper: {message}\nStylist:", "stream": True},
            "validate": {"provider": "lab", "prompt": "Check: {message} {answer}",
                         "on_failure": "open"},
        },
    })  # fmt: skip


async def _conversations(cfg: Any, turns: list[tuple[str, str]]) -> None:
    async with Chain(cfg, quiet=True) as chain:
        for cid, message in turns:
            done = await chain.run_turn(message, conversation_id=cid)
            assert done.status == "ok", done


def _by_prompt(lab: LabServer, text: str) -> list[dict[str, Any]]:
    return [r for r in lab.requests() if text in str(r["messages"])]


def test_key_mode_sends_the_conversation_as_prompt_cache_key(lab: LabServer) -> None:
    lab.reset()
    asyncio.run(_conversations(_config(lab, prompt_cache="key"),
                               [("conv-a", "red shoes?"), ("conv-b", "blue boots?"),
                                ("conv-a", "in size 40?")]))  # fmt: skip
    keys = {r["prompt_cache_key"] for r in _by_prompt(lab, "red shoes?")}
    # conv-a's two turns (compose and validate each) and nothing of conv-b's
    assert keys == {"conv-a"}
    assert len(_by_prompt(lab, "red shoes?")) >= 3
    assert {r["prompt_cache_key"] for r in _by_prompt(lab, "blue boots?")} == {"conv-b"}
    assert all(r["id_slot"] is None for r in lab.requests())


def test_key_mode_sends_a_configured_key(lab: LabServer) -> None:
    lab.reset()
    asyncio.run(_conversations(_config(lab, prompt_cache="key", prompt_cache_key="shop-7"),
                               [("conv-c", "green hats?")]))  # fmt: skip
    assert {r["prompt_cache_key"] for r in lab.requests()} == {"shop-7"}


def test_auto_on_an_unknown_server_sends_nothing(lab: LabServer) -> None:
    lab.reset()
    asyncio.run(_conversations(_config(lab), [("conv-d", "socks?")]))
    assert lab.requests()
    assert all(r["prompt_cache_key"] is None and r["id_slot"] is None
               for r in lab.requests())  # fmt: skip


def test_slot_mode_keeps_each_conversations_answer_on_one_slot(lab: LabServer) -> None:
    lab.reset()
    turns = [("c1", "boots one?"), ("c2", "coats one?"), ("c3", "hats one?"),
             ("c1", "boots two?"), ("c2", "coats two?"), ("c3", "hats two?"),
             ("c1", "boots three?"), ("c3", "hats three?")]  # fmt: skip
    asyncio.run(_conversations(_config(lab, prompt_cache="slot", slots=4), turns))
    answer_slots: dict[str, set[int]] = {}
    check_slots: dict[str, set[int]] = {}
    for r in lab.requests():
        cid = next(c for c, m in turns if m in str(r["messages"]))  # the turn's own message
        text = str(r["messages"])
        assert r["id_slot"] is not None, r
        if "Stylist:" in text and "Check:" not in text:
            answer_slots.setdefault(cid, set()).add(r["id_slot"])
        else:
            check_slots.setdefault(cid, set()).add(r["id_slot"])
    # one slot per conversation's answer step, a different one for each conversation
    assert all(len(s) == 1 for s in answer_slots.values()), answer_slots
    kept = [next(iter(s)) for s in answer_slots.values()]
    assert len(set(kept)) == 3
    # the checks after the answer never went to their conversation's answer slot
    for cid, slots in check_slots.items():
        assert not slots & answer_slots[cid], (cid, slots, answer_slots[cid])


def test_slot_table_prefers_free_unkept_slots_and_gives_up_the_oldest() -> None:
    t = SlotTable(3)
    a = t.acquire("a", owner=True)
    t.release(a)  # type: ignore[arg-type]
    b = t.acquire("b", owner=True)
    c = t.acquire("c", owner=True)
    assert len({a, b, c}) == 3
    # every slot is now busy but a's: a check of b's goes there (not b's own)
    check = t.acquire("b", owner=False)
    assert check == a
    assert t.acquire("a", owner=True) is None  # all busy: the server places it
    for s in (b, c, check):
        t.release(s)  # type: ignore[arg-type]
    # a comes back to its slot; a new conversation takes the one kept longest ago (a's
    # was kept first, but a just took it again: b's is the oldest)
    assert t.acquire("a", owner=True) == a
    d = t.acquire("d", owner=True)
    assert d == b and t.keeper(b) == "d"  # type: ignore[arg-type]
    # a copy of a's answer while a's slot is busy goes elsewhere; a keeps its slot
    copy = t.acquire("a", owner=True)
    assert copy not in (a, d) and t.keeper(a) == "a"  # type: ignore[arg-type]


def test_resolve_mode() -> None:
    assert resolve_mode("auto", kind="openai", base_url=None) == "slot"
    assert resolve_mode("auto", kind="azure", base_url=None) == "key"
    assert resolve_mode("auto", kind="openai", base_url="https://api.openai.com/v1") == "key"
    assert resolve_mode("auto", kind="openai", base_url="http://127.0.0.1:8080/v1") == "off"
    assert resolve_mode("slot", kind="openai", base_url="http://127.0.0.1:8080/v1") == "slot"


def test_a_turns_prompt_begins_with_the_previous_prompt_and_answer() -> None:
    settings = HistorySettings()
    template = "{history}Matches: {products}\nShopper: {message}\nStylist:"
    first = template.format(history="", products="boots A", message="boots?")
    t1 = HistoryTurn("boots?", "We have boots A.", context=turn_context(first, template, ""))
    h2 = render_history([t1], settings)
    second = template.format(history=h2, products="boots A", message="in 40?")
    # the first prompt, then its answer, then this turn's sections: the first prompt is
    # the second's prefix
    assert second.startswith(first + " We have boots A.\n\n")
    t2 = HistoryTurn("in 40?", "Yes.", context=turn_context(second, template, h2))
    h3 = render_history([t1, t2], settings)
    assert h3.startswith(h2) and h3.endswith("Stylist: Yes.\n\n")
    # a template with the history elsewhere keeps the two-line transcript
    assert turn_context(first, "Matches: {history}", "") is None
    assert render_history([HistoryTurn("hi", "hello")], settings) == (
        "Shopper: hi\nStylist: hello\n\n"
    )


def test_an_answer_that_starts_with_its_prompts_lead_continues_it_once() -> None:
    settings = HistorySettings()
    template = "{history}Matches: {products}\nShopper: {message}\nStylist:"
    # the answer step wrote its lead at the end of the prompt and shows it again as the
    # answer's start: the history continues the prompt, the lead is not said twice
    first = template.format(history="", products="boots A", message="boots?")
    first += " Here are our boots"
    t1 = HistoryTurn("boots?", "Here are our boots in black.\n\n- Boots A",
                     context=turn_context(first, template, ""))  # fmt: skip
    h2 = render_history([t1], settings)
    assert h2 == first + " in black.\n- Boots A\n\n"
    assert continuation("x Stylist: Here are our boots", "Here are our boots!") == "!"
    # a short or part-word overlap is no lead: the answer is kept whole
    assert continuation("Stylist: Yes", "Yes, we do.") == "Yes, we do."
    assert continuation("Stylist: our boots", "boots are warm") == "boots are warm"
    assert continuation("Stylist: Here are our boots", "Here are our bootses") == (
        "Here are our bootses")


def test_the_facts_a_turns_prompt_already_held_are_not_shown_again() -> None:
    context = ("Shop policy, Returns:\nReturns: within 30 days of delivery.\n\n"
               "Catalogue matches:\n- [JKT-005] Rain Jacket (yellow) | jackets | €49.95\n\n"
               "Shopper: a jacket, and returns?\nStylist: Here are our rain jackets")  # fmt: skip
    answer = ("Here are our rain jackets in yellow.\n\n"
              "- Rain Jacket (yellow), JKT-005: €49.95; yellow; in stock in S.\n\n"
              "Returns: within 30 days of delivery.")  # fmt: skip
    # the product line (its id listed) and the policy line (word for word) are the
    # prompt's own: the history keeps what the model wrote
    assert prose(answer, context) == "Here are our rain jackets in yellow."
    text = render_history([HistoryTurn("a jacket, and returns?", answer, context=context)],
                          HistorySettings())  # fmt: skip
    assert text == context + " in yellow.\n\n"
    # a paragraph the prompt did not hold is the answer's own: kept, and all before it
    own = answer + "\n\nAsk me about sizes too."
    assert prose(own, context) == own
    assert prose("One.\n\n- Other Coat, COT-009: €9.00.", context) == (
        "One.\n\n- Other Coat, COT-009: €9.00.")
    # a follow-up's prompt lists the products an earlier turn showed by id ("as above"):
    # their lines are in the history already
    again = ("Catalogue matches:\n- as above: JKT-012, JKT-008\n\n"
             "Shopper: Which of those is cheapest?\nStylist: Here are our jackets")  # fmt: skip
    cheapest = ("Here are our jackets for men and women.\n\n"
                "- City Jacket (red), JKT-012: €44.95; red; in stock in S.\n"
                "- City Jacket (red), JKT-008: €44.95; red; in stock in M.")  # fmt: skip
    assert prose(cheapest, again) == "Here are our jackets for men and women."
    text = render_history([HistoryTurn("Which of those is cheapest?", cheapest, context=again)],
                          HistorySettings())  # fmt: skip
    assert text == again + " for men and women.\n\n"
    assert prose("One.\n\n- Other Coat, JKT-0120: €9.00.", again) == (
        "One.\n\n- Other Coat, JKT-0120: €9.00.")


def test_a_replayed_conversations_prompts_each_begin_with_the_previous_one(
    lab: LabServer, tmp_path: Any
) -> None:
    lab.reset()
    cfg = _config(lab)
    turns = [ReplayRequest(f"r{i}", m, conversation_id="cv", turn=i)
             for i, m in enumerate(["red shoes?", "in size 40?", "and in blue?"], start=1)]
    with Store.open(str(tmp_path / "log.db")) as store:
        asyncio.run(run_requests(cfg, turns, store, quiet=True))
    prompts = [r["messages"][-1]["content"] for r in lab.requests()
               if "Check:" not in str(r["messages"])]  # fmt: skip
    assert len(prompts) == 3
    for earlier, later in itertools.pairwise(prompts):
        assert later.startswith(earlier + " ")  # then its answer and this turn's text


def test_a_policy_section_the_history_shows_is_named_not_repeated() -> None:
    from chainrun.steps.policy import policy_again

    returns = "Shop policy, Returns:\nWithin 30 days.\n\n"
    sizing = "Shop policy, Sizes:\nTrue to size.\n\n"
    seen = "Shopper: can I return it?\n" + returns + "Stylist: yes.\n\n"
    assert policy_again(returns + sizing, seen) == "Shop policy, Returns: (as above)\n\n" + sizing
    assert policy_again(sizing, seen) == sizing


def test_products_the_history_shows_are_named_by_id_each_run_in_one_line() -> None:
    from chainrun.retrieval.products import ShownProduct, render_products, render_products_again

    a, b, c, d = (ShownProduct(id=f"JKT-00{i}", title=f"Jacket {i}", category="jackets",
                               price=40.0 + i, stock=3) for i in range(1, 5))  # fmt: skip
    seen = render_products([a, b, d])  # what an earlier turn showed
    again = render_products_again([b, a, c, d], seen)
    # the order kept: b and a in one line, c's line whole (new), then d by id
    assert again.splitlines() == [
        "- as above: JKT-002, JKT-001",
        render_products([c]),
        "- as above: JKT-004",
    ]
    assert render_products_again([c], seen) == render_products([c])
    assert render_products_again([], seen) == "(none)"
