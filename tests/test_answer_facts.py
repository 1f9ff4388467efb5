"""Facts from data, prose from the model: the answer step's ``facts``, the marks of a usable
answer (``names-product``, ``no-repeat``, ``whole-sentences``, the ``prose`` step) and a
replay set's expectations, down to the mutation that must fail them."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import pytest
from conftest import reply_by_step
from typer.testing import CliRunner

from chainrun.chain import Chain
from chainrun.cli import app
from chainrun.config import config_from_dict
from chainrun.evals.assertions import TurnView, parse_assertion
from chainrun.evals.expectations import score_expectations
from chainrun.events import ProductsShown, TokenDelta, TurnFinished
from chainrun.providers.fake import FakeProvider, FakeReply
from chainrun.replay.run import load_requests
from chainrun.retrieval.embeddings import MiniLMEmbedder
from chainrun.retrieval.products import ShownProduct
from chainrun.steps.facts import (
    FactsConfig,
    answer_products,
    closing,
    lead_subject,
    lead_topic,
    policy_lines,
    product_line,
    quote_policy,
    with_lead,
)

pytestmark = pytest.mark.facts  # the default chain as it ships: with its answer's facts

REPO = Path(__file__).resolve().parents[1]
JACKET = ShownProduct(id="JKT-008", title="City Drizzle Rain Jacket (red)", category="jackets",
                      price=44.95, colours=("red",), sizes={"S": 2, "M": 0})  # fmt: skip
COAT = ShownProduct(id="COT-002", title="Wool Overcoat", category="coats", price=199.0,
                    sizes={"S": 0})  # fmt: skip
POLICY = (
    "Returns, refunds and exchanges\n"
    "Returns: within 30 days of delivery, unworn, with labels attached.\n"
    "Refunds go back to the original payment method within 5 working days.\n\n"
)


def test_a_product_line_says_title_id_price_colours_and_the_sizes_in_stock() -> None:
    assert product_line(JACKET) == (
        "- City Drizzle Rain Jacket (red), JKT-008: €44.95; red; in stock in S."
    )
    assert product_line(COAT).endswith("€199.00; sold out.")


def test_the_products_the_prose_names_come_first_then_the_rest_in_order() -> None:
    assert answer_products("the wool overcoat is warm", [JACKET, COAT], 3) == (COAT, JACKET)
    assert answer_products("anything", [JACKET, COAT], 1) == (JACKET,)
    assert answer_products("anything", [JACKET, COAT], 0) == ()


def test_policy_lines_leave_out_the_section_titles() -> None:
    assert policy_lines(POLICY) == [
        "Returns: within 30 days of delivery, unworn, with labels attached.",
        "Refunds go back to the original payment method within 5 working days.",
    ]


@pytest.mark.parametrize("embedder", [None, MiniLMEmbedder()], ids=["words", "minilm"])
async def test_the_quoted_policy_line_is_the_one_that_answers_the_question(embedder) -> None:
    if embedder is not None and not embedder.available():
        pytest.skip("the MiniLM files are not installed")
    refunds = "Refunds go back to the original payment method within 5 working days."
    assert await quote_policy("When do I get my money back?" if embedder else
                              "When do I get my refund?", POLICY, 1, embedder) == (refunds,)
    assert await quote_policy("what color is water", POLICY, 2, embedder) == ()


def test_a_stopped_sentence_is_closed_once() -> None:
    assert closing(" Here are our rain jackets") == "."
    assert closing(" Here is our returns policy.") == ""
    assert closing("") == ""


def _view(answer: str, prose: str | None = None, shown=(JACKET, COAT)) -> TurnView:
    return TurnView(message="m", answer=answer, prose=prose,
                    shown_products=tuple(p.as_json() for p in shown))  # fmt: skip


def test_names_product_counts_only_shown_products_that_fit() -> None:
    a = parse_assertion({"type": "names-product", "category": "jackets", "max_price": 100})
    assert a.check(_view("See JKT-008.")).passed
    assert not a.check(_view("See COT-002.")).passed
    assert not a.check(_view("See JKT-008.", shown=(COAT,))).passed  # nothing fit: no pass
    assert not a.check(TurnView(message="m", answer="JKT-008")).passed  # no search ran


def test_no_repeat_fails_a_looping_answer_and_passes_a_varied_one() -> None:
    a = parse_assertion({"type": "no-repeat"})
    loop = "I'm a shop assistant. I'm a stylist. I'm a shop assistant. I'm a shop assistant."
    assert not a.check(_view(loop)).passed
    run_on = "the same words again and " * 4
    assert not a.check(_view(run_on)).passed
    assert a.check(_view("Here are our jackets. The red one is light.")).passed


def test_whole_sentences_fails_a_check_text_inside_a_sentence_and_a_cut_end() -> None:
    a = parse_assertion({"type": "whole-sentences"})
    spliced = ("Lyon is the only city in France where  I could not confirm the details of "
               "that answer against our catalogue. Please see the product pages.")
    assert not a.check(_view(spliced)).passed
    assert not a.check(_view("Here are our jackets for the")).passed
    assert a.check(_view("Here are our jackets.\n\n- A jacket, JKT-008: €44.95.")).passed


def test_whole_sentences_fails_a_model_sentence_run_into_the_lead() -> None:
    a = parse_assertion({"type": "whole-sentences"})
    lead = "Here are our rain jackets"
    camel = TurnView(message="m", answer=f" {lead} It's a camel.", lead=lead)
    assert not a.check(camel).passed
    goes_on = TurnView(message="m", answer=f" {lead} for your commute.", lead=lead)
    assert a.check(goes_on).passed
    own = TurnView(message="m", answer=f" {lead}. I could not confirm that.", lead=lead + ".")
    assert a.check(own).passed


def test_the_lead_names_what_was_asked_for_in_the_shown_titles_words() -> None:
    boots = ShownProduct(id="SHO-1", title="Men's Leather Chelsea Boots (brown)",
                         category="shoes", price=99.0)  # fmt: skip
    scarf = ShownProduct(id="ACC-4", title="Cashmere Scarf", category="accessories",
                         price=89.0)  # fmt: skip
    blazer = ShownProduct(id="JKT-56", title="Men's Linen Summer Blazer", category="jackets",
                          price=124.0)  # fmt: skip
    assert lead_subject("a waterproof rain jacket under 100?", [JACKET]) == "rain jackets"
    assert lead_subject("Do you have chelsea boots?", [boots]) == "chelsea boots"
    assert lead_subject("What colour of scarf goes with a camel coat?", [scarf]) == "scarves"
    # no title word ends what was asked: the first title's noun after the words it holds
    assert lead_subject("an outfit for a summer wedding", [blazer]) == "summer blazers"
    assert lead_subject("hello", [COAT]) == "overcoats"
    assert lead_subject("a jacket", []) == ""


async def test_a_policys_lines_are_embedded_once_not_on_every_turn(monkeypatch) -> None:
    embedder = MiniLMEmbedder()
    if not embedder.available():
        pytest.skip("MiniLM's files are not installed")
    encoded: list[str] = []
    encode = embedder.encode

    def counting(texts):
        encoded.extend(texts)
        return encode(texts)

    monkeypatch.setattr(embedder, "encode", counting)
    # lines and messages no other test embedded (the process keeps vectors it made)
    run = uuid.uuid4().hex[:8]
    policy = POLICY + f"Exchanges: free in any of our stores, within 30 days ({run}).\n"
    first = await quote_policy(f"can I get my money back? {run}", policy, 1, embedder)
    assert any(run in text for text in encoded)  # the new line, embedded
    assert first == ("Refunds go back to the original payment method within 5 working days.",)
    lines = len(encoded)
    again = await quote_policy(f"how long do refunds take? {run}", policy, 1, embedder)
    assert encoded[lines:] == [f"how long do refunds take? {run}"]  # the message only
    assert again == first
    kept = await embedder.embed_kept(["Refunds go back quickly.", "Refunds go back quickly."])
    assert kept.shape == (2, 384) and (kept[0] == kept[1]).all()
    alone = await embedder.embed(["Refunds go back quickly."])
    assert abs(float(kept[0] @ alone[0]) - 1.0) < 1e-5


async def test_the_policy_lead_names_the_answering_lines_subject_or_the_section() -> None:
    policy = "Shop policy, Returns, refunds and exchanges:\n" + POLICY.split("\n", 1)[1]
    assert await lead_topic("How long do I have for returns?", policy) == "returns"
    # the line that answers has no short subject: the section's title
    assert await lead_topic("when is my refund paid back?", policy) == (
        "returns, refunds and exchanges")
    assert await lead_topic("anything", "") == ""
    # a section titled "About ...": the lead's own "about" is not said twice
    about = "Shop policy, About Leaf & Kettle:\nWe are a small tea shop in Bristol.\n\n"
    assert await lead_topic("hi", about) == "leaf & kettle"


async def test_a_lead_with_nothing_to_say_is_no_lead() -> None:
    facts = FactsConfig(lead={"products": "Here are our {subject}",
                              "policy": "Here is what our policy says about {topic}"})
    assert await facts.render_lead(message="a rain jacket", shown=[JACKET],
                                   policy="") == "Here are our rain jackets"  # fmt: skip
    assert await facts.render_lead(message="hi", shown=[], policy="") == ""


def test_a_checks_text_after_the_lead_is_a_sentence_of_its_own() -> None:
    safe = "I could not confirm the details of that answer."
    assert with_lead(" Here are our jackets", " for you", [safe]) == (
        " Here are our jackets for you")
    assert with_lead(" Here are our jackets", safe, [safe]) == (
        " Here are our jackets. " + safe)
    # the sentence limit cut the check's text to its first sentence: still the check's
    two = safe + " Please see the product pages."
    assert with_lead(" Here are our infusions", safe, [two]) == (
        " Here are our infusions. " + safe)
    assert with_lead(" Here are our jackets", " I could not", [two]) == (
        " Here are our jackets I could not")


def test_the_prose_step_reads_the_sentence_before_the_facts() -> None:
    a = parse_assertion({"type": "regex", "step": "prose", "value": "jacket", "flags": "i"})
    assert not a.check(_view("It's a camel.\n\n- Rain Jacket", prose="It's a camel.")).passed
    assert a.check(_view("Our jackets.\n\n- Rain Jacket", prose="Our jackets.")).passed


async def test_the_default_answer_carries_its_products_as_data_and_as_lines(
    config, store
) -> None:
    fake = FakeProvider(name="local", script=reply_by_step(
        {"compose": FakeReply("some light rain jackets", ttft_s=0.001)}))  # fmt: skip
    async with Chain(config, store=store, providers={"local": fake}, quiet=True) as chain:
        events = [ev async for ev in chain.stream_turn("a rain jacket under 100?")]
    compose = next(r for r in fake.requests if "Catalogue matches" in r.messages[-1]["content"])
    # the lead, with what was asked for in the shown titles' words
    assert compose.messages[-1]["content"].endswith("Stylist: Here are our rain jackets")
    done = next(ev for ev in events if isinstance(ev, TurnFinished))
    shown = [ev for ev in events if isinstance(ev, ProductsShown)]
    assert len(shown) == 1 and 1 <= len(shown[0].products) <= 3
    text = "".join(ev.text for ev in events if isinstance(ev, TokenDelta)
                   and ev.step == "compose")  # fmt: skip
    assert text == done.output
    assert done.output.startswith("Here are our rain jackets some light rain jackets.\n\n- ")
    for product in shown[0].products:
        assert f", {product['id']}: €" in done.output
    row = next(s for s in store.steps(done.run_id) if s.step == "compose")
    assert row.detail["facts"]["ids"] == [p["id"] for p in shown[0].products]
    # the order of events: the products before the text that lists them
    kinds = [type(ev).__name__ for ev in events]
    assert kinds.index("ProductsShown") < max(
        i for i, ev in enumerate(events) if isinstance(ev, TokenDelta))


async def test_the_lead_reaches_the_shopper_at_the_models_first_token(config, store) -> None:
    # the model's first sentence takes 8 x 0.15 s to arrive whole; the grounding check
    # holds it back until it ends, but the lead (chainrun's words) goes out at once
    fake = FakeProvider(name="local", script=reply_by_step({"compose": FakeReply(
        "some light rain jackets for a wet commute in town.", ttft_s=0.01, gap_s=0.15)}))
    async with Chain(config, store=store, providers={"local": fake}, quiet=True) as chain:
        t0 = time.perf_counter()
        arrivals = [(time.perf_counter() - t0, ev) async for ev in
                    chain.stream_turn("a rain jacket under 100?")]  # fmt: skip
    deltas = [(t, ev.text) for t, ev in arrivals
              if isinstance(ev, TokenDelta) and ev.step == "compose"]  # fmt: skip
    assert deltas[0][1] == "Here are our rain jackets"
    assert deltas[1][0] - deltas[0][0] >= 0.9  # the model's sentence came whole, later
    done = next(ev for _, ev in arrivals if isinstance(ev, TurnFinished))
    assert "".join(text for _, text in deltas) == done.output
    assert done.output.startswith(
        "Here are our rain jackets some light rain jackets for a wet commute in town.\n\n- ")
    # the turn's answer TTFT is the lead's arrival
    assert done.answer_ttft_ms is not None and done.answer_ttft_ms < deltas[1][0] * 1000


async def test_a_calls_offset_counts_from_its_steps_start(config, store, monkeypatch) -> None:
    # the answer step works out its lead before its model call: 0.2 s here
    from chainrun.steps.llm import LLMStep

    lead_text = LLMStep._lead_text

    async def slow_lead(self, state):
        await asyncio.sleep(0.2)
        return await lead_text(self, state)

    monkeypatch.setattr(LLMStep, "_lead_text", slow_lead)
    fake = FakeProvider(name="local", script=reply_by_step(
        {"compose": FakeReply("some light rain jackets", ttft_s=0.001)}))  # fmt: skip
    async with Chain(config, store=store, providers={"local": fake}, quiet=True) as chain:
        done = await chain.run_turn("a rain jacket under 100?")
    (call,) = [c for c in store.calls(done.run_id) if c.step == "compose"]
    assert call.started_offset_ms is not None and call.started_offset_ms >= 190


async def test_a_policy_answer_quotes_the_policy_line_that_answers(store) -> None:
    config = config_from_dict({})
    fake = FakeProvider(name="local", script=reply_by_step(
        {"compose": FakeReply("within 30 days", ttft_s=0.001)}))  # fmt: skip
    async with Chain(config, store=store, providers={"local": fake}, quiet=True) as chain:
        done = await chain.run_turn("How many days do I have to return my trousers?")
    # the lead names the policy line's subject ("Returns: within 30 days ...")
    assert done.output.startswith("Here is what our policy says about returns within 30 days.\n\n")
    assert "within 30 days of delivery" in done.output


CAMEL = {"compose": FakeReply("It's a camel", ttft_s=0.001)}


async def test_the_camel_mutation_fails_the_main_jobs_expectations(store) -> None:
    requests = load_requests(REPO / "replays" / "commerce-12.jsonl")
    assert all(r.expect for r in requests)  # every case says what a usable answer holds
    fake = FakeProvider(name="local", script=reply_by_step(CAMEL))
    async with Chain(config_from_dict({}), store=store, providers={"local": fake},
                     quiet=True) as chain:  # fmt: skip
        for r in requests:
            await chain.run_turn(r.message, request_id=r.id)
        run_id = chain.run_id
    assert run_id is not None
    quality = await score_expectations(store, run_id, requests)
    assert quality is not None and quality["n"] == 12
    assert quality["met"] <= 2, quality  # "It's a camel." answers almost nothing asked


def test_replay_prints_how_many_answers_met_their_expectations(tmp_path, lab_config) -> None:
    rows = [json.loads(line) for line in
            (REPO / "replays" / "commerce-12.jsonl").read_text().splitlines()][:3]
    (tmp_path / "set.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(app, [
        "replay", str(tmp_path / "set.jsonl"), "--db", str(tmp_path / "r.db"),
        "--config", str(lab_config), "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["quality"]["n"] == 3
    assert 0 <= doc["quality"]["met"] <= 3


def test_a_bad_expectation_is_one_line_naming_the_file_and_line(tmp_path) -> None:
    bad = {"id": "a", "message": "hi", "expect": [{"type": "names-product", "min": 0}]}
    (tmp_path / "set.jsonl").write_text(json.dumps(bad) + "\n")
    result = CliRunner().invoke(app, ["replay", str(tmp_path / "set.jsonl"),
                                      "--db", str(tmp_path / "r.db")])  # fmt: skip
    assert result.exit_code == 2
    assert "set.jsonl:1" in result.output and "expect[0]" in result.output
    assert not (tmp_path / "r.db").exists()


def test_facts_default_for_the_embedded_model() -> None:
    facts = FactsConfig(lead={"products": "Here are"})
    assert facts.lead_for([JACKET]) == "Here are" and facts.lead_for([]) == ""
