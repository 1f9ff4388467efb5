"""What a product says it is not, and the attributes a shopper names: a keyword search
keeps no product that negates the query's word ("Not waterproof"), and no search (the
padding to ``min_results`` included) adds a product without an attribute the shopper
named or outside the category they named (chainrun.retrieval.attributes)."""

from __future__ import annotations

import sqlite_utils

from chainrun.retrieval import HashEmbedder, RetrievalSettings, build_retriever
from chainrun.retrieval.attributes import negations, query_attributes, why_excluded
from chainrun.retrieval.catalog import Product, write_products

SHOP = [
    Product(id="B1", title="Women's Trail Boots", category="shoes", price=129.0,
            description="Waterproof leather hiking boots with a grippy sole.",
            sizes={"38": 3}, tags=["waterproof", "boots", "hiking"]),
    Product(id="B2", title="Women's Suede Ankle Boots", category="shoes", price=99.0,
            description="Soft suede ankle boots with a block heel. Not waterproof: "
                        "spray before wearing in rain.", sizes={"38": 2}, tags=["boots"]),
    Product(id="B3", title="Men's Chelsea Boots", category="shoes", price=110.0,
            description="Leather Chelsea boots for town.", sizes={"42": 4}, tags=["boots"]),
    Product(id="J1", title="Rain Jacket", category="jackets", price=79.0,
            description="A waterproof rain jacket.", sizes={"M": 5}, tags=["waterproof"]),
    Product(id="S1", title="Non-Iron Oxford Shirt", category="shirts", price=45.0,
            description="A non-iron cotton shirt for the office.", sizes={"M": 5},
            tags=["non-iron", "office"]),
    Product(id="S2", title="Linen Shirt", category="shirts", price=39.0,
            description="A relaxed linen shirt; iron while damp.", sizes={"M": 5},
            tags=["linen"]),
]  # fmt: skip


def _db() -> sqlite_utils.Database:
    db = sqlite_utils.Database(memory=True)
    write_products(db, SHOP, source="test")
    return db


def test_negated_and_affirmed_words() -> None:
    affirmed, negated = negations("Soft suede. Not waterproof, but not only warm: non-iron.")
    assert "waterproof" in negated and "waterproof" not in affirmed
    assert "warm" in affirmed  # "not only" negates nothing
    assert "non-iron" in affirmed and "iron" not in affirmed and "iron" not in negated
    asked = query_attributes("a jumper that is not wool")
    assert asked.unwanted == {"wool"} and "wool" not in asked.search_text
    assert query_attributes("non-iron shirts").wanted == {"non-iron"}


def test_a_product_that_negates_the_word_or_lacks_the_attribute_is_excluded() -> None:
    boots = query_attributes("waterproof boots")
    by_id = {p.id: p.model_dump() for p in SHOP}
    assert why_excluded(by_id["B2"], boots) == "negates waterproof"
    assert why_excluded(by_id["B3"], boots) == "lacks waterproof"
    assert why_excluded(by_id["B1"], boots) is None
    assert why_excluded(by_id["S2"], query_attributes("non-iron shirt")) == "lacks non-iron"
    assert why_excluded(by_id["S1"], query_attributes("non-iron shirt")) is None


async def test_the_stage_keeps_no_negated_match_and_pads_only_within_what_was_asked() -> None:
    """min_results = 4 makes the stage pad "waterproof boots" with the hybrid and filter
    searches; before the rules it handed over the suede boots ("Not waterproof") and the
    Chelsea boots; now neither, and never the rain jacket (another category)."""
    db = _db()
    for rules, expected in ((False, {"B1", "B2", "B3"}), (True, {"B1"})):
        settings = RetrievalSettings(attribute_rules=rules, min_results=4)
        stage = build_retriever(settings, db, embedder=HashEmbedder())
        await stage.warm()
        try:
            found = await stage.retrieve("waterproof boots")
        finally:
            await stage.aclose()
        assert set(found.ids) == expected, rules
        assert "J1" not in found.ids  # the category the shopper named holds
    doc = found.as_json()
    excluded = {i: why for s in doc["searches"] for i, why in (s.get("excluded") or {}).items()}
    assert excluded["B2"] == "negates waterproof" and excluded["B3"] == "lacks waterproof"


async def test_non_iron_is_the_compound_the_catalogue_means() -> None:
    db = _db()
    stage = build_retriever(RetrievalSettings(min_results=4), db, embedder=HashEmbedder())
    await stage.warm()
    try:
        found = await stage.retrieve("non-iron shirts")
    finally:
        await stage.aclose()
    assert found.ids == ["S1"]


def test_an_attribute_used_as_a_noun_names_a_product_not_a_requirement() -> None:
    """"a fleece or a beanie": a fleece is a kind of product; as an attribute every
    result had to be fleece, and the beanies the shopper asked for were all dropped."""
    assert query_attributes("Maybe something warm, like a fleece or a beanie?").wanted == set()
    assert query_attributes("Do you have a waterproof?").wanted == set()
    assert query_attributes("a fleece jacket for hiking").wanted == {"fleece"}
    assert query_attributes("a linen shirt").wanted == {"linen"}
