"""The chain routed on the classify label (``chainrun.config.ROUTED_CHAIN``): product
questions search the catalogue; order-status, returns and sizing questions answer from
the shop's policy text without a product search; a turn whose label is unknown searches."""

from __future__ import annotations

import pytest
from conftest import reply_by_step

from chainrun.chain import Chain
from chainrun.config import ROUTED_CHAIN, config_from_dict
from chainrun.errors import ConfigError
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider, FakeReply, failing


def _chain(store: Store, classify: FakeReply) -> tuple[Chain, FakeProvider]:
    fake = FakeProvider(name="local", script=reply_by_step({"classify": classify}))
    return Chain(config_from_dict(ROUTED_CHAIN), store=store, providers={"local": fake}), fake


def _compose_prompt(fake: FakeProvider) -> str:
    (prompt,) = [r.messages[-1]["content"] for r in fake.requests
                 if "Catalogue matches" in r.messages[-1]["content"]]  # fmt: skip
    return prompt


async def _steps(store: Store, turn_id: int) -> dict:
    await store.flush()
    logged = store.turn(turn_id)
    assert logged is not None
    return {s.step: s for s in logged.steps}


@pytest.mark.parametrize("label", ["returns", "order_status", "sizing"])
async def test_policy_questions_answer_from_the_policy_without_a_search(store, label) -> None:
    chain, fake = _chain(store, FakeReply(label))
    async with chain:
        done = await chain.run_turn("The boots are too big, can I send them back?")
    steps = await _steps(store, done.turn_id)
    assert done.status == "ok" and done.label == label
    assert steps["retrieve"].status == "skipped"
    assert steps["retrieve"].detail == {"skipped": f"when: label is '{label}', one of "
                                        "order_status, returns, sizing"}  # fmt: skip
    assert steps["policy"].status == "ok" and steps["policy"].output == label
    prompt = _compose_prompt(fake)
    assert "Shop policy, " in prompt and "Catalogue matches:\n(none)" in prompt


@pytest.mark.parametrize("classify", [FakeReply("product_search"), FakeReply("styling"),
                                      FakeReply("nonsense"), failing("classify is down")])
async def test_other_questions_search_the_catalogue(store, classify) -> None:
    chain, fake = _chain(store, classify)
    async with chain:
        done = await chain.run_turn("Do you have rain jackets?")
    steps = await _steps(store, done.turn_id)
    assert done.status == "ok"
    assert steps["retrieve"].status == "ok" and steps["policy"].status == "skipped"
    prompt = _compose_prompt(fake)
    assert "Shop policy" not in prompt and "Catalogue matches:\n(none)" not in prompt
    assert "Rain Jacket" in prompt


async def test_a_follow_up_searches_the_subject_it_follows_cheapest_first(store) -> None:
    chain, _ = _chain(store, FakeReply("product_search"))
    async with chain:
        await chain.run_turn("Do you have rain jackets?", conversation_id="c")
        done = await chain.run_turn("Which of those is cheapest?", conversation_id="c")
    retrieve = (await _steps(store, done.turn_id))["retrieve"]
    detail = retrieve.detail or {}
    assert detail["standalone_query"] == "Do you have rain jackets? Which of those is cheapest?"
    assert detail["price_order"] == "price_asc"
    prices = [item["price"] for item in detail["results"]]
    assert prices == sorted(prices) and len(prices) >= 4
    assert all("JKT" in item["id"] or "COT" in item["id"] for item in detail["results"])


def test_policy_step_settings_are_checked(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"policy.*reasoning_effort"):
        config_from_dict({"order": ROUTED_CHAIN["order"],
                          "steps": {"policy": {"kind": "policy", "reasoning_effort": "low"}}})
    cfg = config_from_dict({"order": ROUTED_CHAIN["order"], "steps": {
        **ROUTED_CHAIN["steps"], "policy": {"kind": "policy", "file": str(tmp_path / "x.toml")}}})
    with pytest.raises(ConfigError, match=r"x\.toml: cannot read policy file"):
        Chain(cfg)


def test_the_default_chain_searches_a_follow_up_with_its_subject() -> None:
    cfg = config_from_dict({})
    assert cfg.steps["retrieve"].follow_ups and "{history}" in cfg.steps["compose"].prompt
