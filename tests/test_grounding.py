"""The grounding check: the answer's product ids, titles, prices, stock and policy figures
against the turn's own rows, on the stream (chainrun.checks.grounding).

The lab answers a catalogue line with a real id (JKT-003, the 124 EUR Storm Shell),
another product's title (JKT-005's) and that other product's price (€49.95): through
the library's stream, ``/chat``, the OpenAI-compatible face and a replay, the shopper's
stream never holds the wrong price or title, and the log says which claim and why."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import sqlite_utils
from cli_runner import chainrun
from serve_helpers import serving, sse

from chainrun.chain import Chain
from chainrun.checks.colours import COLOUR_WORDS, NOT_CLAIM_WORDS, SHADE_WORDS
from chainrun.checks.grounding import (
    GroundingSources,
    ProductRow,
    StreamGrounding,
    check_text,
)
from chainrun.checks.holdback import HoldBack
from chainrun.config import config_from_dict
from chainrun.events import TokenDelta
from chainrun.lab import LabServer, Scenario
from chainrun.lab.scenarios import WireFrame
from chainrun.log.store import Store
from chainrun.retrieval.catalog import all_products, ensure_sample_catalog
from chainrun.shop_policy import load_policy
from chainrun.steps.grounding import product_rows

WRONG = ("We have this one: [JKT-003] Women's City Drizzle Packable Rain Jacket (yellow) | "
         "jackets | €49.95 | in stock: M")  # fmt: skip
RIGHT = ("We have this one: [JKT-003] Men's Storm Shell Waterproof Rain Jacket (navy) | "
         "jackets | €124.00 | in stock: M")  # fmt: skip
MESSAGE = "Do you have rain jackets?"


@pytest.fixture(scope="module")
def catalogue() -> dict[str, ProductRow]:
    db = sqlite_utils.Database(memory=True)
    ensure_sample_catalog(db)
    return {p["id"]: ProductRow.of(p) for p in all_products(db)}


@pytest.fixture(scope="module")
def policy() -> str:
    return "\n".join(s.text for s in load_policy().values())


def _sources(catalogue: dict[str, ProductRow], policy: str, *ids: str) -> GroundingSources:
    return GroundingSources([catalogue[i] for i in ids], policy=policy, catalogue=catalogue)


async def _tokens(text: str) -> AsyncIterator[str]:
    for tok in re.findall(r"\S+\s*|\s+", text):
        yield tok


async def _stream(src: GroundingSources, text: str, action: str = "correct") -> tuple[str, Any]:
    check = StreamGrounding(src, action)  # type: ignore[arg-type]
    out = [piece async for piece in HoldBack(check, 0).stream(_tokens(text))]
    return "".join(out), check


def test_each_kind_of_claim_against_the_rows(catalogue, policy) -> None:
    src = _sources(catalogue, policy, "JKT-003", "JKT-005", "SPT-016")
    by_text = {c.text: c for c in check_text(src, (
        "[JKT-003] Women's City Drizzle Packable Rain Jacket (yellow) costs €49.95. "
        "[JKT-013] is great. [ZZZ-999] too. The Women's Waterproof Running Jacket is 89,00 €. "
        "JKT-005 is in stock in M. It costs $49.95. Returns are free within 60 days. "
        "Standard delivery takes 2-4 working days. A present for under 100 EUR."))}  # fmt: skip
    assert by_text["JKT-003"].grounded is not False  # a real id the turn has
    title = by_text["Women's City Drizzle Packable Rain Jacket (yellow)"]
    assert not title.grounded and "JKT-003 given the title of JKT-005" in (title.why or "")
    assert title.correction == "Men's Storm Shell Waterproof Rain Jacket (navy)"
    price = by_text["€49.95"]
    assert not price.grounded and price.correction == "€124.00" and price.product == "JKT-003"
    # a catalogue product the turn was not handed: a true fact about it is no falsehood
    assert by_text["JKT-013"].grounded
    assert not by_text["ZZZ-999"].grounded and "no product of the catalogue" in (
        by_text["ZZZ-999"].why or "")
    assert by_text["89,00 €"].grounded  # the running jacket's price, with a decimal comma
    stock = by_text["in stock in M"]
    assert not stock.grounded and stock.why == "JKT-005 is sold out in M"
    assert not by_text["$49.95"].grounded  # another currency
    assert not by_text["60 days"].grounded and "30" in (by_text["60 days"].why or "")
    assert by_text["2-4 working days"].grounded
    assert by_text["100 EUR"].grounded  # a bound: JKT-005, named before, is under it


async def test_the_stream_is_corrected_before_the_shopper_sees_it(catalogue, policy) -> None:
    src = _sources(catalogue, policy, "JKT-003", "JKT-005", "JKT-009")
    shown, check = await _stream(src, WRONG)
    assert shown == RIGHT
    report = check.report()
    assert report["claims"] >= 3 and not report["grounded"]
    whys = [u["why"] for u in report["ungrounded"]]
    assert any("given the title of JKT-005" in w for w in whys)
    assert any("differs from JKT-003's price €124.00" in w for w in whys)
    assert [d["action"] for d in report["done"]] == ["corrected", "corrected"]
    # a sentence is held until it is complete and judged (the shopper reads whole
    # sentences); a complete one with nothing wrong is released at once
    first = StreamGrounding(src)
    assert (await first("We ", final=False)).hold_from == 0
    verdict = await first("We have it. And ", final=False)
    assert verdict.hold_from == len("We have it.") and not verdict.redactions


async def test_a_product_the_turn_lacks_is_dropped_and_an_empty_answer_replaced(
    catalogue, policy
) -> None:
    src = _sources(catalogue, policy, "JKT-005")
    shown, check = await _stream(src, "Try this.\n[ZZZ-998] Summit hardshell | €229.00\n")
    assert shown == "Try this.\n"
    assert check.report()["done"][0]["action"] == "dropped"
    shown, check = await _stream(src, "[ZZZ-999] The diamond jacket, €1.")
    assert shown == check.safe_text
    for action in ("flag",):
        shown, check = await _stream(src, "[ZZZ-999] The diamond jacket, €1.", action)
        assert shown == "[ZZZ-999] The diamond jacket, €1."
        assert check.report()["n_ungrounded"] == 2


def test_the_prompt_lines_read_as_rows() -> None:
    rows = product_rows("- [JKT-005] Women's Rain Jacket (yellow) | jackets | €49.95 | yellow"
                        " | in stock: XS, S\n- [X-1] bad line")  # fmt: skip
    assert rows == [ProductRow("JKT-005", "Women's Rain Jacket (yellow)", 49.95, "EUR",
                               {"XS": 1, "S": 1}, ("yellow",))]  # fmt: skip
    (two,) = product_rows("- [JKT-002] Longer Storm Shell | jackets | €129.00 | olive/black"
                          " | sold out")  # fmt: skip
    assert two.colours == ("olive", "black") and two.sizes == {}
    assert product_rows("(none)") == [] and product_rows(None) == []


# ------------------------------------------------------------------ the lab, every face


def _chunk(content: str) -> str:
    body = {"id": "chatcmpl-g1", "object": "chat.completion.chunk", "created": 1733040000,
            "model": "m", "choices": [{"index": 0, "delta": {"content": content},
                                       "finish_reason": None}]}  # fmt: skip
    return f"data: {json.dumps(body)}\n\n"


def _frames(text: str) -> list[WireFrame]:
    end = {"id": "chatcmpl-g1", "object": "chat.completion.chunk", "created": 1733040000,
           "model": "m",
           "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}  # fmt: skip
    return [
        *(WireFrame(data=_chunk(tok)) for tok in re.findall(r"\S+\s*|\s+", text)),
        WireFrame(data=f"data: {json.dumps(end)}\n\n"),
        WireFrame(data="data: [DONE]\n\n"),
    ]


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    with LabServer(Scenario(name="wrong-line", wire=_frames(WRONG))) as lab:
        yield lab


def _config(lab: LabServer) -> dict[str, Any]:
    return {"order": ["classify", "retrieve", "policy", "compose"],
            "providers": {"local": {"base_url": lab.base_url}}}  # fmt: skip


def _assert_logged(store: Store, turn_id: int | None = None) -> None:
    run_id = store.latest_run_id()
    assert run_id is not None
    steps = [s for s in store.steps(run_id) if s.step == "compose"]
    assert steps
    for step in steps:
        g = (step.detail or {})["grounding"]
        assert not g["grounded"] and g["n_ungrounded"] >= 2
        whys = " ".join(u["why"] for u in g["ungrounded"])
        assert "JKT-003 given the title of JKT-005" in whys
        assert "€49.95 differs from JKT-003's price €124.00" in whys
    for turn in store.turns(run_id):
        assert "€49.95" not in (turn.output or "") and "€124.00" in (turn.output or "")


async def test_the_librarys_stream_never_shows_the_wrong_price(lab: LabServer) -> None:
    with Store.open(":memory:") as store:
        async with Chain(config_from_dict(_config(lab)), store=store, quiet=True) as chain:
            tokens = [e.text async for e in chain.stream_turn(MESSAGE)
                      if isinstance(e, TokenDelta) and e.step == "compose"]  # fmt: skip
        await store.flush()
        assert "".join(tokens) == RIGHT
        _assert_logged(store)
        # compare's rate of answers with an ungrounded product fact, n and an interval
        from chainrun.analysis.compare import compare

        rid = str(store.latest_run_id())
        g = compare(store, rid, rid)["grounding"]["b"]
        assert g["shown"]["ungrounded"] == 0 and g["shown"]["n"] == 1
        assert g["model"]["ungrounded"] == 1 and g["model"]["ci95"] is not None
        # the audit's item 8: the grounded share with its interval (one answer: too few)
        from chainrun.audit import audit

        item = audit(store, runs=[int(rid)]).items[7]
        assert item.id == 8 and item.verdict == "not_enough_data"
        (fig,) = item.figures.values()
        assert fig["grounded_shown"]["grounded"] == 1 and fig["grounded_shown"]["n"] == 1
        assert fig["grounded_shown"]["ci95"] is not None


async def test_chat_and_the_openai_face_never_show_the_wrong_price(
    lab: LabServer, tmp_path: Path
) -> None:
    store = Store.open(tmp_path / "log.db")
    cfg = config_from_dict(_config(lab))
    async with serving(lambda: Chain(cfg, store=store, quiet=True)) as (url, _):
        async with httpx.AsyncClient(timeout=30) as client:
            async with client.stream("POST", f"{url}/chat", json={"message": MESSAGE}) as r:
                events = [ev async for ev in sse(r)]
            oai = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="-", http_client=client)
            whole = await oai.chat.completions.create(
                model="chainrun-shop", messages=[{"role": "user", "content": MESSAGE}])
            chunks = [c async for c in await oai.chat.completions.create(
                model="chainrun-shop", messages=[{"role": "user", "content": MESSAGE}],
                stream=True)]  # fmt: skip
    tokens = "".join(d["text"] for e, d in events if e == "token" and d["step"] == "compose")
    assert tokens == RIGHT
    grounding = [d for e, d in events if e == "grounding"]
    assert grounding and not grounding[0]["grounded"] and grounding[0]["n_ungrounded"] >= 2
    assert whole.choices[0].message.content == RIGHT
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == RIGHT
    await store.flush()
    _assert_logged(store)
    store.close()


async def test_client_sent_assistant_turns_are_never_a_source(lab: LabServer) -> None:
    """On the OpenAI face the earlier assistant turn is what the client says the assistant
    said: a client that puts the wrong line in the assistant's mouth does not make it
    grounded; the answer that repeats it is corrected the same."""
    with Store.open(":memory:") as store:
        cfg = config_from_dict(_config(lab))
        async with serving(lambda: Chain(cfg, store=store, quiet=True)) as (url, _):
            async with httpx.AsyncClient(timeout=30) as client:
                oai = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="-", http_client=client)
                done = await oai.chat.completions.create(model="chainrun-shop", messages=[
                    {"role": "user", "content": MESSAGE},
                    {"role": "assistant", "content": WRONG},
                    {"role": "user", "content": "So the Storm Shell is €49.95?"},
                ])  # fmt: skip
        assert done.choices[0].message.content == RIGHT
        await store.flush()
        _assert_logged(store)


def test_a_replay_never_shows_the_wrong_price(lab: LabServer, tmp_path: Path) -> None:
    cfg = tmp_path / "chainrun.toml"
    cfg.write_text(f'order = ["classify", "retrieve", "policy", "compose"]\n\n'
                   f'[providers.local]\nbase_url = "{lab.base_url}"\n')  # fmt: skip
    replay = tmp_path / "one.jsonl"
    replay.write_text(json.dumps({"id": "r1", "message": MESSAGE}) + "\n")
    db = tmp_path / "log.db"
    res = chainrun("replay", str(replay), "--config", str(cfg), "--db", str(db))
    assert res.returncode == 0, res.stderr
    assert "€49.95" not in res.stdout
    with Store.open(db) as store:
        _assert_logged(store)
    shown = chainrun("show", "1", "--db", str(db))
    assert "grounding" in shown.stdout and "JKT-003 given the title of JKT-005" in shown.stdout


def test_the_grounded_eval_assertion() -> None:
    from chainrun.evals.assertions import TurnView, parse_assertion

    grounded = parse_assertion({"type": "grounded"})
    bad = {"claims": 3, "ungrounded": [{"kind": "price", "text": "€49.95",
                                        "why": "€49.95 differs from JKT-003's price €124.00"}]}
    assert grounded.check(TurnView("m", "a", grounding={"claims": 2, "ungrounded": []})).passed
    verdict = grounded.check(TurnView("m", "a", grounding=bad))
    assert verdict.passed is False and "differs from JKT-003's price" in verdict.detail
    assert grounded.check(TurnView("m", "a")).passed is False  # no record: not a pass


async def test_an_answer_that_is_not_streamed_is_grounded_whole(lab: LabServer) -> None:
    data = _config(lab)
    data["steps"] = {"compose": {"stream": False}}
    with Store.open(":memory:") as store:
        async with Chain(config_from_dict(data), store=store, quiet=True) as chain:
            done = await chain.run_turn(MESSAGE)
        await store.flush()
        assert done.output == RIGHT
        _assert_logged(store)


@pytest.mark.parametrize(
    ("text", "shown", "done"),
    [
        # a price before the product it is about, streamed word by word: held, then
        # corrected, written as the shop writes prices
        ("Our cheapest: €5.00 for JKT-008, the red one.",
         "Our cheapest: €44.95 for JKT-008, the red one.", "corrected"),
        ("Also EUR 5.00 for the JKT-008.", "Also €44.95 for the JKT-008.", "corrected"),
        # another currency, before the product: written in the shop's
        ("Or pay $19.95 for JKT-009", "Or pay €49.95 for JKT-009", "corrected"),
        # a sentence that names no product is about the one named before it: a wrong
        # price there is not rewritten (which product "it" is, is a guess): the sentence
        # is dropped whole
        ("JKT-008 is our cheapest rain jacket. It costs €5.00.",
         "JKT-008 is our cheapest rain jacket.", "dropped"),
        ("JKT-008 is our cheapest rain jacket. It costs 19.99 today.",
         "JKT-008 is our cheapest rain jacket.", "dropped"),
        # prices with no currency sign, in cents, negative: held and corrected alike
        ("Only 19.99 for JKT-008, the red one.", "Only 44.95 for JKT-008, the red one.",
         "corrected"),
        ("Just 4490 cents for JKT-008.", "Just 4495 cents for JKT-008.", "corrected"),
        ("Now €-44.95 for JKT-008.", "Now €44.95 for JKT-008.", "corrected"),
        ("Now -€44.95 for JKT-008.", "Now €44.95 for JKT-008.", "corrected"),
    ],
)
async def test_a_price_before_its_product_never_reaches_the_shopper(
    catalogue, policy, text: str, shown: str, done: str
) -> None:
    src = _sources(catalogue, policy, "JKT-008", "JKT-005", "JKT-009")
    got, check = await _stream(src, text)
    assert got == shown
    assert {d["action"] for d in check.report()["done"]} == {done}


async def test_an_answer_with_every_sentence_dropped_says_so_once_and_whole(
    catalogue, policy
) -> None:
    """The main job once showed "Lyon is the only city in France where  I could not
    confirm ...": the start of a sentence released, its end dropped, the safe text
    after it. A sentence is now held until judged: the safe text stands alone."""
    src = _sources(catalogue, policy, "JKT-005")
    got, check = await _stream(src, "Sure, here it is: [ZZZ-999] The diamond jacket.")
    assert got == check.safe_text
    got, check = await _stream(src, "Lyon is the only city in France where [ZZZ-999] costs "
                                    "€1. It is €2.")  # fmt: skip
    assert got == check.safe_text and got.count(check.safe_text) == 1
    got, check = await _stream(src, "Lyon is lovely. The only city where JKT-005 costs €1 "
                                    "and ZZZ-999 €2 is Paris. Bye!")  # fmt: skip
    assert got == "Lyon is lovely. Bye!"


def _claims(src: GroundingSources, text: str, *kinds: str) -> list[tuple[str, bool, str | None]]:
    return [(c.text, c.grounded, c.correction) for c in check_text(src, text) if c.kind in kinds]


@pytest.mark.parametrize(
    ("text", "claims"),
    [
        # a bare amount after a price word or beside the product: checked as a price
        ("JKT-008 costs 19.99.", [("19.99", False, "44.95")]),
        ("JKT-008 costs 44.95.", [("44.95", True, None)]),
        ("JKT-008 costs 44,95.", [("44,95", True, None)]),
        ("- [JKT-008] Women's City Drizzle Packable Rain Jacket | jackets | 19.99 | red",
         [("19.99", False, "44.95")]),
        ("JKT-008 is our cheapest. It is priced at 45.", [("45", False, None)]),
        # cents
        ("JKT-008 costs 4495 cents.", [("4495 cents", True, None)]),
        ("JKT-008 costs 4490 cents.", [("4490 cents", False, "4495 cents")]),
        # negative or malformed: never grounded, even at the product's own figure
        ("JKT-008 costs €-44.95.", [("€-44.95", False, "€44.95")]),
        ("JKT-008 costs -€44.95.", [("-€44.95", False, "€44.95")]),
        ("JKT-008 costs EUR -44,95.", [("EUR -44,95", False, "€44.95")]),
        ("JKT-008 costs -44.95 EUR.", [("-44.95 EUR", False, "€44.95")]),
        ("JKT-008 costs €44.955.", [("€44.955", False, "€44.95")]),
        ("JKT-008 costs €44.95.00.", [("€44.95.00", False, "€44.95")]),
        # codes and words after the amount, with a decimal comma
        ("JKT-008 costs EUR 44,95.", [("EUR 44,95", True, None)]),
        ("JKT-008 costs EUR 4,95.", [("EUR 4,95", False, "€44.95")]),
        ("JKT-008 costs 44.95 euros.", [("44.95 euros", True, None)]),
        ("JKT-008 costs 4.95 euros.", [("4.95 euros", False, "€44.95")]),
        # a fee of the policy in a sentence on delivery is the fee, not the product's price
        ("JKT-008 is 44.95 and standard delivery costs 4.95.",
         [("44.95", True, None), ("4.95", True, None)]),
        ("JKT-008 is our cheapest. Express delivery costs €9.95.", [("€9.95", True, None)]),
        # (a wrong fee is never "corrected" into the product's price: it is dropped)
        ("JKT-008 is our cheapest. Express delivery costs €-9.95.",
         [("€-9.95", False, None)]),
        # no price: a size, an order number, a measure, a count, a time, a bound
        ("JKT-008 in EU 42 fits true to size.", []),
        ("Your order 1042 includes JKT-008.", []),
        ("JKT-008 is rated 10,000 mm and weighs 0.35 kg.", []),
        ("JKT-008 is rated 4.50 by our shoppers.", []),
        ("JKT-008 packs into 2 pockets.", []),
        ("JKT-008 ordered now arrives by 10.30 tomorrow.", []),
        # a threshold of the policy, said wrong or right
        ("Orders over 50.00 ship free, JKT-008 too.", [("50.00", False, None)]),
        ("Orders over 60.00 ship free, JKT-008 too.", [("60.00", True, None)]),
        ("A bullet list - [JKT-008] first.", []),
    ],
)
def test_prices_without_a_sign_in_cents_negative_or_malformed(
    catalogue, policy, text: str, claims: list[tuple[str, bool, str | None]]
) -> None:
    src = _sources(catalogue, policy, "JKT-008", "JKT-005", "JKT-009")
    assert _claims(src, text, "price", "fee") == claims
    assert {Decimal("4.95"), Decimal("9.95")} <= src.fees  # the policy's delivery fees


@pytest.mark.parametrize(
    ("ids", "text", "claims"),
    [
        # a colour the product does not come in: in the sentence, carried from the one
        # before, in a catalogue line's column, of a title without its colour
        (("JKT-003", "JKT-002"),
         "[JKT-003] Men's Storm Shell Waterproof Rain Jacket (navy) comes in red.",
         [("red", False)]),
        (("JKT-003", "JKT-002"), "JKT-003 is our warmest. It comes in red and navy.",
         [("red", False), ("navy", True)]),
        (("JKT-003", "JKT-002"),
         "- [JKT-002] Women's Longer Storm Shell Waterproof Rain Jacket | jackets | €129.00 |"
         " red/black | in stock: XS", [("red", False), ("black", True)]),
        (("JKT-003", "JKT-002"),
         "The Women's Longer Storm Shell Waterproof Rain Jacket is available in olive or "
         "yellow.", [("olive", True), ("yellow", False)]),
        # the turn's only product, named loosely
        (("JKT-003",), "The Storm Shell Jacket comes in red.", [("red", False)]),
        # a shade of a colour it comes in: navy is a blue
        (("JKT-003",), "JKT-003 comes in blue.", [("blue", True)]),
        # not claims: the shopper's words asked back, quoted, negated, another object's
        # colour, a title's own colour, a product the turn lacks
        (("JKT-003",), "Do you want JKT-003 in red?", []),
        (("JKT-003",), 'You asked for "red"; JKT-003 is the closest we have.', []),
        (("JKT-003",), "JKT-003 is not available in red.", []),
        (("JKT-003",), "Wear JKT-003 with white trainers.", []),
        (("JKT-003",), "[JKT-003] Men's Storm Shell Waterproof Rain Jacket (navy).", []),
        # a catalogue product the turn lacks is judged against its row
        (("JKT-003",), "JKT-013 comes in red.", [("red", False)]),
    ],
)
def test_colour_claims_against_the_catalogue_colours(
    catalogue, policy, ids: tuple[str, ...], text: str, claims: list[tuple[str, bool]]
) -> None:
    src = _sources(catalogue, policy, *ids)
    assert [(t, g) for t, g, _ in _claims(src, text, "colour")] == claims
    for c in check_text(src, text):
        if c.kind == "colour" and not c.grounded:
            assert c.why and c.why.endswith(f"not {c.text}") and c.correction is None


async def test_a_wrong_colour_never_reaches_the_shopper(catalogue, policy) -> None:
    src = _sources(catalogue, policy, "JKT-003", "JKT-002")
    shown, check = await _stream(src, "JKT-003 keeps you dry. It comes in red. Sizes S to XXL.")
    assert "red" not in shown and shown.startswith("JKT-003 keeps you dry.")
    assert shown.endswith("Sizes S to XXL.")
    (bad,) = check.report()["ungrounded"]
    assert bad["kind"] == "colour" and bad["why"] == "JKT-003 comes in navy, not red"


def test_every_catalogue_colour_word_is_in_the_vocabulary(catalogue) -> None:
    """The vocabulary is data: a catalogue colour word that is in none of its lists (a
    new colour name) fails here, so that it is decided, not silently unchecked."""
    words = {w for row in catalogue.values() for c in row.colours for w in c.lower().split()}
    assert words and words <= COLOUR_WORDS | SHADE_WORDS | NOT_CLAIM_WORDS
    assert not COLOUR_WORDS & (SHADE_WORDS | NOT_CLAIM_WORDS)


def test_the_conversations_products_and_the_shops_currency_reach_the_sources(
    catalogue, policy
) -> None:
    """The answer step's sources: the products earlier turns showed (the ``history``
    field's product ids, read from the catalogue) and the configured currency and locale."""
    from chainrun.checks.config import GroundingConfig
    from chainrun.conversations.history import History, HistoryTurn
    from chainrun.steps.grounding import AnswerGrounding

    step = AnswerGrounding(GroundingConfig(currency="EUR", locale="de_DE"),
                           list(catalogue.values()), policy)  # fmt: skip
    history = History(turns=(HistoryTurn("rain jackets?", "...", products=("JKT-013",)),))
    src = step.sources({"products": [catalogue["JKT-008"]], "history": history})
    assert set(src.history) == {"JKT-013"} and set(src.products) == {"JKT-008"}
    assert (src.currency, src.locale) == ("EUR", "de_DE")
    (price,) = [c for c in check_text(src, "Der JKT-013 kostet 229,00 €.") if c.kind == "price"]
    assert price.grounded and price.product == "JKT-013"
