"""The retrieve stage: early exit, merging, failing open, RRF, settings, hedged fallbacks."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import pytest
import sqlite_utils
from pydantic import ValidationError
from virtual_time import run_virtual, vloop

from chainrun.errors import ProviderUnavailable
from chainrun.retrieval import (
    Filters,
    HashEmbedder,
    Hit,
    Hits,
    HybridSearch,
    RetrievalSettings,
    RetrievalStage,
    build_retriever,
    format_for_prompt,
    rrf_fuse,
)
from chainrun.retrieval.catalog import ensure_sample_catalog
from chainrun.retrieval.stage import HedgedAnswer

#: ids of real sample products, so that the stage can look them up
IDS = ["JKT-002", "JKT-003", "JKT-004", "JKT-005", "JKT-006", "JKT-007", "JKT-008", "JKT-009",
       "JKT-010", "JKT-011", "COT-001", "COT-002"]  # fmt: skip


class CountingSearch:
    """A fake search that returns fixed ids, counts its calls and can be slow or fail."""

    def __init__(
        self, name: str, ids: list[str], *, delay_s: float = 0.0, error: Exception | None = None
    ) -> None:
        self.name = name
        self.ids = ids
        self.delay_s = delay_s
        self.error = error
        self.calls = 0
        self.seen: list[tuple[str, int, Filters | None]] = []
        self.finished = 0

    async def search(self, query: str, k: int, *, filters: Filters | None = None) -> list[Hit]:
        self.calls += 1
        self.seen.append((query, k, filters))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        self.finished += 1
        return [Hit(i, float(len(self.ids) - n), self.name) for n, i in enumerate(self.ids[:k])]


@pytest.fixture
def db() -> Iterator[sqlite_utils.Database]:
    d = sqlite_utils.Database(memory=True)
    ensure_sample_catalog(d)
    yield d
    d.close()


def _retriever(
    db: sqlite_utils.Database, searches: dict[str, Any], **settings: Any
) -> RetrievalStage:
    s = RetrievalSettings(searches=list(searches), **settings)
    return RetrievalStage(s, db, searches)


async def test_stops_after_the_first_search_that_fills_min_results(
    db: sqlite_utils.Database,
) -> None:
    keyword = CountingSearch("keyword", IDS[:4])
    vector = CountingSearch("vector", IDS[4:8])
    browse = CountingSearch("filter", IDS[8:])
    r = _retriever(db, {"keyword": keyword, "vector": vector, "filter": browse}, min_results=4)
    result = await r.retrieve("waterproof jacket")
    assert (keyword.calls, vector.calls, browse.calls) == (1, 0, 0)  # later searches never run
    assert result.stopped_after == "keyword"
    assert [s.name for s in result.searches] == ["keyword"]
    assert result.ids == IDS[:4]
    assert keyword.seen[0][0] == "waterproof jacket" and keyword.seen[0][1] == 8


async def test_merges_in_first_seen_order_and_drops_repeats(db: sqlite_utils.Database) -> None:
    keyword = CountingSearch("keyword", IDS[:2])
    vector = CountingSearch("vector", [IDS[1], IDS[0], IDS[2], IDS[3], IDS[4]])  # two repeats
    browse = CountingSearch("filter", IDS[8:])
    r = _retriever(db, {"keyword": keyword, "vector": vector, "filter": browse}, min_results=4)
    result = await r.retrieve("jacket")
    assert result.ids == IDS[:5]  # keyword's two, then vector's new ones in its order
    assert [(s.name, s.n, s.new) for s in result.searches] == [("keyword", 2, 2), ("vector", 5, 3)]
    assert result.stopped_after == "vector" and browse.calls == 0
    assert [i["source"] for i in result.items] == ["keyword"] * 2 + ["vector"] * 3


async def test_runs_every_search_when_min_results_is_not_reached(db: sqlite_utils.Database) -> None:
    a, b, c = (
        CountingSearch(n, IDS[i : i + 1]) for i, n in enumerate(["keyword", "vector", "filter"])
    )
    result = await _retriever(db, {"keyword": a, "vector": b, "filter": c}, min_results=4).retrieve(
        "x"
    )
    assert (a.calls, b.calls, c.calls) == (1, 1, 1)
    assert result.stopped_after is None and result.ids == IDS[:3]


async def test_no_early_exit_when_the_last_search_fills(db: sqlite_utils.Database) -> None:
    a, b = CountingSearch("keyword", []), CountingSearch("vector", IDS[:6])
    result = await _retriever(db, {"keyword": a, "vector": b}, min_results=4).retrieve("x")
    assert result.stopped_after is None  # nothing was skipped
    assert result.ids == IDS[:6]


async def test_early_exit_can_be_switched_off(db: sqlite_utils.Database) -> None:
    a, b = CountingSearch("keyword", IDS[:4]), CountingSearch("vector", IDS[4:10])
    r = _retriever(db, {"keyword": a, "vector": b}, min_results=4, early_exit=False)
    result = await r.retrieve("x")
    assert b.calls == 1 and result.stopped_after is None
    assert result.ids == IDS[:8]  # capped at k


async def test_a_failing_search_fails_open(db: sqlite_utils.Database) -> None:
    broken = CountingSearch("vector", [], error=ProviderUnavailable("embedder down"))
    keyword, browse = CountingSearch("keyword", IDS[:1]), CountingSearch("filter", IDS[1:6])
    r = _retriever(db, {"keyword": keyword, "vector": broken, "filter": browse})
    result = await r.retrieve("x")
    logs = {s.name: s for s in result.searches}
    assert logs["vector"].error == "ProviderUnavailable: embedder down" and logs["vector"].n == 0
    assert browse.calls == 1 and result.ids == IDS[:6]


async def test_filters_and_label_reach_every_search(db: sqlite_utils.Database) -> None:
    keyword = CountingSearch("keyword", [])
    r = _retriever(db, {"keyword": keyword})
    result = await r.retrieve("something nice under 80 in size M", label="shoes")
    query, _, filters = keyword.seen[0]
    assert query == "something nice"
    assert filters == Filters(max_price=80.0, sizes=("M",), categories=("shoes",))
    assert result.filters == filters and result.query == "something nice"


async def test_result_documents(db: sqlite_utils.Database) -> None:
    r = _retriever(db, {"keyword": CountingSearch("keyword", IDS[:3])}, min_results=1)
    result = await r.retrieve("rain jacket")
    doc = result.as_json()
    assert {"results", "searches", "stopped_after", "filters", "query", "ms"} <= set(doc)
    assert [item["id"] for item in doc["results"]] == IDS[:3]
    assert {"name", "ms", "n", "new", "error", "hedged", "ids"} <= set(doc["searches"][0])
    assert doc["results"][0]["title"] and isinstance(doc["results"][0]["price"], float)
    text = result.prompt_text()
    assert text.splitlines()[0].startswith("- [JKT-002] ") and "€" in text
    assert len(text.splitlines()) == 3


def test_format_for_prompt() -> None:
    items = [
        {"id": "A-1", "title": "Rain Jacket", "category": "jackets", "price": 49.95,
         "colours": ["yellow", "navy"], "sizes": {"S": 0, "M": 2, "L": 1}},
        {"id": "A-2", "title": "Scarf", "category": "accessories", "price": 20,
         "colours": [], "sizes": {"one size": 0}},
    ]  # fmt: skip
    assert format_for_prompt(items) == (
        "- [A-1] Rain Jacket | jackets | €49.95 | yellow/navy | in stock: M, L\n"
        "- [A-2] Scarf | accessories | €20.00 | sold out"
    )
    assert format_for_prompt([]) == ""


# -- reciprocal rank fusion ------------------------------------------------------------


def test_rrf_worked_example() -> None:
    # Cormack, Clarke & Büttcher (SIGIR 2009): RRF(d) = Σ 1 / (k + rank), ranks from 1.
    # keyword ranks: a=1, b=2, c=3        vector ranks: c=1, a=2, d=3        k = 60
    # a: 1/61 + 1/62 = 0.0163934 + 0.0161290 = 0.0325224
    # c: 1/63 + 1/61 = 0.0158730 + 0.0163934 = 0.0322664
    # b: 1/62        = 0.0161290
    # d: 1/63        = 0.0158730
    fused = rrf_fuse([["a", "b", "c"], ["c", "a", "d"]], k=60)
    assert [d for d, _ in fused] == ["a", "c", "b", "d"]
    expected = {"a": 1 / 61 + 1 / 62, "c": 1 / 63 + 1 / 61, "b": 1 / 62, "d": 1 / 63}
    for doc, score in fused:
        assert score == pytest.approx(expected[doc], abs=1e-12)
    assert fused[0][1] == pytest.approx(0.0325224, abs=1e-7)


def test_rrf_small_k_and_ties() -> None:
    # k = 1: x = 1/2 + 1/3 = 0.8333; y = 1/3 + 1/2 = 0.8333 (a tie: first met first); z = 1/4
    fused = rrf_fuse([["x", "y", "z"], ["y", "x"]], k=1)
    assert [d for d, _ in fused] == ["x", "y", "z"]
    assert fused[0][1] == pytest.approx(5 / 6) and fused[2][1] == pytest.approx(1 / 4)
    assert rrf_fuse([["a", "a", "b"]], k=60) == [("a", 1 / 61), ("b", 1 / 63)]  # repeat: once
    with pytest.raises(ValueError):
        rrf_fuse([["a"]], k=0)


def test_hybrid_runs_components_in_parallel_and_fuses() -> None:
    keyword = CountingSearch("keyword_any", ["a", "b", "c"], delay_s=0.1)
    vector = CountingSearch("vector", ["c", "a", "d"], delay_s=0.1)
    hybrid = HybridSearch([keyword, vector], rrf_k=60, candidates=20)

    async def main() -> tuple[list[Hit], float]:
        t0 = vloop().time()
        hits = await hybrid.search("q", 3)
        return hits, vloop().time() - t0

    hits, elapsed = run_virtual(main)
    assert elapsed == pytest.approx(0.1)  # gathered: 0.1 s of virtual time, not 0.2 s
    assert [h.id for h in hits] == ["a", "c", "b"] and all(h.source == "hybrid" for h in hits)
    assert keyword.seen[0][1] == 20  # each component contributes `candidates` hits


async def test_hybrid_degrades_when_a_component_fails(db: sqlite_utils.Database) -> None:
    keyword = CountingSearch("keyword_any", IDS[:5])
    vector = CountingSearch("vector", [], error=ProviderUnavailable("index building"))
    hits = await HybridSearch([keyword, vector]).search("q", 8)
    assert isinstance(hits, Hits) and [h.id for h in hits] == IDS[:5]
    assert hits.errors == ["vector: ProviderUnavailable: index building"]
    r = _retriever(db, {"hybrid": HybridSearch([keyword, vector])})
    log = (await r.retrieve("q")).searches[0]
    assert log.error == "partial: vector: ProviderUnavailable: index building" and log.n == 5
    with pytest.raises(ProviderUnavailable):
        await HybridSearch([vector]).search("q", 8)


# -- settings ---------------------------------------------------------------------------


def test_default_settings() -> None:
    s = RetrievalSettings()
    assert s.searches == ["keyword", "hybrid", "filter"] and s.min_results <= s.k
    assert s.rrf_k == 60 and s.needs_embedder


@pytest.mark.parametrize(
    ("kw", "fragment"),
    [
        ({"searches": ["keyword", "bm42"]}, "unknown search 'bm42'"),
        ({"searches": []}, "at least one search"),
        ({"searches": ["keyword", "keyword"]}, "listed twice"),
        ({"min_results": 9, "k": 8}, "min_results (9) must be <= k (8)"),
        ({"fallbacks": {"vector": "keyword"}}, "'vector' is not one of searches"),
        ({"fallbacks": {"hybrid": "cache"}}, "fallbacks.hybrid: unknown search 'cache'"),
        ({"fallbacks": {"hybrid": "hybrid"}}, "its own fallback"),
        ({"surprise": 1}, "Extra inputs are not permitted"),
        ({"embedding": {"backend": "openai", "base_url": "ftp://x"}}, "http"),
    ],
)
def test_invalid_settings(kw: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(fragment)):
        RetrievalSettings(**kw)


async def test_build_retriever_end_to_end_with_hash_embedder(db: sqlite_utils.Database) -> None:
    r = build_retriever(RetrievalSettings(embedding={"backend": "hash"}), db)
    async with r:
        assert await r.warm() > 0
        quick = await r.retrieve("waterproof jacket under 100")
        assert quick.stopped_after == "keyword" and [s.name for s in quick.searches] == ["keyword"]
        assert all(i["price"] <= 100 for i in quick.items) and len(quick.items) == 8
        vague = await r.retrieve("something to keep me dry when cycling to work")
        assert [s.name for s in vague.searches][:2] == ["keyword", "hybrid"]
        assert vague.items and vague.searches[1].error is None
        browse = await r.retrieve("anything under 30 in XL?")
        assert browse.searches[-1].name == "filter" and browse.items
        assert all(i["price"] <= 30 and i["sizes"].get("XL", 0) > 0 for i in browse.items)


async def test_build_retriever_without_embedding_searches(db: sqlite_utils.Database) -> None:
    r = build_retriever(RetrievalSettings(searches=["keyword", "keyword_any", "filter"]), db)
    assert r.index is None and await r.warm() == 0
    result = await r.retrieve("linen shirt")
    assert result.items


# -- hedged fallbacks (the seam to chainrun.hedging) ----------------------------------


def test_slow_primary_is_hedged_by_its_fallback() -> None:
    from chainrun.retrieval import fallback_hedger, hedged_search

    primary = CountingSearch("vector", ["slow"], delay_s=0.5)
    fallback = CountingSearch("keyword_any", ["fast"])

    async def main() -> tuple[HedgedAnswer, float]:
        hedger = fallback_hedger("vector", "keyword_any", delay_ms=20)
        t0 = vloop().time()
        answer = await hedged_search(primary, fallback, "q", 5, filters=None, hedger=hedger)
        elapsed = vloop().time() - t0
        await hedger.aclose()
        return answer, elapsed

    answer, elapsed = run_virtual(main)
    assert answer.answered_by == "keyword_any" and answer.hedged == "fallback_won"
    assert [h.id for h in answer.hits] == ["fast"]
    assert elapsed == pytest.approx(0.020)  # waited the head start, not the slow primary
    assert primary.calls == 1 and primary.finished == 0  # the loser was cancelled


async def test_slow_but_valid_primary_can_still_win() -> None:
    from chainrun.retrieval import fallback_hedger, hedged_search

    primary = CountingSearch("vector", ["primary"], delay_s=0.08)
    fallback = CountingSearch("keyword_any", ["fallback"], delay_s=0.5)
    hedger = fallback_hedger("vector", "keyword_any", delay_ms=20)
    answer = await hedged_search(primary, fallback, "q", 5, filters=None, hedger=hedger)
    assert answer.answered_by == "vector" and answer.hedged == "primary_won"
    assert fallback.calls == 1 and fallback.finished == 0  # enlisted once, then cancelled
    await hedger.aclose()


async def test_fast_primary_never_enlists_the_fallback() -> None:
    from chainrun.retrieval import fallback_hedger, hedged_search

    primary, fallback = CountingSearch("vector", ["p"]), CountingSearch("keyword_any", ["f"])
    hedger = fallback_hedger("vector", "keyword_any", delay_ms=50)
    answer = await hedged_search(primary, fallback, "q", 5, filters=None, hedger=hedger)
    assert answer.hedged is None and answer.answered_by == "vector" and fallback.calls == 0
    await hedger.aclose()


def test_failing_primary_starts_the_fallback_at_once() -> None:
    from chainrun.retrieval import fallback_hedger, hedged_search

    primary = CountingSearch("vector", [], error=ProviderUnavailable("down"))
    fallback = CountingSearch("keyword_any", ["f"])

    async def main() -> tuple[HedgedAnswer, float]:
        hedger = fallback_hedger("vector", "keyword_any", delay_ms=1000)
        t0 = vloop().time()
        answer = await hedged_search(primary, fallback, "q", 5, filters=None, hedger=hedger)
        elapsed = vloop().time() - t0
        both = CountingSearch("keyword_any", [], error=ProviderUnavailable("also down"))
        with pytest.raises(ProviderUnavailable, match="also down"):
            await hedged_search(primary, both, "q", 5, filters=None, hedger=hedger)
        await hedger.aclose()
        return answer, elapsed

    answer, elapsed = run_virtual(main)
    assert elapsed == 0.0  # did not wait for the 1 s head start
    assert answer.hedged == "fallback_after_error" and answer.answered_by == "keyword_any"


async def test_stage_records_the_hedge(db: sqlite_utils.Database) -> None:
    slow = CountingSearch("hybrid", IDS[:6], delay_s=0.5)
    fallback = CountingSearch("keyword_any", IDS[6:12])
    settings = RetrievalSettings(
        searches=["hybrid", "filter"], fallbacks={"hybrid": "keyword_any"}, hedge_delay_ms=20
    )
    r = RetrievalStage(settings, db, {"hybrid": slow, "keyword_any": fallback,
                                 "filter": CountingSearch("filter", [])})  # fmt: skip
    async with r:
        result = await r.retrieve("jacket")
    log = result.searches[0]
    assert (log.name, log.answered_by, log.hedged) == ("hybrid", "keyword_any", "fallback_won")
    assert log.ms < 300 and result.ids == IDS[6:12]
    assert {i["source"] for i in result.items} == {"keyword_any"}
    assert result.stopped_after == "hybrid"


async def test_retriever_rejects_missing_searches(db: sqlite_utils.Database) -> None:
    with pytest.raises(ValueError, match="no search named 'vector'"):
        RetrievalStage(RetrievalSettings(searches=["vector"]), db, {})
    assert HashEmbedder().model == "hash-256"


async def test_build_retriever_with_a_fallback(db: sqlite_utils.Database) -> None:
    settings = RetrievalSettings(
        searches=["hybrid", "filter"],
        fallbacks={"hybrid": "keyword_any"},
        embedding={"backend": "hash"},
    )
    async with build_retriever(settings, db) as r:
        assert set(r.searches) >= {"hybrid", "keyword_any", "vector", "filter"}
        await r.warm()
        log = (await r.retrieve("linen shirt")).searches[0]
        assert log.name == "hybrid" and log.answered_by in ("hybrid", "keyword_any") and log.n


def test_public_api() -> None:
    import chainrun.retrieval as retrieval

    assert sorted(retrieval.__all__) == sorted(
        ["SEARCH_NAMES", "Embedder", "EmbeddingSettings", "FilterSearch", "Filters",
         "HashEmbedder", "HedgedAnswer", "Hit", "Hits", "HybridSearch", "KeywordSearch",
         "MiniLMEmbedder", "OpenAIEmbedder", "ParsedQuery", "RetrievalResult",
         "RetrievalSettings", "RetrievalStage", "Retriever", "Search", "SearchLog",
         "VECTOR_BACKENDS",
         "Vec0Index", "VectorIndex", "VectorSearch", "build_embedder", "build_retriever",
         "build_searches",
         "fallback_hedger", "format_for_prompt", "fts_query", "hedged_search",
         "parse_filters", "parse_query", "rrf_fuse"]
    )  # fmt: skip
    for name in retrieval.__all__:
        assert getattr(retrieval, name).__doc__ or name in ("SEARCH_NAMES", "VECTOR_BACKENDS")
