"""A follow-up that points back ("Which of those is cheapest?", "Is it available in
navy?") searches among the products the earlier turn showed, on the shipped catalogue:
in price order or narrowed by colour, size or price as it asks; when those products are
not known (a client's own thread) it searches the earlier subject, with a clean query."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import reply_by_step

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.conversations.history import HistoryTurn
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider
from chainrun.replay.run import load_requests, run_requests
from chainrun.retrieval.followup import colours_named, points_back, standalone_query

ROOT = Path(__file__).resolve().parents[1]
CONVERSATIONS = ROOT / "replays" / "conversations.jsonl"


def _retrieve(store: Store, turn_id: int | None) -> dict[str, Any]:
    assert turn_id is not None
    logged = store.turn(turn_id)
    assert logged is not None
    (step,) = [s for s in logged.steps if s.step == "retrieve"]
    assert step.status == "ok"
    return step.detail or {}


def _ids(detail: dict[str, Any]) -> list[str]:
    return [item["id"] for item in detail["results"]]


def _chain(store: Store) -> Chain:
    fake = FakeProvider(name="local", script=reply_by_step())
    return Chain(config_from_dict({}), store=store, providers={"local": fake}, kind="live")


async def test_those_and_it_search_among_what_turn_one_showed(store: Store) -> None:
    async with _chain(store) as chain:
        one = await chain.run_turn("Do you have rain jackets?", conversation_id="c")
        two = await chain.run_turn("Which of those is cheapest?", conversation_id="c")
        navy = await chain.run_turn("Is it available in navy?", conversation_id="c")
    first, cheapest, in_navy = (_retrieve(store, t.turn_id) for t in (one, two, navy))
    shown = _ids(first)
    assert len(shown) >= 4 and all("Rain Jacket" in i["title"] for i in first["results"])
    assert one.products == tuple(shown)
    # "those": turn 1's products, cheapest first; nothing else of the category
    assert cheapest["within"] == shown and sorted(_ids(cheapest)) == sorted(shown)
    prices = [i["price"] for i in cheapest["results"]]
    assert prices == sorted(prices) and cheapest["price_order"] == "price_asc"
    assert not any("Poncho" in i["title"] or "Windbreaker" in i["title"]
                   for i in cheapest["results"])  # fmt: skip
    # a clean query: the subject and what the follow-up adds, no half sentence
    assert cheapest["standalone_query"] == "Do you have rain jackets? cheapest"
    assert cheapest["query"] == "Do you have rain jackets"
    # "it ... in navy": turn 2's products in navy, in the order turn 2 showed them
    assert in_navy["within"] == _ids(cheapest) and in_navy["colours"] == ["navy"]
    navy_ids = [i for i in _ids(cheapest)
                if any("navy" in c for c in next(r for r in cheapest["results"]
                                                 if r["id"] == i)["colours"])]  # fmt: skip
    assert _ids(in_navy) == navy_ids and navy_ids
    assert in_navy["price_order"] is None


async def test_the_products_are_found_again_from_the_log(tmp_path: Path) -> None:
    """A chain that has not seen the conversation reads what turn 1 showed from the log."""
    store = Store.open(tmp_path / "log.db")
    async with _chain(store) as chain:
        one = await chain.run_turn("Show me white leather sneakers for men.", conversation_id="s")
    async with _chain(store) as chain:
        two = await chain.run_turn("Do you have them in size 43?", conversation_id="s")
    first, sized = _retrieve(store, one.turn_id), _retrieve(store, two.turn_id)
    assert sized["within"] == _ids(first) and sized["filters"]["sizes"] == ["43"]
    assert set(_ids(sized)) <= set(_ids(first))
    assert all(i["sizes"].get("43", 0) > 0 for i in sized["results"])
    store.close()


async def test_without_the_earlier_products_the_subject_is_searched(store: Store) -> None:
    """A client's own thread (the OpenAI-compatible face) has no products: the earlier
    query, in price order."""
    history = [HistoryTurn("Do you have rain jackets?", "Yes, several.")]
    async with _chain(store) as chain:
        done = await chain.run_turn("Which of those is cheapest?", history=history)
    detail = _retrieve(store, done.turn_id)
    assert "within" not in detail and detail["price_order"] == "price_asc"
    assert detail["standalone_query"] == "Do you have rain jackets? cheapest"
    assert detail["query"] == "Do you have rain jackets"
    prices = [i["price"] for i in detail["results"]]
    assert prices == sorted(prices) and "jackets" in detail["filters"]["categories"]


async def test_the_conversation_replay_set_searches_among_earlier_results(store: Store) -> None:
    requests = load_requests(CONVERSATIONS)
    fake = FakeProvider(name="local", script=reply_by_step())
    run_id = await run_requests(config_from_dict({}), requests, store,
                                providers={"local": fake}, quiet=True)  # fmt: skip
    turns = {t.request_id: t for t in store.turns(run_id)}
    assert all(t.status == "ok" for t in turns.values())
    by_id = {r.id: r for r in requests}
    pointed = 0
    for rid, req in by_id.items():
        if req.turn is None or req.turn == 1 or not points_back(req.message):
            continue
        logged = store.turn(turns[rid].id)  # type: ignore[arg-type]
        assert logged is not None
        (retrieve,) = [s for s in logged.steps if s.step == "retrieve"]
        if retrieve.status == "skipped":  # a policy question ("Do they run small?")
            continue
        pointed += 1
        detail = retrieve.detail or {}
        earlier = _retrieve(store, turns[f"{req.conversation_id}-{req.turn - 1}"].id)
        assert detail["within"] == _ids(earlier), rid
        assert set(_ids(detail)) <= set(_ids(earlier)), rid
        if "cheapest" in req.message:
            prices = [i["price"] for i in detail["results"]]
            assert prices == sorted(prices) and len(prices) == len(_ids(earlier)), rid
        if "under 50" in req.message:
            assert all(i["price"] <= 50 for i in detail["results"]), rid
        if "navy" in req.message:
            assert all(any("navy" in c for c in i["colours"]) for i in detail["results"]), rid
    # rain-jackets 2 and 3, wedding-outfit 3, white-sneakers 2 and 3 ("How do I keep
    # them clean?": the sneakers shown), hiking-gift 3
    assert pointed == 6
    # "anything similar but cheaper" asks for other products: the catalogue is searched
    similar = _retrieve(store, turns["wool-coat-3"].id)
    assert "within" not in similar and similar["price_order"] == "price_asc"


@pytest.mark.parametrize(
    ("message", "back"),
    [
        ("Which of those is cheapest?", True),
        ("Is it available in navy?", True),
        ("Do you have them in size 43?", True),
        ("Which one is the cheapest?", True),
        ("Is there anything similar but cheaper?", False),  # other products
        ("Show me another one.", False),
        ("And boots?", False),  # a subject of its own
        ("Do you have rain jackets?", False),
    ],
)
def test_points_back(message: str, back: bool) -> None:
    assert points_back(message) is back


def test_a_follow_up_adds_only_what_it_asks_to_the_subject() -> None:
    assert standalone_query("Which of those is cheapest?", ["Do you have rain jackets?"]) == (
        "Do you have rain jackets? cheapest"
    )
    assert standalone_query("What about in size S?", ["Do you have a black wool coat?"]) == (
        "Do you have a black wool coat? in size S"
    )
    assert colours_named("Any in Gray or navy?") == ("grey", "navy")
