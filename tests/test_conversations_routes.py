"""The default chain routes on the classify label: product questions search the
catalogue; order-status, returns and sizing questions answer from the shop's policy text
without a product search; a turn whose label is unknown searches. Its classify step
calls no model, so the route costs the answer no model call; a follow-up keeps the
label (and the search subject) of the turn it follows."""

from __future__ import annotations

import pytest
from conftest import reply_by_step

from chainrun.chain import Chain
from chainrun.config import LLM_CLASSIFY_STEP, POLICY_LABELS, config_from_dict
from chainrun.errors import ConfigError
from chainrun.events import TokenDelta
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider, FakeReply, failing


def _chain(
    store: Store, data: dict | None = None, **replies: FakeReply
) -> tuple[Chain, FakeProvider]:
    fake = FakeProvider(name="local", script=reply_by_step(replies))
    return Chain(config_from_dict(data or {}), store=store, providers={"local": fake}), fake


def _compose_prompt(fake: FakeProvider) -> str:
    (prompt,) = [r.messages[-1]["content"] for r in fake.requests
                 if "Catalogue matches" in r.messages[-1]["content"]]  # fmt: skip
    return prompt


async def _steps(store: Store, turn_id: int) -> dict:
    await store.flush()
    logged = store.turn(turn_id)
    assert logged is not None
    return {s.step: s for s in logged.steps}


def test_the_default_chain_is_routed_on_a_classify_step_that_calls_no_model() -> None:
    cfg = config_from_dict({})
    assert cfg.order == ["classify", "retrieve", "policy", "compose", "validate", "critique"]
    assert cfg.steps["classify"].kind == "classify"
    assert cfg.steps["classify"].method == "combined"
    assert cfg.steps["retrieve"].when == {"label": {"not": list(POLICY_LABELS)}}
    # "other" too: the policy's general section (care, customer service), beside its search
    assert cfg.steps["policy"].when == {"label": [*POLICY_LABELS, "other"]}
    assert "{policy}" in cfg.steps["compose"].prompt


@pytest.mark.parametrize(("message", "label"), [
    ("Can I return the linen trousers I bought?", "returns"),
    ("Where is my parcel? The order number is FS-10293.", "order_status"),
    ("Which size should I pick for the jersey wrap dress?", "sizing"),
])  # fmt: skip
async def test_policy_questions_answer_from_the_policy_without_a_search(
    store, message, label
) -> None:
    chain, fake = _chain(store)
    async with chain:
        done = await chain.run_turn(message)
    steps = await _steps(store, done.turn_id)
    assert done.status == "ok" and done.label == label
    assert steps["classify"].status == "ok" and steps["classify"].output == label
    assert steps["retrieve"].status == "skipped"
    assert steps["retrieve"].detail == {"skipped": f"when: label is '{label}', one of "
                                        "order_status, returns, sizing"}  # fmt: skip
    assert steps["policy"].status == "ok" and steps["policy"].output == label
    prompt = _compose_prompt(fake)
    assert "Shop policy, " in prompt and "Catalogue matches:\n(none)" in prompt
    # no model call before the answer's: compose is the first request the model saw
    assert "Catalogue matches" in fake.requests[0].messages[-1]["content"]


@pytest.mark.parametrize(("message", "label"), [
    ("Do you have rain jackets?", "product_search"),
    ("What should I wear with a rain jacket to a festival?", "styling"),
])  # fmt: skip
async def test_other_questions_search_the_catalogue(store, message, label) -> None:
    chain, fake = _chain(store)
    async with chain:
        done = await chain.run_turn(message)
    steps = await _steps(store, done.turn_id)
    assert done.status == "ok" and done.label == label
    # "other" also reads the policy's general section; no label reads no policy
    assert steps["retrieve"].status == "ok"
    assert steps["policy"].status == ("ok" if label == "other" else "skipped")
    prompt = _compose_prompt(fake)
    assert "Shop policy" not in prompt and "Catalogue matches:\n(none)" not in prompt
    assert "Rain Jacket" in prompt


async def test_an_ambiguous_message_gets_the_policy_text_and_the_products(store) -> None:
    """A message the classifier is not sure of (confidence below ``unsure_below``) is
    routed to each of its labels' steps: compose sees the policy text and the products."""
    message = "The ankle boots I got pinch, what now?"
    chain, fake = _chain(store)
    async with chain:
        done = await chain.run_turn(message)
    steps = await _steps(store, done.turn_id)
    detail = steps["classify"].detail
    assert done.status == "ok" and done.label == "sizing"
    assert detail["unsure"] and detail["confidence"] < 0.8
    assert detail["labels"][0] == "sizing" and "product_search" in detail["labels"]
    assert steps["retrieve"].status == "ok" and steps["policy"].status == "ok"
    prompt = _compose_prompt(fake)
    assert "Shop policy, Sizes and fit:" in prompt
    assert "Catalogue matches:\n(none)" not in prompt and "Boot" in prompt
    # the same message with every label sure: one route, as before
    chain, fake = _chain(store, {"steps": {"classify": {"unsure_below": 0.0}}})
    async with chain:
        done = await chain.run_turn(message)
    steps = await _steps(store, done.turn_id)
    assert steps["retrieve"].status == "skipped" and steps["policy"].status == "ok"
    assert "Catalogue matches:\n(none)" in _compose_prompt(fake)


async def test_an_unsure_label_the_conversations_subject_has_surely_is_taken_alone(
    store,
) -> None:
    """"Do I need to print a label?" alone is unsure (returns, with other and
    order_status as runners-up); after "Can I return them?" (returns, surely) the two
    agree and the turn gets the returns policy only: no search, no other sections."""
    chain, fake = _chain(store)
    question = "Do I need to print a label?"
    async with chain:
        alone = await chain.run_turn(question)
        await chain.run_turn("The linen trousers I bought are too short. Can I return them?",
                             conversation_id="t")  # fmt: skip
        after = await chain.run_turn(question, conversation_id="t")
        # after a sure turn of another label the runners-up stay
        await chain.run_turn("Where is my order?", conversation_id="o")
        other = await chain.run_turn(question, conversation_id="o")
    unsure = (await _steps(store, alone.turn_id))["classify"].detail
    assert unsure["unsure"] and unsure["labels"][0] == "returns" and len(unsure["labels"]) > 1
    steps = await _steps(store, after.turn_id)
    detail = steps["classify"].detail
    assert after.label == "returns" and detail["labels"] == ["returns"]
    assert detail["unsure"]  # the classifier's own confidence is kept as it was
    assert detail["corroborated_by"].endswith("Can I return them?")
    assert steps["retrieve"].status == "skipped" and steps["policy"].output == "returns"
    (prompt,) = [r.messages[-1]["content"] for r in fake.requests
                 if r.cache_key == "t" and r.messages[-1]["content"].endswith(
                     f"Shopper: {question}\nStylist:")]  # fmt: skip
    this_turn = prompt.rsplit("Can I return them?", 1)[1]  # after the earlier turn
    assert "Orders and delivery" not in this_turn and "Catalogue matches:\n(none)" in this_turn
    kept = (await _steps(store, other.turn_id))["classify"].detail
    assert kept["labels"] == unsure["labels"] and "corroborated_by" not in kept


@pytest.mark.parametrize(("classify", "label"), [
    (FakeReply("nonsense"), "other"), (failing("classify is down"), None)])  # fmt: skip
async def test_a_model_label_outside_the_routes_or_none_searches_the_catalogue(
    store, classify, label
) -> None:
    """Classified by the model instead (an llm classify step): an answer outside the
    label set is ``other``, a failed classify (fails open) leaves ``label`` unset; both
    search."""
    chain, fake = _chain(store, {"steps": {"classify": LLM_CLASSIFY_STEP}}, classify=classify)
    async with chain:
        done = await chain.run_turn("Do you have rain jackets?")
    steps = await _steps(store, done.turn_id)
    assert done.status == "ok" and done.label == label
    assert steps["classify"].kind == "llm"
    # "other" also reads the policy's general section; no label reads no policy
    assert steps["retrieve"].status == "ok"
    assert steps["policy"].status == ("ok" if label == "other" else "skipped")
    assert "Rain Jacket" in _compose_prompt(fake)


async def test_the_route_makes_no_model_call_before_the_answer(store) -> None:
    """What the answer waits for before it starts: classify (keyword rules, no model call),
    then retrieve; no model call precedes the answer's. (How long classify takes is
    measured by benchmarks/conversation_routes.py, not asserted here.)"""
    chain, fake = _chain(store)
    async with chain:
        done = await chain.run_turn("Do you have rain jackets?")
    steps = await _steps(store, done.turn_id)
    classify, retrieve = steps["classify"], steps["retrieve"]
    assert classify.kind == "classify" and classify.n_attempts == 0
    assert classify.detail is not None and classify.detail["decided_by"] == "keywords"
    assert classify.detail["labels"] == ["product_search"] and not classify.detail["unsure"]
    assert classify.started_offset_ms + classify.duration_ms <= retrieve.started_offset_ms + 1.0
    prompts = [r.messages[-1]["content"] for r in fake.requests]
    assert "Catalogue matches" in prompts[0] and len(prompts) == 3  # compose, validate, critique


async def test_a_follow_up_keeps_the_route_and_searches_the_subject_cheapest_first(
    store,
) -> None:
    chain, _ = _chain(store)
    async with chain:
        first = await chain.run_turn("Do you have rain jackets?", conversation_id="c")
        done = await chain.run_turn("Which of those is cheapest?", conversation_id="c")
        navy = await chain.run_turn("Is it available in navy?", conversation_id="c")
    assert first.label == done.label == navy.label == "product_search"
    retrieve = (await _steps(store, done.turn_id))["retrieve"]
    assert retrieve.status == "ok"
    detail = retrieve.detail or {}
    assert detail["standalone_query"] == "Do you have rain jackets? cheapest"
    assert detail["within"] == [i["id"] for i in (await _steps(store, first.turn_id))[
        "retrieve"].detail["results"]]  # "those": turn 1's products
    assert detail["price_order"] == "price_asc"
    prices = [item["price"] for item in detail["results"]]
    assert prices == sorted(prices) and len(prices) >= 4
    assert all("JKT" in item["id"] or "COT" in item["id"] for item in detail["results"])
    # "Is it available in navy?" fires no rule and names no subject: the label of the
    # turn it follows ("cheapest" fires a product-search rule on its own)
    steps = await _steps(store, navy.turn_id)
    assert steps["classify"].detail["decided_by"] == "follow_up"
    assert steps["classify"].detail["follows"] == "Which of those is cheapest?"
    assert steps["retrieve"].status == "ok" and steps["policy"].status == "skipped"


async def test_a_follow_up_to_a_policy_question_stays_on_the_policy_route(store) -> None:
    chain, _ = _chain(store)
    async with chain:
        await chain.run_turn("Where is my order FS-10293?", conversation_id="o")
        done = await chain.run_turn("Is it there yet?", conversation_id="o")
        alone = await chain.run_turn("Is it there yet?")
    assert done.label == "order_status"
    steps = await _steps(store, done.turn_id)
    assert steps["retrieve"].status == "skipped" and steps["policy"].status == "ok"
    # the same words on a conversation's first turn are classified alone
    alone_steps = await _steps(store, alone.turn_id)
    assert alone_steps["classify"].detail["decided_by"] != "follow_up"


async def test_follow_ups_off_classifies_each_message_alone(store) -> None:
    chain, _ = _chain(store, {"steps": {"classify": {"follow_ups": False}}})
    async with chain:
        await chain.run_turn("Where is my order FS-10293?", conversation_id="o")
        done = await chain.run_turn("Is it there yet?", conversation_id="o")
    steps = await _steps(store, done.turn_id)
    assert steps["classify"].detail["decided_by"] != "follow_up"


def test_policy_step_settings_are_checked(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"policy.*reasoning_effort"):
        config_from_dict({"steps": {"policy": {"reasoning_effort": "low"}}})
    cfg = config_from_dict({"steps": {"policy": {"file": str(tmp_path / "x.toml")}}})
    with pytest.raises(ConfigError, match=r"x\.toml: cannot read policy file"):
        Chain(cfg)


def test_the_default_chain_searches_a_follow_up_with_its_subject() -> None:
    cfg = config_from_dict({})
    assert cfg.steps["retrieve"].follow_ups and "{history}" in cfg.steps["compose"].prompt
    assert cfg.steps["classify"].follow_ups


async def test_the_answer_prompt_holds_the_two_policy_lines_nearest_the_message(store) -> None:
    """The default policy step keeps, of the returns section, its title and the two lines
    nearest the message (in the section's order), not the section's five; a step with
    ``lines`` unset keeps the whole section."""
    from chainrun.shop_policy import load_policy

    returns = load_policy()["returns"]
    exchanges = next(line for line in returns.lines if line.startswith("Exchanges"))
    message = "Can I exchange a dress I bought online for a different size in a store?"
    chain, fake = _chain(store)
    async with chain:
        done = await chain.run_turn(message)
    assert done.label == "returns"
    prompt = _compose_prompt(fake)
    kept = [line for line in returns.lines if line in prompt]
    assert len(kept) == 2 and exchanges in kept
    assert kept == [line for line in returns.lines if line in kept]  # the section's order
    assert "Shop policy, Returns, refunds and exchanges:\n" + "\n".join(kept) in prompt
    steps = await _steps(store, done.turn_id)
    assert steps["policy"].detail["lines"] == 2

    chain, fake = _chain(store, {"steps": {"policy": {"lines": None}}})
    async with chain:
        await chain.run_turn(message)
    assert all(line in _compose_prompt(fake) for line in returns.lines)


@pytest.mark.facts
async def test_a_check_that_drops_the_models_words_leaves_the_lead_a_sentence(store) -> None:
    """The model's words after the lead claimed a sale the policy does not hold: the
    grounding check drops them and writes its own text, cut to one sentence by the
    answer's sentence limit; the lead ends as a sentence before it (it ran on:
    "Here are our rain jackets I could not confirm ...")."""
    chain, _ = _chain(store, compose=FakeReply(" that are on sale for half price today.",
                                               ttft_s=0.005, gap_s=0.001))
    async with chain:
        shown = "".join([ev.text async for ev in chain.stream_turn("Do you have rain jackets?")
                         if isinstance(ev, TokenDelta)])  # fmt: skip
    first = shown.split("\n\n")[0]
    assert first == ("Here are our rain jackets. I could not confirm the details of that "
                     "answer against our catalogue."), first
